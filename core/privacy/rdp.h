// Rényi differential privacy of one step of the Poisson-subsampled Gaussian
// mechanism, and conversion of an RDP curve to (ε, δ).
//
// Mechanism: every record of the pool is included independently with
// probability q (the sampling rate); the clipped per-record statistics of the
// included records are summed (L2 sensitivity 1 after scaling, DESIGN.md 2.4)
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
//   Terms alternate in sign past k = α; positive and negative parts are
//   summed separately in log space. The form cancels to 1 (terms near 1 − αq
//   and αq), so for tiny A_α − 1 we also take the integer value at ⌈α⌉
//   (valid because Rényi divergence grows with the order) and keep the
//   smaller bound.
// q = 1 uses the closed form ε(α) = α / (2σ²).
//
// Rounding: every series is summed in log space and a bound on its
// floating-point and truncation error is ADDED before the logarithm, so the
// returned ε(α) is an upper bound on the exact value (pessimistic).
//
// Thread-safety: all functions are pure and thread-safe.
#pragma once

#include <span>
#include <vector>

#include "core/base/status.h"

namespace vipsd::privacy {

// The default grid of Rényi orders, documented in docs/privacy_accounting.md:
//   1.05, 1.10, …, 1.95 (step 0.05); 2.0, 2.25, …, 64.0 (step 0.25); then
//   72, 80, …, 256 (step 8); then roughly ×1.25 per step up to 262144
//   (2^18), all integers above 64 — 324 orders. Quarter steps up to 64 keep
//   the grid within 0.1 % of the optimum over all real orders in the
//   settings vipsd is used with (tests/core/privacy/rdp_grid_test.cc).
// Large orders matter for small q and large σ (the optimal order grows like
// σ·sqrt(ln(1/δ)/(T q²))); libraries that stop at 63 or 256 lose tightness.
const std::vector<double>& DefaultRdpOrders();

// ε(α) of ONE step. Validates q ∈ (0, 1], σ ∈ (0, ∞), α > 1 finite.
// Returns +∞ (not an error) when the value overflows a double.
StatusOr<double> SampledGaussianRdp(double sampling_rate,
                                    double noise_multiplier, double order);

// ε(α) of one step at every order of `orders`.
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
