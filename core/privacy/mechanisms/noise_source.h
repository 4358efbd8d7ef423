// NoiseSource: where the Gaussian mechanism gets its randomness.
//
// The noise that makes a release private must be unpredictable to anyone who
// sees the release. Production code uses SecureNoiseSource (secure_noise.h):
// a ChaCha20 keystream (libsodium) keyed from the operating system's CSPRNG.
// A reproducible, fixed-seed variant exists for tests and experiments; it
// reports is_private() == false and announces itself loudly on creation.
//
// Thread-safety: a NoiseSource is NOT thread-safe; give each thread its own
// or guard it. The step driver draws all noise of a step from one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "core/base/status.h"

namespace vipsd::privacy {

class DiscreteGaussianSampler;

class NoiseSource {
 public:
  virtual ~NoiseSource() = default;

  // Fills `out` with independent N(0, 1) draws (floating point: NOT used for
  // releases any more, which take FillDiscreteGaussian; kept for tests and
  // benchmarks that compare the two).
  virtual void FillStandardNormal(std::span<double> out) = 0;

  // Fills `out` with independent uniformly random 64-bit words (used for
  // Poisson sampling decisions, which must be as unpredictable as the noise).
  virtual void FillUniformBits(std::span<uint64_t> out) = 0;

  // Fills `out` with independent draws from the discrete Gaussian `sampler`
  // (the release noise, discrete_gaussian.h). The default runs the exact
  // sampler on this source's FillUniformBits words; only test sources
  // override it (a zero-noise source returns zeros). Errors as
  // DiscreteGaussianSampler::Fill (out is then zero-filled and must not be
  // released).
  virtual Status FillDiscreteGaussian(const DiscreteGaussianSampler& sampler,
                                      std::span<int64_t> out);

  // The same on up to `threads` threads (the calling one included). The
  // draws do not depend on `threads`: SecureNoiseSource fills fixed chunks
  // from streams of their own (secure_noise.h); any other source fills
  // serially with FillDiscreteGaussian (the default).
  virtual Status FillDiscreteGaussianParallel(const DiscreteGaussianSampler& sampler,
                                              std::span<int64_t> out, int threads);

  // False for any source that an adversary could predict (fixed seed) or
  // that adds no noise. Releases made with such a source are not private.
  virtual bool is_private() const = 0;

  // Short description for logs and release metadata, e.g.
  // "chacha20-os-seeded" or "chacha20-fixed-seed (NOT PRIVATE)".
  virtual std::string description() const = 0;
};

}  // namespace vipsd::privacy
