// Held-out evaluation of a released Bayesian logistic regression posterior
// q(m) = N(μ, Σ) (core/models/blr.h). Works from the release arrays alone
// ("mean", "covariance"), so vipsd-eval can score a release on disk. The
// held-out records are the evaluator's own, not the daemon's pool; nothing
// here is private.
//
// Predictive probability: the probit ("MacKay") approximation
//   p(y = 1 | x) ≈ σ(κ(s²) μ_a),  μ_a = xᵀμ,  s² = xᵀΣx,  κ(s²) = (1 + π s²/8)^(−½)
// (MacKay 1992, "The evidence framework applied to classification
// networks"; Bishop, PRML 2006, Section 4.5.2): σ is replaced by the
// probit Φ(λa) with λ² = π/8, whose Gaussian convolution is closed-form.
// We work with the predictive logit z = κ(s²) μ_a and never round p: the
// log-loss uses log σ(z) = −log1p(exp(−z)) evaluated stably, so it is
// finite for any finite z (no clamping of probabilities).
//
// AUC: the Mann–Whitney statistic with midranks — scores are ranked
// ascending, tied scores share the mean of their ranks, and
//   AUC = (R₊ − n₊(n₊ + 1)/2) / (n₊ n₋),
// R₊ the rank sum of the positives. Equals P(score₊ > score₋) + ½ P(tie)
// over all positive/negative pairs. Undefined (FAILED_PRECONDITION) unless
// both classes occur.
//
// Log-loss: −(1/n) Σ [y log p + (1 − y) log(1 − p)] in nats.
//
// Thread-safety: pure functions.
#pragma once

#include <Eigen/Core>
#include <cstdint>
#include <span>
#include <vector>

#include "core/base/status.h"
#include "core/model/model.h"
#include "core/release/release.h"

namespace vipsd::models {

struct BlrPosterior {
  Eigen::VectorXd mean;        // μ, d
  Eigen::MatrixXd covariance;  // Σ, d × d, symmetric
};

// From the arrays "mean" (d) and "covariance" (d, d) of a BLR release (other
// arrays are ignored). INVALID_ARGUMENT naming the array if one is missing,
// has the wrong shape, or is not finite, or if the covariance is not
// symmetric (relative 1e-9) or has a negative diagonal.
StatusOr<BlrPosterior> BlrPosteriorFromArrays(std::span<const release::ReleaseArray> arrays);
StatusOr<BlrPosterior> BlrPosteriorFromArrays(std::span<const model::NamedArray> arrays);

// κ(xᵀΣx) · xᵀμ (see header). x.size() must equal the posterior's d.
double PredictiveLogit(const BlrPosterior& posterior, std::span<const double> x);

// σ(z), computed without overflow.
double Sigmoid(double z);

// AUC with midranks; scores and labels (0/1) of equal length.
// INVALID_ARGUMENT for a length mismatch, a non-finite score or a label
// other than 0/1; FAILED_PRECONDITION if a class is absent.
StatusOr<double> AreaUnderRocCurve(std::span<const double> scores,
                                   std::span<const double> labels);

// Mean log-loss of predictive logits (nats). INVALID_ARGUMENT for a length
// mismatch, no records, a non-finite logit or a label other than 0/1.
StatusOr<double> LogLossFromLogits(std::span<const double> logits,
                                   std::span<const double> labels);

struct BlrEvaluation {
  double auc = 0;
  double log_loss = 0;
  double accuracy = 0;  // threshold p ≥ ½, i.e. z ≥ 0
  int64_t records = 0;
  int64_t positives = 0;
};

// Scores every (features, label) pair; features of length d.
StatusOr<BlrEvaluation> EvaluateBlr(const BlrPosterior& posterior,
                                    std::span<const std::vector<double>> features,
                                    std::span<const double> labels);

// How a release's marginal intervals treat a reference posterior's mean
// (issue 50; docs/results.md, "Calibrated posteriors"): for each
// coefficient j, whether |μ_j − ref.μ_j| ≤ z·sqrt(Σ_jj) at the central 50 %
// (z = 0.6745) and 95 % (z = 1.96) intervals, as the fraction of the d
// coefficients, and the median over j of sqrt(Σ_jj / ref.Σ_jj).
struct BlrCoverage {
  double coverage_50 = 0;
  double coverage_95 = 0;
  double sd_ratio_median = 0;
  int64_t coefficients = 0;
};
// INVALID_ARGUMENT when the dimensions differ or a variance is not > 0.
StatusOr<BlrCoverage> CoverageOfReference(const BlrPosterior& posterior,
                                          const BlrPosterior& reference);

}  // namespace vipsd::models
