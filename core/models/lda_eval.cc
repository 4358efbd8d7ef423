#include "core/models/lda_eval.h"

#include <unsupported/Eigen/SpecialFunctions>

#include <cmath>

namespace vipsd::models {
namespace {

constexpr double kCompletionTolerance = 1e-6;
constexpr int kCompletionMaxIterations = 1000;

Status CheckIds(std::span<const std::vector<int32_t>> documents, int64_t vocabulary_size) {
  for (const auto& document : documents) {
    for (int32_t id : document) {
      if (id < 0 || id >= vocabulary_size) {
        return InvalidArgumentError("a document has a word id outside [0, V)");
      }
    }
  }
  return Status::Ok();
}

}  // namespace

StatusOr<CompletionResult> DocumentCompletion(const Eigen::MatrixXd& lambda, double alpha,
                                              std::span<const std::vector<int32_t>> documents) {
  if (lambda.size() == 0 || !lambda.allFinite() || !(lambda.array() > 0).all()) {
    return InvalidArgumentError("lambda must be non-empty, finite and > 0");
  }
  if (!(alpha > 0)) return InvalidArgumentError("alpha must be > 0");
  VIPSD_RETURN_IF_ERROR(CheckIds(documents, lambda.cols()));
  const Eigen::Index num_topics = lambda.rows();
  const Eigen::MatrixXd beta = lambda.array().colwise() / lambda.rowwise().sum().array();
  CompletionResult result;
  double loglik = 0;
  int64_t fitted = 0, total_iterations = 0;
  std::vector<int32_t> words;
  std::vector<double> counts;
  for (const auto& document : documents) {
    if (document.empty()) continue;
    const size_t observed = document.size() / 2;
    Eigen::VectorXd theta = Eigen::VectorXd::Constant(num_topics, 1.0 / num_topics);
    if (observed > 0) {
      CountWords(std::span(document).first(observed), &words, &counts);
      const auto m = static_cast<Eigen::Index>(words.size());
      Eigen::MatrixXd beta_d(num_topics, m);
      for (Eigen::Index j = 0; j < m; ++j) beta_d.col(j) = beta.col(words[j]);
      const Eigen::Map<const Eigen::VectorXd> c(counts.data(), m);
      Eigen::VectorXd gamma =
          Eigen::VectorXd::Constant(num_topics, alpha + static_cast<double>(observed) /
                                                            static_cast<double>(num_topics));
      int iteration = 1;
      for (; iteration <= kCompletionMaxIterations; ++iteration) {
        const Eigen::VectorXd e = ExpDirichletExpectation(gamma);
        const Eigen::VectorXd norm = beta_d.transpose() * e;
        const Eigen::VectorXd next =
            (alpha + e.array() * (beta_d * (c.array() / norm.array()).matrix()).array())
                .matrix();
        const bool done = (next - gamma).cwiseAbs().mean() < kCompletionTolerance;
        gamma = next;
        if (done) break;
      }
      iteration = std::min(iteration, kCompletionMaxIterations);
      total_iterations += iteration;
      ++fitted;
      if (iteration == kCompletionMaxIterations) ++result.documents_at_max_iterations;
      theta = gamma / gamma.sum();
    }
    for (size_t n = observed; n < document.size(); ++n) {
      loglik += std::log(beta.col(document[n]).dot(theta));
    }
    result.heldout_tokens += static_cast<int64_t>(document.size() - observed);
    result.observed_tokens += static_cast<int64_t>(observed);
    ++result.documents;
  }
  if (result.heldout_tokens == 0) {
    return InvalidArgumentError("no held-out tokens: every test document is empty");
  }
  result.heldout_loglik_per_token = loglik / static_cast<double>(result.heldout_tokens);
  result.perplexity = std::exp(-result.heldout_loglik_per_token);
  result.mean_iterations =
      fitted > 0 ? static_cast<double>(total_iterations) / static_cast<double>(fitted) : 0;
  return result;
}

StatusOr<BoundResult> PerWordPerplexityBound(const LdaModel& model,
                                             std::span<const std::vector<int32_t>> documents) {
  const LdaConfig& config = model.config();
  VIPSD_RETURN_IF_ERROR(CheckIds(documents, config.vocabulary_size));
  const Eigen::MatrixXd elog_beta = model.exp_elog_beta().array().log().matrix();
  const auto num_topics = static_cast<double>(config.num_topics);
  const double alpha = config.alpha;
  BoundResult result;
  double total = 0;
  std::vector<int32_t> words;
  std::vector<double> counts;
  for (const auto& document : documents) {
    if (document.empty()) continue;
    CountWords(document, &words, &counts);
    const LdaDocumentFit fit = model.FitDocument(words, counts);
    const double gamma_sum = fit.gamma.sum();
    const Eigen::VectorXd elog_theta =
        (fit.gamma.array().digamma() - Eigen::numext::digamma(gamma_sum)).matrix();
    double bound = 0;
    for (size_t j = 0; j < words.size(); ++j) {
      const Eigen::VectorXd terms = elog_theta + elog_beta.col(words[j]);
      const double max = terms.maxCoeff();
      bound += counts[j] * (max + std::log((terms.array() - max).exp().sum()));
    }
    bound += ((alpha - fit.gamma.array()) * elog_theta.array()).sum();
    for (Eigen::Index k = 0; k < fit.gamma.size(); ++k) bound += std::lgamma(fit.gamma[k]);
    bound += -std::lgamma(gamma_sum) + std::lgamma(num_topics * alpha) -
             num_topics * std::lgamma(alpha);
    total += bound;
    result.tokens += static_cast<int64_t>(document.size());
    ++result.documents;
  }
  if (result.tokens == 0) return InvalidArgumentError("no tokens: every document is empty");
  result.perplexity = std::exp(-total / static_cast<double>(result.tokens));
  return result;
}

StatusOr<UnigramResult> UnigramBaseline(std::span<const std::vector<int32_t>> train,
                                        std::span<const std::vector<int32_t>> test,
                                        int64_t vocabulary_size, double eta) {
  if (vocabulary_size < 1) return InvalidArgumentError("vocabulary_size must be >= 1");
  if (!(eta > 0)) return InvalidArgumentError("eta must be > 0");
  VIPSD_RETURN_IF_ERROR(CheckIds(train, vocabulary_size));
  VIPSD_RETURN_IF_ERROR(CheckIds(test, vocabulary_size));
  std::vector<double> counts(static_cast<size_t>(vocabulary_size), 0.0);
  double total = 0;
  for (const auto& document : train) {
    for (int32_t id : document) counts[static_cast<size_t>(id)] += 1;
    total += static_cast<double>(document.size());
  }
  const double denominator = total + static_cast<double>(vocabulary_size) * eta;
  UnigramResult result;
  double heldout = 0, all = 0;
  for (const auto& document : test) {
    const size_t observed = document.size() / 2;
    for (size_t n = 0; n < document.size(); ++n) {
      const double logp = std::log((counts[static_cast<size_t>(document[n])] + eta) / denominator);
      all += logp;
      if (n >= observed) heldout += logp;
    }
    result.tokens += static_cast<int64_t>(document.size());
    result.heldout_tokens += static_cast<int64_t>(document.size() - observed);
  }
  if (result.tokens == 0) return InvalidArgumentError("no test tokens");
  result.completion_perplexity = std::exp(-heldout / static_cast<double>(result.heldout_tokens));
  result.all_tokens_perplexity = std::exp(-all / static_cast<double>(result.tokens));
  return result;
}

}  // namespace vipsd::models
