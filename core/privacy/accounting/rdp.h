// Rényi differential privacy of one step of the Poisson-subsampled Gaussian
// mechanism, and conversion of an RDP curve to (ε, δ).
//
// Mechanism: every record of the pool is included independently with
// probability q (the sampling rate); the clipped per-record statistics of the
// included records are summed (L2 sensitivity 1 after scaling, docs/privacy_accounting.md §1)
// and N(0, σ²) noise is added to each coordinate (σ = noise multiplier).
// Adjacency: add/remove one record.
//
// Per order α > 1 the step is (α, ε(α))-RDP with
//   ε(α) = ln(A_α) / (α − 1),
//   A_α  = E_{z~μ0}[(μ(z)/μ0(z))^α],  μ0 = N(0, σ²), μ = (1−q)N(0, σ²) + qN(1, σ²),
// Mironov, Talwar, Zhang, "Rényi Differential Privacy of the Sampled Gaussian
// Mechanism" (2019), Section 3. Their Theorem 5 shows this direction
// dominates the other (D_α(μ0‖μ) ≤ D_α(μ‖μ0)), so ε(α) covers both add and
// remove neighbours; tests check this against numerical integration.
//
// Integer α (Section 3.2): A_α = Σ_k C(α,k)(1−q)^(α−k) q^k exp((k²−k)/(2σ²)).
//   We evaluate A_α − 1 = Σ_{k≥2} C(α,k)(1−q)^(α−k) q^k expm1((k²−k)/(2σ²)),
//   a sum of positive terms (the k = 0, 1 terms vanish), in log space. This
//   keeps full relative precision when A_α is within 1e-15 of 1 (small q,
//   large σ), where summing the plain series would round ε(α) to zero.
// Fractional α (Section 3.3): the two-series form split at
//   z0 = σ² ln(1/q − 1) + 1/2, each term weighted by a Gaussian tail (erfc).
//   Terms alternate in sign past k = α and, because the exponents collapse
//   to C(α,k)·K·(M(w0) + M(w1)) with M(w) = e^{w²/2}Φ(w) increasing,
//   decrease in magnitude there: the series stops once a term is below
//   e^-25 of A_α − 1 and adds that term as the bound on the rest
//   (docs/privacy_accounting.md §2). Positive and negative parts are summed
//   separately in log space. The form cancels to 1 (terms near 1 − αq
//   and αq), so for tiny A_α − 1 we also take the integer value at ⌈α⌉
//   (valid because Rényi divergence grows with the order) and keep the
//   smaller bound.
// q = 1 uses the closed form ε(α) = α / (2σ²).
//
// Rounding: every series is summed in log space, with compensated
// (Neumaier) running sums, and a bound on its floating-point, summation and
// truncation error is ADDED before the logarithm, so the returned ε(α) is
// an upper bound on the exact value (pessimistic).
//
// Thread-safety: all functions are pure and thread-safe.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <vector>

#include "core/base/status.h"

