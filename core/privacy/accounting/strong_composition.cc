#include "core/privacy/accounting/strong_composition.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>
#include <string>

#include "core/privacy/accounting/analytic_gaussian.h"

namespace vipsd::privacy {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// δ'' and T·q·δ0 are both scaled by this, so that their floating-point sum
// stays ≤ the target δ despite the rounding of f, 1 − f and the products.
constexpr double kSplitShrink = 1.0 - 16 * DBL_EPSILON;
// Covers the rounding of the amplification and composition formulas.
constexpr double kEpsilonRoundUp = 1.0 + 64 * DBL_EPSILON;
// Largest per-step δ0 handed to GaussianEpsilon (which needs δ0 < 1).
constexpr double kMaxStepDelta = 1.0 - DBL_EPSILON;
// Steps above 2^53 are not exact as doubles.
constexpr int64_t kMaxSteps = int64_t{1} << 53;

// Search over the slack fraction f, in u = logit(f).
constexpr int kGridPoints = 201;
constexpr int kGoldenIterations = 60;  // bracket shrinks by 0.618^60 ≈ 3e-13
const double kLogitLimit = std::log(1e8);  // f ∈ [≈1e-8, ≈1 − 1e-8]

struct Problem {
  double sampling_rate;
  double noise_multiplier;
  double steps;
  double delta;
};

// ln(1 + q(e^{ε0} − 1)) without overflow for large ε0.
double AmplifiedEpsilon(double sampling_rate, double step_epsilon0) {
  if (sampling_rate == 1.0) return step_epsilon0;
  if (step_epsilon0 < 700.0) return std::log1p(sampling_rate * std::expm1(step_epsilon0));
  // = ε0 + ln q + ln(1 + (1 − q)e^{−ε0}/q)
  return step_epsilon0 + std::log(sampling_rate) +
         std::log1p((1.0 - sampling_rate) * std::exp(-step_epsilon0) / sampling_rate);
}

// Fills the per-step fields of `out` when the T steps together get
// `steps_delta` (= T·q·δ0 before clamping). False if ε0 cannot be computed.
bool FillStep(const Problem& problem, double steps_delta, StrongCompositionResult* out) {
  double step_delta0 = steps_delta / (problem.steps * problem.sampling_rate);
  if (step_delta0 > kMaxStepDelta) step_delta0 = kMaxStepDelta;
  if (!(step_delta0 > 0.0)) return false;
  StatusOr<double> step_epsilon0 = GaussianEpsilon(problem.noise_multiplier, step_delta0);
  if (!step_epsilon0.ok()) return false;
  out->step_delta0 = step_delta0;
  out->step_epsilon0 = *step_epsilon0;
  out->amplified_epsilon = AmplifiedEpsilon(problem.sampling_rate, *step_epsilon0);
  out->amplified_delta = problem.sampling_rate * step_delta0;
  return true;
}

// DRV advanced composition of T (ε', δ') steps with slack δ''.
double AdvancedCompositionEpsilon(double steps, double amplified_epsilon,
                                  double slack_delta) {
  return std::sqrt(2.0 * steps * -std::log(slack_delta)) * amplified_epsilon +
         steps * amplified_epsilon * std::expm1(amplified_epsilon);
}

// Evaluates advanced composition at slack fraction f = 1/(1 + e^{−u}) and
// keeps the best candidate seen (unrounded epsilon; +∞ is kept as a
// candidate too, so its components are always consistent).
class SplitSearch {
 public:
  explicit SplitSearch(const Problem& problem) : problem_(problem) {}

  double Evaluate(double logit_fraction) {
    // f and 1 − f computed separately so neither loses precision near 0.
    const double slack_fraction = 1.0 / (1.0 + std::exp(-logit_fraction));
    const double steps_fraction = 1.0 / (1.0 + std::exp(logit_fraction));
    StrongCompositionResult candidate;
    if (!FillStep(problem_, steps_fraction * problem_.delta * kSplitShrink, &candidate)) {
      return kInf;
    }
    candidate.slack_delta = slack_fraction * problem_.delta * kSplitShrink;
    candidate.used_basic_composition = false;
    candidate.epsilon = AdvancedCompositionEpsilon(
        problem_.steps, candidate.amplified_epsilon, candidate.slack_delta);
    if (!any_finite_step_ || candidate.epsilon < best_.epsilon) best_ = candidate;
    any_finite_step_ = true;
    return candidate.epsilon;
  }

