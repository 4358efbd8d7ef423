// FilterWeights: how the adaptive RDP filter (privacy.schedule: adaptive)
// spends δ across its Rényi orders.
//
// The filter (rdp_accountant.h, docs/privacy_accounting.md §5) lets a step
// run only if some order α stays within the ceiling when its curve is
// converted at δ_α, and the run is (ceiling, Σ_α δ_α)-DP. Any split with
// Σ_α δ_α ≤ δ is valid provided it is fixed before the first release: it
// must not depend on data or on anything an operator saw. Splitting δ
// uniformly (δ/|orders|) costs ln|orders|/(α−1) at every order; a split that
// puts most of δ on the order where the run will end costs far less there.
//
// Concentrated() chooses the split from public settings only — the
// configured (q, σ, δ) and a design horizon of H steps (global mode: the
// steps the ceiling allows a fixed schedule, found with every order at δ/2;
// residency mode: the window M) — before any data is read, and the ledger
// stores it (docs/ledger_format.md), so a restart or reload never changes
// it. The split:
//   * 1/2 on α*, the order at which H steps of (q, σ) reach their smallest
//     ε with δ/2 (so the run pays ln 2/(α*−1) instead of ln|orders|/(α*−1));
//   * 1/4 spread evenly over the other orders in [α*/2, 2α*] (a reload that
//     moves q or σ moderately still finds a cheap order nearby);
//   * 1/4 spread evenly over all orders (any order stays usable).
// The weights are scaled by (1 − 2^-40) so that their floating-point sum
// is ≤ 1; Validate() refuses any vector whose sum exceeds 1.
//
// An empty weight vector means the uniform split δ/|orders| (ledgers
// written before weights existed keep it).
//
// What is private: nothing; only public settings.
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/status.h"

namespace vipsd::privacy {

// Weight (fraction of δ) per order, aligned with an accountant's orders.
using FilterWeights = std::vector<double>;

// The design horizon of global mode: the largest H ≤ 2^40 whose fixed
// schedule of (q, σ), every order converted at δ/2, stays within the
// ceiling; at least 1.
StatusOr<int64_t> FilterHorizonForCeiling(double sampling_rate, double noise_multiplier,
                                          double delta, double epsilon_ceiling);

// The concentrated split for `orders` (sorted, as an accountant holds
// them) at the design horizon `horizon_steps` ≥ 1.
StatusOr<FilterWeights> ConcentratedFilterWeights(std::span<const double> orders,
                                                  double sampling_rate, double noise_multiplier,
                                                  double delta, int64_t horizon_steps);

// The split a new state directory gets (the daemon and `vipsd-privacy plan`
// both call this): over DefaultRdpOrders(), at the horizon
// FilterHorizonForCeiling(...) in global mode (window_steps = 0), or at the
// window M = window_steps in residency mode.
StatusOr<FilterWeights> DesignFilterWeights(double sampling_rate, double noise_multiplier,
                                            double delta, double epsilon_ceiling,
                                            int64_t window_steps);

// Size matches `num_orders`, every weight finite and > 0, sum ≤ 1. An empty
// vector (uniform) is valid.
Status ValidateFilterWeights(std::span<const double> weights, size_t num_orders);

// The order with the largest weight (for logs and docs); 0 if uniform.
double PeakFilterOrder(std::span<const double> orders, std::span<const double> weights);

// Exact text form (hex floats) with the orders beside the weights, so that
// a ledger whose weights do not belong to its accountant is refused.
std::string SerializeFilterWeights(std::span<const double> orders,
                                   std::span<const double> weights);
StatusOr<FilterWeights> DeserializeFilterWeights(std::string_view text,
                                                 std::span<const double> orders);

}  // namespace vipsd::privacy
