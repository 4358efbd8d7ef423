#include "core/privacy/accounting/planner.h"

#include <cmath>
#include <functional>
#include <vector>

#include "core/privacy/accounting/filter_weights.h"
#include "core/privacy/accounting/fixed_schedule.h"
#include "core/privacy/accounting/pld_accountant.h"
#include "core/privacy/accounting/rdp.h"
#include "core/privacy/accounting/rdp_accountant.h"
#include "core/privacy/accounting/strong_composition.h"

namespace vipsd::privacy {
namespace {

// Largest T ≥ 1 with fits(T) (0 if not even one step fits): doubles, then
// bisects. Relies on fits being monotone (true, then false).
StatusOr<int64_t> LargestFitting(const std::function<StatusOr<bool>(int64_t)>& fits) {
  VIPSD_ASSIGN_OR_RETURN(bool one_fits, fits(1));
  if (!one_fits) return int64_t{0};
  int64_t good = 1, bad = 2;  // invariant: good fits, bad (if checked) does not
  for (;;) {
    VIPSD_ASSIGN_OR_RETURN(bool ok, fits(bad));
    if (!ok) break;
    good = bad;
    if (bad >= kMaxPlannedSteps) {
      return OutOfRangeError("the budget allows more than 2^40 steps");
    }
    bad *= 2;
  }
  while (bad - good > 1) {
    const int64_t mid = good + (bad - good) / 2;
    VIPSD_ASSIGN_OR_RETURN(bool ok, fits(mid));
    (ok ? good : bad) = mid;
  }
  return good;
}

constexpr double kMinSigma = 1e-2;
constexpr double kMaxSigma = 1e4;

Status ValidateCommon(double sampling_rate, double delta) {
  if (!(sampling_rate > 0.0 && sampling_rate <= 1.0)) {
    return InvalidArgumentError("sampling_rate must be in (0, 1]");
  }
  if (!(delta > 0.0 && delta < 1.0)) return InvalidArgumentError("delta must be in (0, 1)");
  return Status::Ok();
}

Status ValidateSigma(double noise_multiplier) {
  if (!(noise_multiplier > 0.0) || !std::isfinite(noise_multiplier)) {
    return InvalidArgumentError("noise_multiplier must be finite and > 0");
  }
  return Status::Ok();
}

Status ValidateTarget(double target_epsilon) {
  if (!(target_epsilon > 0.0) || !std::isfinite(target_epsilon)) {
    return InvalidArgumentError("target_epsilon must be finite and > 0");
  }
  return Status::Ok();
}

// A σ with three significant digits: mantissa ∈ [100, 999] × 10^(exponent − 2).
struct ThreeDigits {
  int mantissa;
  int exponent;

