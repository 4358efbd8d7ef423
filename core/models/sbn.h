// Sigmoid belief network with one hidden layer for VIPS (docs/models.md;
// Park, Foulds, Chaudhuri, Welling, "Variational Bayes In Private Settings",
// JMLR 2020, Algorithm 6), with the Pólya-Gamma augmentation and mean-field
// updates of Gan, Henao, Carlson, Carin, "Learning Deep Sigmoid Belief
// Networks with Data Augmentation" (AISTATS 2015), and the stochastic
// natural-parameter step of Hoffman, Blei, Wang, Paisley (JMLR 2013).
//
// Model (J visible units, K hidden units; b is the HIDDEN bias, c the
// VISIBLE bias, as in docs/models.md and the paper's code):
//   z_k ~ Bernoulli(σ(b_k)),  y_j | z ~ Bernoulli(σ(ψ_j)),  ψ_j = w_jᵀz + c_j,
//   w_j ~ N(0, α_W⁻¹ I) (row j of W, length K), c_j ~ N(0, α_c⁻¹), b_k ~ N(0, α_b⁻¹).
// Prior on W: an isotropic Gaussian, NOT the paper's TPBN shrinkage prior.
// Reasons: the TPBN's local scales are re-estimated from E[w_jk²], which in
// private runs is dominated by the noise of the W precision matrices, so the
// shrinkage would feed noise back into the prior; the Gaussian keeps the
// M-step closed-form (no GIG/Bessel updates, no extra hyperparameter state
// to checkpoint); and the quality measure (reconstruction accuracy) does not
// need sparse W. The prior precisions are public configuration.
// PG augmentation (Polson, Scott, Windle 2013): with ξ⁽⁰⁾_j ~ PG(1, ·) and
// ξ⁽¹⁾_k ~ PG(1, ·), p(y_j | ψ_j, ξ⁽⁰⁾_j) ∝ exp((y_j − ½)ψ_j − ½ ξ⁽⁰⁾_j ψ_j²) and
// p(z_k | b_k, ξ⁽¹⁾_k) ∝ exp((z_k − ½)b_k − ½ ξ⁽¹⁾_k b_k²).
// Mean field: q(W) = Π_j N(μ_j, Σ_j) (full K × K covariance per row),
// q(c) = Π_j N, q(b) = Π_k N, and per record q(z) = Π_k Bernoulli(m_k),
// q(ξ⁽⁰⁾_j) = PG(1, t_j). Q_j := E[w_j w_jᵀ] = μ_jμ_jᵀ + Σ_j.
//
// E-step for one record y (behind the wall; the mean-field VB updates of
// Gan et al. 2015 and of the authors' code (sbn_vb_priv.m), here
// with the full row covariances), against the released q(W) q(b) q(c):
//   E[ψ_j²] = mᵀQ_j m + Σ_k Q_j,kk m_k(1 − m_k) + 2E[c_j]μ_jᵀm + E[c_j²],
//   ⟨ξ_j⟩ = PolyaGammaMean(sqrt(E[ψ_j²])) = tanh(t/2)/(2t),  t = sqrt(E[ψ_j²]);
//   with M = Σ_j ⟨ξ_j⟩ Q_j and g = μᵀ(y − ½) (μ the J × K mean of W):
//   logit m_k = E[b_k] + g_k − Σ_j ⟨ξ_j⟩E[c_j]μ_jk − ½ M_kk − Σ_{l≠k} M_kl m_l.
// Each m_k update is the exact coordinate maximiser of the local ELBO with
// the Jaakkola–Jordan (equivalently PG) bound, and each ξ update is the
// exact maximiser over t, so every update increases the local ELBO.
// Schedule: m ← σ(E[b]); repeat up to estep_max_iterations times: update
// ⟨ξ⟩ from m, then sweep k = 0..K−1 in order until no m_k moves by more
// than estep_tolerance (at most 100 sweeps; a sweep is O(K²)); stop when no
// m_k moved by more than estep_tolerance over the whole iteration. Finally
// ⟨ξ⟩ is recomputed from the final m. Deterministic (no randomness). Cost
// per iteration O(J·K²) (two passes over the J × K(K+1)/2 array of Q).
// q(ξ⁽¹⁾) depends only on the released q(b): it lives in the M-step and is
// never noised.
//
// Per-record statistic: seven blocks, ONE Gaussian mechanism (docs/privacy_accounting.md §1).
// m_k = ⟨z_k⟩, ξ_j = ⟨ξ⁽⁰⁾_j⟩, v = packed upper triangle of ⟨zzᵀ⟩ in LAPACK
// 'U' order (block_layout.h: v[i + l(l+1)/2] = ⟨z_i z_l⟩, i ≤ l; ⟨z_k z_k⟩ =
// m_k, ⟨z_i z_l⟩ = m_i m_l for i ≠ l), P = K(K+1)/2:
//   block      coordinates        value                    proven bound B_b
//   "count"    1                  1                        1
//   "z"        K                  m_k − ½                  √K / 2
//   "y"        J                  y_j − ½                  √J / 2
//   "xi"       J                  ξ_j                      √J / 4
//   "xi_z"     J·K  (j·K + k)     ξ_j m_k                  √(J·K) / 4
//   "y_z"      J·K  (j·K + k)     (y_j − ½) m_k            √(J·K) / 2
//   "xi_zz"    J·P  (j·P + p)     ξ_j v_p                  √(J·P) / 4
// These are the paper's blocks (z; y; ⟨ξ⁽⁰⁾⟩; ⟨ξ⁽⁰⁾⟩⟨z⟩ᵀ; y⟨z⟩ᵀ;
// ⟨ξ⁽⁰⁾_j⟩⟨zzᵀ⟩, cf. the authors' released code, sbn_vb_priv.m) with two
// changes: (1) sums, not means; z, y and y⟨z⟩ᵀ are centred by ½ per record,
// which halves their bounds (Σ(y − ½) = Σy − N/2 carries the same
// information once N is known); (2) the "count" block estimates N, the
// number of records, which the M-step needs for the ½-terms of the paper's
// updates and for q(b) (Σ_n ⟨ξ⁽¹⁾⟩ = N⟨ξ⁽¹⁾⟩); the paper uses the known data
// and batch sizes, which are private here (docs/models.md, "The stochastic step"). The W precision
// block is one vector block of all J packed triangles (one bound for all
// rows) rather than J symmetric blocks: the noise per coordinate is nearly
// the same (σ√B·C_b), and the other blocks keep B = 7 instead of J + 6.
//
// Bound proofs. Adjacency: add/remove one record, so each block's sum
// changes by exactly that record's block and its sensitivity is the
// record's L2 norm; it suffices to bound every record's block norm. For
// every y ∈ {0,1}^J (the E-step rejects anything else) and every q(W), q(b),
// q(c) (any released parameters, however extreme):
//   (a) m_k ∈ [0, 1]: m_k = 1/(1 + exp(−x)) with exp(·) ∈ [0, +∞] gives a
//       value in [0, 1] in IEEE arithmetic (NaN logits are mapped to ½);
//       the code clamps to [0, 1] as well.
//   (b) ξ_j ∈ [0, ¼]: tanh(u)/u is decreasing on u > 0 with limit 1 at 0,
//       so tanh(t/2)/(2t) = ¼·tanh(t/2)/(t/2) ≤ ¼ for every t ≥ 0; the code
//       clamps to [0, ¼] (E[ψ²] is clamped at 0 first), so the bound never
//       rests on E[ψ²] being computed accurately.
//   (c) |y_j − ½| = ½ exactly.
//   count: ‖1‖ = 1.   z: |m_k − ½| ≤ ½ ⇒ ‖·‖ ≤ √K/2.   y: ‖·‖ = √J/2.
//   xi: ‖ξ‖ ≤ √J·¼.   xi_z = ξ mᵀ: ‖ξ mᵀ‖_F = ‖ξ‖‖m‖ ≤ (√J/4)·√K.
//   y_z: ‖(y − ½)mᵀ‖_F = (√J/2)‖m‖ ≤ √(JK)/2.
//   xi_zz = ξ ⊗ v: ‖·‖ = ‖ξ‖‖v‖, ‖v‖² = Σ_k m_k² + Σ_{i<l} m_i²m_l²
//       ≤ K + K(K−1)/2 = P ⇒ ‖·‖ ≤ √J·¼·√P.
// Every bound is approached (m → 1, ξ → ¼ as E[ψ²] → 0), so none can be
// tightened for all parameters. Rounding: after computing the values the
// E-step passes each block through privacy::ClipToL2Bound(B_b), whose
// rigorous (pessimistic) norm makes every emitted block ≤ B_b even where a
// bound is attained (the y block always has norm exactly √J/2); blocks
// clearly inside are bit-for-bit unchanged. The mechanism clips again at
// C_b = a_b·B_b (clip fractions a_b ∈ (0, 1], default 1), so privacy never
// rests on the E-step.
//
// Size: J·(2 + 2K + P) + K + 1 coordinates; for J = 784, K = 50 that is
// 1,079,619 (the xi_zz block alone is 999,600). The statistic is dense and
// emitted listing every coordinate.
//
// M-step with the noisy sum S̃ (after the one mechanism), sampling rate q
// and step size ρ. Every quantity below is post-processing of S̃, the
// public q and the previous public state. Estimates of pool-wide sums:
//   N̂ = max(S̃_count/q, 0); Z = S̃_z/q, Y = S̃_y/q, X = S̃_xi/q, XZ = S̃_xi_z/q,
//   YZ = S̃_y_z/q, S_j = S̃_xi_zz,j/q (unpacked to K × K).
// Feasibility clamps (each exact sum lies in its box when N̂ = N, so the
// clamp can only remove noise that points out of the feasible set):
//   Z, Y, YZ ∈ [−N̂/2, N̂/2]; X, XZ ∈ [0, N̂/4].
// Intermediate natural parameters (Gan et al. 2015 updates, as sums):
//   Λ̂_j = Project(α_W I + S_j),  ĥ_j = YZ_j − E[c_j]·XZ_j        (row j of W)
//   λ̂c_j = α_c + X_j,            ĥc_j = Y_j − μ_jᵀXZ_j
//   λ̂b_k = α_b + N̂·⟨ξ⁽¹⁾_k⟩,     ĥb_k = Z_k,   ⟨ξ⁽¹⁾_k⟩ = PolyaGammaMean(√E[b_k²])
// (E[c_j], μ_j and q(b) are the values before this step, as in SVI.)
// Project (post-processing; noise-level eigenvalue floor and a ceiling):
// with S_j = V diag(λ) Vᵀ (symmetric eigendecomposition) and the noise
// radius r = max(0, −min_i λ_i),
//   Project(α_W I + S_j) = V diag(min(max(λ_i, r) + α_W, α_W + N̂(K + ¼)/4)) Vᵀ.
// Why: the exact S_j = Σ_n ξ_nj⟨z_n z_nᵀ⟩ is positive semi-definite with
// largest eigenvalue ≤ N·¼·(‖m‖² + ¼) ≤ N(K + ¼)/4 (⟨zzᵀ⟩ = mmᵀ +
// diag(m − m²)), so without noise r = 0 (up to rounding) and Project
// returns the exact α_W I + S_j. The added Gaussian matrix has a spectrum
// symmetric around 0 (a Wigner semicircle of radius ≈ 2√K times the
// per-entry noise std), so r estimates the noise radius from the release
// itself. Flooring every eigenvalue at r — not at 0 — keeps directions whose
// estimate is pure noise at a precision of the noise's size, so the mean
// Λ̂⁻¹ĥ is shrunk there instead of amplified to ĥ/α_W (flooring at 0 lets W
// explode in private runs; measured, docs/sbn_model.md). It
// depends only on the released sum, hence is
// post-processing. Blending (SVI): every natural parameter moves as
// η ← (1 − ρ)η + ρη̂ (Λ_j, h_j = Λ_jμ_j, λc, hc, λb, hb); a convex
// combination of positive-definite matrices stays positive definite. Then
// Σ_j = Λ_j⁻¹ and μ_j = Σ_j h_j (Cholesky), and the E-step expectations are
// recomputed. The sums are divided by q, never by the realised batch size.
//
// Initialisation (public, data-independent, seeded by init_seed): μ_jk ~
// N(0, init_weight_std²) (std::mt19937_64 + std::normal_distribution),
// Σ_j = init_variance·I, E[b] = E[c] = 0 with variance init_variance.
// A small initial variance matters: with unit variances the E-step's
// penalty ½Σ_j ξ_j E[w_jk²] switches every hidden unit off and SVI stalls.
//
// Public start (SetPublicPrior; model.public_prior, docs/models.md "Public
// priors"): instead of the random initialisation the run starts from the
// variational state of a NON-PRIVATE SBN release fitted on public records
// (same J and K): Λ_j = Σ_j⁻¹, h_j = Λ_jμ_j from its "w_mean" and
// "w_covariance", and the bias precisions and precision-means from
// "b_mean"/"b_variance" and "c_mean"/"c_variance" (so the model's release
// arrays equal the public ones up to the rounding of Σ → Λ → Σ). It is
// ONLY the start, as for LDA: the prior of W stays N(0, α_W⁻¹ I) (and those
// of b and c stay theirs), every later step is the same private step on the
// same statistic, charged the same ε, and the SVI blend η ← (1 − ρ)η + ρη̂
// forgets the start at the rate Π_t(1 − ρ_t) like any other start. What it
// buys is an E-step that already assigns records to hidden units the public
// data know, so the first noisy statistics carry that structure instead of
// the noise having to break the symmetry of a random start. The public
// precisions are those of the public fit (they scale with its number of
// records, not with the private pool's); this model's init_seed is then
// unused and the public release's hyperparameters are not read (its prior
// precisions may differ). Why not also the prior of W
// (as BLR does): a public posterior's precision grows with the number of
// public records, so as a fixed prior it would outweigh the private data
// unless its scale were learnt (BLR's evidence update of α); an SBN has no
// such update, and the M-step's projection and ceiling (above) are derived
// for the isotropic α_W I only.
//
// Release arrays (row-major doubles; all public post-processing):
//   "w_mean"        (J, K)  μ
//   "w_covariance"  (J, P)  row j = Σ_j packed (LAPACK 'U', as above)
//   "b_mean" (K), "b_variance" (K), "c_mean" (J), "c_variance" (J).
// Evaluation (sbn_eval.h) needs all of them: the held-out E-step uses Σ_j.
// Checkpoint arrays (the whole state, restored bit-exactly): the natural
// parameters "w_precision" (J, P) packed Λ_j, "w_precision_mean" (J, K) h_j,
// "b_precision" (K), "b_precision_mean" (K), "c_precision" (J),
// "c_precision_mean" (J); everything else is recomputed from them.
//
// Privacy: records and per-record fits are private; nothing here logs. EStep
// errors name no record content. Thread-safety: EStep, FitRecord and the
// accessors are const and may run concurrently (each thread with its own
// scratch); MStep and RestoreCheckpoint must not run concurrently with them
// (model.h).
#pragma once

