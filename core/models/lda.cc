#include "core/models/lda.h"

#include <unsupported/Eigen/SpecialFunctions>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>

namespace vipsd::models {
namespace {

constexpr double kPhiNormFloor = 1e-100;

struct LdaScratch final : model::EStepScratch {
  std::vector<int32_t> tokens;
  std::vector<int32_t> words;
  std::vector<double> counts;
  Eigen::MatrixXd beta_d;  // K × m columns of exp(E[log β]) for the words
  Eigen::VectorXd gamma, new_gamma, e, norm;
};

Status FieldError(const std::string& field, const std::string& allowed) {
  return InvalidArgumentError("lda." + field + " must be " + allowed);
}

}  // namespace

Status ValidateLdaConfig(const LdaConfig& c) {
  if (c.num_topics < 1 || c.num_topics > 100000) return FieldError("num_topics", "in [1, 100000]");
  if (c.vocabulary_size < 1 || c.vocabulary_size > 10000000) {
    return FieldError("vocabulary_size", "in [1, 10000000]");
  }
  if (c.num_topics * c.vocabulary_size > (int64_t{1} << 31)) {
    return FieldError("num_topics * vocabulary_size", "at most 2^31");
  }
  if (!(c.alpha > 0) || !std::isfinite(c.alpha)) return FieldError("alpha", "finite and > 0");
  if (!(c.eta > 0) || !std::isfinite(c.eta)) return FieldError("eta", "finite and > 0");
  if (c.resample_length < 0 || c.resample_length > 1000000) {
    return FieldError("resample_length", "in [0, 1000000] (0 = actual tokens, non-private only)");
  }
  if (!(c.clip_fraction > 0 && c.clip_fraction <= 1)) {
    return FieldError("clip_fraction", "in (0, 1]");
  }
  if (c.estep_max_iterations < 1 || c.estep_max_iterations > 100000) {
    return FieldError("estep_max_iterations", "in [1, 100000]");
  }
  if (!(c.estep_tolerance > 0) || !std::isfinite(c.estep_tolerance)) {
    return FieldError("estep_tolerance", "finite and > 0");
  }
  return Status::Ok();
}

Eigen::VectorXd ExpDirichletExpectation(const Eigen::VectorXd& gamma) {
  const double total = Eigen::numext::digamma(gamma.sum());
  return (gamma.array().digamma() - total).exp().matrix();
}

void CountWords(std::span<const int32_t> tokens, std::vector<int32_t>* words,
                std::vector<double>* counts) {
  words->assign(tokens.begin(), tokens.end());
  std::sort(words->begin(), words->end());
  counts->clear();
  size_t unique = 0;
  for (size_t i = 0; i < words->size(); ++i) {
    if (unique > 0 && (*words)[unique - 1] == (*words)[i]) {
      counts->back() += 1.0;
    } else {
      (*words)[unique++] = (*words)[i];
      counts->push_back(1.0);
    }
  }
  words->resize(unique);
}

StatusOr<std::unique_ptr<LdaModel>> LdaModel::Create(const LdaConfig& config) {
  VIPSD_RETURN_IF_ERROR(ValidateLdaConfig(config));
  // Without resampling there is no proven bound; the layout still needs a
  // finite one, and the driver refuses σ > 0 for such a model.
  const double bound = config.resample_length > 0
                           ? config.clip_fraction * static_cast<double>(config.resample_length)
                           : 1e300;
  VIPSD_ASSIGN_OR_RETURN(
      auto layout,
      privacy::BlockLayout::Create({privacy::BlockSpec{
          "topic_word", privacy::BlockKind::kVector,
          static_cast<size_t>(config.num_topics * config.vocabulary_size), bound}}));
  std::unique_ptr<LdaModel> model(new LdaModel(config, std::move(layout)));
  std::mt19937_64 rng(config.init_seed);
  std::gamma_distribution<double> gamma(100.0, 1.0 / 100.0);
  for (Eigen::Index v = 0; v < model->lambda_.cols(); ++v) {
    for (Eigen::Index k = 0; k < model->lambda_.rows(); ++k) model->lambda_(k, v) = gamma(rng);
  }
  model->RecomputeExpectations();
  return model;
}

LdaModel::LdaModel(const LdaConfig& config, privacy::BlockLayout layout)
    : config_(config),
      layout_(std::move(layout)),
      lambda_(config.num_topics, config.vocabulary_size),
      exp_elog_beta_(config.num_topics, config.vocabulary_size) {}

std::vector<std::pair<std::string, int64_t>> LdaModel::dimensions() const {
  return {{"K", config_.num_topics},
          {"V", config_.vocabulary_size},
          {"N", config_.resample_length}};
}

void LdaModel::RecomputeExpectations() {
  const Eigen::VectorXd row_sums = lambda_.rowwise().sum();
  Eigen::VectorXd psi_rows(row_sums.size());
  for (Eigen::Index k = 0; k < row_sums.size(); ++k) {
    psi_rows[k] = Eigen::numext::digamma(row_sums[k]);
  }
  exp_elog_beta_ = (lambda_.array().digamma().colwise() - psi_rows.array()).exp().matrix();
}

Status LdaModel::SetLambda(const Eigen::MatrixXd& lambda) {
  if (lambda.rows() != lambda_.rows() || lambda.cols() != lambda_.cols()) {
    return InvalidArgumentError("lambda must be K x V = " + std::to_string(lambda_.rows()) +
                                " x " + std::to_string(lambda_.cols()));
  }
  if (!lambda.allFinite() || !(lambda.array() > 0).all()) {
    return InvalidArgumentError("lambda must be finite and > 0");
  }
  lambda_ = lambda;
  RecomputeExpectations();
  return Status::Ok();
}

std::unique_ptr<model::EStepScratch> LdaModel::NewScratch() const {
  return std::make_unique<LdaScratch>();
}

LdaDocumentFit LdaModel::FitDocument(std::span<const int32_t> words,
                                     std::span<const double> counts) const {
  LdaScratch scratch;
  return FitDocumentInto(words, counts, scratch);
}

LdaDocumentFit LdaModel::FitDocumentInto(std::span<const int32_t> words,
                                         std::span<const double> counts,
                                         model::EStepScratch& scratch_base) const {
  auto& s = static_cast<LdaScratch&>(scratch_base);
  const Eigen::Index num_topics = lambda_.rows();
  const auto m = static_cast<Eigen::Index>(words.size());
  s.beta_d.resize(num_topics, m);
  for (Eigen::Index j = 0; j < m; ++j) s.beta_d.col(j) = exp_elog_beta_.col(words[j]);
  const Eigen::Map<const Eigen::VectorXd> c(counts.data(), m);
  LdaDocumentFit fit;
  fit.gamma = Eigen::VectorXd::Ones(num_topics);
  for (fit.iterations = 1; fit.iterations <= config_.estep_max_iterations; ++fit.iterations) {
    s.e = ExpDirichletExpectation(fit.gamma);
    s.norm.noalias() = s.beta_d.transpose() * s.e;
    s.norm.array() = c.array() / (s.norm.array() + kPhiNormFloor);
    s.new_gamma.noalias() = s.beta_d * s.norm;
    s.new_gamma.array() = config_.alpha + s.e.array() * s.new_gamma.array();
    const double change = (s.new_gamma - fit.gamma).cwiseAbs().mean();
    fit.gamma.swap(s.new_gamma);
    if (change < config_.estep_tolerance) break;
  }
  fit.iterations = std::min(fit.iterations, config_.estep_max_iterations);
  return fit;
}

Status LdaModel::EStep(const model::Record& record, model::RecordRng& rng,
                       model::EStepScratch& scratch_base, model::SparseStatistic& out) const {
  auto& scratch = static_cast<LdaScratch&>(scratch_base);
  out.Clear();
  const int64_t vocabulary_size = config_.vocabulary_size;
  for (int32_t id : record.word_ids) {
    if (id < 0 || id >= vocabulary_size) {
      return InvalidArgumentError("document has a word id outside [0, V)");
    }
  }
  if (record.word_ids.empty()) return Status::Ok();  // contributes the zero vector
  std::span<const int32_t> tokens(record.word_ids);
  if (config_.resample_length > 0) {
    // Exactly N draws with replacement from the document's tokens.
    scratch.tokens.resize(static_cast<size_t>(config_.resample_length));
    for (int32_t& token : scratch.tokens) {
      token = record.word_ids[rng.Below(record.word_ids.size())];
    }
    tokens = scratch.tokens;
  }
  CountWords(tokens, &scratch.words, &scratch.counts);
  const LdaDocumentFit fit = FitDocumentInto(scratch.words, scratch.counts, scratch);

  const Eigen::Index num_topics = lambda_.rows();
  const auto m = static_cast<Eigen::Index>(scratch.words.size());
  const Eigen::VectorXd e = ExpDirichletExpectation(fit.gamma);
  out.indices.resize(static_cast<size_t>(num_topics * m));
  out.values.resize(out.indices.size());
  // n_v = Σ_k e_k expElogβ[k, v]; s[k, v] = e_k expElogβ[k, v] c_v / n_v.
  std::vector<double>& ratio = scratch.counts;  // reuse: c_v / n_v
  for (Eigen::Index j = 0; j < m; ++j) {
    const double norm = exp_elog_beta_.col(scratch.words[j]).dot(e) + kPhiNormFloor;
    ratio[j] = scratch.counts[j] / norm;
  }
  size_t out_index = 0;
  for (Eigen::Index k = 0; k < num_topics; ++k) {
    for (Eigen::Index j = 0; j < m; ++j) {
      const int32_t v = scratch.words[j];
      out.indices[out_index] = static_cast<uint32_t>(k * vocabulary_size + v);
      out.values[out_index] = e[k] * exp_elog_beta_(k, v) * ratio[j];
      ++out_index;
    }
  }
  return Status::Ok();
}

Status LdaModel::MStep(const Eigen::VectorXd& statistic_sum, double sampling_rate,
                       double rho) {
  if (statistic_sum.size() != lambda_.size()) {
    return InvalidArgumentError("statistic sum has the wrong size for K x V");
  }
  if (!(sampling_rate > 0 && sampling_rate <= 1)) {
    return InvalidArgumentError("sampling_rate must be in (0, 1]");
  }
  if (!(rho > 0 && rho <= 1)) return InvalidArgumentError("rho must be in (0, 1]");
  if (!statistic_sum.allFinite()) return OutOfRangeError("statistic sum is not finite");
  // Row-major K × V sum → column-major λ.
  const Eigen::Map<const Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>
      sum(statistic_sum.data(), lambda_.rows(), lambda_.cols());
  const Eigen::MatrixXd lambda_hat =
      (config_.eta + sum.array().max(0.0) / sampling_rate).matrix();
  lambda_ = (1.0 - rho) * lambda_ + rho * lambda_hat;
  RecomputeExpectations();
  return Status::Ok();
}

std::vector<model::NamedArray> LdaModel::ReleaseArrays() const {
  model::NamedArray lambda{"lambda", {lambda_.rows(), lambda_.cols()}, {}};
  lambda.data.resize(static_cast<size_t>(lambda_.size()));
  Eigen::Map<Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>(
      lambda.data.data(), lambda_.rows(), lambda_.cols()) = lambda_;
  return {std::move(lambda)};
}

Status LdaModel::RestoreCheckpoint(std::span<const model::NamedArray> arrays) {
  if (arrays.size() != 1 || arrays[0].name != "lambda") {
    return InvalidArgumentError("an LDA checkpoint holds exactly one array, \"lambda\"");
  }
  const auto& array = arrays[0];
  if (array.shape != std::vector<int64_t>{lambda_.rows(), lambda_.cols()} ||
      array.data.size() != static_cast<size_t>(lambda_.size())) {
    return InvalidArgumentError("checkpoint array \"lambda\" must have shape K x V = " +
                                std::to_string(lambda_.rows()) + " x " +
                                std::to_string(lambda_.cols()));
  }
  const Eigen::MatrixXd lambda =
      Eigen::Map<const Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>(
          array.data.data(), lambda_.rows(), lambda_.cols());
  return SetLambda(lambda);
}

}  // namespace vipsd::models