  const StrongCompositionResult& best() const { return best_; }
  bool any_finite_step() const { return any_finite_step_; }

 private:
  Problem problem_;
  StrongCompositionResult best_{.epsilon = kInf};
  bool any_finite_step_ = false;
};

}  // namespace

StatusOr<StrongCompositionResult> StrongCompositionEpsilon(double sampling_rate,
                                                           double noise_multiplier,
                                                           int64_t steps, double delta) {
  if (!(sampling_rate > 0.0 && sampling_rate <= 1.0)) {
    return InvalidArgumentError("sampling_rate must be in (0, 1], got " +
                                std::to_string(sampling_rate));
  }
  if (!(noise_multiplier > 0.0) || !std::isfinite(noise_multiplier)) {
    return InvalidArgumentError("noise_multiplier must be finite and > 0, got " +
                                std::to_string(noise_multiplier));
  }
  if (steps < 1 || steps > kMaxSteps) {
    return InvalidArgumentError("steps must be in [1, 2^53], got " + std::to_string(steps));
  }
  if (!(delta > 0.0 && delta < 1.0)) {
    return InvalidArgumentError("delta must be in (0, 1), got " + std::to_string(delta));
  }
  const Problem problem{sampling_rate, noise_multiplier, static_cast<double>(steps), delta};

  // Advanced composition: grid over logit(f), then golden section between
  // the neighbours of the best grid point.
  SplitSearch search(problem);
  double best_logit = 0.0;
  double best_value = kInf;
  const double grid_step = 2.0 * kLogitLimit / (kGridPoints - 1);
  for (int i = 0; i < kGridPoints; ++i) {
    const double logit = -kLogitLimit + grid_step * i;
    const double value = search.Evaluate(logit);
    if (value < best_value) {
      best_value = value;
      best_logit = logit;
    }
  }
  if (best_value < kInf) {
    constexpr double kInvGolden = 0.61803398874989484820;  // (√5 − 1)/2
    double lo = std::max(best_logit - grid_step, -kLogitLimit);
    double hi = std::min(best_logit + grid_step, kLogitLimit);
    double left = hi - kInvGolden * (hi - lo);
    double right = lo + kInvGolden * (hi - lo);
    double left_value = search.Evaluate(left);
    double right_value = search.Evaluate(right);
    for (int i = 0; i < kGoldenIterations; ++i) {
      if (left_value <= right_value) {
        hi = right;
        right = left;
        right_value = left_value;
        left = hi - kInvGolden * (hi - lo);
        left_value = search.Evaluate(left);
      } else {
        lo = left;
        left = right;
        left_value = right_value;
        right = lo + kInvGolden * (hi - lo);
        right_value = search.Evaluate(right);
      }
    }
  }

  // Basic composition with no slack: all of δ goes to the steps (f = 0).
  StrongCompositionResult basic{.epsilon = kInf};
  const bool basic_ok = FillStep(problem, delta * kSplitShrink, &basic);
  if (basic_ok) {
    basic.slack_delta = 0.0;
    basic.used_basic_composition = true;
    basic.epsilon = problem.steps * basic.amplified_epsilon;
  }

  if (!basic_ok && !search.any_finite_step()) {
    return OutOfRangeError(
        "delta / steps is too small for a per-step epsilon in double precision (delta " +
        std::to_string(delta) + ", steps " + std::to_string(steps) + ")");
  }
  StrongCompositionResult result =
      basic_ok && basic.epsilon <= search.best().epsilon ? basic : search.best();
  result.epsilon *= kEpsilonRoundUp;
  result.delta = problem.steps * result.amplified_delta + result.slack_delta;
  return result;
}

}  // namespace vipsd::privacy
