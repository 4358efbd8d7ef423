// Latent Dirichlet allocation for VIPS (docs/models.md; Park et al. 2020,
// Algorithm 3; the E-step is the implicit-φ mean-field fixed point of
// Hoffman, Blei, Wang, Paisley, "Stochastic Variational Inference", 2013).
//
// K topics over a fixed PUBLIC vocabulary of V terms (a vocabulary built from
// the private stream would leak). Variational parameters: λ (K × V, Dirichlet
// over each topic's words) held globally; γ (per document, K) fitted inside
// the E-step and discarded.
//
// Per-record statistic (one block "topic_word", K·V coordinates, word-major
// v·K + k, i.e. the column-major layout of λ): s_d[k, v] = Σ_n φ_dn^k
// 1[w_dn = v], computed from the document's words w_d1..w_dN. Word-major
// keeps a document's K·m values in m contiguous runs of K, which the
// mechanism's accumulator and the M-step read with few cache misses.
//   * Private mode (resample_length N ≥ 1): the document is replaced by N
//     draws with replacement from its in-vocabulary tokens, so every document
//     has exactly N words (an empty document contributes the zero vector).
//     Bound: for each word v, Σ_k s_d[k, v] = c_v (its count; φ sums to 1 over
//     k), so ‖s_d‖₂² = Σ_v Σ_k s_d[k,v]² ≤ Σ_v c_v² ≤ (Σ_v c_v)² = N². The
//     block's clip bound is C = a·N (clip_fraction a; paper a = 0.1).
//   * Non-private mode (resample_length 0): the document's actual tokens, as
//     in standard SVI and the peer libraries. No bound is claimed
//     (has_proven_bounds() is false) and the driver refuses σ > 0.
//
// E-step per document, against the released λ (post-processing):
//   γ ← 1 (every k); repeat ≤ estep_max_iterations times:
//     e_k = exp(ψ(γ_k) − ψ(Σγ)); n_v = Σ_k e_k·expElogβ[k,v] + 1e-100;
//     γ'_k = α + e_k·Σ_v c_v·expElogβ[k,v]/n_v; stop if mean|γ' − γ| < tol.
//   With the final e (recomputed from the final γ) and n:
//     s[k,v] = e_k·expElogβ[k,v]·c_v/n_v, listed word by word.
//   ψ and exp(ψ(·) − c) come from core/models/digamma.h (vectorised; checked
//   against Boost.Math's digamma to 1e-12, observed ~2e-15). The loop works
//   on K padded to an even length and fuses both products with
//   expElogβ[:, words] into one pass over the gathered columns, four at a
//   time; it allocates nothing once the scratch buffers have grown.
// M-step with the noisy sum S̃ (docs/models.md, "Noise-aware posteriors"):
// negatives clamped to 0 (post-processing), λ̂ = η + S̃/q, λ ← (1 − ρ)λ + ρλ̂,
// in place; then exp(E[log β]) is recomputed, on mstep_threads threads
// (split by columns, so the result does not depend on the count). The clamp
// leaves noise mass in λ: with s the noise std per cell (one block,
// privacy::NoiseStdPerBlock) and s_t = s/q, a cell without counts gets
// max(n, 0), of mean s_t/√(2π) and variance s_t²(1/2 − 1/(2π)), each step;
// a cell whose counts stand clear of 0 gets n, of variance s_t². The M-step
// carries both, exactly (steps' noises are independent):
//   noise_floor f ← (1 − ρ)f + ρ·s_t/√(2π)
//   noise_floor_variance u ← (1 − ρ)²u + ρ²s_t²(1/2 − 1/(2π))
//   noise_variance v ← (1 − ρ)²v + ρ²s_t²
// so that λ_kw − η = (the cell's counts, estimated) + (noise): f of λ_kw is
// noise where the topic has no count of w, and λ_kw − η − f within a few
// √u of 0 is not distinguishable from noise. The clamp's mass stays in λ
// (the E-step's smoothing; removing it was measured to cost held-out
// perplexity, docs/models.md) but is stated as noise, not counts.
//
// Release: "lambda" (K × V; E[β] = λ / row sums), "noise_floor" [f],
// "noise_floor_variance" [u], "noise_variance" [v] (shape (1) each) and
// "noise_share" [K]: the share of topic k's mass beyond η that the noise
// floor accounts for, min(1, V·f / Σ_w (λ_kw − η)).
// Checkpoint: "lambda" and the three scalars; a checkpoint of the earlier
// format ("lambda" alone) restores with no noise counted.
//
// Thread-safety: EStep and the evaluation functions are const and may run
// concurrently; MStep must not run concurrently with them (model.h).
#pragma once

