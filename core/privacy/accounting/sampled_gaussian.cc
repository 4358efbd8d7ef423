#include "core/privacy/accounting/sampled_gaussian.h"

#include <cmath>
#include <string>

#include "core/base/format.h"

namespace vipsd::privacy {

Status ValidateSampledGaussian(const SampledGaussian& step, bool require_noise) {
  if (!(step.sampling_rate > 0.0 && step.sampling_rate <= 1.0)) {
    return InvalidArgumentError("sampling_rate must be in (0, 1], got " +
                                ShortestNumber(step.sampling_rate));
  }
  if (!std::isfinite(step.noise_multiplier) || step.noise_multiplier < 0.0 ||
      (require_noise && step.noise_multiplier == 0.0)) {
    return InvalidArgumentError(std::string("noise_multiplier must be finite and ") +
                                (require_noise ? "> 0" : ">= 0") + ", got " +
                                ShortestNumber(step.noise_multiplier));
  }
  return Status::Ok();
}

}  // namespace vipsd::privacy