#include <Eigen/Core>
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/base/status.h"
#include "core/model/model.h"
#include "core/models/polya_gamma.h"

namespace vipsd::models {

// Per-block clip fractions a_b ∈ (0, 1]: the mechanism clips block b at
// C_b = a_b·B_b (B_b its proven bound). 1 = clip only at the proof (no bias).
// A fraction below 1 trades bias (records whose block is larger are scaled
// down) for less noise (the noise std of block b is σ·√7·C_b).
struct SbnClipFractions {
  double count = 1;
  double z = 1;
  double y = 1;
  double xi = 1;
  double xi_z = 1;
  double y_z = 1;
  double xi_zz = 1;
};

struct SbnConfig {
  int64_t visible = 0;  // J ∈ [1, 65536]
  int64_t hidden = 0;   // K ∈ [1, 1024]; the statistic size (header) ≤ 2^26
  double weight_prior_precision = 1.0;        // α_W, finite, > 0
  double visible_bias_prior_precision = 1.0;  // α_c, finite, > 0
  double hidden_bias_prior_precision = 1.0;   // α_b, finite, > 0
  double init_weight_std = 0.1;  // std of the initial W means, finite, ≥ 0
  double init_variance = 0.01;   // initial posterior variance of W, b, c; (0, 1e6]
  int estep_max_iterations = 100;  // [1, 100000]
  double estep_tolerance = 1e-4;   // max |Δ m_k| for convergence; finite, > 0
  uint64_t init_seed = 0;
  SbnClipFractions clip_fractions;  // each in (0, 1]
};

// Validates every range above; messages name the field ("sbn.hidden", …)
// and the allowed range.
Status ValidateSbnConfig(const SbnConfig& config);

// Block order of the statistic (header table).
enum SbnBlock : size_t { kSbnCount = 0, kSbnZ, kSbnY, kSbnXi, kSbnXiZ, kSbnYZ, kSbnXiZZ };
inline constexpr size_t kSbnNumBlocks = 7;
inline constexpr std::array<std::string_view, kSbnNumBlocks> kSbnBlockNames = {
    "count", "z", "y", "xi", "xi_z", "y_z", "xi_zz"};

// The proven bounds B_b (header), in block order.
std::array<double, kSbnNumBlocks> SbnProvenBounds(int64_t visible, int64_t hidden);

// K(K+1)/2.
inline int64_t SbnPackedSize(int64_t hidden) { return hidden * (hidden + 1) / 2; }

namespace sbn {

// 1/(1 + exp(−x)) in [0, 1]; NaN gives ½.
double Sigmoid(double x);

}  // namespace sbn

// The expectations under q(W) q(b) q(c) that the E-step and the evaluation
// read. Built from the model state or from release arrays.
struct SbnExpectations {
  int64_t visible = 0;
  int64_t hidden = 0;
  Eigen::MatrixXd w_mean;           // J × K: μ
  Eigen::MatrixXd w_second_packed;  // J × P: row j = Q_j = μ_jμ_jᵀ + Σ_j, packed 'U'
  Eigen::MatrixXd w_second_diag;    // J × K: Q_j,kk = E[w_jk²]
  Eigen::VectorXd c_mean;           // J: E[c_j]
  Eigen::VectorXd c_second;         // J: E[c_j²]
  Eigen::VectorXd b_mean;           // K: E[b_k]
};

// From means and (co)variances: w_mean J × K, w_covariance J × P (packed
// rows), b_mean K, c_mean and c_variance J. INVALID_ARGUMENT (naming the
// argument) for inconsistent shapes, non-finite values or negative
// variances (covariances are not checked for positive semi-definiteness:
// the E-step clamps E[ψ²] at 0).
StatusOr<SbnExpectations> MakeSbnExpectations(const Eigen::MatrixXd& w_mean,
                                              const Eigen::MatrixXd& w_covariance_packed,
                                              const Eigen::VectorXd& b_mean,
                                              const Eigen::VectorXd& c_mean,
                                              const Eigen::VectorXd& c_variance);

// From the release arrays "w_mean", "w_covariance", "b_mean", "c_mean",
// "c_variance" (others, e.g. "b_variance", are ignored). Messages name the
// array.
StatusOr<SbnExpectations> SbnExpectationsFromRelease(std::span<const model::NamedArray> arrays);

// Result of the per-record fixed point (private when computed on a pool
// record).
struct SbnLocalFit {
  Eigen::VectorXd z_mean;  // m = ⟨z⟩, K, in [0, 1]
  Eigen::VectorXd xi;      // ⟨ξ⁽⁰⁾⟩, J, in [0, ¼]
  int iterations = 0;      // outer iterations run
  bool converged = false;  // false: stopped at max_iterations
};

// Reusable buffers for FitSbnLocal; one per thread.
struct SbnFitScratch {
  Eigen::VectorXd y_half, g, r, u, quad, diag_term, second, m_prev, m_var, v, base, packed_m;
  Eigen::MatrixXd interaction;  // K × K: M
};

// The E-step fixed point (header) for observations y (length J, values in
// {0, 1}; the caller checks) against `e`.
void FitSbnLocal(const SbnExpectations& e, std::span<const double> y, int max_iterations,
                 double tolerance, SbnFitScratch& scratch, SbnLocalFit& fit);

class SbnModel final : public model::Model {
 public:
  static StatusOr<std::unique_ptr<SbnModel>> Create(const SbnConfig& config);