#include <Eigen/Core>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/base/status.h"
#include "core/model/model.h"

namespace vipsd::models {

// model.public_prior.weight's default (LdaConfig::public_start_weight).
inline constexpr double kDefaultPublicStartWeight = 0.01;

struct LdaConfig {
  int64_t num_topics = 0;       // K ≥ 1
  int64_t vocabulary_size = 0;  // V ≥ 1
  double alpha = 0;             // Dirichlet prior on θ_d, > 0
  double eta = 0;               // Dirichlet prior on β_k, > 0
  // N: words per document after resampling; 0 = actual tokens (non-private).
  int64_t resample_length = 500;
  double clip_fraction = 0.1;   // a ∈ (0, 1]; C = a·N
  int estep_max_iterations = 100;
  double estep_tolerance = 1e-3;  // mean |Δγ|
  // Seed of the (public, data-independent) initialisation
  // λ ~ Gamma(100, 1/100), as in Hoffman's online LDA and scikit-learn.
  uint64_t init_seed = 0;
  // m ∈ (0, 1]: the public start's share of λ₀ (SetPublicPrior). The
  // default was chosen on the validation file (docs/results.md §7).
  double public_start_weight = kDefaultPublicStartWeight;
  // Threads for the K·V work of MStep (the blend and E[log β]), in [1, 256];
  // typically the step driver's thread count. Every entry is computed the
  // same way whatever the count (columns are split, row sums stay serial),
  // so results do not depend on it.
  int mstep_threads = 1;
};

// Validates the ranges above; messages name the field and the allowed range.
Status ValidateLdaConfig(const LdaConfig& config);

// Result of the E-step fixed point for one document (behind the wall).
struct LdaDocumentFit {
  Eigen::VectorXd gamma;  // K
  int iterations = 0;
};

class LdaModel final : public model::Model {
 public:
  static StatusOr<std::unique_ptr<LdaModel>> Create(const LdaConfig& config);

  std::string type() const override { return "lda"; }
  const privacy::BlockLayout& statistic_layout() const override { return layout_; }
  std::vector<std::pair<std::string, int64_t>> dimensions() const override;
  bool has_proven_bounds() const override { return config_.resample_length > 0; }
  std::unique_ptr<model::EStepScratch> NewScratch() const override;
  Status EStep(const model::Record& record, model::RecordRng& rng,
               model::EStepScratch& scratch, model::SparseStatistic& out) const override;
  Status MStep(const Eigen::VectorXd& statistic_sum, const privacy::SampledGaussian& released_by,
               double rho) override;
  std::vector<model::NamedArray> ReleaseArrays() const override;
  // "lambda" and the noise scalars (header, "M-step").
  std::vector<model::NamedArray> CheckpointArrays() const override;
  Status RestoreCheckpoint(std::span<const model::NamedArray> arrays) override;
  // The public start (no noise counted): a blend of the seeded random start
  // R (Create) and the public release's "lambda" P, each public topic
  // rescaled to its random topic's mass:
  //   λ₀[k] = (1 − m)·R[k] + m·(|R[k]| / |P[k]|)·P[k],  m = public_start_weight,
  // |x| = Σ_v x_v. So every topic keeps the random start's mass and only its
  // shape moves towards the public topic. Why a blend: the start decides
  // which topics the first E-step sorts documents into; a full public start
  // (m = 1) locks the private run into the public topics, which costs
  // quality when the public source is of another kind, and a small share
  // gives the first E-step the public structure without that lock
  // (docs/results.md §7 measures m). R is regenerated from init_seed, so the
  // result does not depend on what λ was before the call.
  Status SetPublicPrior(std::span<const model::NamedArray> arrays) override;