namespace vipsd::privacy {

// Grids of Rényi orders (docs/privacy_accounting.md §3). A ledger stores
// the orders its accountant was created with and keeps them for good, so
// every grid a release has used is kept here, oldest first; their sizes
// differ, which lets a caller that holds only a ledger's filter weights name
// their grid (RdpOrderGridWithCount).
enum class RdpOrderGrid {
  // 162 orders (vipsd before ef9222a): 1.05 … 1.95 step 0.05; 2 … 10
  // step 0.25; integers 11 … 64; 72 … 256 step 8; ×1.25 (integers) from
  // 320 to 2^18.
  kV1,
  // 324 orders (ef9222a up to the grid change of issue 29): quarter steps
  // from 2 to 64 instead; otherwise as kV1. Up to 1.6 % above the optimum
  // over real orders at σ = 0.6 (its quarter steps are too coarse below 6)
  // and up to 7 % for optima below 1.05 (ε in the thousands).
  kV2,
  // 323 orders (the default since issue 29), spaced by how wide the set of
  // orders within 0.1 % of the optimum is:
  //   1 + (k/46)², k = 3 … 46           (1.0043 … 2: 44 orders)
  //   2.05 … 4.5 step 0.05              (50)
  //   1 + (k/70)², k = 131 … 210        (4.502 … 10: 80)
  //   10·(56/55)^k, k = 1 … 102, and 64 (×1.018 per order: 103)
  //   64·1.1^k, k = 1 … 14, and 256     (15)
  //   320, 400, 500, … ×1.25 (integers) up to 206758, and 2^18 (31).
  // Within 0.1 % of the optimum over all real orders for σ ∈ [0.5, 0.8],
  // q ∈ [0.001, 1], 1 … 1e5 steps, δ ∈ [1e-6, 1e-3]
  // (tests/core/privacy/accounting/rdp_order_grid_test.cc checks σ = 0.6 and 0.8
  // against the quadrature oracle); up to about 0.7 % at σ ∈ [0.9, 1.5]
  // and 1.5 % at σ = 2 for q near 0.001, where the optimum sits at the edge
  // of the orders where RDP explodes (α ≈ 2σ² ln(1/q)).
  kV3,
};
inline constexpr RdpOrderGrid kCurrentRdpOrderGrid = RdpOrderGrid::kV3;

// The orders of `grid`, sorted, distinct, all > 1.
const std::vector<double>& RdpOrders(RdpOrderGrid grid);

// The grid a new accountant gets: RdpOrders(kCurrentRdpOrderGrid). Large
// orders matter for small q and large σ (the optimal order grows like
// σ·sqrt(ln(1/δ)/(T q²))); libraries that stop at 63 or 256 lose
// tightness there.
const std::vector<double>& DefaultRdpOrders();

// The grid with `count` orders, if one has that many.
std::optional<RdpOrderGrid> RdpOrderGridWithCount(size_t count);

// ε(α) of ONE step. Validates q ∈ (0, 1], σ ∈ (0, ∞), α > 1 finite.
// Returns +∞ (not an error) when the value overflows a double.
StatusOr<double> SampledGaussianRdp(double sampling_rate,
                                    double noise_multiplier, double order);

// ε(α) of one step at every order of `orders`. When `orders` is sorted, each
// value is also capped by the values at larger orders (Rényi divergence is
// non-decreasing in the order), so the curve is non-decreasing.
StatusOr<std::vector<double>> SampledGaussianRdpCurve(
    double sampling_rate, double noise_multiplier,
    std::span<const double> orders);

// How an RDP curve is turned into (ε, δ).
enum class RdpConversion {
  // Balle, Barthe, Gaboardi, Hsu, Sato, "Hypothesis Testing Interpretations
  // and Rényi Differential Privacy" (AISTATS 2020), Theorem 21:
  //   ε = ε(α) + ln((α−1)/α) − (ln δ + ln α)/(α − 1).
  // It is never larger than the classic bound; the improvement at order α is
  // exactly ln(α)/(α−1) − ln((α−1)/α) ≥ 0 (see ConversionImprovement).
  kImproved,
  // Mironov 2017, Proposition 3: ε = ε(α) + ln(1/δ)/(α − 1).
  kClassic,
};

const char* RdpConversionName(RdpConversion conversion);

// How much the improved conversion subtracts from the classic one at order α.
double ConversionImprovement(double order);

struct EpsilonAtOrder {
  double epsilon = 0;  // ≥ 0; +∞ if no order gives a finite bound
  double order = 0;    // the order that achieves it
};

struct DeltaAtOrder {
  double delta = 1;  // in [0, 1]
  double order = 0;
};

// Smallest ε over the orders such that the RDP curve implies (ε, δ)-DP.
// `rdp[i]` is the cumulative RDP at `orders[i]`. δ ∈ (0, 1).
StatusOr<EpsilonAtOrder> EpsilonFromRdp(std::span<const double> orders,
                                        std::span<const double> rdp,
                                        double delta,
                                        RdpConversion conversion);

// The adaptive filter's ε (rdp_accountant.h, filter_weights.h): order i is
// converted at δ·weights[i]; empty weights mean δ/|orders| at every order.
// The weights must pass ValidateFilterWeights (Σ ≤ 1).
StatusOr<EpsilonAtOrder> EpsilonFromRdpFilter(std::span<const double> orders,
                                              std::span<const double> rdp, double delta,
                                              std::span<const double> weights,
                                              RdpConversion conversion);

// Smallest δ over the orders such that the RDP curve implies (ε, δ)-DP.
// The improved conversion also uses δ ≤ sqrt(1 − exp(−ε(α))), valid because
// ε(α) ≥ KL divergence for α > 1 (Pinsker-type bound used by current RDP
// accountants). ε ≥ 0.
StatusOr<DeltaAtOrder> DeltaFromRdp(std::span<const double> orders,
                                    std::span<const double> rdp,
                                    double epsilon, RdpConversion conversion);

}  // namespace vipsd::privacy
