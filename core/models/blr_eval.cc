#include "core/models/blr_eval.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <numeric>
#include <string>

namespace vipsd::models {
namespace {

using RowMajorMatrix = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// Shared by both array types (same name/shape/data fields).
template <typename Array>
StatusOr<BlrPosterior> PosteriorFrom(std::span<const Array> arrays) {
  const Array* mean = nullptr;
  const Array* covariance = nullptr;
  for (const Array& array : arrays) {
    if (array.name == "mean") mean = &array;
    if (array.name == "covariance") covariance = &array;
  }
  if (mean == nullptr) return InvalidArgumentError("release has no array \"mean\"");
  if (covariance == nullptr) return InvalidArgumentError("release has no array \"covariance\"");
  if (mean->shape.size() != 1 || mean->shape[0] < 1 ||
      mean->data.size() != static_cast<size_t>(mean->shape[0])) {
    return InvalidArgumentError("array \"mean\" must have shape (d,) with d >= 1");
  }
  const int64_t d = mean->shape[0];
  if (covariance->shape != std::vector<int64_t>{d, d} ||
      covariance->data.size() != static_cast<size_t>(d * d)) {
    return InvalidArgumentError("array \"covariance\" must have shape (d, d) matching \"mean\"");
  }
  for (const Array* array : {mean, covariance}) {
    for (double value : array->data) {
      if (!std::isfinite(value)) {
        return InvalidArgumentError("array \"" + array->name + "\" is not finite");
      }
    }
  }
  BlrPosterior posterior;
  posterior.mean = Eigen::Map<const Eigen::VectorXd>(mean->data.data(), d);
  posterior.covariance = Eigen::Map<const RowMajorMatrix>(covariance->data.data(), d, d);
  const double scale = posterior.covariance.cwiseAbs().maxCoeff();
  if ((posterior.covariance - posterior.covariance.transpose()).cwiseAbs().maxCoeff() >
      1e-9 * scale) {
    return InvalidArgumentError("array \"covariance\" is not symmetric");
  }
  if ((posterior.covariance.diagonal().array() < 0).any()) {
    return InvalidArgumentError("array \"covariance\" has a negative diagonal entry");
  }
  return posterior;
}

Status CheckLabels(std::span<const double> labels) {
  for (double label : labels) {
    if (!(label == 0.0 || label == 1.0)) return InvalidArgumentError("labels must be 0 or 1");
  }
  return Status::Ok();
}

// log σ(z) = −log(1 + e^(−z)), stable for any finite z.
double LogSigmoid(double z) {
  return z >= 0 ? -std::log1p(std::exp(-z)) : z - std::log1p(std::exp(z));
}

}  // namespace

StatusOr<BlrPosterior> BlrPosteriorFromArrays(std::span<const release::ReleaseArray> arrays) {
  return PosteriorFrom(arrays);
}

StatusOr<BlrPosterior> BlrPosteriorFromArrays(std::span<const model::NamedArray> arrays) {
  return PosteriorFrom(arrays);
}

double PredictiveLogit(const BlrPosterior& posterior, std::span<const double> x) {
  const Eigen::Map<const Eigen::VectorXd> features(x.data(), static_cast<Eigen::Index>(x.size()));
  const double mean_activation = posterior.mean.dot(features);
  const double variance = std::max(0.0, features.dot(posterior.covariance * features));
  return mean_activation / std::sqrt(1.0 + std::numbers::pi * variance / 8.0);
}

double Sigmoid(double z) {
  if (z >= 0) return 1.0 / (1.0 + std::exp(-z));
  const double e = std::exp(z);
  return e / (1.0 + e);
}

StatusOr<double> AreaUnderRocCurve(std::span<const double> scores,
                                   std::span<const double> labels) {
  if (scores.size() != labels.size()) {
    return InvalidArgumentError("scores and labels differ in length");
  }
  VIPSD_RETURN_IF_ERROR(CheckLabels(labels));
  for (double score : scores) {
    if (!std::isfinite(score)) return InvalidArgumentError("scores must be finite");
  }
  const size_t n = scores.size();
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return scores[a] < scores[b]; });
  double positive_rank_sum = 0;
  double positives = 0;
  for (size_t start = 0; start < n;) {
    size_t end = start;
    while (end < n && scores[order[end]] == scores[order[start]]) ++end;
    // Ranks start + 1 … end share their mean.
    const double midrank = 0.5 * (static_cast<double>(start + 1) + static_cast<double>(end));
    for (size_t k = start; k < end; ++k) {
      if (labels[order[k]] == 1.0) {
        positive_rank_sum += midrank;
        positives += 1;
      }
    }
    start = end;
  }
  const double negatives = static_cast<double>(n) - positives;
  if (positives == 0 || negatives == 0) {
    return FailedPreconditionError("AUC needs at least one positive and one negative record");
  }
  return (positive_rank_sum - positives * (positives + 1) / 2) / (positives * negatives);
}

