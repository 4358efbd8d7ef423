// The exact (ε, δ) privacy profile of the Gaussian mechanism, its inverse in
// ε, and the analytic calibration of σ for a target (ε, δ).
//
// Mechanism: a statistic of L2 sensitivity 1 (under the adjacency in force,
// docs/privacy_accounting.md §1: add/remove one record) is released with N(0, σ²) noise on
// each coordinate; σ is the noise multiplier. Nothing here looks at data:
// inputs and outputs are public parameters only.
//
// Balle & Wang, "Improving the Gaussian Mechanism for Differential Privacy:
// Analytical Calibration and Optimal Denoising" (ICML 2018), Theorem 8: the
// mechanism is (ε, δ)-DP if and only if δ ≥ δ_σ(ε), where
//   δ_σ(ε) = Φ(1/(2σ) − εσ) − e^ε Φ(−1/(2σ) − εσ).
// This is the hockey-stick divergence between N(1, σ²) and N(0, σ²) (it is
// the same in both directions), so it is tight, not just an upper bound.
// It is strictly decreasing in ε and in σ. No subsampling is involved here;
// strong_composition.h and the RDP accountant handle sampled steps.
//
// Evaluation. Write x1 = 1/(2σ) − εσ, x2 = −1/(2σ) − εσ, t1 = −x1, t2 = −x2
// (t2 > 0 always) and M(t) = Φ(−t)/φ(t) for the Mills ratio. The identity
// e^ε φ(x2) = φ(x1) holds exactly (x2²/2 − x1²/2 = ε), hence
//   δ_σ(ε) = φ(x1) · (M(t1) − M(t2)).
// The Gaussian exponents cancel algebraically instead of numerically, so e^ε
// is never formed (no overflow for large ε) and the difference is taken
// between two O(1/t) quantities instead of two terms near underflow. M(t) is
// erfc-based for t < 2 and Laplace's continued fraction (an erfcx) above.
// When x1 > 0 (ε < 1/(2σ²)) we use instead
//   δ_σ(ε) = [Φ(x1) − Φ(x2)] − (e^ε − 1)·Φ(x2),
// where the bracket is a sum of two erfs of positive arguments and the
// second term is small next to it, so large σ at ε ≈ 0 (both Φ ≈ 1/2) keeps
// full precision.
//
// Accuracy and rounding (pessimistic by construction). With u = 2^-52 and
// s = 1/(2σ) + εσ, the relative error of the computed δ is bounded by about
//   u · (2|x1|·s + 2x1² + 2s + 40) · (1 + (M(t1) + M(t2)) / (M(t1) − M(t2))).
// The x1 part is the conditioning of exp(−x1²/2) on its rounded argument
// (intrinsic to double arithmetic; ~1e-12 at ε = 50, σ = 1); the last factor
// is the cancellation between the two terms, ≈ 2εσ² for large σ (it does
// not arise in the x1 > 0 form).
// GaussianDelta evaluates this bound and ADDS twice it to its result, so it
// never returns less than the exact δ_σ(ε). Measured against 60-digit
// arithmetic over σ ∈ [0.5, 100], δ ≥ 1e-12: the unrounded value is within
// 3e-13 relative of the exact one and the returned value exceeds it by at
// most 2e-11 relative. Where φ(x1) is below ~1e-290 the plain upper bound
// Φ(x1) is returned (never less than DBL_MIN): δ that small is outside any
// meaningful use. If a bound cannot be formed (e.g. σ so small that
// 1/(2σ) overflows) the trivial bound 1 is returned.
//
// GaussianEpsilon and GaussianSigmaForEpsilon bisect on the pessimistic δ and
// return the upper end of the final bracket, so the returned ε (resp. σ) is
// never below the exact answer and (ε, δ) (resp. σ) is a valid guarantee.
//
// Failure: invalid arguments give InvalidArgument naming the parameter; a
// target δ too small to reach in double precision gives OutOfRange.
//
// Thread-safety: all functions are pure and thread-safe.
#pragma once

#include "core/base/status.h"

namespace vipsd::privacy {

// δ_σ(ε), rounded up. noise_multiplier σ ∈ (0, ∞), epsilon ε ∈ [0, ∞) finite.
// The result is in [0, 1].
StatusOr<double> GaussianDelta(double noise_multiplier, double epsilon);

// The smallest ε ≥ 0 with δ_σ(ε) ≤ delta, to relative precision 1e-12 and
// rounded up. σ ∈ (0, ∞), delta ∈ (0, 1). Returns 0 when δ_σ(0) ≤ delta.
StatusOr<double> GaussianEpsilon(double noise_multiplier, double delta);

// Analytic calibration (Balle & Wang 2018, Section 4): the smallest σ with
// δ_σ(ε) ≤ delta, to relative precision 1e-12 and rounded up. Solved by
// bisection on σ using the monotonicity of δ_σ(ε) in σ (equivalent to their
// Algorithm 1, which bisects a reparametrisation of the same equation).
// epsilon ∈ [0, ∞) finite, delta ∈ (0, 1).
StatusOr<double> GaussianSigmaForEpsilon(double epsilon, double delta);

}  // namespace vipsd::privacy