  std::string type() const override { return "sbn"; }
  const privacy::BlockLayout& statistic_layout() const override { return layout_; }
  // {{"J", J}, {"K", K}}.
  std::vector<std::pair<std::string, int64_t>> dimensions() const override;
  bool has_proven_bounds() const override { return true; }
  std::unique_ptr<model::EStepScratch> NewScratch() const override;
  // INVALID_ARGUMENT if record.features is not J values in {0, 1} (the
  // message names no value).
  Status EStep(const model::Record& record, model::RecordRng& rng,
               model::EStepScratch& scratch, model::SparseStatistic& out) const override;
  // INVALID_ARGUMENT for a wrong size, q ∉ (0, 1] or ρ ∉ (0, 1]; OUT_OF_RANGE
  // for a non-finite sum or if the update fails (not finite / Cholesky
  // fails; cannot happen for finite input short of overflow). On error the
  // model is unchanged.
  Status MStep(const Eigen::VectorXd& statistic_sum, const privacy::SampledGaussian& released_by,
               double rho) override;
  std::vector<model::NamedArray> ReleaseArrays() const override;
  std::vector<model::NamedArray> CheckpointArrays() const override;
  // Exactly the six checkpoint arrays (any order), shapes as documented,
  // finite, precisions > 0 and every Λ_j positive definite; otherwise
  // INVALID_ARGUMENT naming the array and the model is unchanged.
  Status RestoreCheckpoint(std::span<const model::NamedArray> arrays) override;
  // The public start (header, "Public start"): `arrays` are the release
  // arrays of a non-private SBN fit of the same J and K ("w_mean" (J, K),
  // "w_covariance" (J, K(K+1)/2), "b_mean" and "b_variance" (K), "c_mean"
  // and "c_variance" (J); others are ignored). Each must be present with
  // that shape and finite, every variance > 0 and every Σ_j positive
  // definite (a precision Σ_j⁻¹ that is valid); otherwise INVALID_ARGUMENT
  // naming the array (and its expected shape) and the model is unchanged.
  Status SetPublicPrior(std::span<const model::NamedArray> arrays) override;

