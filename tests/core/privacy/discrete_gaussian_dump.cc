// Prints the C++ discrete-Gaussian δ(ε) and Rényi divergences on a fixed grid
// for tests/core/privacy/discrete_gaussian_oracle.py, which recomputes them
// by direct summation in 40-digit decimal arithmetic and compares.
// Lines:
//   delta <n> <d> <Δ> <ε> <δ_remove> <δ_add> <error_bound>
//   renyi <n> <d> <Δ> <α> <D_α> <αΔ²/(2σ²)>
#include <cstdint>
#include <cstdio>

#include "core/privacy/mechanisms/discrete_gaussian.h"

int main() {
  using vipsd::privacy::Rational;
  const Rational grid[] = {{1, 4}, {1, 1}, {7, 3}, {1369, 100}, {1000003, 7919}, {400, 1}};
  int failures = 0;
  for (const Rational& sigma2 : grid) {
    for (uint64_t sensitivity : {1u, 2u, 3u}) {
      for (double eps : {0.0, 0.1, 0.5, 1.0, 2.0, 5.0}) {
        auto d = vipsd::privacy::DiscreteGaussianMechanismDelta(sigma2, sensitivity, eps);
        if (!d.ok()) {
          std::fprintf(stderr, "%s\n", d.status().ToString().c_str());
          ++failures;
          continue;
        }
        std::printf("delta %llu %llu %llu %.17g %.21Le %.21Le %.6Le\n",
                    static_cast<unsigned long long>(sigma2.numerator),
                    static_cast<unsigned long long>(sigma2.denominator),
                    static_cast<unsigned long long>(sensitivity), eps, d->delta_remove,
                    d->delta_add, d->error_bound);
      }
      if (sigma2.numerator == 400) continue;  // the oracle's Rényi sums stay small
      for (double alpha : {1.5, 2.0, 3.7, 8.0, 32.0}) {
        auto r = vipsd::privacy::DiscreteGaussianRenyiDivergence(sigma2, sensitivity, alpha);
        if (!r.ok()) {
          std::fprintf(stderr, "%s\n", r.status().ToString().c_str());
          ++failures;
          continue;
        }
        std::printf("renyi %llu %llu %llu %.17g %.21Le %.21Le\n",
                    static_cast<unsigned long long>(sigma2.numerator),
                    static_cast<unsigned long long>(sigma2.denominator),
                    static_cast<unsigned long long>(sensitivity), alpha, *r,
                    vipsd::privacy::DiscreteGaussianRdpBound(sigma2, sensitivity, alpha));
      }
    }
  }
  return failures == 0 ? 0 : 1;
}
