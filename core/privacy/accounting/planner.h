// Privacy planning: ε for a schedule, the noise multiplier σ a target ε
// needs, and the number of steps a budget allows.
//
// Five accountants answer the same question with different bounds for the
// same mechanism (T Poisson-subsampled Gaussian steps, rate q, noise σ,
// add/remove adjacency):
//   kFixed  – what the daemon charges with privacy.schedule: fixed (the
//             default): the smaller of PLD (Δ = 2^-10) and RDP
//             (fixed_schedule.h). Exactly the daemon's number.
//   kFilter – what the daemon charges with privacy.schedule: adaptive: the
//             RDP privacy filter, order α converted at δ·w_α with the split
//             of filter_weights.h. MaxStepsForEpsilon uses the daemon's
//             split for that ceiling (global mode) and gives exactly the
//             daemon's step count; EstimateEpsilon uses the split designed
//             for `steps` (what a residency window of that length gets).
//             FilterEpsilon/FilterMaxSteps take an explicit split.
//   kRdp    – Rényi DP with the improved conversion at δ (rdp.h), for a
//             fixed schedule. Reports the optimal order.
//   kPld    – privacy-loss distribution with pessimistic discretisation
//             (pld_accountant.h); tighter, still a valid upper bound.
//   kStrong – per-step analytic Gaussian, amplification by sampling and
//             Dwork–Rothblum–Vadhan composition (strong_composition.h); the
//             VIPS paper's baseline, for comparison experiments only.
//
// Searches rely on ε being non-increasing in σ and non-decreasing in T for
// every accountant (tests check this).
//   * NoiseMultiplierForEpsilon bisects on log σ, then rounds UP to three
//     significant digits and walks down while the next-smaller 3-digit value
//     still meets the target, so the answer is the smallest 3-digit σ that
//     meets it (ε(σ) ≤ target is re-checked on the returned value).
//   * MaxStepsForEpsilon doubles T, then bisects; returns 0 if even one step
//     exceeds the target. Gives up above kMaxPlannedSteps.
//
// Thread-safety: pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "core/base/status.h"
#include "core/privacy/accounting/sampled_gaussian.h"

namespace vipsd::privacy {

enum class AccountantKind { kFixed, kFilter, kRdp, kPld, kStrong };

const char* AccountantName(AccountantKind kind);
// "fixed", "filter", "rdp", "pld" or "strong".
std::optional<AccountantKind> ParseAccountantName(std::string_view name);

struct PrivacyEstimate {
  double epsilon = 0;
  // RDP, filter and fixed: the optimal order; RDP only: ε by the classic
  // conversion.
  std::optional<double> order;
  std::optional<double> epsilon_classic;
  // Fixed only: the two bounds whose minimum is `epsilon`.
  std::optional<double> fixed_pld;
  std::optional<double> fixed_rdp;
};

// Largest step count the planner will search up to.
inline constexpr int64_t kMaxPlannedSteps = int64_t{1} << 40;

// ε after `steps` steps. Validates q ∈ (0, 1], σ > 0, steps ≥ 1, δ ∈ (0, 1).
StatusOr<PrivacyEstimate> EstimateEpsilon(AccountantKind kind, const SampledGaussian& step,
                                          int64_t steps, double delta);

// Smallest σ, to three significant digits, with ε(σ) ≤ target_epsilon.
// Searches σ ∈ [1e-2, 1e4]; OutOfRange if the target is not reachable there.
StatusOr<double> NoiseMultiplierForEpsilon(AccountantKind kind, double target_epsilon,
                                           double sampling_rate, int64_t steps,
                                           double delta);

// What a step's timing adds to δ (SECURITY.md "Overruns"). The worst-case
// step is timed at the batch B that Poisson sampling exceeds with
// probability below kBatchTailProbability per step, whatever the data
// (daemon/setup/step_calibration.h). When that step fits its slot with margin on
// the calibrated machine, an overrun needs a batch above B: over T steps
// with probability at most β = T · kBatchTailProbability (a union bound), and
// the run is (ε, δ + β)-DP with the overrun's event counted as a failure.
inline constexpr double kBatchTailProbability = 1e-9;
inline double OverrunBeta(int64_t steps) {
  const double beta = static_cast<double>(steps) * kBatchTailProbability;
  return beta < 1 ? beta : 1;
}

// Largest T with ε(T) ≤ target_epsilon (0 if not even one step fits).
// OutOfRange if more than kMaxPlannedSteps would fit.
StatusOr<int64_t> MaxStepsForEpsilon(AccountantKind kind, double target_epsilon,
                                     double sampling_rate, double noise_multiplier,
                                     double delta);

// The adaptive filter with an explicit δ split (the daemon's; see
// filter_weights.h): ε after `steps`, and the largest T within the target.
StatusOr<PrivacyEstimate> FilterEpsilon(double sampling_rate, double noise_multiplier,
                                        int64_t steps, double delta,
                                        const std::vector<double>& filter_weights);
StatusOr<int64_t> FilterMaxSteps(double target_epsilon, double sampling_rate,
                                 double noise_multiplier, double delta,
                                 const std::vector<double>& filter_weights);

// Residency mode: the longest window M a new state directory could be
// configured with and still start — ε of M steps within the target, where
// for kFilter each candidate M is charged with the split designed for it.
StatusOr<int64_t> MaxResidencyWindow(AccountantKind kind, double target_epsilon,
                                     double sampling_rate, double noise_multiplier,
                                     double delta);

// What one configuration plans: `vipsd-privacy plan` and `vipsd
// --check-config` both answer with it (one number everywhere).
//   fixed: privacy.schedule fixed (else adaptive: the filter's split that a
//          new state directory gets, filter_weights.h);
//   residency: privacy.accounting residency, with window_steps M.
struct PlannedRun {
  std::vector<double> filter_weights;  // adaptive only
  // Global: the steps to the ceiling. Residency: the longest window M a new
  // directory could be configured with (the daemon runs for ever).
  int64_t steps = 0;
  // The steps a record's claim covers, whose timing β counts: M in
  // residency mode, `steps` in global mode.
  int64_t timed_steps = 0;
  double overrun_beta = 0;  // OverrunBeta(timed_steps)
};
StatusOr<PlannedRun> PlanRun(bool fixed, bool residency, double ceiling, double sampling_rate,
                             double noise_multiplier, double delta, int64_t window_steps);

}  // namespace vipsd::privacy