  const SbnConfig& config() const { return config_; }
  const SbnExpectations& expectations() const { return expectations_; }
  // Proven bounds B_b (the layout holds C_b = a_b·B_b).
  const std::array<double, kSbnNumBlocks>& proven_bounds() const { return proven_bounds_; }
  const Eigen::MatrixXd& w_mean() const { return expectations_.w_mean; }  // J × K
  const Eigen::MatrixXd& w_covariance_packed() const { return w_covariance_packed_; }  // J × P
  const Eigen::VectorXd& b_mean() const { return expectations_.b_mean; }
  const Eigen::VectorXd& b_variance() const { return b_variance_; }
  const Eigen::VectorXd& c_mean() const { return expectations_.c_mean; }
  const Eigen::VectorXd& c_variance() const { return c_variance_; }

  // The E-step fixed point for y (J values in {0, 1}) against the current
  // parameters, as EStep computes it.
  StatusOr<SbnLocalFit> FitRecord(std::span<const double> y) const;

 private:
  SbnModel(const SbnConfig& config, privacy::BlockLayout layout);
  // Replaces the state with the given natural parameters and recomputes
  // everything derived, or returns an error and changes nothing.
  Status SetState(Eigen::MatrixXd w_precision, Eigen::MatrixXd w_precision_mean,
                  Eigen::VectorXd b_precision, Eigen::VectorXd b_precision_mean,
                  Eigen::VectorXd c_precision, Eigen::VectorXd c_precision_mean);

  SbnConfig config_;
  privacy::BlockLayout layout_;
  std::array<double, kSbnNumBlocks> proven_bounds_{};
  // State: natural parameters.
  Eigen::MatrixXd w_precision_;       // J × P, row j = Λ_j packed
  Eigen::MatrixXd w_precision_mean_;  // J × K, row j = h_j = Λ_j μ_j
  Eigen::VectorXd b_precision_, b_precision_mean_;  // K
  Eigen::VectorXd c_precision_, c_precision_mean_;  // J
  // Derived.
  Eigen::MatrixXd w_covariance_packed_;  // J × P
  Eigen::VectorXd b_variance_, c_variance_;
  SbnExpectations expectations_;
};

}  // namespace vipsd::models
