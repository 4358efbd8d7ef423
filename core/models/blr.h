// Bayesian logistic regression for VIPS (docs/models.md; Park, Foulds,
// Chaudhuri, Welling, "Variational Bayes In Private Settings", JMLR 2020,
// Algorithm 5), with the Pólya-Gamma augmentation of Polson, Scott, Windle
// (2013) and the stochastic natural-parameter updates of Hoffman, Blei,
// Wang, Paisley, "Stochastic Variational Inference" (JMLR 2013).
//
// Model. y_n ~ Bernoulli(σ(mᵀx_n)), m | α ~ N(0, α⁻¹ I), α ~ Gamma(a0, b0)
// (shape a0, rate b0). With ω_n ~ PG(1, 0) the likelihood becomes
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
// M-step with the noisy sums S̃1 (d) and S̃2 (mirrored to d × d), sampling
// rate q and step size ρ (docs/models.md, "The stochastic step"; the SVI step of Hoffman et al.
// 2013 — the natural parameters of each global factor move toward the
// "intermediate" estimate computed as if the whole pool were S̃/q):
//   Λ̂ = Project(E[α] I + S̃2 / q),      η̂ = S̃1 / q,
//   Λ ← (1 − ρ) Λ + ρ Λ̂,               η ← (1 − ρ) η + ρ η̂,
//   Σ = Λ⁻¹, μ = Λ⁻¹ η                  (Cholesky of Λ),
//   â = a0 + d/2, b̂ = b0 + ½ (μᵀμ + tr Σ)   with the NEW q(m),
//   a ← (1 − ρ) a + ρ â,                 b ← (1 − ρ) b + ρ b̂,   E[α] = a / b.
// (Λ, η) are the natural parameters of q(m) (up to the factor −½ on Λ) and
// (a − 1, −b) those of q(α); blending them linearly is SVI's step. The sums
// are divided by q, never by the realised batch size (docs/models.md, "The stochastic step").
//
// Positive-definite projection (Project). Noise can make E[α]I + S̃2/q
// indefinite. Project takes its symmetric eigendecomposition V diag(λ) Vᵀ
// (Eigen::SelfAdjointEigenSolver) and returns V diag(max(λ_i, f)) Vᵀ with
//   f = max(eigenvalue_floor, E[α]).
// For the exact statistic S2 = Σ ⟨ξ_n⟩ x_n x_nᵀ ⪰ 0, so the exact Λ̂ already
// has every eigenvalue ≥ E[α]: flooring at E[α] is the Frobenius-nearest
// point of the set {A ⪰ E[α] I} that provably contains the noiseless value
// (equivalently: S̃2/q projected onto the positive semidefinite cone).
// `eigenvalue_floor` is an absolute lower limit for the case E[α] is tiny.
// Because Λ is then a convex combination of matrices ⪰ f_t I, it stays
// positive definite for the whole run. The projection is post-processing:
// its inputs are the released noisy sum, the public q and the previous
// public state (E[α]), and no private record is read — so it costs no
// privacy (post-processing theorem, Dwork & Roth 2014, Prop. 2.1).
//
// Initialisation (public, data-independent): q(α) = the prior Gamma(a0,
// b0); q(m) = N(0, (b0/a0) I), i.e. Λ = (a0/b0) I, η = 0.
//
// Release arrays (row-major doubles; all public post-processing):
//   "mean"        (d)       μ
//   "covariance"  (d, d)    Σ (symmetric)
//   "alpha_shape" ()        a   } q(α) = Gamma(a, b), E[α] = a / b
//   "alpha_rate"  ()        b   }
// Checkpoint arrays (the whole state, restored bit-exactly):
//   "precision" (d, d) Λ, exactly symmetric and positive definite;
//   "precision_mean" (d) η; "alpha_shape" (); "alpha_rate" ().
// μ, Σ and E[mmᵀ] are recomputed from them deterministically.
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

struct BlrConfig {
  int64_t dim = 0;             // d ∈ [1, 1024]; Σ is d × d, the M-step costs O(d³)
  double prior_shape = 1.0;    // a0: Gamma prior on α, finite and > 0
  double prior_rate = 1.0;     // b0: finite and > 0
  // Absolute floor of the PD projection (the floor used is
  // max(eigenvalue_floor, E[α]), see the header); finite, in (0, 1e6].
  double eigenvalue_floor = 1e-6;
};

// Checks the ranges above; messages name the field ("blr.dim", …) and the
// allowed range.
Status ValidateBlrConfig(const BlrConfig& config);

// Σ_i x_i² in index order, in double. THE definition of "‖x‖₂ ≤ 1" shared
// by the decoder (which guarantees FeatureSquaredNorm(x) ≤ 1) and the
// E-step (which checks it). Overflows to +inf only if some |x_i| is huge,
// which correctly reads as "above 1".
double FeatureSquaredNorm(std::span<const double> x);

// V diag(max(λ_i, floor)) Vᵀ for the symmetric `matrix` = V diag(λ) Vᵀ
// (only its lower triangle is read), symmetrised exactly ((A + Aᵀ)/2): the
// Frobenius-nearest symmetric matrix with all eigenvalues ≥ floor.
// INVALID_ARGUMENT if `matrix` is not square or not finite or `floor` is
// not finite; OUT_OF_RANGE if the eigensolver does not converge.
StatusOr<Eigen::MatrixXd> ProjectToEigenvalueFloor(const Eigen::MatrixXd& matrix, double floor);

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
  Status MStep(const Eigen::VectorXd& statistic_sum, double sampling_rate,
               double rho) override;
  std::vector<model::NamedArray> ReleaseArrays() const override;
  std::vector<model::NamedArray> CheckpointArrays() const override;
  Status RestoreCheckpoint(std::span<const model::NamedArray> arrays) override;

  const BlrConfig& config() const { return config_; }
  const Eigen::VectorXd& mean() const { return mean_; }              // μ
  const Eigen::MatrixXd& covariance() const { return covariance_; }  // Σ
  const Eigen::MatrixXd& precision() const { return precision_; }    // Λ
  const Eigen::VectorXd& precision_mean() const { return precision_mean_; }  // η
  double alpha_shape() const { return alpha_shape_; }
  double alpha_rate() const { return alpha_rate_; }
  double expected_alpha() const { return alpha_shape_ / alpha_rate_; }

  // ⟨ξ⟩ of a feature vector of length d against the current q(m) (what
  // EStep uses). Precondition: x.size() == d, finite.
  double ExpectedXi(std::span<const double> x) const;

 private:
  BlrModel(const BlrConfig& config, privacy::BlockLayout layout);
  // Sets the state and its derived quantities if Λ is positive definite and
  // everything is finite; otherwise returns an error and changes nothing.
  Status SetState(Eigen::MatrixXd precision, Eigen::VectorXd precision_mean, double alpha_shape,
                  double alpha_rate);

  BlrConfig config_;
  privacy::BlockLayout layout_;
  // State (natural parameters).
  Eigen::MatrixXd precision_;       // Λ = Σ⁻¹
  Eigen::VectorXd precision_mean_;  // η = Σ⁻¹ μ
  double alpha_shape_ = 0;          // a
  double alpha_rate_ = 0;           // b
  // Derived from the state.
  Eigen::MatrixXd covariance_;      // Σ
  Eigen::VectorXd mean_;            // μ
  Eigen::MatrixXd second_moment_;   // E[m mᵀ] = μμᵀ + Σ
};

}  // namespace vipsd::models
