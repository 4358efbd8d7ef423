#include "core/privacy/mechanisms/distributed_noise.h"

#include <cmath>
#include <numbers>
#include <string>

namespace vipsd::privacy {
namespace {

// e(v) = 2·Σ_{m ≥ 1} exp(−2π²·v·m²), summed until a term no longer changes
// the sum (at most 64 terms: for v ≥ 2^-10 the 64th term is below e^-79).
long double ThetaExcess(long double v) {
  const long double pi = std::numbers::pi_v<long double>;
  long double sum = 0;
  for (int m = 1; m <= 64; ++m) {
    const long double term = std::exp(-2 * pi * pi * v * m * m);
    if (sum + term == sum) break;
    sum += term;
  }
  return 2 * sum;
}

}  // namespace

StatusOr<DistributedNoise> DistributedNoiseFor(const BlockLayout& layout, double noise_multiplier,
                                               uint32_t holders, uint32_t tolerated) {
  if (holders < 1 || holders > kMaxHolders) {
    return InvalidArgumentError("the number of holders must be in [1, " +
                                std::to_string(kMaxHolders) + "], got " +
                                std::to_string(holders));
  }
  if (tolerated >= holders) {
    return InvalidArgumentError("the tolerated number of colluding holders (" +
                                std::to_string(tolerated) +
                                ") must be below the number of holders (" +
                                std::to_string(holders) + ")");
  }
  VIPSD_ASSIGN_OR_RETURN(DiscreteNoise central, DiscreteNoiseFor(layout, noise_multiplier));
  DistributedNoise noise;
  noise.central = central;
  noise.holders = holders;
  noise.tolerated = tolerated;
  const uint64_t honest = holders - tolerated;
  // σ_g² < 2^62 and honest ≥ 1: no overflow.
  noise.share_sigma2 = Rational{(central.sigma2.numerator + honest - 1) / honest, 1};
  return noise;
}

StatusOr<double> HonestNoiseMultiplier(const DistributedNoise& noise, uint32_t honest) {
  if (honest > noise.holders) {
    return InvalidArgumentError("honest holders (" + std::to_string(honest) +
                                ") exceed the holders (" + std::to_string(noise.holders) + ")");
  }
  // honest·s² ≤ 64·2^62 fits 128 bits exactly.
  __extension__ typedef unsigned __int128 U128;
  const U128 variance = static_cast<U128>(honest) * noise.share_sigma2.numerator;
  if (variance <= kReductionTau2 || noise.central.bound_squared == 0) return 0.0;
  const long double usable = static_cast<long double>(variance - kReductionTau2);
  const long double ratio = usable / static_cast<long double>(noise.central.bound_squared);
  // Round down: the charge must never exceed what the honest noise covers.
  double sigma = static_cast<double>(std::sqrt(ratio));
  while (sigma > 0 && static_cast<long double>(sigma) * sigma > ratio) {
    sigma = std::nextafter(sigma, 0.0);
  }
  // At least n − t honest holders cover σ_g², hence the configured σ (the
  // ceilings in σ_g² and s² leave room): report exactly σ then, so that one
  // number is charged everywhere.
  if (honest >= noise.holders - noise.tolerated) {
    return std::max(sigma, noise.central.noise_multiplier);
  }
  return std::min(sigma, noise.central.noise_multiplier);
}

long double ShareSumClosenessBound(long double share_sigma2, uint32_t honest) {
  if (honest == 0 || !(share_sigma2 > 0)) return 0;
  const long double base = std::log1p(ThetaExcess(share_sigma2));
  long double eta = base;
  for (uint32_t j = 1; j < honest; ++j) {
    const long double v = share_sigma2 * j / (j + 1);
    eta += base - std::log1p(-ThetaExcess(v));
  }
  return eta;
}

long double Log10ShareSumClosenessBound(long double share_sigma2, uint32_t honest) {
  const long double pi = std::numbers::pi_v<long double>;
  return std::log10(3.0L * std::max<uint32_t>(honest, 1)) -
         pi * pi * share_sigma2 / std::log(10.0L);
}

}  // namespace vipsd::privacy
