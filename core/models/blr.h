// Bayesian logistic regression for VIPS (docs/models.md; Park, Foulds,
// Chaudhuri, Welling, "Variational Bayes In Private Settings", JMLR 2020,
// Algorithm 5), with the Pólya-Gamma augmentation of Polson, Scott, Windle
// (2013) and the stochastic natural-parameter updates of Hoffman, Blei,
// Wang, Paisley, "Stochastic Variational Inference" (JMLR 2013).
//
// Model. y_n ~ Bernoulli(σ(mᵀx_n)), m | α ~ N(0, α⁻¹ I), α ~ Gamma(a0, b0)
// (shape a0, rate b0). With prior groups (BlrConfig::prior_group, "Prior
// groups" below) m_j | α ~ N(0, α_g(j)⁻¹) with one α_g ~ Gamma(a0, b0) per
// group; what follows is written for one group. With ω_n ~ PG(1, 0) the
// likelihood becomes
// conditionally Gaussian in m (Polson et al. 2013, Theorem 1):
//   p(y_n | m, ω_n) ∝ exp((y_n − ½) x_nᵀm − ½ ω_n (x_nᵀm)²).
// Mean field q(m) q(α) Π_n q(ω_n) gives
//   q(ω_n) = PG(1, c_n),  c_n = sqrt(x_nᵀ E[m mᵀ] x_n),
//   ⟨ξ_n⟩ := E_q[ω_n] = tanh(c_n/2) / (2 c_n)   (limit ¼ as c_n → 0),
//   q(m) = N(μ, Σ):  Σ⁻¹ = E[α] I + Σ_n ⟨ξ_n⟩ x_n x_nᵀ,  Σ⁻¹μ = Σ_n (y_n − ½) x_n,
//   q(α) = Gamma(a0 + d/2, b0 + ½ E[mᵀm]),  E[mᵀm] = μᵀμ + tr Σ.
//
// Records (model::Record): `features` (dense, length d) and `label` (0 or
// 1). Inputs must have ‖x‖₂ ≤ 1, measured as FeatureSquaredNorm(x) ≤ 1;
// the decoder (connectors/decode/blr_record_decoder.h) enforces that by
// rejecting or rescaling. EStep re-checks and returns INVALID_ARGUMENT for a
// record that violates it (wrong length, non-finite value, label not 0/1,
// squared norm above 1); the driver then leaves the record out of the sum.
//
// Per-record statistic: two blocks, one Gaussian mechanism (docs/privacy_accounting.md §1):
//   "s1"  vector, d coordinates:        s1 = (y − ½) x,        bound C1 = ½
//   "s2"  symmetric d × d, packed upper triangle (d(d+1)/2 coordinates,
//         block_layout.h):             s2 = ⟨ξ⟩ x xᵀ,          bound C2 = ¼
// Proofs (add/remove-one adjacency, any record with ‖x‖₂ ≤ 1, y ∈ {0, 1}):
//   ‖s1‖₂ = |y − ½| ‖x‖₂ = ½ ‖x‖₂ ≤ ½.
//   0 < ⟨ξ⟩ ≤ ¼ for every c ≥ 0: tanh(u)/u is decreasing on u > 0 with
//   limit 1 at 0, so tanh(c/2)/(2c) = ¼ · tanh(c/2)/(c/2) ≤ ¼. Then
//   ‖s2‖_F = ⟨ξ⟩ ‖x xᵀ‖_F = ⟨ξ⟩ ‖x‖₂² ≤ ¼, and the packed norm (each
//   off-diagonal pair once) is ≤ the Frobenius norm. The bound does not
//   depend on c being computed accurately: any c ≥ 0 (even a rounded or
//   clamped one) gives ⟨ξ⟩ ∈ [0, ¼], which is why the E-step may clamp.
// Both bounds are attained (x a unit basis vector, c → 0), so they cannot
// be tightened. Rounding: the E-step computes ⟨ξ⟩ and clamps it to [0, ¼],
// then passes each block through privacy::ClipToL2Bound, whose rigorous
// (pessimistic) norm makes every emitted block ≤ its bound even when the
// exact bound is attained and rounding would push it a few ulps over; blocks
// clearly inside their bound are bit-for-bit unchanged. The driver clips
// again (GaussianSumMechanism), so privacy never rests on the E-step alone.
// The statistic is emitted sparsely: only coordinates with x_i ≠ 0 (and
// pairs with x_i x_j ≠ 0) are listed — the mechanism treats unlisted
// coordinates as zero, which is what they are.
// In the private sum the symmetric block is noised on its packed upper
// triangle (with diagonal) and mirrored ("Analyze Gauss", Dwork, Talwar,
// Thakurta, Zhang 2014): one noise draw per unordered pair.
//
// E-step (behind the wall), against the current released q(m):
//   c² = (xᵀμ)² + xᵀΣx = xᵀ (μμᵀ + Σ) x, clamped at 0 (it is ≥ 0 exactly);
//   ⟨ξ⟩ = PolyaGammaMean(c).
//
// M-step: a noise-aware posterior (docs/models.md, "Noise-aware
// posteriors"). The state holds unbiased running estimates of the pool-wide
// sums, never projected, and the variance of the privacy noise in them:
//   A ← (1 − ρ) A + ρ S̃2/q,          B ← (1 − ρ) B + ρ S̃1/q,
//   v2 ← (1 − ρ)² v2 + ρ² (s2/q)²,    v1 ← (1 − ρ)² v1 + ρ² (s1/q)²,
// where s_b is block b's per-coordinate noise std of this step's release
// (privacy::NoiseStdPerBlock of the public σ; 0 for an exact sum). The
// noises of different steps are independent, so v_b is exactly the variance
// of every coordinate of the noise left in A (packed upper triangle) and B.
// From (A, B, v1, v2, E[α]) the posterior q(m) = N(μ, Σ) is derived:
//  1. Signal spectrum. A = V diag(a) Vᵀ. Noise spreads the spectrum of the
//     true S2/q (a symmetric Gaussian matrix with entry variance v2 has its
//     eigenvalues within ±2·sqrt(d·v2)); an eigenvalue is kept as signal
//     only above the threshold t = c·2·sqrt(d·v2), c = kSignalEdgeFraction,
//     and shrunk by the spiked-Wigner inversion
//        λ_i = (a_i + sqrt(a_i² − t²)) / 2   if a_i > t,   else 0,
//     (λ_i = max(a_i, 0) for an exact sum). S2 ⪰ 0, so λ_i ≥ 0 is no loss.
//  2. The noisy linear statistic as an observation. Under the Pólya-Gamma
//     augmentation S1 | m ~ N(S2 m, S2); the released B adds N(0, v1 I), so
//     B | m ~ N(Ŝ2 m, Ŝ2 + v1 I) with Ŝ2 = V diag(λ) Vᵀ. With the prior
//     N(0, E[α]⁻¹ I), in the eigenbasis:
//        p_i = E[α] + λ_i²/(λ_i + v1),   f_i = λ_i/(λ_i + v1),
//        Σ_data = V diag(1/p) Vᵀ,        μ = V diag(f/p) Vᵀ B.
//     At v1 = 0 this is the usual Σ⁻¹ = E[α] I + S2, Σ⁻¹μ = S1; where the
//     noise dominates a direction (λ_i ≪ v1) the posterior falls back to the
//     prior there instead of reading noise as data.
//  3. The noise E left in A moves μ = Φ(A) B, Φ(A) = V diag(φ(a_i)) Vᵀ,
//     φ(a) = f/p. Its spread is estimated by a parametric bootstrap: K
//     draws of a symmetric E' with one N(0, v2) entry per element of the
//     packed upper triangle (the mechanism's noise), μ_k = Φ(A + E') B with
//     each draw's spectrum mapped as in steps 1–2, and the released
//     covariance is Σ = Σ_data + Cov_k(μ_k); "noise_covariance" in the
//     release is that second term. K = BlrNoiseShareDraws(d) (64 up to d =
//     128, 16 at d = 1024), from a generator with a fixed seed, so the
//     share is a deterministic function of the state. A first-order
//     (Fréchet) propagation was used before: where eigenvalues lie closer
//     together than the noise, or straddle the threshold, it overstated the
//     spread 4–12× (BlrMStepTest.TheNoiseShareIsTheSpreadOfTheMeanUnderTheNoiseOfA).
//  q(α) = Gamma(a, b) by the evidence (type-II) update: the directions the
//     data determine, γ = Σ_i (1 − E[α]/p_i) = d − E[α] tr Σ_data, against
//     the squared norm of the coefficients there, the mean's plus the noise
//     share's: â = a0 + γ/2, b̂ = b0 + ½ (μᵀμ + tr N), N the current
//     release's noise_covariance (one step behind: the share is derived
//     once per step). Its fixed point is the variational update's (â = a0 +
//     d/2, b̂ = b0 + ½ (μᵀμ + tr Σ_data + tr N): E[α] tr Σ_data = d − γ),
//     but the d − γ directions the prior dominates no longer pull each
//     step's target towards the current E[α], so a short private run gets
//     nearer to it (docs/results.md, "Calibrated posteriors");
//     a ← (1 − ρ) a + ρ â,  b ← (1 − ρ) b + ρ b̂,  E[α] = a / b,
//  Prior groups: the prior precision is D = diag(E[α_g(j)]) and P = D +
//     V diag(f·λ) Vᵀ is not diagonal in A's eigenbasis; Σ_data = P⁻¹ by
//     Cholesky and μ = P⁻¹ V diag(f) Vᵀ B, in each bootstrap draw too (D's
//     entries floored at eigenvalue_floor). q(α_g) by the evidence update
//     on the group's coefficients: γ_g = d_g − E[α_g] Σ_{j∈g} Σ_data,jj,
//     b̂_g = b0 + ½ Σ_{j∈g} (μ_j² + N_jj). When every E[α_g] is equal the
//     eigenbasis derivation is used, so one group is bit for bit the model
//     without groups.
//  the posterior is derived again with the new E[α], and the E-step uses
//  E[mmᵀ] = μμᵀ + Σ_data. All of this reads only the released sums, the
//  public q, ρ, σ and bounds: post-processing, no privacy cost. The eigen-
//  values p_i are floored at eigenvalue_floor (a guard for a tiny E[α]).
//  Sums are divided by q, never by the realised batch size (docs/models.md,
//  "The stochastic step").
//
// Public prior (SetPublicPrior; model.public_prior): the release N(m0, S)
// of a non-private fit on public records becomes the prior m | α ~ N(m0,
// (α R)⁻¹), R = S⁻¹, α ~ Gamma(a0, b0) a scale learned by the evidence
// update: γ = d − E[α] tr(R Σ_data) against E[(m − m0)ᵀ R (m − m0)] =
// (μ − m0)ᵀ R (μ − m0) + tr(R N). At a0 = b0 = 1 the run starts from the
// public posterior itself; where the private data disagree with it, E[α]
// falls and the prior widens (it never moves m0). The posterior is the
// general one of "Prior groups" with Λ0 = E[α] R and mean m0 (E[α] floored
// at eigenvalue_floor there). Not with prior groups (one scale).
//
// Initialisation (public, data-independent): q(α_g) = the prior Gamma(a0,
// b0); A = 0, B = 0, v1 = v2 = 0, so q(m) = N(0, (b0/a0) I) (with a public
// prior, N(m0, (b0/a0) S)).
//
// Release arrays (row-major doubles; all public post-processing):
//   "mean"              (d)     μ
//   "covariance"        (d, d)  Σ, the privacy noise's share included
//   "noise_covariance"  (d, d)  the share of Σ due to the noise left in A
//                               (zero for a non-private run); the noise in
//                               B is already inside Σ_data = Σ − it
//   "alpha_shape" ()  a   } q(α) = Gamma(a, b), E[α] = a / b; with G > 1
//   "alpha_rate"  ()  b   } prior groups, shape (G): one q(α_g) per group,
//   "prior_group" (d)        and the group of every coefficient (G > 1 only)
//   "noise_variance_s1" (), "noise_variance_s2" ()   v1, v2
// Checkpoint arrays (the whole state, restored bit-exactly):
//   "statistic_s1" (d) B; "statistic_s2" (d, d) A, exactly symmetric;
//   "noise_variance_s1" (); "noise_variance_s2" (); "alpha_shape" ();
//   "alpha_rate" () (both (G), and "prior_group" (d), with G > 1 groups; a
//   checkpoint restores only into a model of the same grouping). μ, Σ and
//   E[mmᵀ] are recomputed from them
//   deterministically. A checkpoint of the earlier format ("precision",
//   "precision_mean") is restored as A = Λ − E[α] I, B = η, v1 = v2 = 0: the
//   noise of the steps before it is then not counted (docs/models.md).
//
// Thread-safety: EStep, ExpectedXi and the accessors are const and may run
// concurrently; MStep and RestoreCheckpoint must not run concurrently with
// them (model.h).
#pragma once

