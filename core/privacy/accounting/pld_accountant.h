// Privacy-loss-distribution (PLD) accounting for the composition of
// Poisson-subsampled Gaussian steps: a tighter (ε, δ) than RDP, and still an
// upper bound.
//
// Mechanism and adjacency: as in rdp.h. One step includes each record with
// probability q (sampling rate), sums the clipped statistics (L2 sensitivity
// 1) and adds N(0, σ²) noise (σ = noise multiplier). Neighbours differ by
// adding or removing one record. Per step, with μ_c = N(c, σ²) and
// M = (1 − q)μ0 + qμ1, the two dominating pairs are
//   remove:  P = M,  Q = μ0        add:  P = μ0,  Q = M
// and δ(ε) of a fixed schedule of steps is the larger of the two hockey-stick
// divergences of the product pairs,
//   δ(ε) = max over {remove, add} of E_{P^T}[(1 − e^{ε − L})₊],
// L = Σ_t ln(dP/dQ)(x_t) the privacy loss (Zhu, Dong, Wang, "Optimal
// accounting of differential privacy via characteristic function", AISTATS
// 2022, Sections 3 and 5: the product of dominating pairs dominates the
// composition). Both directions are composed separately and the maximum is
// reported. (For single steps and ε ≥ 0 the remove direction has been the
// larger in every case we checked; that is not assumed.)
//
// Method (Koskela, Jälkö, Honkela, AISTATS 2020 and 2021; Doroshenko, Ghazi,
// Kamath, Kumar, Manurangsi, "Connect the dots", PoPETs 2022):
//  1. Per step the loss is put on the grid kΔ. Δ is the requested
//     discretisation rounded DOWN to a power of two, so every grid value and
//     every sum of grid values is exact in binary floating point. ln(dP/dQ)
//     is monotone in the output x, so each grid cell [kΔ, (k+1)Δ] is an
//     x-interval whose P- and Q-masses are Gaussian CDF differences
//     (computed from erfc tails in long double).
//  2. kConnectTheDots (default): each cell's mass is split between its two
//     ends so that both its P-mass and its Q-mass = E_P[e^{−L}] are kept
//     (the chord of the privacy profile between grid points). The law of
//     e^{−L} under P becomes a mean-preserving spread, δ(ε) is a convex
//     non-increasing function of e^{−L}, and composition multiplies
//     independent e^{−L} factors, which keeps that order: every δ(ε) of every
//     composition can only grow. The mean loss moves by at most Δ²/8 per
//     step, so the error stays small for 10^7 steps.
//     kRoundUp: each cell's mass goes to its upper end (classic "privacy
//     buckets"); also pessimistic, but biased by up to Δ per step.
//  3. Tails: P-mass beyond the per-step range goes to an atom at +∞ (counted
//     fully in δ); mass below it is lumped upward. Both only raise δ. The
//     per-step tails hold at most tail_mass_truncation/(2·steps) each.
//  4. Composition: one real FFT of length N (a power of two, at most 2^21)
//     per distinct (q, σ); the spectra are raised to the step counts and
//     multiplied; one inverse FFT. N covers the part of the composed loss
//     that a Chernoff bound (computed from the discretised PMF itself) does
//     not exclude at level tail_mass_truncation/2. Mass outside that window
//     aliases: from below it lands on larger losses (harmless); the Chernoff
//     bound on mass from above is added to δ. If the window or the per-step
//     grid would exceed 2^21 points, Δ is doubled until it fits (the bound
//     stays valid, only looser).
//  5. Floating point. Rounding is bounded and ADDED to δ, never ignored:
//     per-step CDF and split errors (assuming libm erfc/exp/log/sin within 32
//     ulps; glibc documents fewer) times the number of steps; the FFT error
//     (normwise bound, 32·(log2 N + 2) unit roundoffs per transform); the
//     spectral power, whose error is amplified by the step count — so the
//     heaviest bin is kept out of the FFT and added back exactly (small q
//     gives nearly a point mass), and the largest coefficients are
//     recomputed directly in long double from a form centred on the mean;
//     the evaluation of δ(ε). Negative FFT outputs are clamped to 0. Grid
//     boundaries are nudged towards the lower loss by their own error bound.
//  6. δ(ε) = P(+∞) + Σ_{l > ε} (1 − e^{ε−l}) p(l) + the bounds above;
//     ε(δ) is the smallest ε ≥ 0 with δ(ε) ≤ δ, solved exactly on the
//     segment between grid points and then verified by direct evaluation
//     (moved up to the next grid point if the check fails).
//
// Validity: the result is an upper bound for a schedule of (q, σ, steps)
// fixed before the run. It is not a privacy filter: if (q, σ) are chosen
// adaptively the daemon's RDP accountant (rdp_accountant.h,
// Adaptivity::kAdaptiveFilter) is the one to use.
//
// Lower bounds: ComposedPld::ComposeLowerBound rounds every cell DOWN, drops
// the tails and SUBTRACTS every error bound; the true δ(ε) and ε(δ) lie
// between the two. It exists to measure how tight the upper bound is and
// must never be used to account a budget. It is loose for many steps (the
// rounding bias grows like steps·Δ/2).
//
// Cost (2-vCPU build machine, RelWithDebInfo, default options, q = 0.004,
// σ = 1, both directions): 0.3 s for 10^3 steps, 0.35 s for 10^5, 0.9 s for
// 10^7 (Δ doubled to 2^-12 there). Small σ costs more (σ = 0.5, q = 1: up to
// 2 s; σ = 0.1: up to 4 s). Peak memory about 230 MB at N = 2^21 (18 MB at
// 10^3 steps).
//
// What is private: nothing. Only public parameters (q, σ, steps, ε, δ) are
// used; error messages contain only those.
//
// Thread-safety: all functions are pure; a ComposedPld is immutable after
// construction and may be queried from several threads.
//
// Failure: invalid parameters give INVALID_ARGUMENT naming the parameter;
// allocation failure gives RESOURCE_EXHAUSTED. When the error terms alone
// exceed δ, Epsilon returns +∞ (a valid, if useless, bound), not an error.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/base/status.h"

