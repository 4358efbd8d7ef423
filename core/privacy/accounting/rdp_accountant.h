// RdpAccountant: the budget of record for vipsd.
//
// Tracks the cumulative Rényi DP curve of every private step the daemon has
// run. Each step is one Poisson-subsampled Gaussian mechanism (rdp.h); steps
// with different (q, σ) compose by adding their RDP per order (Mironov 2017,
// Proposition 1). ε is reported through the improved conversion of Balle et
// al. (2020) by default, and through the classic one on request.
//
// Adaptivity. (q, σ) may be changed between steps by a reload, possibly
// after an operator has seen earlier releases, and the daemon stops at a
// fixed ε ceiling. Two regimes:
//  * kFixedSchedule: the (q, σ) sequence is fixed in advance (no reload has
//    changed it). Stopping at the ceiling is then stopping at a step count
//    that is a deterministic function of public parameters, and the usual
//    "minimum over orders" conversion is valid.
//  * kAdaptiveFilter: (q, σ) were chosen adaptively. For each order α the
//    process exp((α−1)(L_t − S_t(α))), L_t the privacy loss of the first t
//    releases and S_t(α) the RDP composed so far, is a non-negative
//    supermartingale even when ε_t(α) is chosen adaptively (Feldman & Zrnic
//    2021; Lécuyer 2021). The daemon runs a step only if some order stays
//    within its budget B_α, so the outcome space splits into parts on which
//    one order α is within budget; bounding the hockey-stick divergence on
//    each part with that order's supermartingale and summing gives δ =
//    Σ_α δ_α. Converting every order with δ/|Λ| (|Λ| = grid size) therefore
//    makes the whole adaptive run (ε_ceiling, δ)-DP, at a cost of
//    ln|Λ|/(α−1) in ε. Any split δ_α = w_α·δ with Σ w_α ≤ 1 fixed before
//    the first release is equally valid; SetFilterWeights installs one
//    (filter_weights.h: concentrated where the configured (q, σ) end, so
//    the cost there is ln 2/(α−1)). CheckCeiling/GetEpsilon do this in
//    this mode; the weights do not enter kFixedSchedule conversions.
//  docs/privacy_accounting.md gives the argument in full.
//
// What is private: nothing here. The accountant sees only public parameters
// (q, σ, step counts); it never sees records or statistics.
//
// Rounding: per-step RDP values are upper bounds (rdp.h); sums are exact up
// to double rounding, which is negligible next to the series' error margins.
//
// Thread-safety: not thread-safe; the daemon owns one accountant and touches
// it from the step thread only. Copies are independent.
//
// Failure: methods return a Status for invalid parameters; the accountant's
// state is unchanged by a failed call.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/status.h"
#include "core/privacy/accounting/rdp.h"
#include "core/privacy/accounting/sampled_gaussian.h"

namespace vipsd::privacy {

// Answer of "would this step cross the ceiling?".
enum class Adaptivity { kFixedSchedule, kAdaptiveFilter };

// ε of a cumulative curve under `adaptivity`: δ for a fixed schedule, the
// filter split (`filter_weights`, empty = uniform) for the adaptive filter.
StatusOr<EpsilonAtOrder> ConvertForAdaptivity(std::span<const double> orders,
                                              std::span<const double> rdp, double delta,
                                              RdpConversion conversion, Adaptivity adaptivity,
                                              std::span<const double> filter_weights);

struct CeilingCheck {
  bool would_exceed = false;
  double epsilon_after = 0;  // ε if the step(s) had run
  double order = 0;          // order achieving epsilon_after
};

class RdpAccountant {
 public:
  // Uses DefaultRdpOrders().
  RdpAccountant();

  // Custom grid: sorted or not, every order finite and > 1, no duplicates.
  static StatusOr<RdpAccountant> Create(std::vector<double> orders);

  // Adds `steps` Poisson-subsampled Gaussian steps of `step` (q, σ > 0).
  // steps ≥ 1.
  Status Compose(const SampledGaussian& step, int64_t steps = 1);

  // ε for δ from the cumulative curve. With no steps composed ε = 0.
  StatusOr<EpsilonAtOrder> GetEpsilon(
      double delta, RdpConversion conversion = RdpConversion::kImproved,
      Adaptivity adaptivity = Adaptivity::kFixedSchedule) const;
  StatusOr<DeltaAtOrder> GetDelta(
      double epsilon, RdpConversion conversion = RdpConversion::kImproved) const;

  // ε as if `steps` more steps of `step` had been composed; no state change.
  StatusOr<EpsilonAtOrder> EpsilonIfComposed(
      const SampledGaussian& step, int64_t steps, double delta,
      RdpConversion conversion = RdpConversion::kImproved,
      Adaptivity adaptivity = Adaptivity::kFixedSchedule) const;

  // Would composing `steps` more steps of `step` make ε at the ceiling's δ
  // exceed its ε? Only public parameters enter this decision.
  StatusOr<CeilingCheck> CheckCeiling(
      const SampledGaussian& step, int64_t steps, const EpsilonDelta& ceiling,
      RdpConversion conversion = RdpConversion::kImproved,
      Adaptivity adaptivity = Adaptivity::kFixedSchedule) const;

  // The adaptive filter's split of δ over the orders (filter_weights.h);
  // empty = uniform. Validated against the order count.
  Status SetFilterWeights(std::vector<double> weights);
  const std::vector<double>& filter_weights() const { return filter_weights_; }

  const std::vector<double>& orders() const { return orders_; }
  const std::vector<double>& rdp() const { return rdp_; }
  // Total number of steps composed.
  int64_t steps() const { return steps_; }

  // Exact, versioned text form (hexadecimal floating point, so restore gives
  // bit-identical values). Format in docs/privacy_accounting.md.
  std::string Serialize() const;
  static StatusOr<RdpAccountant> Deserialize(std::string_view text);

  bool operator==(const RdpAccountant& other) const {
    return orders_ == other.orders_ && rdp_ == other.rdp_ && steps_ == other.steps_ &&
           filter_weights_ == other.filter_weights_;
  }

 private:
  RdpAccountant(std::vector<double> orders, std::vector<double> rdp, int64_t steps);

  // Per-step curve for (q, σ). The last few are cached: the daemon composes
  // the same (q, σ) step after step, and a what-if query usually precedes
  // the matching Compose.
  StatusOr<std::vector<double>> StepCurve(const SampledGaussian& step) const;

  std::vector<double> orders_;
  std::vector<double> rdp_;
  int64_t steps_ = 0;
  std::vector<double> filter_weights_;  // empty: uniform

  struct CachedCurve {
    SampledGaussian step;
    std::vector<double> curve;
  };
  static constexpr size_t kCurveCacheSize = 4;
  mutable std::vector<CachedCurve> curve_cache_;  // most recent last
};

}  // namespace vipsd::privacy
