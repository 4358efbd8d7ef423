// The independent oracle of the RDP tests: numerical integration (Boost's
// adaptive Gauss–Kronrod) of the Rényi divergence between μ0 = N(0, σ²) and
// μ = (1 − q)N(0, σ²) + qN(1, σ²), in both directions. It shares no code
// with the series in core/privacy/accounting/rdp.cc. Test-only; header-only so that
// rdp_test and rdp_order_grid_test use the same integrator.
#pragma once

#include <boost/math/quadrature/gauss_kronrod.hpp>
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace vipsd::privacy::oracle {

// Result of integrating A_α − 1 = ∫ (integrand) dz, with the integral of the
// absolute integrand for judging conditioning. Both scaled by exp(log_scale).
struct Integral {
  double log_a = 0;      // ln A_α
  double condition = 0;  // ∫|h| / |∫h|
};

// Direction kForward: A = E_{μ0}[(μ/μ0)^α]  (the series' direction).
// Direction kBackward: A = E_{μ}[(μ0/μ)^α].
enum class Direction { kForward, kBackward };

// h(z) such that A − 1 = ∫ h. With x = (2z − 1)/(2σ²) and r = μ/μ0 = 1 + q·expm1(x):
//   forward:  h = μ0(z) · expm1(α ln r)
//   backward: h = μ0(z) · r · expm1(−α ln r)
// Returns ln|h| and the sign.
inline void LogIntegrand(double z, double q, double sigma, double alpha, Direction direction,
                         double* log_abs, int* sign) {
  const double log_mu0 = -z * z / (2 * sigma * sigma) - std::log(sigma * std::sqrt(2 * M_PI));
  const double x = (2 * z - 1) / (2 * sigma * sigma);
  // ln r, stable for large x (r ≈ q e^x).
  const double log_r = x > 30 ? std::log(q) + x + std::log1p((1 - q) * std::exp(-x) / q)
                              : std::log1p(q * std::expm1(x));
  double y = direction == Direction::kForward ? alpha * log_r : -alpha * log_r;
  double log_abs_expm1;
  if (y > 0) {
    log_abs_expm1 = y > 30 ? y + std::log1p(-std::exp(-y)) : std::log(std::expm1(y));
    *sign = 1;
  } else if (y < 0) {
    log_abs_expm1 = std::log(-std::expm1(y));
    *sign = -1;
  } else {
    *log_abs = -std::numeric_limits<double>::infinity();
    *sign = 0;
    return;
  }
  *log_abs = log_mu0 + log_abs_expm1 + (direction == Direction::kBackward ? log_r : 0.0);
}

// How hard the integrator works. The defaults ask for 1e-14 relative, which
// an ill-conditioned integral (A_α − 1 far below ∫|h|) can only miss after
// refining to the maximum depth: seconds per call. A minimisation over
// orders needs far less.
struct OracleEffort {
  int scan_points = 20000;  // the scan for the integrand's scale (overflow guard only)
  double tolerance = 1e-14;
  unsigned max_depth = 20;
};

inline Integral IntegrateRenyi(double q, double sigma, double alpha, Direction direction,
                               const OracleEffort& effort = {}) {
  const int scan_points = effort.scan_points;
  // The mass sits between the two Gaussian centres and, for large α, near
  // z ≈ α (forward) — integrate over a generous window and find the scale.
  const double lo = -40 * sigma - 2;
  const double hi = std::max(alpha, 1.0) + 40 * sigma + 2;
  double log_scale = -std::numeric_limits<double>::infinity();
  for (int i = 0; i <= scan_points; ++i) {
    const double z = lo + (hi - lo) * i / static_cast<double>(scan_points);
    double la;
    int s;
    LogIntegrand(z, q, sigma, alpha, direction, &la, &s);
    log_scale = std::max(log_scale, la);
  }
  auto signed_part = [&](double z) {
    double la;
    int s;
    LogIntegrand(z, q, sigma, alpha, direction, &la, &s);
    return s * std::exp(la - log_scale);
  };
  auto abs_part = [&](double z) { return std::abs(signed_part(z)); };
  using Quad = boost::math::quadrature::gauss_kronrod<double, 61>;
  // Split at 1/2 (sign change of h) and at a few points to help adaptivity.
  std::vector<double> cuts = {lo, 0.5 - 10 * sigma, 0.5, 0.5 + 10 * sigma, hi};
  if (alpha > 1) cuts.insert(cuts.end() - 1, std::min(hi - 1, alpha));
  std::sort(cuts.begin(), cuts.end());
  double total = 0, total_abs = 0;
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    if (cuts[i + 1] <= cuts[i]) continue;
    total += Quad::integrate(signed_part, cuts[i], cuts[i + 1], effort.max_depth,
                             effort.tolerance);
    total_abs += Quad::integrate(abs_part, cuts[i], cuts[i + 1], effort.max_depth,
                                 effort.tolerance);
  }
  Integral result;
  result.condition = total_abs / std::abs(total);
  // ln A = ln(1 + total·e^scale)
  const double log_excess = std::log(std::abs(total)) + log_scale;
  if (total > 0) {
    result.log_a = log_excess > 30 ? log_excess + std::log1p(std::exp(-log_excess))
                                   : std::log1p(std::exp(log_excess));
  } else {
    result.log_a = std::log1p(-std::exp(log_excess));
  }
  return result;
}

// ε(α) = ln A_α/(α − 1) of one step by the oracle, in the series' direction.
inline double OracleRdp(double q, double sigma, double alpha, const OracleEffort& effort = {}) {
  return IntegrateRenyi(q, sigma, alpha, Direction::kForward, effort).log_a / (alpha - 1);
}

}  // namespace vipsd::privacy::oracle
