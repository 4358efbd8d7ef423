#include "core/svi/step_randomness.h"

#include <sodium.h>

#include <cmath>
#include <cstring>
#include <string>

namespace vipsd::svi {
namespace {

constexpr char kStreamKeyDomain[] = "vipsd-step-stream-v1";
constexpr char kUnitDigestDomain[] = "vipsd-unit-v1";
constexpr char kUnitWordDomain[] = "vipsd-step-unit-v1";
constexpr int64_t kMaxOffset = int64_t{1} << 62;
// Blocks of keystream a run may skip over rather than start a new run.
constexpr uint64_t kMaxGapBlocks = 8;

uint64_t LoadLe64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

StepKey DrawStepKey(privacy::NoiseSource& noise) {
  uint64_t words[4];
  noise.FillUniformBits(words);
  StepKey key;
  for (size_t w = 0; w < 4; ++w) {
    for (size_t b = 0; b < 8; ++b) {
      key.bytes[w * 8 + b] = static_cast<uint8_t>(words[w] >> (8 * b));
    }
  }
  sodium_memzero(words, sizeof(words));
  return key;
}

std::array<uint8_t, 32> DeriveStreamKey(const StepKey& key, std::string_view stream) {
  static_assert(crypto_generichash_KEYBYTES_MIN <= 32 && 32 <= crypto_generichash_KEYBYTES_MAX);
  std::string message(kStreamKeyDomain, sizeof(kStreamKeyDomain));  // includes the 0 byte
  message.append(stream);
  std::array<uint8_t, 32> out{};
  // crypto_generichash cannot fail for valid output and key lengths.
  crypto_generichash(out.data(), out.size(), reinterpret_cast<const unsigned char*>(message.data()),
                     message.size(), key.bytes.data(), key.bytes.size());
  return out;
}

std::array<uint8_t, 16> UnitDigest(std::string_view unit_id) {
  std::string message(kUnitDigestDomain, sizeof(kUnitDigestDomain));  // includes the 0 byte
  message.append(unit_id);
  std::array<uint8_t, 16> out{};
  crypto_generichash(out.data(), out.size(), reinterpret_cast<const unsigned char*>(message.data()),
                     message.size(), nullptr, 0);
  sodium_memzero(message.data(), message.size());
  return out;
}

uint64_t UnitWord(const StepKey& key, const std::array<uint8_t, 16>& digest) {
  unsigned char message[sizeof(kUnitWordDomain) + 16];
  std::memcpy(message, kUnitWordDomain, sizeof(kUnitWordDomain));  // includes the 0 byte
  std::memcpy(message + sizeof(kUnitWordDomain), digest.data(), digest.size());
  unsigned char out[32];
  crypto_generichash(out, sizeof(out), message, sizeof(message), key.bytes.data(),
                     key.bytes.size());
  const uint64_t word = LoadLe64(out);
  sodium_memzero(out, sizeof(out));
  return word;
}

Status KeyedWords(const std::array<uint8_t, 32>& stream_key, uint64_t nonce,
                  std::span<const int64_t> offsets, std::vector<uint64_t>& out) {
  static_assert(crypto_stream_chacha20_KEYBYTES == 32 && crypto_stream_chacha20_NONCEBYTES == 8);
  out.resize(offsets.size());
  for (size_t i = 0; i < offsets.size(); ++i) {
    if (offsets[i] < 0 || offsets[i] >= kMaxOffset) {
      return InvalidArgumentError("record offset " + std::to_string(offsets[i]) +
                                  " outside [0, 2^62)");
    }
    if (i > 0 && offsets[i] <= offsets[i - 1]) {
      return InvalidArgumentError("record offsets of one stream must be strictly increasing (" +
                                  std::to_string(offsets[i - 1]) + " then " +
                                  std::to_string(offsets[i]) + ")");
    }
  }
  unsigned char nonce_bytes[8];
  for (size_t b = 0; b < 8; ++b) nonce_bytes[b] = static_cast<unsigned char>(nonce >> (8 * b));
  std::vector<unsigned char> zeros, stream;
  size_t i = 0;
  while (i < offsets.size()) {
    // A run of records whose blocks are at most kMaxGapBlocks apart.
    const uint64_t first_block = static_cast<uint64_t>(offsets[i]) / 8;
    uint64_t last_block = first_block;
    size_t j = i + 1;
    while (j < offsets.size() &&
           static_cast<uint64_t>(offsets[j]) / 8 <= last_block + kMaxGapBlocks) {
      last_block = static_cast<uint64_t>(offsets[j]) / 8;
      ++j;
    }
    const size_t bytes = static_cast<size_t>(last_block - first_block + 1) * 64;
    zeros.assign(bytes, 0);
    stream.resize(bytes);
    crypto_stream_chacha20_xor_ic(stream.data(), zeros.data(), bytes, nonce_bytes, first_block,
                                  stream_key.data());
    for (size_t r = i; r < j; ++r) {
      const uint64_t position = static_cast<uint64_t>(offsets[r]) - first_block * 8;
      out[r] = LoadLe64(stream.data() + position * 8);
    }
    i = j;
  }
  sodium_memzero(stream.data(), stream.size());
  return Status::Ok();
}

uint64_t SampleThreshold(double q) {
  // ldexp is exact; the conversion truncates (q < 1 keeps it below 2^64).
  return static_cast<uint64_t>(std::ldexp(q, 64));
}

}  // namespace vipsd::svi
