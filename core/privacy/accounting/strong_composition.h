// The paper's baseline accountant: (ε, δ) of T Poisson-subsampled Gaussian
// steps by per-step (ε, δ)-DP, amplification by subsampling, and advanced
// (strong) composition. For comparison experiments only (docs/privacy_accounting.md); the
// daemon's ceiling uses the RDP accountant, which is much tighter.
//
// Mechanism and adjacency as in rdp.h: each record joins a step's batch with
// probability q (sampling rate), the batch sum has L2 sensitivity 1 and gets
// N(0, σ²) noise per coordinate (σ = noise multiplier); add/remove one record.
// Only public parameters go in and come out.
//
// Per step (δ0 chosen below):
//   ε0 = GaussianEpsilon(σ, δ0)  — exact profile, analytic_gaussian.h;
//   ε' = ln(1 + q(e^{ε0} − 1)),  δ' = q·δ0  — amplification by Poisson
//     subsampling (Balle, Barthe, Gaboardi, "Privacy Amplification by
//     Subsampling: Tight Analyses via Couplings and Divergences", NeurIPS
//     2018; earlier Li, Qardaji, Su, ASIACCS 2012).
// Over T steps, for a slack δ'' > 0 (Dwork, Rothblum, Vadhan, "Boosting and
// Differential Privacy", FOCS 2010; stated as Dwork & Roth 2014,
// Theorem 3.20):
//   ε_total = sqrt(2T ln(1/δ'')) ε' + T ε' (e^{ε'} − 1),  δ_total = Tδ' + δ''.
// Basic composition (Dwork & Roth, Theorem 3.16) gives (Tε', Tδ') with no
// slack. Both hold under adaptive choice of the mechanisms, but this module
// assumes one (q, σ) for all T steps.
//
// The δ split. For a target total δ and a slack fraction f ∈ (0, 1):
//   δ'' = f·δ·(1 − κ),  δ0 = (1 − f)·δ·(1 − κ) / (T q),
// with κ = 16·2^-52 so that the floating-point sum T q δ0 + δ'' never exceeds
// δ. δ0 is clamped to below 1 (this only happens when T q < δ, and it makes
// the per-step budget smaller, never larger). ε_total(f) is minimised by a
// grid of 201 points uniform in logit(f) = ln(f/(1 − f)) over
// [−ln 1e8, ln 1e8] (so f from 1e-8 to 1 − 1e-8, log-spaced towards both
// ends), then golden-section search on logit(f) between the neighbours of
// the best grid point. The grid, not unimodality, is what the search relies
// on; golden section only polishes. Basic composition is evaluated with
// f = 0 (all of δ to the steps) and wins when it is smaller (always for
// T = 1).
//
// Rounding: ε0 is rounded up (analytic_gaussian.h); the amplification and
// composition formulas are evaluated in a handful of floating-point
// operations, and the returned ε_total is multiplied by (1 + 64·2^-52) to
// cover their rounding. The reported components are the unrounded ones, so
// recomputing the formula from them gives the returned ε up to that factor.
// Results that overflow are returned as +∞ (a vacuous, still valid bound).
//
// Cost: about 250 GaussianEpsilon calls (~12 µs each), independent of T:
// ~3 ms per call on a 2020s x86 core.
//
// Thread-safety: pure and thread-safe. Failure: InvalidArgument naming the
// parameter for out-of-range input; OutOfRange if no split gives a finite
// per-step ε (δ/T far below the double-precision range).
#pragma once

#include <cstdint>

#include "core/base/status.h"

namespace vipsd::privacy {

struct StrongCompositionResult {
  double epsilon = 0;            // ε_total, rounded up
  double delta = 0;              // T·amplified_delta + slack_delta ≤ target δ
  double step_epsilon0 = 0;      // ε0 of the Gaussian mechanism per step
  double step_delta0 = 0;        // δ0 of the Gaussian mechanism per step
  double amplified_epsilon = 0;  // ε' after Poisson subsampling
  double amplified_delta = 0;    // δ' = q·δ0
  double slack_delta = 0;        // δ'' of advanced composition; 0 if basic
  bool used_basic_composition = false;  // ε = T·ε' (basic) beat DRV
};

// ε_total for T = `steps` steps at sampling rate q and noise multiplier σ,
// with total failure probability at most `delta`. Validates q ∈ (0, 1],
// σ ∈ (0, ∞), steps ≥ 1 (and ≤ 2^53 so that it is exact as a double),
// delta ∈ (0, 1).
StatusOr<StrongCompositionResult> StrongCompositionEpsilon(double sampling_rate,
                                                           double noise_multiplier,
                                                           int64_t steps, double delta);

}  // namespace vipsd::privacy