StatusOr<double> LogLossFromLogits(std::span<const double> logits,
                                   std::span<const double> labels) {
  if (logits.size() != labels.size()) {
    return InvalidArgumentError("logits and labels differ in length");
  }
  if (logits.empty()) return InvalidArgumentError("log-loss needs at least one record");
  VIPSD_RETURN_IF_ERROR(CheckLabels(labels));
  double total = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (!std::isfinite(logits[i])) return InvalidArgumentError("logits must be finite");
    // log p(y) = log σ(z) for y = 1, log σ(−z) for y = 0.
    total -= LogSigmoid(labels[i] == 1.0 ? logits[i] : -logits[i]);
  }
  return total / static_cast<double>(logits.size());
}

StatusOr<BlrEvaluation> EvaluateBlr(const BlrPosterior& posterior,
                                    std::span<const std::vector<double>> features,
                                    std::span<const double> labels) {
  if (features.size() != labels.size()) {
    return InvalidArgumentError("features and labels differ in length");
  }
  std::vector<double> logits(features.size());
  BlrEvaluation evaluation;
  double correct = 0;
  for (size_t i = 0; i < features.size(); ++i) {
    if (features[i].size() != static_cast<size_t>(posterior.mean.size())) {
      return InvalidArgumentError("a record's feature length differs from the release's d");
    }
    logits[i] = PredictiveLogit(posterior, features[i]);
    if ((logits[i] >= 0) == (labels[i] == 1.0)) correct += 1;
    if (labels[i] == 1.0) ++evaluation.positives;
  }
  VIPSD_ASSIGN_OR_RETURN(evaluation.auc, AreaUnderRocCurve(logits, labels));
  VIPSD_ASSIGN_OR_RETURN(evaluation.log_loss, LogLossFromLogits(logits, labels));
  evaluation.records = static_cast<int64_t>(features.size());
  evaluation.accuracy = correct / static_cast<double>(features.size());
  return evaluation;
}

StatusOr<BlrCoverage> CoverageOfReference(const BlrPosterior& posterior,
                                          const BlrPosterior& reference) {
  const Eigen::Index d = posterior.mean.size();
  if (reference.mean.size() != d || posterior.covariance.rows() != d ||
      reference.covariance.rows() != d) {
    return InvalidArgumentError("the release and the reference have different dimensions");
  }
  BlrCoverage out;
  out.coefficients = d;
  std::vector<double> ratios;
  for (Eigen::Index j = 0; j < d; ++j) {
    const double variance = posterior.covariance(j, j), reference_variance = reference.covariance(j, j);
    if (!(variance > 0) || !(reference_variance > 0)) {
      return InvalidArgumentError("a marginal variance is not > 0");
    }
    const double sd = std::sqrt(variance);
    const double gap = std::abs(posterior.mean[j] - reference.mean[j]);
    if (gap <= 0.6744897501960817 * sd) out.coverage_50 += 1;
    if (gap <= 1.959963984540054 * sd) out.coverage_95 += 1;
    ratios.push_back(sd / std::sqrt(reference_variance));
  }
  out.coverage_50 /= static_cast<double>(d);
  out.coverage_95 /= static_cast<double>(d);
  std::sort(ratios.begin(), ratios.end());
  const size_t n = ratios.size();
  out.sd_ratio_median = n % 2 == 1 ? ratios[n / 2] : 0.5 * (ratios[n / 2 - 1] + ratios[n / 2]);
  return out;
}

}  // namespace vipsd::models