#include <Eigen/Core>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/base/status.h"
#include "core/model/model.h"
#include "core/models/polya_gamma.h"

namespace vipsd::models {

// c of the signal threshold (header): chosen on the Adult validation split
// (docs/results.md, "Calibrated posteriors"); 1 is the spiked-Wigner edge.
inline constexpr double kSignalEdgeFraction = 0.35;

// The noise share's draws (header, step 3): 64 up to d = 128, then fewer so
// that their cost stays near 64 eigendecompositions of 128 × 128 (O(d³)
// each), never below 16 (at d = 1024, 16 decompositions of 1024 × 1024).
inline int BlrNoiseShareDraws(int64_t dim) {
  const double scaled = 64.0 * 128.0 * 128.0 * 128.0 / (static_cast<double>(dim) * dim * dim);
  return scaled >= 64 ? 64 : scaled <= 16 ? 16 : static_cast<int>(scaled);
}
// Seed of its fixed generator (any constant: a public choice).
inline constexpr uint64_t kNoiseShareSeed = 0x6e6f697365736861;  // "noisesha"

struct BlrConfig {
  int64_t dim = 0;             // d ∈ [1, 1024]; Σ is d × d, the M-step costs O(d³)
  double prior_shape = 1.0;    // a0: Gamma prior on α, finite and > 0
  double prior_rate = 1.0;     // b0: finite and > 0
  // Absolute floor of the posterior precision's eigenvalues (a guard for a
  // tiny E[α], see the header); finite, in (0, 1e6].
  double eigenvalue_floor = 1e-6;
  // The prior group of every coefficient (header, "Prior groups"): empty
  // (one α for all), or d entries that use each of 0 .. G−1, G ≤ d. Public:
  // it names columns, never values.
  std::vector<int32_t> prior_group;
};

// G of prior_group (1 when it is empty). Precondition: validated.
int64_t PriorGroupCount(const BlrConfig& config);

// The prior of q(m) a posterior is derived with (blr.cc): Λ0 =
// diag(diagonal) (E[α_g(j)] per coefficient) and mean 0 without a public
// prior; with one, Λ0 = diagonal[0] · R (diagonal holds E[α] alone) and
// mean m0, R and m0 the public prior's precision and mean.
struct BlrPrior {
  Eigen::VectorXd diagonal;
  const Eigen::MatrixXd* public_precision = nullptr;
  const Eigen::VectorXd* public_mean = nullptr;
};

// Checks the ranges above; messages name the field ("blr.dim", …) and the
// allowed range.
Status ValidateBlrConfig(const BlrConfig& config);

// Σ_i x_i² in index order, in double. THE definition of "‖x‖₂ ≤ 1" shared
// by the decoder (which guarantees FeatureSquaredNorm(x) ≤ 1) and the
// E-step (which checks it). Overflows to +inf only if some |x_i| is huge,
// which correctly reads as "above 1".
double FeatureSquaredNorm(std::span<const double> x);

class BlrModel final : public model::Model {
 public:
  static StatusOr<std::unique_ptr<BlrModel>> Create(const BlrConfig& config);

