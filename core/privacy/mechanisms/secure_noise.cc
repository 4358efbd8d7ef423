#include "core/privacy/mechanisms/secure_noise.h"

#include <sodium.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <string_view>
#include <vector>

#include "core/base/log.h"
#include "core/base/parallel.h"
#include "core/privacy/mechanisms/discrete_gaussian.h"

namespace vipsd::privacy {
namespace {

constexpr std::string_view kLogComponent = "privacy.noise";

// Ziggurat with 256 equal-area layers for f(x) = exp(−x²/2) (unnormalised).
//   x[1] = r, f(x[i+1]) = f(x[i]) + v / x[i], x[256] = 0;
//   layer i ≥ 1 is the rectangle [0, x[i]] × [f(x[i]), f(x[i+1])] (area v);
//   layer 0 is the base [0, r] × [0, f(r)] plus the tail beyond r, area
//   v = r f(r) + ∫_r^∞ f, drawn as a virtual rectangle of width x[0] = v / f(r).
constexpr int kLayers = 256;

struct ZigguratTables {
  std::array<double, kLayers + 1> x{};      // layer widths, x[256] = 0
  std::array<double, kLayers + 1> f{};      // f(x[i]), f[256] = 1
  std::array<double, kLayers> inner_ratio{};  // x[i+1] / x[i]: fully-inside test
  internal::ZigguratGeometry geometry;
};

long double GaussDensityUnnormalised(long double x) { return std::exp(-0.5L * x * x); }

// Builds the stack of layers for a trial r in extended precision. Returns
// false if the layers reach the top (f = 1) before layer 255, i.e. r is too
// small; otherwise `top_excess` = (area of the top layer) − v, which is
// positive when r is too large.
bool BuildLayers(long double r, std::array<long double, kLayers + 1>& x,
                 long double& v, long double& top_excess) {
  const long double kHalfPi = 1.5707963267948966192313216916397514L;
  v = r * GaussDensityUnnormalised(r) +
      std::sqrt(kHalfPi) * std::erfc(r / std::sqrt(2.0L));
  x[0] = v / GaussDensityUnnormalised(r);
  x[1] = r;
  for (int i = 1; i < kLayers - 1; ++i) {
    const long double next_height = GaussDensityUnnormalised(x[i]) + v / x[i];
    if (next_height >= 1.0L) return false;
    x[i + 1] = std::sqrt(-2.0L * std::log(next_height));
  }
  x[kLayers] = 0.0L;
  const long double top = x[kLayers - 1];
  top_excess = top * (1.0L - GaussDensityUnnormalised(top)) - v;
  return true;
}

ZigguratTables ComputeZigguratTables() {
  // The top-layer excess is increasing in r; bisect to the last bit of the
  // extended-precision mantissa.
  long double lo = 3.0L;
  long double hi = 4.5L;
  std::array<long double, kLayers + 1> x{};
  long double v = 0;
  long double excess = 0;
  for (int iteration = 0; iteration < 200; ++iteration) {
    const long double mid = 0.5L * (lo + hi);
    if (mid <= lo || mid >= hi) break;
    if (!BuildLayers(mid, x, v, excess) || excess < 0) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  long double excess_lo = 0, excess_hi = 0, v_lo = 0, v_hi = 0;
  std::array<long double, kLayers + 1> x_lo{};
  const bool lo_closed = BuildLayers(lo, x_lo, v_lo, excess_lo);
  BuildLayers(hi, x, v_hi, excess_hi);  // hi always closes (excess ≥ 0)
  // Keep whichever end closes the top layer more exactly.
  if (lo_closed && std::fabs(excess_lo) < std::fabs(excess_hi)) {
    x = x_lo;
    v = v_lo;
    excess = excess_lo;
  } else {
    v = v_hi;
    excess = excess_hi;
  }

  ZigguratTables tables;
  for (int i = 0; i <= kLayers; ++i) {
    tables.x[i] = static_cast<double>(x[i]);
    tables.f[i] = static_cast<double>(GaussDensityUnnormalised(x[i]));
  }
  tables.f[kLayers] = 1.0;
  for (int i = 0; i < kLayers; ++i) {
    tables.inner_ratio[i] = static_cast<double>(x[i + 1] / x[i]);
  }
  tables.geometry.tail_start = static_cast<double>(x[1]);
  tables.geometry.layer_area = static_cast<double>(v);
  tables.geometry.top_layer_mismatch = static_cast<double>(std::fabs(excess) / v);
  return tables;
}

const ZigguratTables& Tables() {
  static const ZigguratTables tables = ComputeZigguratTables();
  return tables;
}

}  // namespace

namespace internal {
ZigguratGeometry GetZigguratGeometry() { return Tables().geometry; }
}  // namespace internal

StatusOr<std::unique_ptr<SecureNoiseSource>> SecureNoiseSource::Create() {
  if (sodium_init() < 0) {
    return InternalError("libsodium initialisation failed (sodium_init returned -1); "
                         "no secure noise source is available");
  }
  unsigned char key[kKeyBytes];
  randombytes_buf(key, sizeof key);
  std::unique_ptr<SecureNoiseSource> source(new SecureNoiseSource(key, /*is_private=*/true));
  sodium_memzero(key, sizeof key);
  return source;
}

StatusOr<std::unique_ptr<NoiseSource>> SecureNoiseSource::CreateReproducible(uint64_t seed) {
  if (sodium_init() < 0) {
    return InternalError("libsodium initialisation failed (sodium_init returned -1)");
  }
  // key = BLAKE2b-256("vipsd/noise/fixed-seed/v1" || seed as 8 little-endian bytes).
  static constexpr std::string_view kDomain = "vipsd/noise/fixed-seed/v1";
  unsigned char message[kDomain.size() + 8];
  std::memcpy(message, kDomain.data(), kDomain.size());
  for (int byte = 0; byte < 8; ++byte) {
    message[kDomain.size() + byte] = static_cast<unsigned char>(seed >> (8 * byte));
  }
  unsigned char key[kKeyBytes];
  if (crypto_generichash(key, sizeof key, message, sizeof message, nullptr, 0) != 0) {
    return InternalError("BLAKE2b key derivation failed for the fixed-seed noise source");
  }
  std::unique_ptr<NoiseSource> source(new SecureNoiseSource(key, /*is_private=*/false));
  sodium_memzero(key, sizeof key);
  Log(LogLevel::kWarning, kLogComponent,
      "FIXED-SEED noise source created: its noise is predictable from the seed and "
      "releases made with it are NOT PRIVATE (test/reproducibility mode only)");
  return source;
}

SecureNoiseSource::SecureNoiseSource(const unsigned char (&key)[kKeyBytes], bool is_private)
    : keystream_(kKeystreamChunkWords),
      position_(kKeystreamChunkWords),  // empty: the first draw refills
      is_private_(is_private) {
  std::memcpy(key_, key, kKeyBytes);
  Tables();  // solve the ziggurat once, outside any timed release
}

SecureNoiseSource::~SecureNoiseSource() {
  sodium_memzero(key_, sizeof key_);
  sodium_memzero(keystream_.data(), keystream_.size() * sizeof(uint64_t));
}

std::string SecureNoiseSource::description() const {
  return is_private_ ? "chacha20-os-seeded" : "chacha20-fixed-seed (NOT PRIVATE)";
}

void SecureNoiseSource::Refill() {
  if (next_nonce_ == std::numeric_limits<uint64_t>::max()) {
    // 2^64 − 1 chunks of 64 KiB consumed: unreachable in practice, but reusing
    // a nonce would repeat noise, so stop rather than continue.
    Log(LogLevel::kError, kLogComponent, "ChaCha20 nonce space exhausted; aborting");
    std::abort();
  }
  unsigned char nonce[crypto_stream_chacha20_NONCEBYTES];
  static_assert(sizeof nonce == sizeof next_nonce_);
  for (size_t byte = 0; byte < sizeof nonce; ++byte) {
    nonce[byte] = static_cast<unsigned char>(next_nonce_ >> (8 * byte));
  }
  static_assert(kKeyBytes == crypto_stream_chacha20_KEYBYTES);
  crypto_stream_chacha20(reinterpret_cast<unsigned char*>(keystream_.data()),
                         kKeystreamChunkBytes, nonce, key_);
  ++next_nonce_;
  position_ = 0;
}

Status SecureNoiseSource::FillDiscreteGaussian(const DiscreteGaussianSampler& sampler,
                                               std::span<int64_t> out) {
  return FillDiscreteGaussianParallel(sampler, out, 1);
}

Status SecureNoiseSource::FillDiscreteGaussianParallel(const DiscreteGaussianSampler& sampler,
                                                       std::span<int64_t> out, int threads) {
  // The call's base key: the next 256 bits of this stream.
  std::array<uint64_t, kKeyBytes / sizeof(uint64_t)> words;
  FillUniformBits(words);
  unsigned char base[kKeyBytes];
  std::memcpy(base, words.data(), kKeyBytes);
  sodium_memzero(words.data(), sizeof words);
  const size_t chunks = (out.size() + kDiscreteGaussianChunk - 1) / kDiscreteGaussianChunk;
  std::mutex error_mutex;
  Status error = Status::Ok();  // the first failure; guarded by error_mutex
  ForEachIndexOnThreads(chunks, threads, [&](size_t c) {
    // Chunk c's key: BLAKE2b-256(c as 8 little-endian bytes; key = base).
    unsigned char index[8];
    for (int byte = 0; byte < 8; ++byte) {
      index[byte] = static_cast<unsigned char>(c >> (8 * byte));
    }
    unsigned char key[kKeyBytes];
    Status status = Status::Ok();
    if (crypto_generichash(key, sizeof key, index, sizeof index, base, sizeof base) != 0) {
      status = InternalError("BLAKE2b key derivation failed for a noise chunk");
    } else {
      SecureNoiseSource chunk_source(key, is_private_);
      const size_t begin = c * kDiscreteGaussianChunk;
      status = sampler.Fill(chunk_source,
                            out.subspan(begin, std::min(kDiscreteGaussianChunk,
                                                        out.size() - begin)));
    }
    sodium_memzero(key, sizeof key);
    if (!status.ok()) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (error.ok()) error = status;
    }
  });
  sodium_memzero(base, sizeof base);
  if (!error.ok()) {
    std::fill(out.begin(), out.end(), 0);  // as DiscreteGaussianSampler::Fill on failure
    return error;
  }
  return Status::Ok();
}

void SecureNoiseSource::FillUniformBits(std::span<uint64_t> out) {
  size_t done = 0;
  while (done < out.size()) {
    if (position_ == kKeystreamChunkWords) Refill();
    const size_t count = std::min(out.size() - done, kKeystreamChunkWords - position_);
    std::memcpy(out.data() + done, keystream_.data() + position_, count * sizeof(uint64_t));
    position_ += count;
    done += count;
  }
}

double SecureNoiseSource::SampleTail() {
  const double r = Tables().geometry.tail_start;
  for (;;) {
    const double excess = -std::log(NextOpenUniform()) / r;
    const double exponential = -std::log(NextOpenUniform());
    if (2.0 * exponential > excess * excess) return r + excess;
  }
}

void SecureNoiseSource::FillStandardNormal(std::span<double> out) {
  const ZigguratTables& tables = Tables();
  for (double& draw : out) {
    for (;;) {
      const uint64_t word = NextWord();
      const size_t layer = word & 0xFF;
      const bool negative = ((word >> 8) & 1) != 0;
      const double u = static_cast<double>(word >> 11) * 0x1.0p-53;  // [0, 1)
      const double x = u * tables.x[layer];
      if (u < tables.inner_ratio[layer]) {  // inside the layer's core rectangle
        draw = negative ? -x : x;
        break;
      }
      if (layer == 0) {  // base layer, beyond r
        const double tail = SampleTail();
        draw = negative ? -tail : tail;
        break;
      }
      // Wedge: accept (x, y) with y uniform in the layer's height band.
      const double y = tables.f[layer] +
                       NextOpenUniform() * (tables.f[layer + 1] - tables.f[layer]);
      if (y < std::exp(-0.5 * x * x)) {
        draw = negative ? -x : x;
        break;
      }
    }
  }
}

}  // namespace vipsd::privacy
