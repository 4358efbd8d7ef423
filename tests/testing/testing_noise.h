// TEST-ONLY noise sources. NOT PRIVATE.
//
// ZeroNoiseSource returns zeros from FillStandardNormal and
// FillDiscreteGaussian, which turns the release mechanism into the identity
// on the grid-rounded sum: useful for checking that the
// mechanism's plumbing (scaling, clipping, mirroring) is exact. It lives in
// tests/testing so that no release binary can link it.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "core/privacy/mechanisms/noise_source.h"

namespace vipsd::testing {

class ZeroNoiseSource final : public privacy::NoiseSource {
 public:
  explicit ZeroNoiseSource(uint64_t bits_seed = 1) : state_(bits_seed) {}
  void FillStandardNormal(std::span<double> out) override;
  Status FillDiscreteGaussian(const privacy::DiscreteGaussianSampler& sampler,
                              std::span<int64_t> out) override;
  void FillUniformBits(std::span<uint64_t> out) override;  // splitmix64
  bool is_private() const override { return false; }
  std::string description() const override {
    return "zero-noise (TEST ONLY, NOT PRIVATE)";
  }

 private:
  uint64_t state_;
};

}  // namespace vipsd::testing
