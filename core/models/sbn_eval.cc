#include "core/models/sbn_eval.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <string>
#include <thread>

namespace vipsd::models {
namespace {

constexpr double kProposalFloor = 1e-3;

uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

double Uniform(model::RecordRng& rng) {
  return static_cast<double>(rng.Next() >> 11) * 0x1.0p-53;  // [0, 1)
}

// log(1 + exp(x)), stable.
double Softplus(double x) { return std::max(x, 0.0) + std::log1p(std::exp(-std::fabs(x))); }

Status CheckRecord(std::span<const double> record, int64_t visible, size_t index) {
  if (record.size() != static_cast<size_t>(visible)) {
    return InvalidArgumentError("record " + std::to_string(index) + " must have J = " +
                                std::to_string(visible) + " values");
  }
  for (double value : record) {
    if (value != 0.0 && value != 1.0) {
      return InvalidArgumentError("record " + std::to_string(index) + " must hold only 0 and 1");
    }
  }
  return Status::Ok();
}

struct RecordScore {
  int64_t correct_sampled = 0;
  int64_t correct_mean = 0;
  double loglik = 0;
  int iterations = 0;
  bool converged = false;
};

int64_t CountCorrect(const Eigen::VectorXd& activation, std::span<const double> y) {
  int64_t correct = 0;
  for (Eigen::Index j = 0; j < activation.size(); ++j) {
    const double predicted = activation[j] > 0 ? 1.0 : 0.0;
    correct += predicted == y[static_cast<size_t>(j)] ? 1 : 0;
  }
  return correct;
}

RecordScore ScoreRecord(const SbnExpectations& e, std::span<const double> y,
                        const SbnEvalOptions& options, uint64_t seed, SbnFitScratch& scratch,
                        SbnLocalFit& fit) {
  RecordScore score;
  FitSbnLocal(e, y, options.estep_max_iterations, options.estep_tolerance, scratch, fit);
  score.iterations = fit.iterations;
  score.converged = fit.converged;
  const Eigen::Index num_hidden = e.hidden;
  const Eigen::VectorXd& m = fit.z_mean;
  model::RecordRng rng(seed);

  Eigen::VectorXd activation = e.w_mean * m + e.c_mean;
  score.correct_mean = CountCorrect(activation, y);
  Eigen::VectorXd z(num_hidden);
  for (Eigen::Index k = 0; k < num_hidden; ++k) z[k] = Uniform(rng) < m[k] ? 1.0 : 0.0;
  activation.noalias() = e.w_mean * z;
  activation += e.c_mean;
  score.correct_sampled = CountCorrect(activation, y);

  if (options.importance_samples > 0) {
    Eigen::VectorXd proposal = m.cwiseMax(kProposalFloor).cwiseMin(1.0 - kProposalFloor);
    double prior_softplus = 0;
    for (Eigen::Index k = 0; k < num_hidden; ++k) prior_softplus += Softplus(e.b_mean[k]);
    std::vector<double> log_weights(static_cast<size_t>(options.importance_samples));
    for (double& log_weight : log_weights) {
      double log_prior = -prior_softplus;
      double log_proposal = 0;
      for (Eigen::Index k = 0; k < num_hidden; ++k) {
        const bool on = Uniform(rng) < proposal[k];
        z[k] = on ? 1.0 : 0.0;
        log_prior += on ? e.b_mean[k] : 0.0;
        log_proposal += std::log(on ? proposal[k] : 1.0 - proposal[k]);
      }
      activation.noalias() = e.w_mean * z;
      activation += e.c_mean;
      double log_likelihood = 0;
      for (Eigen::Index j = 0; j < activation.size(); ++j) {
        log_likelihood += y[static_cast<size_t>(j)] * activation[j] - Softplus(activation[j]);
      }
      log_weight = log_likelihood + log_prior - log_proposal;
    }
    const double max_log = *std::max_element(log_weights.begin(), log_weights.end());
    double total = 0;
    for (double log_weight : log_weights) total += std::exp(log_weight - max_log);
    score.loglik = max_log + std::log(total / static_cast<double>(log_weights.size()));
  }
  return score;
}

}  // namespace

StatusOr<SbnHeldOutResult> EvaluateSbnHeldOut(const SbnExpectations& e,
                                              std::span<const std::vector<double>> records,
                                              const SbnEvalOptions& options) {
  if (records.empty()) return InvalidArgumentError("no held-out records to evaluate");
  if (options.estep_max_iterations < 1) {
    return InvalidArgumentError("estep_max_iterations must be >= 1");
  }
  if (!(options.estep_tolerance > 0) || !std::isfinite(options.estep_tolerance)) {
    return InvalidArgumentError("estep_tolerance must be finite and > 0");
  }
  if (options.importance_samples < 0 || options.importance_samples > 1000000) {
    return InvalidArgumentError("importance_samples must be in [0, 1000000]");
  }
  if (options.threads < 1 || options.threads > 256) {
    return InvalidArgumentError("threads must be in [1, 256]");
  }
  if (e.visible < 1 || e.hidden < 1 || e.w_mean.rows() != e.visible ||
      e.w_mean.cols() != e.hidden) {
    return InvalidArgumentError("expectations are not consistent (use MakeSbnExpectations)");
  }
  for (size_t i = 0; i < records.size(); ++i) {
    VIPSD_RETURN_IF_ERROR(CheckRecord(records[i], e.visible, i));
  }
  std::vector<RecordScore> scores(records.size());
  std::atomic<size_t> next{0};
  auto worker = [&]() {
    SbnFitScratch scratch;
    SbnLocalFit fit;
    for (size_t i = next.fetch_add(1); i < records.size(); i = next.fetch_add(1)) {
      scores[i] = ScoreRecord(e, records[i], options, Mix(options.seed ^ Mix(i)), scratch, fit);
    }
  };
  const size_t workers = std::min<size_t>(static_cast<size_t>(options.threads), records.size());
  if (workers <= 1) {
    worker();
  } else {
    std::vector<std::thread> threads;
    for (size_t w = 0; w < workers; ++w) threads.emplace_back(worker);
    for (auto& thread : threads) thread.join();
  }
  SbnHeldOutResult result;
  result.records = static_cast<int64_t>(records.size());
  result.pixels = result.records * e.visible;
  result.importance_samples = options.importance_samples;
  int64_t correct_sampled = 0, correct_mean = 0;
  double loglik = 0, iterations = 0;
  for (const RecordScore& score : scores) {
    correct_sampled += score.correct_sampled;
    correct_mean += score.correct_mean;
    loglik += score.loglik;
    iterations += score.iterations;
    result.records_at_max_iterations += score.converged ? 0 : 1;
  }
  const auto pixels = static_cast<double>(result.pixels);
  result.accuracy_sampled = static_cast<double>(correct_sampled) / pixels;
  result.accuracy_mean = static_cast<double>(correct_mean) / pixels;
  result.loglik_per_record = loglik / static_cast<double>(result.records);
  result.loglik_per_pixel = loglik / pixels;
  result.mean_estep_iterations = iterations / static_cast<double>(result.records);
  return result;
}

StatusOr<SbnMarginalBaselineResult> SbnMarginalBaseline(
    std::span<const std::vector<double>> train, std::span<const std::vector<double>> test) {
  if (train.empty() || test.empty()) {
    return InvalidArgumentError("the marginal baseline needs non-empty train and test records");
  }
  const auto visible = static_cast<int64_t>(train.front().size());
  if (visible < 1) return InvalidArgumentError("records must have at least one value");
  for (size_t i = 0; i < train.size(); ++i) VIPSD_RETURN_IF_ERROR(CheckRecord(train[i], visible, i));
  for (size_t i = 0; i < test.size(); ++i) VIPSD_RETURN_IF_ERROR(CheckRecord(test[i], visible, i));
  std::vector<double> counts(static_cast<size_t>(visible), 0.0);
  for (const auto& record : train) {
    for (size_t j = 0; j < counts.size(); ++j) counts[j] += record[j];
  }
  std::vector<double> probability(counts.size());
  const auto n = static_cast<double>(train.size());
  for (size_t j = 0; j < counts.size(); ++j) probability[j] = (counts[j] + 1.0) / (n + 2.0);
  int64_t correct = 0;
  double loglik = 0;
  for (const auto& record : test) {
    for (size_t j = 0; j < probability.size(); ++j) {
      const double predicted = probability[j] > 0.5 ? 1.0 : 0.0;
      correct += predicted == record[j] ? 1 : 0;
      loglik += std::log(record[j] == 1.0 ? probability[j] : 1.0 - probability[j]);
    }
  }
  SbnMarginalBaselineResult result;
  result.records = static_cast<int64_t>(test.size());
  result.train_records = static_cast<int64_t>(train.size());
  result.accuracy = static_cast<double>(correct) /
                    (static_cast<double>(test.size()) * static_cast<double>(visible));
  result.loglik_per_record = loglik / static_cast<double>(test.size());
  return result;
}

}  // namespace vipsd::models
