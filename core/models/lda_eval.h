// Held-out evaluation of a released LDA model (public parameters only; the
// held-out documents are the evaluator's own, not the daemon's pool).
//
// Document completion (Hoffman et al. 2013, Section 4; identical procedure
// to the peer kit's evaluator so the numbers are comparable):
//   B = λ / row sums. For each document with n ≥ 1 tokens, the first
//   h = ⌊n/2⌋ are observed and the rest held out. γ ← α + h/K; repeat ≤ 1000
//   times: e = exp(ψ(γ) − ψ(Σγ)), γ' = α + e ⊙ Σ_w c_w B[:,w]/(eᵀB[:,w]),
//   stop when mean|γ' − γ| < 1e-6. θ̂ = γ/Σγ (θ̂ uniform when h = 0). Every
//   held-out token scores log Σ_k θ̂_k B[k,w]; perplexity = exp(−mean).
// Per-word perplexity bound (Hoffman, Blei, Bach 2010): for each document,
//   the E-step fixed point (the model's own tolerance) against E[log β],
//   then the document part of the ELBO
//     Σ_w c_w log Σ_k exp(E[log θ_k] + E[log β_kw])
//     + Σ_k (α − γ_k) E[log θ_k] + Σ_k lnΓ(γ_k) − lnΓ(Σγ) + lnΓ(Kα) − K lnΓ(α),
//   perplexity = exp(−Σ_d bound_d / Σ_d n_d). The topic-level term of the
//   full ELBO is omitted (it does not depend on the held-out documents).
// Unigram baseline: p(w) = (c_train(w) + η)/(N_train + Vη), scored on the
//   same held-out halves (and on all tokens).
#pragma once

#include <Eigen/Core>
#include <cstdint>
#include <span>
#include <vector>

#include "core/base/status.h"
#include "core/models/lda.h"

namespace vipsd::models {

struct CompletionResult {
  double perplexity = 0;
  double heldout_loglik_per_token = 0;
  int64_t documents = 0;
  int64_t observed_tokens = 0;
  int64_t heldout_tokens = 0;
  double mean_iterations = 0;
  int64_t documents_at_max_iterations = 0;
};

// λ: K × V, finite and > 0. Word ids must be in [0, V).
StatusOr<CompletionResult> DocumentCompletion(const Eigen::MatrixXd& lambda, double alpha,
                                              std::span<const std::vector<int32_t>> documents);

struct BoundResult {
  double perplexity = 0;
  int64_t documents = 0;
  int64_t tokens = 0;
};

StatusOr<BoundResult> PerWordPerplexityBound(const LdaModel& model,
                                             std::span<const std::vector<int32_t>> documents);

struct UnigramResult {
  double completion_perplexity = 0;  // on the held-out halves
  double all_tokens_perplexity = 0;  // on every test token
  int64_t heldout_tokens = 0;
  int64_t tokens = 0;
};

StatusOr<UnigramResult> UnigramBaseline(std::span<const std::vector<int32_t>> train,
                                        std::span<const std::vector<int32_t>> test,
                                        int64_t vocabulary_size, double eta);

}  // namespace vipsd::models
