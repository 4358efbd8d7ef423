// SecureNoiseSource: the production NoiseSource. A ChaCha20 keystream
// (libsodium, original 64-bit-nonce variant) keyed with 256 bits from the
// operating system's CSPRNG (randombytes_buf, i.e. getrandom(2) on Linux),
// turned into N(0, 1) draws by a ziggurat sampler.
//
// Keystream management. The keystream is generated in chunks of
// kKeystreamChunkBytes. Chunk k is ChaCha20(key, nonce = k, block counter
// starting at 0), so every chunk uses a distinct (key, nonce) pair and no
// 64-byte keystream block is ever produced twice. Words are consumed strictly
// in order; FillStandardNormal and FillUniformBits draw from the same stream.
// The nonce is a 64-bit counter: exhausting it would take 2^64 chunks
// (2^80 bytes), which cannot happen; if it ever did, the source aborts the
// process rather than reuse a nonce. The key and the unread keystream are
// wiped with sodium_memzero when the source is destroyed.
//
// Gaussian transform. Marsaglia & Tsang, "The Ziggurat Method for Generating
// Random Variables" (J. Stat. Softw. 2000) with 256 layers, using an
// independent layer index as recommended by Doornik, "An Improved Ziggurat
// Method to Generate Normal Random Samples" (2005). The layer boundaries are
// solved at start-up in extended precision (the base width r is found by
// bisection so that the top layer closes exactly), then rounded to double.
// Each fast-path draw uses one 64-bit word: 8 bits pick the layer, 1 bit the
// sign and 53 bits the abscissa; wedges and the tail (Marsaglia 1964:
// t = −ln(U1)/r, accepted when −2 ln(U2) > t², returns r + t) use fresh
// 53-bit uniforms in (0, 1]. The sampler is exact in distribution except for
// the 2^-53 resolution of its uniforms and the double rounding of the tables
// (the layer areas agree to ~1e-16 relative).
//
// Floating-point caveat, and why releases do not use this sampler. Every
// floating-point Gaussian sampler produces only a data-independent,
// non-uniform subset of doubles, and the low-order bits of "value + noise"
// can then reveal the value (Mironov, "On Significance of the Least
// Significant Bits for Differential Privacy", CCS 2012; Jin et al., "Are We
// There Yet? Timing and Floating-Point Attacks on Differential Privacy
// Systems", S&P 2022, which attack ziggurat, polar and Box–Muller samplers).
// Releases therefore take their noise from FillDiscreteGaussian (the exact
// integer sampler of discrete_gaussian.h, on this source's random words)
// over integer sums (gaussian_mechanism.h); FillStandardNormal is kept for
// tests and benchmarks only. Timing: the rejection loops make the run time
// depend (weakly) on the noise values, never on private records.
//
// Reproducible mode. CreateReproducible(seed) derives the key from the seed
// (BLAKE2b via crypto_generichash, domain-separated). Anyone who knows the
// seed can recompute the noise, so the source reports is_private() == false,
// describes itself as "chacha20-fixed-seed (NOT PRIVATE)" and logs a WARNING
// when created. For a given seed the stream is identical on every
// little-endian machine and with every libsodium implementation (AVX2, SSSE3,
// reference), because ChaCha20 output is fully specified.
//
// Thread-safety: NOT thread-safe (the keystream position is mutable state);
// give each thread its own source. Do not fork(2) a process that holds a
// source and use it in both parent and child: both would draw the same noise.
//
// Failure: Create() fails only if libsodium cannot be initialised.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/base/status.h"
#include "core/privacy/mechanisms/noise_source.h"

namespace vipsd::privacy {

class SecureNoiseSource final : public NoiseSource {
 public:
  // Size of one ChaCha20 chunk (one nonce). Large enough to amortise the
  // call into libsodium, small enough to stay in L2 cache.
  static constexpr size_t kKeystreamChunkBytes = 64 * 1024;
  static constexpr size_t kKeystreamChunkWords = kKeystreamChunkBytes / sizeof(uint64_t);

  // Production source: fresh 256-bit key from the OS CSPRNG.
  static StatusOr<std::unique_ptr<SecureNoiseSource>> Create();

  // NOT PRIVATE. Fixed-seed source for tests and reproducible experiments;
  // logs a WARNING on creation. Returned as a plain NoiseSource so that it
  // cannot be passed where a SecureNoiseSource is required.
  static StatusOr<std::unique_ptr<NoiseSource>> CreateReproducible(uint64_t seed);

  ~SecureNoiseSource() override;
  SecureNoiseSource(const SecureNoiseSource&) = delete;
  SecureNoiseSource& operator=(const SecureNoiseSource&) = delete;

  void FillStandardNormal(std::span<double> out) override;
  void FillUniformBits(std::span<uint64_t> out) override;
  // The release noise in chunks of kDiscreteGaussianChunk draws, chunk c
  // drawn by the exact sampler from a ChaCha20 stream of its own, keyed
  // BLAKE2b-256(c; key = a 256-bit key drawn from this stream for the call):
  // every chunk's (key, nonce) pairs are distinct from every other stream's,
  // the chunks are independent, and the draws are the same whatever the
  // number of threads that fill them (issue 30: a step's noise — 500,000
  // draws at K·V = 500,000, ~0.15 s on one core — divides over the
  // coordinator's threads). FillDiscreteGaussian is this on one thread.
  static constexpr size_t kDiscreteGaussianChunk = 16384;
  Status FillDiscreteGaussian(const DiscreteGaussianSampler& sampler,
                              std::span<int64_t> out) override;
  Status FillDiscreteGaussianParallel(const DiscreteGaussianSampler& sampler,
                                      std::span<int64_t> out, int threads) override;
  bool is_private() const override { return is_private_; }
  std::string description() const override;

 private:
  static constexpr size_t kKeyBytes = 32;

  SecureNoiseSource(const unsigned char (&key)[kKeyBytes], bool is_private);

  uint64_t NextWord() {
    if (position_ == kKeystreamChunkWords) Refill();
    return keystream_[position_++];
  }
  // Uniform in (0, 1], 53 random bits, never 0 (safe for log).
  double NextOpenUniform() {
    return static_cast<double>((NextWord() >> 11) + 1) * 0x1.0p-53;
  }
  double SampleTail();  // |Z| conditioned on |Z| > r
  void Refill();

  unsigned char key_[kKeyBytes];
  uint64_t next_nonce_ = 0;
  std::vector<uint64_t> keystream_;
  size_t position_;  // next unread word of keystream_
  bool is_private_;
};

namespace internal {

// Exposed for tests: the solved ziggurat geometry. `tail_start` is r (the
// published value for 256 layers is 3.6541528853610088), `layer_area` is v,
// and `top_layer_mismatch` is |area of the top layer − v| / v as built.
struct ZigguratGeometry {
  double tail_start = 0;
  double layer_area = 0;
  double top_layer_mismatch = 0;
};
ZigguratGeometry GetZigguratGeometry();

}  // namespace internal
}  // namespace vipsd::privacy
