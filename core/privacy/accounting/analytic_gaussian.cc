#include "core/privacy/accounting/analytic_gaussian.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <string>

namespace vipsd::privacy {
namespace {

// Error unit for the pessimistic bounds: 2^-52, twice the unit roundoff.
constexpr double kUnit = DBL_EPSILON;
constexpr double kLogSqrtTwoPi = 0.91893853320467274178;  // ln √(2π)
constexpr double kInvSqrtTwoPi = 0.39894228040143267794;  // 1/√(2π)
constexpr double kSqrtHalfPi = 1.25331413731550025121;    // √(π/2) = M(0)
constexpr double kSqrtHalf = 0.70710678118654752440;      // 1/√2

// Relative error of MillsRatio() itself, exact argument (erfc/exp for t < 2,
// a few ulps; the continued fraction's truncation is below one ulp with the
// term count below, checked against 40-digit arithmetic).
constexpr double kMillsRelError = 16 * kUnit;

// |x1| beyond which φ(x1)·1.26 < 1e-322 < DBL_MIN, i.e. δ underflows, or
// Φ(x2)·e^ε underflows next to Φ(x1) ≈ 1.
constexpr double kNegligibleArgument = 38.5;

// Below this log φ(x1) the subnormal range is close enough that we stop
// trusting products and return a plain upper bound.
const double kLogTiny = std::log(DBL_MIN) + 40.0;

// Mills ratio M(t) = Φ(−t)/φ(t) = √(π/2)·erfcx(t/√2) for t ≥ 0.
double MillsRatio(double t) {
  if (t < 2.0) return kSqrtHalfPi * std::exp(0.5 * t * t) * std::erfc(t * kSqrtHalf);
  // Laplace's continued fraction M(t) = 1/(t + 1/(t + 2/(t + 3/(t + …)))),
  // evaluated backwards. All partial numerators and denominators are
  // positive, so the backward recurrence is stable; the term count keeps the
  // truncation error below one ulp for t ≥ 2 (it needs ~120 terms at t = 2
  // and ~20 at t = 6).
  const double t_squared = t * t;
  const int terms = 16 + static_cast<int>(std::ceil(480.0 / std::min(t_squared, 1e9)));
  double tail = 0.0;
  for (int k = terms; k >= 1; --k) tail = k / (t + tail);
  return 1.0 / (t + tail);
}

// Standard normal CDF.
double NormalCdf(double x) { return 0.5 * std::erfc(-x * kSqrtHalf); }

// Product of a non-negative magnitude and a relative error that may be +∞;
// 0 · ∞ is 0 here (a term that is exactly zero contributes no error).
double Scaled(double magnitude, double relative_error) {
  return magnitude == 0.0 ? 0.0 : magnitude * relative_error;
}

// δ_σ(ε) rounded up; arguments already validated. See the header for the
// derivation and the error model.
double DeltaUpperBound(double sigma, double epsilon) {
  const double half_mu = 0.5 / sigma;     // 1/(2σ); +∞ for subnormal σ
  const double eps_sigma = epsilon * sigma;
  const double x1 = half_mu - eps_sigma;  // argument of the first Φ
  const double t2 = half_mu + eps_sigma;  // minus the argument of the second
  if (!std::isfinite(half_mu)) return 1.0;  // σ → 0: δ → 1 (eps_sigma ≈ 0)
  if (!std::isfinite(eps_sigma)) return DBL_MIN;  // x1 = −∞: δ = 0
  // s bounds |x1| and t2; both carry an absolute rounding error ≤ 2u·s.
  const double s = t2;
  const double arg_error = 2 * kUnit * s;
  // Relative error of M(t) for a rounded t: |d ln M/dt| = 1/M(t) − t ≤ 0.8.
  const double mills_error = kMillsRelError + arg_error;
  // ln φ(x1) and its absolute (= φ's relative) error: argument error times
  // |x1|, the rounding of x1² (relative u, doubled for safety) and of the rest.
  const double log_phi = -0.5 * x1 * x1 - kLogSqrtTwoPi;
  const double phi_error = std::abs(x1) * arg_error + kUnit * (2 * x1 * x1 + 4);

  double value;
  double error;
  if (x1 <= 0.0) {
    if (x1 + arg_error < -kNegligibleArgument) return DBL_MIN;
    const double t1 = -x1;
    const double mills1 = MillsRatio(t1);
    if (log_phi < kLogTiny) {
      // δ ≤ Φ(x1) = φ(x1)·M(t1), pessimistically rounded.
      const double bound =
          std::exp(log_phi + std::log(mills1) + 2 * (phi_error + mills_error));
      return std::clamp(bound, DBL_MIN, 1.0);
    }
    const double phi = std::exp(log_phi);
    const double mills2 = MillsRatio(t2);
    value = phi * (mills1 - mills2);
    // Errors in M(t1), M(t2) are amplified by the cancellation; the error in
    // the common factor φ(x1) is relative to δ itself.
    error = Scaled(phi * (mills1 + mills2), mills_error + 2 * kUnit) +
            Scaled(std::abs(value), phi_error + 4 * kUnit);
  } else {
    if (x1 - arg_error > kNegligibleArgument) return 1.0;
    // δ = [Φ(x1) − Φ(x2)] − (e^ε − 1)Φ(x2). The bracket is a sum of two erfs
    // of positive arguments (x1 > 0 > x2), so there is no cancellation there,
    // and since ε < 1/(2σ²) here the second term is small next to it. This
    // keeps full precision for large σ at ε ≈ 0, where Φ(x1) ≈ Φ(x2) ≈ 1/2.
    const double first = 0.5 * (std::erf(x1 * kSqrtHalf) + std::erf(t2 * kSqrtHalf));
    const double first_error =
        8 * kUnit * first +
        arg_error * kInvSqrtTwoPi * (std::exp(-0.5 * x1 * x1) + std::exp(-0.5 * t2 * t2));
    double second;
    double second_relative_error;
    if (epsilon < 1.0) {
      second = std::expm1(epsilon) * NormalCdf(-t2);
      // φ(t)/Φ(−t) = 1/M(t) ≤ t + 0.8 converts t2's error into Φ's.
      second_relative_error = 16 * kUnit + arg_error * (t2 + 0.8);
    } else {
      // (e^ε − 1)Φ(x2) = (1 − e^−ε)·e^ε·Φ(x2) = (1 − e^−ε)·φ(x1)·M(t2): no
      // e^ε is formed, so large ε (small σ) cannot overflow.
      second = -std::expm1(-epsilon) * std::exp(log_phi) * MillsRatio(t2);
      second_relative_error = 4 * kUnit + phi_error + mills_error;
    }
    value = first - second;
    error = first_error + Scaled(second, second_relative_error) +
            kUnit * (first + second);
  }
  // Twice the first-order bound covers the second-order terms.
  const double bound = std::max(value, 0.0) + 2 * error;
  // NaN (should not occur) and anything above 1 become the trivial bound 1.
  if (!(bound <= 1.0)) return 1.0;
  return bound;
}

Status ValidateNoiseMultiplier(double noise_multiplier) {
  if (!(noise_multiplier > 0.0) || !std::isfinite(noise_multiplier)) {
    return InvalidArgumentError("noise_multiplier must be finite and > 0, got " +
                                std::to_string(noise_multiplier));
  }
  return Status::Ok();
}

Status ValidateEpsilon(double epsilon) {
  if (!(epsilon >= 0.0) || !std::isfinite(epsilon)) {
    return InvalidArgumentError("epsilon must be finite and >= 0, got " +
                                std::to_string(epsilon));
  }
  return Status::Ok();
}

Status ValidateDelta(double delta) {
  if (!(delta > 0.0 && delta < 1.0)) {
    return InvalidArgumentError("delta must be in (0, 1), got " + std::to_string(delta));
  }
  return Status::Ok();
}

// Stop bisecting when the bracket is this narrow relative to its upper end.
constexpr double kRelativeTolerance = 1e-12;
// Bracket expansion stops here: the target is not reachable in doubles.
constexpr double kBracketLimit = 1e300;
constexpr int kMaxBisections = 2200;  // enough to reach DBL_MIN from 1e300

}  // namespace

StatusOr<double> GaussianDelta(double noise_multiplier, double epsilon) {
  VIPSD_RETURN_IF_ERROR(ValidateNoiseMultiplier(noise_multiplier));
  VIPSD_RETURN_IF_ERROR(ValidateEpsilon(epsilon));
  return DeltaUpperBound(noise_multiplier, epsilon);
}

StatusOr<double> GaussianEpsilon(double noise_multiplier, double delta) {
  VIPSD_RETURN_IF_ERROR(ValidateNoiseMultiplier(noise_multiplier));
  VIPSD_RETURN_IF_ERROR(ValidateDelta(delta));
  if (DeltaUpperBound(noise_multiplier, 0.0) <= delta) return 0.0;
  // Invariant: δ(lo) > delta ≥ δ(hi), with δ the pessimistic value, so hi is
  // always a valid ε and the exact smallest ε lies below it.
  double lo = 0.0;
  double hi = 1.0;
  while (DeltaUpperBound(noise_multiplier, hi) > delta) {
    lo = hi;
    hi *= 2.0;
    if (hi > kBracketLimit) {
      return OutOfRangeError("delta is too small to reach with noise_multiplier " +
                             std::to_string(noise_multiplier));
    }
  }
  for (int i = 0; i < kMaxBisections && hi - lo > kRelativeTolerance * hi; ++i) {
    const double mid = lo + 0.5 * (hi - lo);
    if (DeltaUpperBound(noise_multiplier, mid) <= delta) {
      hi = mid;
    } else {
      lo = mid;
    }
  }
  return hi;
}

StatusOr<double> GaussianSigmaForEpsilon(double epsilon, double delta) {
  VIPSD_RETURN_IF_ERROR(ValidateEpsilon(epsilon));
  VIPSD_RETURN_IF_ERROR(ValidateDelta(delta));
  // Invariant: δ_lo(ε) > delta ≥ δ_hi(ε). δ_σ(ε) → 1 as σ → 0 and → 0 as
  // σ → ∞ (for δ above the double-precision floor), so both ends exist.
  double lo = 1.0;
  double hi = 1.0;
  if (DeltaUpperBound(hi, epsilon) > delta) {
    while (DeltaUpperBound(hi, epsilon) > delta) {
      lo = hi;
      hi *= 2.0;
      if (hi > kBracketLimit) {
        return OutOfRangeError("delta is too small to reach at epsilon " +
                               std::to_string(epsilon));
      }
    }
  } else {
    while (DeltaUpperBound(lo, epsilon) <= delta) {
      hi = lo;
      lo *= 0.5;
      if (lo < 1.0 / kBracketLimit) {
        return InternalError("no noise_multiplier violates the target at epsilon " +
                             std::to_string(epsilon));
      }
    }
  }
  for (int i = 0; i < kMaxBisections && hi - lo > kRelativeTolerance * hi; ++i) {
    const double mid = lo + 0.5 * (hi - lo);
    if (DeltaUpperBound(mid, epsilon) <= delta) {
      hi = mid;
    } else {
      lo = mid;
    }
  }
  return hi;
}

}  // namespace vipsd::privacy