  std::string type() const override { return "blr"; }
  const privacy::BlockLayout& statistic_layout() const override { return layout_; }
  // {{"d", d}}.
  std::vector<std::pair<std::string, int64_t>> dimensions() const override;
  bool has_proven_bounds() const override { return true; }
  std::unique_ptr<model::EStepScratch> NewScratch() const override;
  Status EStep(const model::Record& record, model::RecordRng& rng,
               model::EStepScratch& scratch, model::SparseStatistic& out) const override;
  // Errors (model unchanged): INVALID_ARGUMENT for a wrong size, q ∉ (0, 1]
  // or ρ ∉ (0, 1]; OUT_OF_RANGE for a non-finite sum or if the updated state
  // is not finite / not positive definite (cannot happen for finite input
  // short of overflow).
  Status MStep(const Eigen::VectorXd& statistic_sum, const privacy::SampledGaussian& released_by,
               double rho) override;
  std::vector<model::NamedArray> ReleaseArrays() const override;
  std::vector<model::NamedArray> CheckpointArrays() const override;
  Status RestoreCheckpoint(std::span<const model::NamedArray> arrays) override;
  // The public prior (header, "Public prior"): `arrays` are a non-private
  // BLR release of the same d, of which "mean" (d) and "covariance" (d, d,
  // symmetric positive definite) are used. Resets the state to the prior.
  // INVALID_ARGUMENT (model unchanged) for a missing or malformed array;
  // FAILED_PRECONDITION with prior groups (one scale for the public
  // precision; blr.prior_group must be empty).
  Status SetPublicPrior(std::span<const model::NamedArray> arrays) override;
  bool has_public_prior() const { return public_precision_.size() > 0; }

