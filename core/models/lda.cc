#include "core/models/lda.h"

#include <unsupported/Eigen/SpecialFunctions>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/base/parallel.h"
#include "core/models/digamma.h"
#include "core/privacy/mechanisms/gaussian_mechanism.h"

namespace vipsd::models {
namespace {

constexpr double kPhiNormFloor = 1e-100;

// The E-step works on topic vectors padded with zeros to an even length, so
// that its inner loops run on whole pairs of doubles (one SSE2 operation)
// without tails. Padding entries of E[θ] and of the gathered columns of
// exp(E[log β]) are zero, so they change no sum. (Wider GCC vectors than the
// machine's registers are kept in memory by the compiler: slower.)
constexpr Eigen::Index kTopicPadding = 2;
typedef double Pair __attribute__((vector_size(kTopicPadding * sizeof(double))));

Eigen::Index PaddedTopics(Eigen::Index num_topics) {
  return (num_topics + kTopicPadding - 1) / kTopicPadding * kTopicPadding;
}

void LoadPair(const double* data, Pair& value) { std::memcpy(&value, data, sizeof(value)); }

void StorePair(const Pair& value, double* data) { std::memcpy(data, &value, sizeof(value)); }

double Sum(const Pair& value) { return value[0] + value[1]; }

struct LdaScratch final : model::EStepScratch {
  ResampleBuffers resample;
  std::vector<int32_t> words;
  std::vector<double> counts;
  // Padded topics × m, column-major: the document's columns of exp(E[log β]).
  std::vector<double> beta_d;
  // Padded topics each.
  std::vector<double> gamma, new_gamma, e, weighted;
  std::vector<double> ratio;  // m: c_v / n_v
};

// The implicit-φ core of the E-step, one pass over the document's columns
// β_j (padded_topics doubles each, zero padding) of exp(E[log β]):
//   n_j = β_j · e + floor, ratio_j = c_j / n_j,
// and, if `weighted` is not null, weighted = Σ_j ratio_j β_j (padded_topics).
// Four columns at a time, so that four dot products and their updates are in
// flight together.
void WordRatios(const double* beta_d, Eigen::Index padded_topics, Eigen::Index m,
                const double* e, const double* counts, double* ratio, double* weighted) {
  if (weighted != nullptr) std::fill(weighted, weighted + padded_topics, 0.0);
  Pair ep, b0p, b1p, b2p, b3p, w;
  Eigen::Index j = 0;
  for (; j + 4 <= m; j += 4) {
    const double* b0 = beta_d + j * padded_topics;
    const double* b1 = b0 + padded_topics;
    const double* b2 = b1 + padded_topics;
    const double* b3 = b2 + padded_topics;
    Pair s0{}, s1{}, s2{}, s3{};
    for (Eigen::Index offset = 0; offset < padded_topics; offset += kTopicPadding) {
      LoadPair(e + offset, ep);
      LoadPair(b0 + offset, b0p);
      LoadPair(b1 + offset, b1p);
      LoadPair(b2 + offset, b2p);
      LoadPair(b3 + offset, b3p);
      s0 += b0p * ep;
      s1 += b1p * ep;
      s2 += b2p * ep;
      s3 += b3p * ep;
    }
    const double r0 = counts[j] / (Sum(s0) + kPhiNormFloor);
    const double r1 = counts[j + 1] / (Sum(s1) + kPhiNormFloor);
    const double r2 = counts[j + 2] / (Sum(s2) + kPhiNormFloor);
    const double r3 = counts[j + 3] / (Sum(s3) + kPhiNormFloor);
    ratio[j] = r0;
    ratio[j + 1] = r1;
    ratio[j + 2] = r2;
    ratio[j + 3] = r3;
    if (weighted == nullptr) continue;
    for (Eigen::Index offset = 0; offset < padded_topics; offset += kTopicPadding) {
      LoadPair(weighted + offset, w);
      LoadPair(b0 + offset, b0p);
      LoadPair(b1 + offset, b1p);
      LoadPair(b2 + offset, b2p);
      LoadPair(b3 + offset, b3p);
      w += ((b0p * r0 + b1p * r1) + b2p * r2) + b3p * r3;
      StorePair(w, weighted + offset);
    }
  }
  for (; j < m; ++j) {
    const double* b = beta_d + j * padded_topics;
    Pair sum{};
    for (Eigen::Index offset = 0; offset < padded_topics; offset += kTopicPadding) {
      LoadPair(e + offset, ep);
      LoadPair(b + offset, b0p);
      sum += b0p * ep;
    }
    const double r = counts[j] / (Sum(sum) + kPhiNormFloor);
    ratio[j] = r;
    if (weighted == nullptr) continue;
    for (Eigen::Index offset = 0; offset < padded_topics; offset += kTopicPadding) {
      LoadPair(weighted + offset, w);
      LoadPair(b + offset, b0p);
      w += b0p * r;
      StorePair(w, weighted + offset);
    }
  }
}

// e_k = exp(ψ(γ_k) − ψ(Σ_k γ_k)) for the first num_topics entries (the
// padding of e stays zero).
void ExpElogTheta(const std::vector<double>& gamma, Eigen::Index num_topics,
                  std::vector<double>& e) {
  const auto k = static_cast<size_t>(num_topics);
  double total = 0;
  for (size_t i = 0; i < k; ++i) total += gamma[i];
  ExpDigammaMinus(std::span(gamma.data(), k), Digamma(total), std::span(e.data(), k));
}

Status FieldError(const std::string& field, const std::string& allowed) {
  return InvalidArgumentError("lda." + field + " must be " + allowed);
}

// The seeded random start λ ~ Gamma(100, 1/100) per cell (LdaConfig::init_seed).
Eigen::MatrixXd RandomStart(const LdaConfig& config) {
  std::mt19937_64 rng(config.init_seed);
  std::gamma_distribution<double> gamma(100.0, 1.0 / 100.0);
  Eigen::MatrixXd lambda(config.num_topics, config.vocabulary_size);
  for (Eigen::Index v = 0; v < lambda.cols(); ++v) {
    for (Eigen::Index k = 0; k < lambda.rows(); ++k) lambda(k, v) = gamma(rng);
  }
  return lambda;
}

}  // namespace

Status ValidateLdaConfig(const LdaConfig& c) {
  if (!(c.public_start_weight > 0 && c.public_start_weight <= 1)) {
    return FieldError("public_start_weight", "in (0, 1]");
  }
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
  if (c.mstep_threads < 1 || c.mstep_threads > 256) {
    return FieldError("mstep_threads", "in [1, 256]");
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

void ResampleWords(std::span<const int32_t> document, int64_t draws, model::RecordRng& rng,
                   ResampleBuffers& buffers, std::vector<int32_t>* words,
                   std::vector<double>* counts) {
  const size_t length = document.size();
  if (static_cast<int64_t>(length) >= draws) {
    buffers.tokens.resize(static_cast<size_t>(draws));
    for (int32_t& token : buffers.tokens) token = document[rng.Below(length)];
    CountWords(buffers.tokens, words, counts);
    return;
  }
  // The same draws in the same order, tallied per distinct word; the words
  // drawn at least once, in increasing order, are CountWords' words, and
  // each tally (a sum of ones) its count.
  std::vector<int32_t>& distinct = buffers.distinct;
  distinct.assign(document.begin(), document.end());
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  buffers.slot.resize(length);
  for (size_t i = 0; i < length; ++i) {
    buffers.slot[i] = static_cast<uint32_t>(
        std::lower_bound(distinct.begin(), distinct.end(), document[i]) - distinct.begin());
  }
  buffers.tally.assign(distinct.size(), 0.0);
  for (int64_t d = 0; d < draws; ++d) buffers.tally[buffers.slot[rng.Below(length)]] += 1.0;
  words->clear();
  counts->clear();
  for (size_t u = 0; u < distinct.size(); ++u) {
    if (buffers.tally[u] > 0) {
      words->push_back(distinct[u]);
      counts->push_back(buffers.tally[u]);
    }
  }
}

StatusOr<std::unique_ptr<LdaModel>> LdaModel::Create(const LdaConfig& config) {
  VIPSD_RETURN_IF_ERROR(ValidateLdaConfig(config));
  // Without resampling there is no proven bound; the layout still needs a
  // finite one, and the driver refuses σ > 0 for such a model. 2^400 is never
  // reached (‖s_d‖ ≤ the document's length), and as a power of two it makes
  // the mechanism's scaling by 1/C and back exact, and keeps the scaled
  // squares (≥ 2^-800·Σ s²) in the normal range, so the norm takes its fast
  // path.
  const double bound = config.resample_length > 0
                           ? config.clip_fraction * static_cast<double>(config.resample_length)
                           : std::ldexp(1.0, 400);
  VIPSD_ASSIGN_OR_RETURN(
      auto layout,
      privacy::BlockLayout::Create({privacy::BlockSpec{
          "topic_word", privacy::BlockKind::kVector,
          static_cast<size_t>(config.num_topics * config.vocabulary_size), bound}}));
  std::unique_ptr<LdaModel> model(new LdaModel(config, std::move(layout)));
  VIPSD_RETURN_IF_ERROR(model->SetLambda(RandomStart(config)));
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
  const Eigen::Index num_topics = lambda_.rows();
  const Eigen::Index vocabulary_size = lambda_.cols();
  // ψ(Σ_v λ_kv), repeated so that the offsets of any entry of the
  // column-major K × V array start at psi_rows[k] with k = index mod K.
  std::vector<double> psi_rows(static_cast<size_t>(num_topics) + digamma_internal::kBlock);
  const Eigen::VectorXd row_sums = lambda_.rowwise().sum();
  for (size_t i = 0; i < psi_rows.size(); ++i) {
    psi_rows[i] = Digamma(row_sums[static_cast<Eigen::Index>(i % static_cast<size_t>(num_topics))]);
  }
  const double* offsets = psi_rows.data();
  const auto k = static_cast<size_t>(num_topics);
  ParallelRanges(vocabulary_size, config_.mstep_threads, [&](Eigen::Index begin, Eigen::Index end) {
    // Columns [begin, end): a contiguous run of the column-major arrays whose
    // first entry is row 0, so entry i of the run has offset psi_rows[i mod K].
    digamma_internal::ExpDigammaMinusLoop(
        lambda_.data() + begin * num_topics, static_cast<size_t>((end - begin) * num_topics),
        [offsets, k](size_t i) { return offsets + i % k; },
        exp_elog_beta_.data() + begin * num_topics);
  });
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
  noise_ = Noise{};
  RecomputeExpectations();
  return Status::Ok();
}

StatusOr<Eigen::MatrixXd> LdaModel::LambdaFromArray(const model::NamedArray& array,
                                                     const std::string& what) const {
  if (array.shape != std::vector<int64_t>{lambda_.rows(), lambda_.cols()} ||
      array.data.size() != static_cast<size_t>(lambda_.size())) {
    return InvalidArgumentError(what + " \"lambda\" must have shape K x V = " +
                                std::to_string(lambda_.rows()) + " x " +
                                std::to_string(lambda_.cols()));
  }
  return Eigen::MatrixXd(
      Eigen::Map<const Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>(
          array.data.data(), lambda_.rows(), lambda_.cols()));
}

Status LdaModel::SetPublicPrior(std::span<const model::NamedArray> arrays) {
  const auto found = std::find_if(arrays.begin(), arrays.end(),
                                  [](const model::NamedArray& a) { return a.name == "lambda"; });
  if (found == arrays.end()) {
    return InvalidArgumentError("the public prior has no array \"lambda\" (an LDA release)");
  }
  VIPSD_ASSIGN_OR_RETURN(const Eigen::MatrixXd public_lambda,
                         LambdaFromArray(*found, "the public prior's array"));
  if (!public_lambda.allFinite() || !(public_lambda.array() > 0).all()) {
    return InvalidArgumentError("the public prior's \"lambda\" must be finite and > 0");
  }
  const double m = config_.public_start_weight;
  Eigen::MatrixXd start = RandomStart(config_);
  for (Eigen::Index k = 0; k < start.rows(); ++k) {
    const double scale = start.row(k).sum() / public_lambda.row(k).sum();
    start.row(k) = (1 - m) * start.row(k) + (m * scale) * public_lambda.row(k);
  }
  return SetLambda(start);  // checks finite and > 0 (a sum that overflowed)
}

Eigen::VectorXd LdaModel::NoiseShare() const {
  Eigen::VectorXd share(lambda_.rows());
  const double floor_mass = static_cast<double>(lambda_.cols()) * noise_.floor;
  for (Eigen::Index k = 0; k < lambda_.rows(); ++k) {
    const double mass = lambda_.row(k).sum() - static_cast<double>(lambda_.cols()) * config_.eta;
    share[k] = mass > 0 ? std::min(floor_mass / mass, 1.0) : (floor_mass > 0 ? 1.0 : 0.0);
  }
  return share;
}

std::unique_ptr<model::EStepScratch> LdaModel::NewScratch() const {
  return std::make_unique<LdaScratch>();
}

LdaDocumentFit LdaModel::FitDocument(std::span<const int32_t> words,
                                     std::span<const double> counts) const {
  LdaScratch scratch;
  LdaDocumentFit fit;
  fit.iterations = FitDocumentInto(words, counts, scratch);
  fit.gamma = Eigen::Map<const Eigen::VectorXd>(scratch.gamma.data(), lambda_.rows());
  return fit;
}

int LdaModel::FitDocumentInto(std::span<const int32_t> words, std::span<const double> counts,
                              model::EStepScratch& scratch_base) const {
  auto& s = static_cast<LdaScratch&>(scratch_base);
  const Eigen::Index num_topics = lambda_.rows();
  const Eigen::Index padded = PaddedTopics(num_topics);
  const auto k = static_cast<size_t>(num_topics);
  const auto m = static_cast<Eigen::Index>(words.size());
  s.beta_d.assign(static_cast<size_t>(padded * m), 0.0);
  for (Eigen::Index j = 0; j < m; ++j) {
    const double* column = exp_elog_beta_.data() + static_cast<Eigen::Index>(words[j]) * num_topics;
    std::copy(column, column + num_topics, s.beta_d.begin() + j * padded);
  }
  s.gamma.assign(static_cast<size_t>(padded), 0.0);
  std::fill(s.gamma.begin(), s.gamma.begin() + num_topics, 1.0);
  s.new_gamma.assign(static_cast<size_t>(padded), 0.0);
  s.e.assign(static_cast<size_t>(padded), 0.0);
  s.weighted.resize(static_cast<size_t>(padded));
  s.ratio.resize(static_cast<size_t>(m));
  int iteration = 1;
  for (; iteration <= config_.estep_max_iterations; ++iteration) {
    ExpElogTheta(s.gamma, num_topics, s.e);
    // n_v = Σ_k e_k β_kv (+ floor); γ'_k = α + e_k Σ_v β_kv c_v / n_v.
    WordRatios(s.beta_d.data(), padded, m, s.e.data(), counts.data(), s.ratio.data(),
               s.weighted.data());
    double change = 0;
    for (size_t i = 0; i < k; ++i) {
      s.new_gamma[i] = config_.alpha + s.e[i] * s.weighted[i];
      change += std::abs(s.new_gamma[i] - s.gamma[i]);
    }
    s.gamma.swap(s.new_gamma);
    if (change / static_cast<double>(k) < config_.estep_tolerance) break;
  }
  return std::min(iteration, config_.estep_max_iterations);
}

Status LdaModel::EStep(const model::Record& record, model::RecordRng& rng,
                       model::EStepScratch& scratch_base, model::SparseStatistic& out) const {
  auto& scratch = static_cast<LdaScratch&>(scratch_base);
  const int64_t vocabulary_size = config_.vocabulary_size;
  for (int32_t id : record.word_ids) {
    if (id < 0 || id >= vocabulary_size) {
      out.Clear();
      return InvalidArgumentError("document has a word id outside [0, V)");
    }
  }
  if (record.word_ids.empty()) {  // contributes the zero vector
    out.Clear();
    return Status::Ok();
  }
  if (config_.resample_length > 0) {
    // Exactly N draws with replacement from the document's tokens.
    ResampleWords(record.word_ids, config_.resample_length, rng, scratch.resample,
                  &scratch.words, &scratch.counts);
  } else {
    CountWords(record.word_ids, &scratch.words, &scratch.counts);
  }
  FitDocumentInto(scratch.words, scratch.counts, scratch);

  // With e from the final γ: n_v = Σ_k e_k expElogβ[k, v] (+ floor) and
  // s[k, v] = e_k expElogβ[k, v] c_v / n_v.
  const Eigen::Index num_topics = lambda_.rows();
  const Eigen::Index padded = PaddedTopics(num_topics);
  const auto m = static_cast<Eigen::Index>(scratch.words.size());
  ExpElogTheta(scratch.gamma, num_topics, scratch.e);
  WordRatios(scratch.beta_d.data(), padded, m, scratch.e.data(), scratch.counts.data(),
             scratch.ratio.data(), nullptr);
  // Every entry is overwritten below: resizing without clearing first avoids
  // zero-filling K·m entries per document.
  // Word-major coordinates w·K + k: increasing because the words are sorted,
  // and each word's K values are contiguous in the mechanism's accumulator.
  out.indices.resize(static_cast<size_t>(num_topics * m));
  out.values.resize(out.indices.size());
  size_t out_index = 0;
  for (Eigen::Index j = 0; j < m; ++j) {
    const auto column_offset = static_cast<uint32_t>(scratch.words[j] * num_topics);
    const double* beta_column = scratch.beta_d.data() + j * padded;
    const double ratio = scratch.ratio[j];
    for (Eigen::Index topic = 0; topic < num_topics; ++topic) {
      out.indices[out_index] = column_offset + static_cast<uint32_t>(topic);
      out.values[out_index] = scratch.e[static_cast<size_t>(topic)] * beta_column[topic] * ratio;
      ++out_index;
    }
  }
  return Status::Ok();
}

Status LdaModel::MStep(const Eigen::VectorXd& statistic_sum,
                       const privacy::SampledGaussian& released_by, double rho) {
  const double sampling_rate = released_by.sampling_rate;
  const double noise_multiplier = released_by.noise_multiplier;
  VIPSD_RETURN_IF_ERROR(model::CheckMStepInputs("lda", statistic_sum, layout_, sampling_rate, rho,
                                                noise_multiplier));
  VIPSD_ASSIGN_OR_RETURN(const std::vector<double> noise_std,
                         privacy::NoiseStdPerBlock(layout_, noise_multiplier));
  // λ ← (1 − ρ)λ + ρ(η + max(S̃, 0)/q) in place; the sum's word-major layout
  // is λ's column-major one.
  const Eigen::Index num_topics = lambda_.rows();
  const double keep = 1.0 - rho;
  const double* sum = statistic_sum.data();
  double* lambda = lambda_.data();
  ParallelRanges(lambda_.cols(), config_.mstep_threads, [&](Eigen::Index begin, Eigen::Index end) {
    for (Eigen::Index i = begin * num_topics; i < end * num_topics; ++i) {
      const double lambda_hat = config_.eta + std::max(sum[i], 0.0) / sampling_rate;
      lambda[i] = keep * lambda[i] + rho * lambda_hat;
    }
  });
  // The noise this step left in λ (header, "M-step"): max(n, 0) with n ~
  // N(0, s_t²) has mean s_t/√(2π) and variance s_t²(1/2 − 1/(2π)).
  const double step_std = noise_std[0] / sampling_rate;
  const double inv_sqrt_2pi = 0.5 * M_2_SQRTPI * M_SQRT1_2;
  noise_.floor = keep * noise_.floor + rho * step_std * inv_sqrt_2pi;
  noise_.floor_variance = keep * keep * noise_.floor_variance +
                          rho * rho * step_std * step_std * (0.5 - 0.5 * M_1_PI);
  noise_.variance = keep * keep * noise_.variance + rho * rho * step_std * step_std;
  RecomputeExpectations();
  return Status::Ok();
}

namespace {

model::NamedArray ScalarArray(std::string name, double value) {
  return {std::move(name), {1}, {value}};
}

}  // namespace

std::vector<model::NamedArray> LdaModel::ReleaseArrays() const {
  std::vector<model::NamedArray> arrays = CheckpointArrays();
  const Eigen::VectorXd share = NoiseShare();
  arrays.push_back({"noise_share", {share.size()}, {share.data(), share.data() + share.size()}});
  return arrays;
}

std::vector<model::NamedArray> LdaModel::CheckpointArrays() const {
  model::NamedArray lambda{"lambda", {lambda_.rows(), lambda_.cols()}, {}};
  lambda.data.resize(static_cast<size_t>(lambda_.size()));
  Eigen::Map<Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>(
      lambda.data.data(), lambda_.rows(), lambda_.cols()) = lambda_;
  std::vector<model::NamedArray> arrays;
  arrays.push_back(std::move(lambda));
  arrays.push_back(ScalarArray("noise_floor", noise_.floor));
  arrays.push_back(ScalarArray("noise_floor_variance", noise_.floor_variance));
  arrays.push_back(ScalarArray("noise_variance", noise_.variance));
  return arrays;
}

Status LdaModel::RestoreCheckpoint(std::span<const model::NamedArray> arrays) {
  // "lambda" and the three noise scalars, or (the earlier format) "lambda"
  // alone.
  static const char* const kNoise[] = {"noise_floor", "noise_floor_variance", "noise_variance"};
  if (arrays.empty() || arrays[0].name != "lambda" || (arrays.size() != 1 && arrays.size() != 4)) {
    return InvalidArgumentError(
        "an LDA checkpoint holds \"lambda\", \"noise_floor\", \"noise_floor_variance\" and "
        "\"noise_variance\" (or, in the earlier format, \"lambda\" alone)");
  }
  VIPSD_ASSIGN_OR_RETURN(const Eigen::MatrixXd lambda,
                         LambdaFromArray(arrays[0], "checkpoint array"));
  double values[3] = {0, 0, 0};
  for (size_t i = 1; i < arrays.size(); ++i) {
    const auto& scalar = arrays[i];
    if (scalar.name != kNoise[i - 1] || scalar.shape != std::vector<int64_t>{1} ||
        scalar.data.size() != 1 || !(scalar.data[0] >= 0) || !std::isfinite(scalar.data[0])) {
      return InvalidArgumentError(std::string("checkpoint array \"") + kNoise[i - 1] +
                                  "\" must follow in order and hold one finite value >= 0");
    }
    values[i - 1] = scalar.data[0];
  }
  VIPSD_RETURN_IF_ERROR(SetLambda(lambda));
  noise_ = Noise{values[0], values[1], values[2]};
  return Status::Ok();
}

}  // namespace vipsd::models
