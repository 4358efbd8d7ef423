// Held-out evaluation of a released sigmoid belief network (sbn.h). Works
// from public parameters only (SbnExpectations, e.g. built with
// SbnExpectationsFromRelease); the held-out records are the evaluator's own.
//
// Per record y (J values in {0, 1}): q(z) is inferred with the model's own
// E-step (FitSbnLocal: the mean-field fixed point against q(W) q(b) q(c),
// using the released row covariances), giving m = ⟨z⟩. Then:
//
// Reconstruction accuracy, paper protocol ("accuracy_sampled"): as in the
// authors' code for the VIPS paper (sbn_vb_priv.m, step 6), ONE sample
// z ~ q(z) (z_k = 1 iff u_k < m_k, u_k uniform), and ŷ_j = 1 iff
// σ(μ_jᵀz + E[c_j]) > 0.5, i.e. iff μ_jᵀz + E[c_j] > 0 (posterior means of W
// and c); accuracy = (# pixels with ŷ_j = y_j) / (J · #records). The
// paper's code refines q(z) of the test records by one sweep per training
// iteration; here q(z) is fitted to convergence against the release, which
// is what "infer q(z) from a held-out record" means for a fixed release.
// "accuracy_mean": the same with z replaced by m = E[z] (deterministic).
// Ties (μ_jᵀz + E[c_j] = 0 exactly) predict 0.
//
// Held-out log-likelihood ("loglik_per_record", nats): an importance-
// sampling estimate of log p(y | W̄, b̄, c̄) under the POSTERIOR MEANS of the
// parameters (a plug-in likelihood, not the posterior predictive), with the
// fitted q(z) as proposal, its probabilities clamped to [1e-3, 1 − 1e-3] so
// that every z has positive proposal mass:
//   log p̂(y) = log (1/S) Σ_s p(y | z_s) p(z_s) / q̃(z_s),  z_s ~ q̃.
// p̂ is unbiased for p(y), so by Jensen E[log p̂(y)] ≤ log p(y): the estimate
// is a STOCHASTIC LOWER BOUND that tightens as S grows (Burda, Grosse,
// Salakhutdinov 2016). It is not a bound for any single draw.
//
// Marginal baseline: p_j = (Σ_train y_j + 1)/(N_train + 2) (Laplace-smoothed
// per-pixel frequency); ŷ_j = 1 iff p_j > 0.5; log-likelihood
// Σ_j log Bernoulli(y_j; p_j) per record.
//
// Randomness: record i uses model::RecordRng(seed mixed with i), so results
// do not depend on the thread count. Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/base/status.h"
#include "core/models/sbn.h"

namespace vipsd::models {

struct SbnEvalOptions {
  int estep_max_iterations = 100;  // ≥ 1
  double estep_tolerance = 1e-4;   // > 0
  int importance_samples = 100;    // S ≥ 0; 0 skips the log-likelihood
  uint64_t seed = 0;
  int threads = 1;                 // [1, 256]
};

struct SbnHeldOutResult {
  int64_t records = 0;
  int64_t pixels = 0;            // J · records
  double accuracy_sampled = 0;   // paper protocol
  double accuracy_mean = 0;      // reconstruction from E[z]
  // IS estimate (nats); 0 when importance_samples = 0.
  double loglik_per_record = 0;
  double loglik_per_pixel = 0;
  int importance_samples = 0;
  double mean_estep_iterations = 0;
  int64_t records_at_max_iterations = 0;
};

// INVALID_ARGUMENT if a record is not J values in {0, 1} (naming its index,
// never its content) or an option is out of range; no records is an error.
StatusOr<SbnHeldOutResult> EvaluateSbnHeldOut(const SbnExpectations& expectations,
                                              std::span<const std::vector<double>> records,
                                              const SbnEvalOptions& options);

struct SbnMarginalBaselineResult {
  double accuracy = 0;
  double loglik_per_record = 0;  // nats
  int64_t records = 0;
  int64_t train_records = 0;
};

// Per-pixel marginal baseline fitted on `train`, scored on `test` (both
// non-empty, all records of the same length, values in {0, 1}).
StatusOr<SbnMarginalBaselineResult> SbnMarginalBaseline(
    std::span<const std::vector<double>> train, std::span<const std::vector<double>> test);

}  // namespace vipsd::models