  const BlrConfig& config() const { return config_; }
  const Eigen::VectorXd& mean() const { return mean_; }              // μ
  const Eigen::MatrixXd& covariance() const { return covariance_; }  // Σ (noise share included)
  // Σ_data = P⁻¹ (what the E-step and q(α) use) and P.
  const Eigen::MatrixXd& data_covariance() const { return data_covariance_; }
  const Eigen::MatrixXd& precision() const { return precision_; }
  const Eigen::MatrixXd& noise_covariance() const { return noise_covariance_; }
  const Eigen::MatrixXd& statistic_s2() const { return statistic_s2_; }  // A
  const Eigen::VectorXd& statistic_s1() const { return statistic_s1_; }  // B
  double noise_variance_s1() const { return noise_variance_s1_; }        // v1
  double noise_variance_s2() const { return noise_variance_s2_; }        // v2
  // q(α_g) = Gamma(alpha_shape[g], alpha_rate[g]), one entry per prior group.
  const Eigen::VectorXd& alpha_shape() const { return alpha_shape_; }
  const Eigen::VectorXd& alpha_rate() const { return alpha_rate_; }
  Eigen::VectorXd expected_alpha() const;  // E[α_g], per group
  Eigen::VectorXd prior_precision() const;  // E[α_g(j)], per coefficient

