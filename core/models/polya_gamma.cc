#include "core/models/polya_gamma.h"

#include <algorithm>
#include <cmath>

namespace vipsd::models {

double PolyaGammaMean(double c) {
  if (std::isnan(c)) return 0.25;
  const double magnitude = std::fabs(c);
  double mean;
  if (magnitude < 1e-3) {
    const double c2 = magnitude * magnitude;
    mean = 0.25 * (1.0 - c2 / 12.0 + c2 * c2 / 120.0);
  } else if (std::isinf(magnitude)) {
    mean = 0.0;
  } else {
    mean = std::tanh(0.5 * magnitude) / (2.0 * magnitude);
  }
  return std::clamp(mean, 0.0, 0.25);
}

}  // namespace vipsd::models
