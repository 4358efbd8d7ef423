// Distributed discrete Gaussian noise (issue 31, federated mode): n data
// holders each add a share of the step's noise to their own integer partial
// sum, so that the total carries at least the noise one trusted process
// would add, even when the aggregator colludes with (or loses) up to t
// holders. docs/privacy_accounting.md §1c has the argument in full; in short:
//
// The central mechanism (gaussian_mechanism.h) adds Z ~ N_Z(0, σ_g²) per
// coordinate, σ_g² = ⌈σ²·S·(1 + 2^-40)⌉ + τ², and is charged as the
// continuous Gaussian at noise multiplier σ because its pmf is within a
// factor e^{±η} (η < 10^-856) of a post-processed continuous Gaussian of
// variance σ_g². Here holder i adds Z_i ~ N_Z(0, s²) with the share
//     s² = ⌈σ_g² / (n − t)⌉   (an integer, in grid units²),
// and an adversary that knows c holders' shares (the aggregator plus c
// colluding holders) faces the sum of the h = n − c honest shares. That sum
// is not a discrete Gaussian, but its pmf is within e^{±η_h} of the sampled
// Gaussian density of variance V = h·s² (ShareSumClosenessBound, by Poisson
// summation; cf. Kairouz, Liu, Steinke, "The Distributed Discrete Gaussian
// Mechanism for Federated Learning with Secure Aggregation", ICML 2021,
// whose τ is the same series), so the central reduction goes through with
// σ_g² replaced by V: the release may be charged at
//     σ_h = sqrt((V − τ²) / S),
// which is ≥ σ whenever h ≥ n − t (then V ≥ σ_g²). With more colluders the
// guarantee degrades to σ_h < σ (HonestNoiseMultiplier says by how much; the
// planner reports it). With h·s² ≤ τ² nothing is claimed (σ_h = 0).
//
// Integer headroom. A holder's masked message is its sum plus its share mod
// 2^64; the aggregator recovers the total exactly when it lies in
// [−2^63, 2^63). Each holder's sum is bounded by its contributions times
// 2^21 grid units (≤ 2^61 at kMaxContributions), the shares by the sampler's
// range (|Z_i| < 2^63 / n with overwhelming probability for s² < 2^62 / n²);
// DistributedNoiseFor refuses n above kMaxHolders and the caller caps each
// holder's contributions at kMaxContributions / n.
//
// Pure functions of public parameters; thread-safe.
#pragma once

#include <cstdint>

#include "core/base/status.h"
#include "core/privacy/mechanisms/block_layout.h"
#include "core/privacy/mechanisms/discrete_gaussian.h"
#include "core/privacy/mechanisms/gaussian_mechanism.h"

namespace vipsd::privacy {

// At most this many holders (the integer headroom above).
inline constexpr uint32_t kMaxHolders = 64;

struct DistributedNoise {
  DiscreteNoise central;   // what one trusted process would add (σ_g²)
  uint32_t holders = 0;    // n
  uint32_t tolerated = 0;  // t: colluding (or silent) holders the σ survives
  Rational share_sigma2;   // s² = ⌈σ_g² / (n − t)⌉, denominator 1
};

// InvalidArgument unless 1 ≤ n ≤ kMaxHolders and t < n; otherwise the
// errors of DiscreteNoiseFor(layout, σ).
StatusOr<DistributedNoise> DistributedNoiseFor(const BlockLayout& layout, double noise_multiplier,
                                               uint32_t holders, uint32_t tolerated);

// The noise multiplier a release may be charged at when only `honest` of the
// holders' shares are unknown to the adversary: sqrt((honest·s² − τ²)/S),
// rounded down; 0 when honest·s² ≤ τ². Equals at least the configured σ for
// honest ≥ n − t. InvalidArgument for honest > n.
StatusOr<double> HonestNoiseMultiplier(const DistributedNoise& noise, uint32_t honest);

// η_h: the sum of h ≥ 1 independent N_Z(0, s²) has, at every integer x, a pmf
// within a factor e^{±η_h} of exp(−x²/(2hs²)) / sqrt(2π·h·s²). With
// e(v) = 2·Σ_{m ≥ 1} exp(−2π²·v·m²):
//   η_1 = ln(1 + e(s²)),
//   η_{j+1} = η_j + ln(1 + e(s²)) − ln(1 − e(j·s²/(j + 1))).
// Long double; it underflows to 0 for the shares vipsd uses (s² ≳ 10^5).
// s² must be > 0.
long double ShareSumClosenessBound(long double share_sigma2, uint32_t honest);

// log10 of an upper bound on η_h that does not underflow: for s² ≥ 1/2 every
// increment above is at most e(s²) + 1.001·e(s²/2) ≤ 2.02·exp(−π²·s²), so
// η_h ≤ 3·h·exp(−π²·s²) and this returns log10(3h) − π²·s²/ln 10. For
// reports (manifests, the planner). s² must be ≥ 1/2.
long double Log10ShareSumClosenessBound(long double share_sigma2, uint32_t honest);

}  // namespace vipsd::privacy