  const LdaConfig& config() const { return config_; }
  // K × V.
  const Eigen::MatrixXd& lambda() const { return lambda_; }
  // Replaces λ (e.g. restored from a release, for evaluation); K × V,
  // finite and > 0. No noise is counted for it.
  Status SetLambda(const Eigen::MatrixXd& lambda);
  // The noise carried in λ (header, "M-step").
  struct Noise {
    double floor = 0;           // f: mean noise mass of a cell without counts
    double floor_variance = 0;  // u: its variance
    double variance = 0;        // v: noise variance of a cell with counts
  };
  const Noise& noise() const { return noise_; }
  // Per topic: the share of its mass beyond η that the noise floor accounts for.
  Eigen::VectorXd NoiseShare() const;
  const Eigen::MatrixXd& exp_elog_beta() const { return exp_elog_beta_; }

  // The E-step fixed point for unique words `words` with counts `counts`
  // (the same iteration EStep uses), against the current λ.
  LdaDocumentFit FitDocument(std::span<const int32_t> words,
                             std::span<const double> counts) const;

 private:
  LdaModel(const LdaConfig& config, privacy::BlockLayout layout);
  // FitDocument into the buffers of an LdaScratch (no allocation once the
  // buffers have grown): leaves γ in the scratch and returns the iterations.
  int FitDocumentInto(std::span<const int32_t> words, std::span<const double> counts,
                      model::EStepScratch& scratch) const;
  // The K × V matrix of a row-major array named "lambda", or an error that
  // starts with `what`.
  StatusOr<Eigen::MatrixXd> LambdaFromArray(const model::NamedArray& array,
                                            const std::string& what) const;
  // E[log β] and exp(E[log β]) from λ, on config_.mstep_threads threads.
  void RecomputeExpectations();

  LdaConfig config_;
  privacy::BlockLayout layout_;
  Noise noise_;
  Eigen::MatrixXd lambda_;         // K × V
  Eigen::MatrixXd exp_elog_beta_;  // K × V, exp(ψ(λ) − ψ(Σ_v λ))
};

// exp(ψ(γ_k) − ψ(Σγ)).
Eigen::VectorXd ExpDirichletExpectation(const Eigen::VectorXd& gamma);

// Sorted unique words and their counts from a token list.
void CountWords(std::span<const int32_t> tokens, std::vector<int32_t>* words,
                std::vector<double>* counts);

// Reusable buffers of ResampleWords.
struct ResampleBuffers {
  std::vector<int32_t> tokens;    // the draws (documents at least `draws` long)
  std::vector<int32_t> distinct;  // the document's sorted distinct words
  std::vector<uint32_t> slot;     // per position: its word's index in `distinct`
  std::vector<double> tally;      // per distinct word: how often it was drawn
};

// The private E-step's document: `draws` tokens drawn with replacement from
// `document` (non-empty), position rng.Below(|document|) for each draw in
// turn, as sorted unique words and their counts. Exactly CountWords of the
// draws: a document shorter than `draws` tallies the draws per distinct word
// instead of sorting them (a Wikipedia paragraph has ~60 words against the
// default N = 500; the sort was 9.5 % of a daemon's CPU at V = 2,000); a
// longer one sorts the draws.
void ResampleWords(std::span<const int32_t> document, int64_t draws, model::RecordRng& rng,
                   ResampleBuffers& buffers, std::vector<int32_t>* words,
                   std::vector<double>* counts);

}  // namespace vipsd::models