  // ⟨ξ⟩ of a feature vector of length d against the current q(m) (what
  // EStep uses). Precondition: x.size() == d, finite.
  double ExpectedXi(std::span<const double> x) const;

  // A's eigendecomposition (ascending eigenvalues), shared by the two
  // posteriors an M-step derives (public for the derivation in blr.cc).
  struct Spectrum {
    Eigen::VectorXd values;
    Eigen::MatrixXd vectors;
  };
  static StatusOr<Spectrum> Decompose(const Eigen::MatrixXd& statistic_s2);

 private:
  BlrModel(const BlrConfig& config, privacy::BlockLayout layout);
  // Sets the state and the posterior derived from it if everything is
  // finite; otherwise returns an error and changes nothing. `spectrum`:
  // Decompose(statistic_s2) when the caller has it (nullptr: computed).
  Status SetState(Eigen::MatrixXd statistic_s2, Eigen::VectorXd statistic_s1,
                  double noise_variance_s1, double noise_variance_s2, Eigen::VectorXd alpha_shape,
                  Eigen::VectorXd alpha_rate, const Spectrum* spectrum = nullptr);
  // E[α] per group → per coefficient.
  Eigen::VectorXd PriorPrecision(const Eigen::VectorXd& expected_alpha) const;
  // The prior a derivation uses at these E[α].
  BlrPrior PriorOf(const Eigen::VectorXd& expected_alpha) const;
  // q(α)'s release and checkpoint arrays (header).
  std::vector<model::NamedArray> AlphaArrays() const;

  BlrConfig config_;
  privacy::BlockLayout layout_;
  // State.
  Eigen::MatrixXd statistic_s2_;  // A
  Eigen::VectorXd statistic_s1_;  // B
  double noise_variance_s1_ = 0;  // v1
  double noise_variance_s2_ = 0;  // v2
  Eigen::VectorXd alpha_shape_;   // a_g
  Eigen::VectorXd alpha_rate_;    // b_g
  std::vector<int32_t> group_of_;  // the prior group of each coefficient
  // The public prior's mean m0 and precision R (empty: none).
  Eigen::VectorXd public_mean_;
  Eigen::MatrixXd public_precision_;
  // Derived from the state.
  Eigen::MatrixXd precision_;         // P
  Eigen::MatrixXd data_covariance_;   // Σ_data
  Eigen::MatrixXd noise_covariance_;  // V Cov(Vᵀδμ) Vᵀ (header, step 3)
  Eigen::MatrixXd covariance_;        // Σ
  Eigen::VectorXd mean_;              // μ
  Eigen::MatrixXd second_moment_;     // μμᵀ + Σ_data
};

}  // namespace vipsd::models