namespace vipsd::privacy {

enum class PldDiscretization {
  kConnectTheDots,  // split each cell keeping P- and Q-mass (tightest)
  kRoundUp,         // move each cell to its upper end
};

struct PldOptions {
  // Requested grid spacing Δ of the privacy loss, in (0, 1]. Rounded down to
  // a power of two (1e-4 → 2^-14 ≈ 6.1e-5); doubled while the grid exceeds
  // 2^21 points.
  double discretization = 1e-4;
  // Total P-mass, per direction, that truncation may move to +∞ (or, from
  // the aliasing bound, add to δ). In [1e-300, 1e-3].
  double tail_mass_truncation = 1e-15;
  PldDiscretization method = PldDiscretization::kConnectTheDots;
};

// The two dominating pairs (see the header comment).
enum class PldDirection {
  kRemove,  // P = (1 − q)N(0, σ²) + qN(1, σ²), Q = N(0, σ²)
  kAdd,     // P = N(0, σ²), Q = (1 − q)N(0, σ²) + qN(1, σ²)
};

// `steps` consecutive steps with the same sampling rate and noise multiplier.
struct PldStepGroup {
  double sampling_rate = 1.0;     // q ∈ (0, 1]
  double noise_multiplier = 1.0;  // σ ∈ (0, ∞)
  int64_t steps = 1;              // ≥ 1
};

// How one direction was computed; every error term is already included in
// the answers (added for an upper bound, subtracted for a lower bound).
struct PldDirectionReport {
  double grid_spacing = 0;    // Δ actually used
  int64_t grid_points = 0;    // points of the composed grid (FFT length)
  double infinity_mass = 0;   // P-mass at +∞ (upper bound only)
  double aliasing_bound = 0;  // Chernoff bound on mass aliased by the window
  double fft_error = 0;       // bound on the ℓ1 error of the composition
  double rounding_error = 0;  // per-step floating-point error × steps
};

// The composed privacy-loss distributions of both directions, ready for any
// number of δ(ε) and ε(δ) queries.
class ComposedPld {
 public:
  enum class Bound { kUpper, kLower };

  // Upper bound (the accountant). `groups` must be non-empty; the total step
  // count must be at most 2^40.
  static StatusOr<ComposedPld> Compose(std::span<const PldStepGroup> groups,
                                       const PldOptions& options = {});

  // Lower bound, for measuring tightness only (see the header comment).
  static StatusOr<ComposedPld> ComposeLowerBound(std::span<const PldStepGroup> groups,
                                                 const PldOptions& options = {});

  Bound bound() const { return bound_; }

  // δ(ε) for ε ≥ 0 (finite). In [0, 1]. The maximum over both directions.
  StatusOr<double> Delta(double epsilon) const;

  // δ(ε) of one direction only (diagnostics and tests; Delta is the bound).
  StatusOr<double> DirectionDelta(PldDirection direction, double epsilon) const;

  // ε(δ) for δ ∈ (0, 1). ≥ 0; +∞ if the error terms alone reach δ.
  StatusOr<double> Epsilon(double delta) const;

  const PldDirectionReport& remove_report() const { return remove_.report; }
  const PldDirectionReport& add_report() const { return add_.report; }

 private:
  // One direction: masses on the grid (window_first + w)·Δ, w ∈ [0, size).
  struct Direction {
    std::vector<double> mass;
    int64_t window_first = 0;
    double grid_spacing = 0;
    // δ_upper(ε) = (1 + relative)·D(ε) + additive, capped at 1;
    // δ_lower(ε) = (1 − relative)·D(ε) − additive, floored at 0;
    // D(ε) = Σ_{l > ε} (1 − e^{ε−l}) mass(l).
    double relative = 0;
    double additive = 0;
    PldDirectionReport report;
  };

  static StatusOr<ComposedPld> ComposeImpl(std::span<const PldStepGroup> groups,
                                           const PldOptions& options, Bound bound);
  double DeltaOf(const Direction& direction, double epsilon) const;
  double EpsilonOf(const Direction& direction, double delta) const;

  ComposedPld() = default;

  Bound bound_ = Bound::kUpper;
  Direction remove_;
  Direction add_;
};

// ε of `steps` identical steps at the given δ ∈ (0, 1) (upper bound).
StatusOr<double> PldEpsilon(double sampling_rate, double noise_multiplier, int64_t steps,
                            double delta, const PldOptions& options = {});

// δ of `steps` identical steps at the given ε ≥ 0 (upper bound).
StatusOr<double> PldDelta(double sampling_rate, double noise_multiplier, int64_t steps,
                          double epsilon, const PldOptions& options = {});

}  // namespace vipsd::privacy
