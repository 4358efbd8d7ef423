// ResidencyAccountant: the per-record budget of the "residency" accounting
// mode (docs/privacy_accounting.md §6b), for a daemon that runs indefinitely.
//
// In residency mode every record is a sampling candidate in at most M steps
// that ran, and those steps are consecutive (core/svi/record_pool.h: a
// record stays pooled from its arrival until M steps have run, or less).
// Steps in which a record is not pooled do not read it; for that record they
// are post-processing of other data. So the record's privacy loss is the
// composition of at most M consecutive subsampled-Gaussian steps, and at
// every order α its RDP is at most the sum over some window of M consecutive
// steps. This class keeps the (q, σ) of the last M − 1 steps that ran and,
// before a step, computes ε of the window that step would close (those
// M − 1 steps plus the new one). The daemon runs the step only if that ε is
// within the ceiling. Every window is checked when its last step is about to
// run, so every record's ε stays within the ceiling forever, whatever the
// total number of steps.
//
// Adaptive (q, σ): reloads may change them after earlier releases were
// seen. With Adaptivity::kAdaptiveFilter the window is converted at
// δ·w_α (rdp_accountant.h, filter_weights.h; docs/privacy_accounting.md
// §5 and §7): each
// record's prefix RDP is dominated, order by order, by the window that the
// admitting check evaluated, so the union-over-orders filter argument
// applies record by record.
//
// What is private: nothing; only public (q, σ, M, step counts).
// Rounding: per-step curves are upper bounds (rdp.h); a window is the sum of
// per-segment count × curve, recomputed from scratch (never by subtracting),
// so rounding cannot drift downwards over millions of steps.
//
// Thread-safety: not thread-safe; owned by the step thread. Copies are
// independent.
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/base/status.h"
#include "core/privacy/accounting/rdp.h"
#include "core/privacy/accounting/rdp_accountant.h"

namespace vipsd::privacy {

class ResidencyAccountant {
 public:
  // M = max_residency_steps ≥ 1; orders as for RdpAccountant (default grid).
  static StatusOr<ResidencyAccountant> Create(int64_t max_residency_steps);
  static StatusOr<ResidencyAccountant> Create(int64_t max_residency_steps,
                                              std::vector<double> orders);

  // ε of one record present for M steps of (q, σ): the start-up and reload
  // check ("is this M affordable at all?"), over the state directory's
  // `orders` with its filter weights (empty = uniform).
  static StatusOr<CeilingCheck> CheckConfiguration(int64_t max_residency_steps,
                                                   const SampledGaussian& step,
                                                   const EpsilonDelta& ceiling,
                                                   Adaptivity adaptivity,
                                                   std::span<const double> orders,
                                                   std::span<const double> filter_weights);
  // The same without the orders: empty weights use DefaultRdpOrders(), and
  // non-empty ones the grid with as many orders (RdpOrderGridWithCount: a
  // ledger written before the current grid keeps its own, rdp.h).
  static StatusOr<CeilingCheck> CheckConfiguration(int64_t max_residency_steps,
                                                   const SampledGaussian& step,
                                                   const EpsilonDelta& ceiling,
                                                   Adaptivity adaptivity,
                                                   std::span<const double> filter_weights = {});

  // ε of the window the next step (q, σ) would close, against the ceiling.
  StatusOr<CeilingCheck> CheckCeiling(const SampledGaussian& step, const EpsilonDelta& ceiling,
                                      Adaptivity adaptivity);

  // Records a step that ran with (q, σ); `window_epsilon` is the ε its check
  // reported (kept as the worst per-record ε so far).
  Status RecordStep(const SampledGaussian& step, double window_epsilon);

  // Lowers M (reload). Raising it is refused: the steps before the current
  // window are no longer known, so a longer window cannot be checked.
  Status SetMaxResidencySteps(int64_t max_residency_steps);

  // The adaptive filter's split of δ (filter_weights.h); empty = uniform.
  // Kept by the ledger, not by Serialize().
  Status SetFilterWeights(std::vector<double> weights);
  const std::vector<double>& filter_weights() const { return filter_weights_; }
  const std::vector<double>& orders() const { return orders_; }

  int64_t max_residency_steps() const { return max_residency_steps_; }
  // Steps recorded since the mode started.
  int64_t steps() const { return steps_; }
  // Largest window ε of any step that ran: the per-record ε spent so far.
  double worst_epsilon() const { return worst_epsilon_; }

  // Exact versioned text form (hex floats), for the ledger.
  std::string Serialize() const;
  static StatusOr<ResidencyAccountant> Deserialize(std::string_view text);

  bool operator==(const ResidencyAccountant& other) const {
    return max_residency_steps_ == other.max_residency_steps_ && orders_ == other.orders_ &&
           window_ == other.window_ && steps_ == other.steps_ &&
           worst_epsilon_ == other.worst_epsilon_ && filter_weights_ == other.filter_weights_;
  }

 private:
  struct Segment {
    SampledGaussian step;
    int64_t count;
    bool operator==(const Segment&) const = default;
  };

  ResidencyAccountant(int64_t max_residency_steps, std::vector<double> orders)
      : max_residency_steps_(max_residency_steps), orders_(std::move(orders)) {}
  StatusOr<const std::vector<double>*> Curve(const SampledGaussian& step);
  void TrimWindow();

  int64_t max_residency_steps_;
  std::vector<double> orders_;
  std::deque<Segment> window_;  // the last ≤ M − 1 steps, oldest first
  int64_t steps_ = 0;
  double worst_epsilon_ = 0;
  std::vector<double> filter_weights_;  // empty: uniform

  struct CachedCurve {
    SampledGaussian step;
    std::vector<double> curve;
  };
  std::vector<CachedCurve> curve_cache_;  // small; most recent last
};

}  // namespace vipsd::privacy
