#include "tests/testing/testing_noise.h"

#include <algorithm>

namespace vipsd::testing {

void ZeroNoiseSource::FillStandardNormal(std::span<double> out) {
  std::fill(out.begin(), out.end(), 0.0);
}

Status ZeroNoiseSource::FillDiscreteGaussian(const privacy::DiscreteGaussianSampler&,
                                             std::span<int64_t> out) {
  std::fill(out.begin(), out.end(), 0);
  return Status::Ok();
}

void ZeroNoiseSource::FillUniformBits(std::span<uint64_t> out) {
  for (auto& word : out) {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    word = z ^ (z >> 31);
  }
}

}  // namespace vipsd::testing