  double value() const {
    // Division by an exact power of ten gives the double nearest to the
    // decimal value (1.24, not 1.2400000000000002).
    return exponent >= 2 ? mantissa * std::pow(10.0, exponent - 2)
                         : mantissa / std::pow(10.0, 2 - exponent);
  }
  ThreeDigits Smaller() const {
    return mantissa > 100 ? ThreeDigits{mantissa - 1, exponent}
                          : ThreeDigits{999, exponent - 1};
  }
  ThreeDigits Larger() const {
    return mantissa < 999 ? ThreeDigits{mantissa + 1, exponent}
                          : ThreeDigits{100, exponent + 1};
  }
  // Smallest three-digit value ≥ x (x > 0, finite).
  static ThreeDigits RoundUp(double x) {
    int exponent = static_cast<int>(std::floor(std::log10(x)));
    double scaled = x / std::pow(10.0, exponent - 2);
    // log10 may be off by one next to exact powers of ten.
    if (scaled >= 1000.0) scaled = x / std::pow(10.0, ++exponent - 2);
    if (scaled < 100.0) scaled = x / std::pow(10.0, --exponent - 2);
    ThreeDigits rounded{static_cast<int>(std::ceil(scaled)), exponent};
    if (rounded.mantissa >= 1000) rounded = {100, exponent + 1};
    if (rounded.mantissa < 100) rounded = {100, exponent};
    // `scaled` carries rounding error: settle on the exact answer.
    while (rounded.value() < x) rounded = rounded.Larger();
    while (rounded.Smaller().value() >= x) rounded = rounded.Smaller();
    return rounded;
  }
};

}  // namespace

const char* AccountantName(AccountantKind kind) {
  switch (kind) {
    case AccountantKind::kFixed: return "fixed";
    case AccountantKind::kFilter: return "filter";
    case AccountantKind::kRdp: return "rdp";
    case AccountantKind::kPld: return "pld";
    case AccountantKind::kStrong: return "strong";
  }
  return "unknown";
}

std::optional<AccountantKind> ParseAccountantName(std::string_view name) {
  if (name == "fixed") return AccountantKind::kFixed;
  if (name == "filter") return AccountantKind::kFilter;
  if (name == "rdp") return AccountantKind::kRdp;
  if (name == "pld") return AccountantKind::kPld;
  if (name == "strong") return AccountantKind::kStrong;
  return std::nullopt;
}

StatusOr<PrivacyEstimate> EstimateEpsilon(AccountantKind kind, const SampledGaussian& step,
                                          int64_t steps, double delta) {
  VIPSD_RETURN_IF_ERROR(ValidateSampledGaussian(step, /*require_noise=*/true));
  VIPSD_RETURN_IF_ERROR(ValidateCommon(step.sampling_rate, delta));
  const double sampling_rate = step.sampling_rate;
  const double noise_multiplier = step.noise_multiplier;
  if (steps < 1) return InvalidArgumentError("steps must be >= 1");
  PrivacyEstimate estimate;
  switch (kind) {
    case AccountantKind::kFixed: {
      VIPSD_ASSIGN_OR_RETURN(auto fixed,
                             FixedScheduleAccountant::Create(step));
      VIPSD_ASSIGN_OR_RETURN(auto at, fixed.Epsilon(steps, delta));
      estimate.epsilon = at.epsilon;
      estimate.fixed_pld = at.pld;
      estimate.fixed_rdp = at.rdp;
      estimate.order = at.rdp_order;
      return estimate;
    }
    case AccountantKind::kFilter: {
      VIPSD_ASSIGN_OR_RETURN(auto weights,
                             ConcentratedFilterWeights(DefaultRdpOrders(), sampling_rate,
                                                       noise_multiplier, delta, steps));
      return FilterEpsilon(sampling_rate, noise_multiplier, steps, delta, weights);
    }
    case AccountantKind::kRdp: {
      const auto& orders = DefaultRdpOrders();
      VIPSD_ASSIGN_OR_RETURN(auto curve,
                             SampledGaussianRdpCurve(sampling_rate, noise_multiplier, orders));
      for (double& value : curve) value *= static_cast<double>(steps);
      VIPSD_ASSIGN_OR_RETURN(auto improved,
                             EpsilonFromRdp(orders, curve, delta, RdpConversion::kImproved));
      VIPSD_ASSIGN_OR_RETURN(auto classic,
                             EpsilonFromRdp(orders, curve, delta, RdpConversion::kClassic));
      estimate.epsilon = improved.epsilon;
      estimate.order = improved.order;
      estimate.epsilon_classic = classic.epsilon;
      return estimate;
    }
    case AccountantKind::kPld: {
      VIPSD_ASSIGN_OR_RETURN(estimate.epsilon,
                             PldEpsilon(sampling_rate, noise_multiplier, steps, delta));
      return estimate;
    }
    case AccountantKind::kStrong: {
      VIPSD_ASSIGN_OR_RETURN(auto result, StrongCompositionEpsilon(
                                              sampling_rate, noise_multiplier, steps, delta));
      estimate.epsilon = result.epsilon;
      return estimate;
    }
  }
  return InvalidArgumentError("unknown accountant");
}

StatusOr<double> NoiseMultiplierForEpsilon(AccountantKind kind, double target_epsilon,
                                           double sampling_rate, int64_t steps,
                                           double delta) {
  VIPSD_RETURN_IF_ERROR(ValidateTarget(target_epsilon));
  VIPSD_RETURN_IF_ERROR(ValidateCommon(sampling_rate, delta));
  if (steps < 1) return InvalidArgumentError("steps must be >= 1");
  auto meets = [&](double sigma) -> StatusOr<bool> {
    VIPSD_ASSIGN_OR_RETURN(auto estimate,
                           EstimateEpsilon(kind, {sampling_rate, sigma}, steps, delta));
    return estimate.epsilon <= target_epsilon;
  };
  // Bracket [low, high] with high meeting the target and low not.
  double low = kMinSigma, high = kMaxSigma;
  bool bracketed = false;
  if (kind != AccountantKind::kRdp) {
    // The RDP answer is a cheap, usually close starting point for the
    // slower accountants; expand from it by factors of two.
    auto hint = NoiseMultiplierForEpsilon(AccountantKind::kRdp, target_epsilon,
                                          sampling_rate, steps, delta);
    if (hint.ok()) {
      high = *hint;
      VIPSD_ASSIGN_OR_RETURN(bool ok, meets(high));
      while (!ok && high < kMaxSigma) {
        high = std::min(kMaxSigma, high * 2);
        VIPSD_ASSIGN_OR_RETURN(ok, meets(high));
      }
      if (ok) {
        low = std::max(kMinSigma, high / 2);
        VIPSD_ASSIGN_OR_RETURN(bool low_ok, meets(low));
        while (low_ok && low > kMinSigma) {
          high = low;
          low = std::max(kMinSigma, low / 2);
          VIPSD_ASSIGN_OR_RETURN(low_ok, meets(low));
        }
        if (low_ok) return low;  // even the smallest σ searched meets it
        bracketed = true;
      }
    }
  }
  if (!bracketed) {
    VIPSD_ASSIGN_OR_RETURN(bool reachable, meets(kMaxSigma));
    if (!reachable) {
      return OutOfRangeError(
          "the target epsilon is not reachable with noise_multiplier <= 1e4");
    }
    VIPSD_ASSIGN_OR_RETURN(bool low_meets, meets(low));
    if (low_meets) return low;
  }
  // Bisect on log σ to 1e-3 relative; rounding to three digits and the
  // walk below settle the last digit exactly.
  while (high / low > 1.0 + 1e-3) {
    const double mid = std::sqrt(low * high);
    VIPSD_ASSIGN_OR_RETURN(bool ok, meets(mid));
    (ok ? high : low) = mid;
  }
  ThreeDigits answer = ThreeDigits::RoundUp(high);
  // `high` met the target and answer ≥ high, so answer meets it (ε is
  // non-increasing in σ); check rather than assume, then make it minimal.
  VIPSD_ASSIGN_OR_RETURN(bool answer_meets, meets(answer.value()));
  while (!answer_meets) {  // only if ε(σ) is not monotone to rounding level
    answer = answer.Larger();
    VIPSD_ASSIGN_OR_RETURN(answer_meets, meets(answer.value()));
  }
  for (;;) {
    const ThreeDigits smaller = answer.Smaller();
    if (smaller.value() < kMinSigma) break;
    VIPSD_ASSIGN_OR_RETURN(bool smaller_meets, meets(smaller.value()));
    if (!smaller_meets) break;
    answer = smaller;
  }
  return answer.value();
}

StatusOr<int64_t> MaxStepsForEpsilon(AccountantKind kind, double target_epsilon,
                                     double sampling_rate, double noise_multiplier,
                                     double delta) {
  VIPSD_RETURN_IF_ERROR(ValidateTarget(target_epsilon));
  VIPSD_RETURN_IF_ERROR(ValidateCommon(sampling_rate, delta));
  VIPSD_RETURN_IF_ERROR(ValidateSigma(noise_multiplier));
  // RDP: the per-step curve does not depend on T; compute it once.
  std::vector<double> step_curve;
  if (kind == AccountantKind::kRdp) {
    VIPSD_ASSIGN_OR_RETURN(step_curve, SampledGaussianRdpCurve(sampling_rate,
                                                               noise_multiplier,
                                                               DefaultRdpOrders()));
  }
  if (kind == AccountantKind::kFilter) {
    // The daemon's split for this ceiling (global mode).
    VIPSD_ASSIGN_OR_RETURN(auto weights, DesignFilterWeights(sampling_rate, noise_multiplier,
                                                             delta, target_epsilon, 0));
    return FilterMaxSteps(target_epsilon, sampling_rate, noise_multiplier, delta, weights);
  }
  auto fits = [&](int64_t steps) -> StatusOr<bool> {
    if (kind == AccountantKind::kRdp) {
      std::vector<double> curve = step_curve;
      for (double& value : curve) value *= static_cast<double>(steps);
      VIPSD_ASSIGN_OR_RETURN(auto epsilon, EpsilonFromRdp(DefaultRdpOrders(), curve, delta,
                                                          RdpConversion::kImproved));
      return epsilon.epsilon <= target_epsilon;
    }
    VIPSD_ASSIGN_OR_RETURN(auto estimate, EstimateEpsilon(kind, {sampling_rate, noise_multiplier},
                                                          steps, delta));
    return estimate.epsilon <= target_epsilon;
  };
  return LargestFitting(fits);
}

StatusOr<PrivacyEstimate> FilterEpsilon(double sampling_rate, double noise_multiplier,
                                        int64_t steps, double delta,
                                        const std::vector<double>& filter_weights) {
  VIPSD_RETURN_IF_ERROR(ValidateCommon(sampling_rate, delta));
  VIPSD_RETURN_IF_ERROR(ValidateSigma(noise_multiplier));
  if (steps < 1) return InvalidArgumentError("steps must be >= 1");
  RdpAccountant filter;
  VIPSD_RETURN_IF_ERROR(filter.SetFilterWeights(filter_weights));
  VIPSD_RETURN_IF_ERROR(filter.Compose({sampling_rate, noise_multiplier}, steps));
  VIPSD_ASSIGN_OR_RETURN(auto at, filter.GetEpsilon(delta, RdpConversion::kImproved,
                                                     Adaptivity::kAdaptiveFilter));
  PrivacyEstimate estimate;
  estimate.epsilon = at.epsilon;
  estimate.order = at.order;
  return estimate;
}

StatusOr<int64_t> FilterMaxSteps(double target_epsilon, double sampling_rate,
                                 double noise_multiplier, double delta,
                                 const std::vector<double>& filter_weights) {
  VIPSD_RETURN_IF_ERROR(ValidateTarget(target_epsilon));
  VIPSD_RETURN_IF_ERROR(ValidateCommon(sampling_rate, delta));
  VIPSD_RETURN_IF_ERROR(ValidateSigma(noise_multiplier));
  RdpAccountant filter;
  VIPSD_RETURN_IF_ERROR(filter.SetFilterWeights(filter_weights));
  return LargestFitting([&](int64_t steps) -> StatusOr<bool> {
    VIPSD_ASSIGN_OR_RETURN(auto check,
                           filter.CheckCeiling({sampling_rate, noise_multiplier}, steps,
                                               {target_epsilon, delta}, RdpConversion::kImproved,
                                               Adaptivity::kAdaptiveFilter));
    return !check.would_exceed;
  });
}

StatusOr<int64_t> MaxResidencyWindow(AccountantKind kind, double target_epsilon,
                                     double sampling_rate, double noise_multiplier,
                                     double delta) {
  if (kind != AccountantKind::kFilter) {
    return MaxStepsForEpsilon(kind, target_epsilon, sampling_rate, noise_multiplier, delta);
  }
  VIPSD_RETURN_IF_ERROR(ValidateTarget(target_epsilon));
  return LargestFitting([&](int64_t window) -> StatusOr<bool> {
    VIPSD_ASSIGN_OR_RETURN(auto at, EstimateEpsilon(kind, {sampling_rate, noise_multiplier},
                                                    window, delta));
    return at.epsilon <= target_epsilon;
  });
}

StatusOr<PlannedRun> PlanRun(bool fixed, bool residency, double ceiling, double sampling_rate,
                             double noise_multiplier, double delta, int64_t window_steps) {
  PlannedRun run;
  const AccountantKind kind = fixed ? AccountantKind::kFixed : AccountantKind::kFilter;
  if (!fixed) {
    VIPSD_ASSIGN_OR_RETURN(run.filter_weights,
                           DesignFilterWeights(sampling_rate, noise_multiplier, delta, ceiling,
                                               residency ? window_steps : 0));
  }
  if (residency) {
    VIPSD_ASSIGN_OR_RETURN(run.steps, MaxResidencyWindow(kind, ceiling, sampling_rate,
                                                         noise_multiplier, delta));
  } else if (fixed) {
    VIPSD_ASSIGN_OR_RETURN(run.steps, MaxStepsForEpsilon(kind, ceiling, sampling_rate,
                                                         noise_multiplier, delta));
  } else {
    VIPSD_ASSIGN_OR_RETURN(run.steps, FilterMaxSteps(ceiling, sampling_rate, noise_multiplier,
                                                     delta, run.filter_weights));
  }
  run.timed_steps = residency ? window_steps : run.steps;
  run.overrun_beta = OverrunBeta(run.timed_steps);
  return run;
}

}  // namespace vipsd::privacy
