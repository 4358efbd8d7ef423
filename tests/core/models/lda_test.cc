#include "core/models/lda.h"

#include <gtest/gtest.h>

#include <boost/math/special_functions/digamma.hpp>
#include <unsupported/Eigen/SpecialFunctions>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/privacy/mechanisms/block_layout.h"
#include "core/privacy/mechanisms/gaussian_mechanism.h"

namespace vipsd::models {
namespace {

LdaConfig SmallConfig(int64_t resample_length) {
  LdaConfig config;
  config.num_topics = 3;
  config.vocabulary_size = 5;
  config.alpha = 0.3;
  config.eta = 0.05;
  config.resample_length = resample_length;
  config.clip_fraction = 0.1;
  config.estep_max_iterations = 100000;
  config.estep_tolerance = 1e-13;
  config.init_seed = 11;
  return config;
}

double Norm(const model::SparseStatistic& s) {
  double sum = 0;
  for (double v : s.values) sum += v * v;
  return std::sqrt(sum);
}

TEST(LdaDigammaTest, EigenDigammaMatchesBoostTo1e12) {
  // Independent oracle: Boost.Math's digamma. Relative error, or absolute
  // near the root at x ≈ 1.4616 where ψ crosses zero.
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> log_x(std::log(1e-4), std::log(1e5));
  for (int i = 0; i < 20000; ++i) {
    const double x = std::exp(log_x(rng));
    const double ours = Eigen::numext::digamma(x);
    const double oracle = boost::math::digamma(x);
    EXPECT_NEAR(ours, oracle, 1e-12 * std::max(1.0, std::abs(oracle))) << x;
  }
}

// Brute force: the explicit per-token mean-field updates (one φ_n per token,
// not the implicit-φ form), iterated to convergence.
Eigen::MatrixXd BruteForceStatistic(const LdaModel& model, const std::vector<int32_t>& tokens) {
  const LdaConfig& c = model.config();
  const Eigen::MatrixXd& eb = model.exp_elog_beta();
  Eigen::VectorXd gamma = Eigen::VectorXd::Ones(c.num_topics);
  Eigen::MatrixXd phi(c.num_topics, tokens.size());
  for (int iteration = 0; iteration < 200000; ++iteration) {
    const double psi_sum = boost::math::digamma(gamma.sum());
    Eigen::VectorXd e(c.num_topics);
    for (int k = 0; k < c.num_topics; ++k) e[k] = std::exp(boost::math::digamma(gamma[k]) - psi_sum);
    for (size_t n = 0; n < tokens.size(); ++n) {
      phi.col(n) = e.cwiseProduct(eb.col(tokens[n]));
      phi.col(n) /= phi.col(n).sum();
    }
    const Eigen::VectorXd next = (c.alpha + phi.rowwise().sum().array()).matrix();
    const double change = (next - gamma).cwiseAbs().maxCoeff();
    gamma = next;
    if (change < 1e-15) break;
  }
  Eigen::MatrixXd s = Eigen::MatrixXd::Zero(c.num_topics, c.vocabulary_size);
  for (size_t n = 0; n < tokens.size(); ++n) s.col(tokens[n]) += phi.col(n);
  return s;
}

TEST(LdaModelTest, EStepMatchesBruteForceMeanField) {
  auto model = LdaModel::Create(SmallConfig(0));
  ASSERT_TRUE(model.ok());
  const std::vector<int32_t> tokens = {0, 0, 2, 4, 4, 4, 1};
  model::Record record;
  record.word_ids = tokens;
  model::RecordRng rng(1);
  auto scratch = (*model)->NewScratch();
  model::SparseStatistic statistic;
  ASSERT_TRUE((*model)->EStep(record, rng, *scratch, statistic).ok());
  const Eigen::MatrixXd expected = BruteForceStatistic(**model, tokens);
  Eigen::MatrixXd got = Eigen::MatrixXd::Zero(3, 5);
  for (size_t i = 0; i < statistic.indices.size(); ++i) {  // word-major: v·K + k
    got(statistic.indices[i] % 3, statistic.indices[i] / 3) = statistic.values[i];
  }
  EXPECT_LT((got - expected).cwiseAbs().maxCoeff(), 1e-9) << got << "\n\n" << expected;
  // φ sums to one per token: column sums are the word counts.
  const Eigen::VectorXd counts = got.colwise().sum();
  EXPECT_NEAR(counts[0], 2, 1e-12);
  EXPECT_NEAR(counts[1], 1, 1e-12);
  EXPECT_NEAR(counts[2], 1, 1e-12);
  EXPECT_NEAR(counts[3], 0, 1e-12);
  EXPECT_NEAR(counts[4], 3, 1e-12);
  // Indices strictly increasing (the mechanism's sparse contract).
  for (size_t i = 1; i < statistic.indices.size(); ++i) {
    EXPECT_LT(statistic.indices[i - 1], statistic.indices[i]);
  }
}

TEST(LdaModelTest, ResamplingGivesExactlyNWordsAndTheBoundHolds) {
  LdaConfig config = SmallConfig(50);
  config.num_topics = 4;
  config.vocabulary_size = 2000;
  config.estep_max_iterations = 100;
  config.estep_tolerance = 1e-3;
  auto model = LdaModel::Create(config);
  ASSERT_TRUE(model.ok());
  const double n = 50, clip = 0.1 * n;
  EXPECT_EQ((*model)->statistic_layout().block(0).clip_bound, clip);
  auto scratch = (*model)->NewScratch();
  std::mt19937_64 gen(5);
  std::vector<std::vector<int32_t>> documents = {
      std::vector<int32_t>(1000, 7),         // one repeated word: ‖s‖ can reach N
      {},                                    // empty after OOV removal
      {1999},                                // one token
  };
  std::vector<int32_t> long_document(200000);  // very long
  for (auto& id : long_document) id = static_cast<int32_t>(gen() % 2000);
  documents.push_back(long_document);
  for (int i = 0; i < 200; ++i) {  // random lengths and vocabularies
    std::vector<int32_t> d(1 + gen() % 300);
    const int range = 1 + static_cast<int>(gen() % 2000);
    for (auto& id : d) id = static_cast<int32_t>(gen() % range);
    documents.push_back(d);
  }
  for (size_t d = 0; d < documents.size(); ++d) {
    model::Record record;
    record.word_ids = documents[d];
    model::RecordRng rng(d + 1);
    model::SparseStatistic statistic;
    ASSERT_TRUE((*model)->EStep(record, rng, *scratch, statistic).ok());
    if (documents[d].empty()) {
      EXPECT_TRUE(statistic.values.empty());
      continue;
    }
    double total = 0;
    for (double v : statistic.values) total += v;
    EXPECT_NEAR(total, n, 1e-9) << d;  // exactly N draws
    EXPECT_LE(Norm(statistic), n * (1 + 1e-12)) << d;
    // After clipping the block never exceeds C = a·N.
    std::vector<double> values = statistic.values;
    privacy::ClipToL2Bound(values, clip);
    double sq = 0;
    for (double v : values) sq += v * v;
    EXPECT_LE(std::sqrt(sq), clip) << d;
  }
  // The repeated-word document reaches the bound N exactly: the proof's
  // inequality is tight, so clipping at a·N really binds.
  model::Record repeated;
  repeated.word_ids = documents[0];
  model::RecordRng rng(1);
  model::SparseStatistic statistic;
  ASSERT_TRUE((*model)->EStep(repeated, rng, *scratch, statistic).ok());
  EXPECT_GT(Norm(statistic), n / std::sqrt(4.0) - 1e-9);
}

TEST(LdaModelTest, ResampledWordsAreCountWordsOfTheSameDraws) {
  // The oracle: draw the N positions one by one from a copy of the same
  // rng, sort the drawn tokens (CountWords). ResampleWords tallies instead
  // when the document is shorter than N; both branches must give the same
  // words, counts and rng state.
  std::mt19937_64 gen(17);
  ResampleBuffers buffers;
  std::vector<int32_t> words, expected_words;
  std::vector<double> counts, expected_counts;
  int tallied = 0, sorted = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int64_t draws = 1 + static_cast<int64_t>(gen() % 600);
    std::vector<int32_t> document(1 + gen() % 900);
    const int range = 1 + static_cast<int>(gen() % 3000);
    for (auto& id : document) id = static_cast<int32_t>(gen() % range);
    (static_cast<int64_t>(document.size()) < draws ? tallied : sorted) += 1;
    model::RecordRng rng(1000 + trial), oracle_rng(1000 + trial);
    std::vector<int32_t> tokens(static_cast<size_t>(draws));
    for (auto& token : tokens) token = document[oracle_rng.Below(document.size())];
    CountWords(tokens, &expected_words, &expected_counts);
    ResampleWords(document, draws, rng, buffers, &words, &counts);
    ASSERT_EQ(words, expected_words) << trial;
    ASSERT_EQ(counts, expected_counts) << trial;
    EXPECT_EQ(rng.Next(), oracle_rng.Next()) << trial;  // the same draws consumed
  }
  EXPECT_GT(tallied, 100);
  EXPECT_GT(sorted, 100);
  // One repeated word, a one-token document, and N = 1.
  for (const auto& [document, draws] :
       std::vector<std::pair<std::vector<int32_t>, int64_t>>{
           {std::vector<int32_t>(10, 7), 500}, {{1999}, 500}, {{3, 1, 2}, 1}}) {
    model::RecordRng rng(5);
    ResampleWords(document, draws, rng, buffers, &words, &counts);
    double total = 0;
    for (double c : counts) total += c;
    EXPECT_EQ(total, static_cast<double>(draws));
    EXPECT_TRUE(std::is_sorted(words.begin(), words.end()));
  }
}

TEST(LdaModelTest, MStepBlendsTheClampedNoisySumDividedByQ) {
  auto model = LdaModel::Create(SmallConfig(10));
  ASSERT_TRUE(model.ok());
  const Eigen::MatrixXd before = (*model)->lambda();
  Eigen::VectorXd sum(15);
  for (int i = 0; i < 15; ++i) sum[i] = (i % 4 == 0) ? -2.0 : 0.5 * i;  // word-major v·K + k
  const double q = 0.25, rho = 0.3;
  ASSERT_TRUE((*model)->MStep(sum, {q, 0.0}, rho).ok());
  for (int k = 0; k < 3; ++k) {
    for (int v = 0; v < 5; ++v) {
      const double s = std::max(0.0, sum[v * 3 + k]);
      EXPECT_DOUBLE_EQ((*model)->lambda()(k, v), (1 - rho) * before(k, v) + rho * (0.05 + s / q));
    }
  }
  // E[log β] follows λ.
  const Eigen::MatrixXd& l = (*model)->lambda();
  EXPECT_NEAR(std::log((*model)->exp_elog_beta()(1, 2)),
              boost::math::digamma(l(1, 2)) - boost::math::digamma(l.row(1).sum()), 1e-12);
  EXPECT_EQ((*model)->noise().floor, 0.0);  // σ = 0: no noise
  EXPECT_EQ((*model)->noise().variance, 0.0);
  EXPECT_FALSE((*model)->MStep(Eigen::VectorXd::Zero(14), {q, 0.0}, rho).ok());
  EXPECT_FALSE((*model)->MStep(sum, {0.0, 0.0}, rho).ok());
  EXPECT_FALSE((*model)->MStep(sum, {q, 0.0}, 0.0).ok());
}

TEST(LdaModelTest, NoiseFollowsTheExactRecursions) {
  auto model = LdaModel::Create(SmallConfig(10));
  ASSERT_TRUE(model.ok());
  const double sigma = 3, q = 0.4;
  auto stds = privacy::NoiseStdPerBlock((*model)->statistic_layout(), sigma);
  ASSERT_TRUE(stds.ok());
  const double s = (*stds)[0] / q;
  EXPECT_NEAR((*stds)[0], sigma * 0.1 * 10, 1e-2 * (*stds)[0]);  // σ·C on the noise's grid
  const Eigen::VectorXd sum = Eigen::VectorXd::Constant(15, 2.0);
  ASSERT_TRUE((*model)->MStep(sum, {q, sigma}, 0.5).ok());
  ASSERT_TRUE((*model)->MStep(sum, {q, sigma}, 0.25).ok());
  const double mean = s / std::sqrt(2 * M_PI), spread = s * s * (0.5 - 0.5 / M_PI);
  const auto& noise = (*model)->noise();
  EXPECT_NEAR(noise.floor, 0.75 * 0.5 * mean + 0.25 * mean, 1e-12 * mean);
  EXPECT_NEAR(noise.floor_variance, 0.75 * 0.75 * 0.25 * spread + 0.0625 * spread,
              1e-12 * spread);
  EXPECT_NEAR(noise.variance, 0.75 * 0.75 * 0.25 * s * s + 0.0625 * s * s, 1e-12 * s * s);
  // A non-private step keeps the earlier steps' noise, decayed.
  const LdaModel::Noise before = noise;
  ASSERT_TRUE((*model)->MStep(sum, {q, 0.0}, 0.5).ok());
  EXPECT_NEAR((*model)->noise().floor, 0.5 * before.floor, 1e-15);
  EXPECT_NEAR((*model)->noise().variance, 0.25 * before.variance, 1e-12);
}

// Topics over a shared vocabulary with Zipf-shaped word frequencies f_w ∝
// 1/(w + 1): β_k ~ Dirichlet(0.3·V·f), topic_total counts each, as a
// step's exact statistic (word-major v·K + k).
Eigen::VectorXd OverlappingTopics(int64_t num_topics, int64_t vocabulary, double topic_total,
                                  uint64_t seed) {
  std::mt19937_64 rng(seed);
  double norm = 0;
  for (int64_t w = 0; w < vocabulary; ++w) norm += 1.0 / static_cast<double>(w + 1);
  Eigen::VectorXd sum = Eigen::VectorXd::Zero(num_topics * vocabulary);
  for (int64_t k = 0; k < num_topics; ++k) {
    std::vector<double> draws(static_cast<size_t>(vocabulary));
    double total = 0;
    for (int64_t w = 0; w < vocabulary; ++w) {
      const double shape =
          0.3 * static_cast<double>(vocabulary) / (static_cast<double>(w + 1) * norm);
      draws[static_cast<size_t>(w)] = std::gamma_distribution<double>(shape, 1.0)(rng);
      total += draws[static_cast<size_t>(w)];
    }
    for (int64_t w = 0; w < vocabulary; ++w) {
      sum[w * num_topics + k] = topic_total * draws[static_cast<size_t>(w)] / total;
    }
  }
  return sum;
}

// What the release states about the noise in λ, against the noise itself:
// three noisy steps on a fixed statistic (topics over a shared Zipf
// vocabulary, a third of each topic's words without counts), 300 noise
// draws, each against the same steps without noise. On cells without
// counts λ − λ_exact has mean noise_floor and sd √noise_floor_variance; on
// cells whose counts stand clear of 0 it has mean 0 and sd √noise_variance.
TEST(LdaModelTest, TheStatedNoiseIsTheNoiseInLambda) {
  LdaConfig config = SmallConfig(100);
  config.num_topics = 4;
  config.vocabulary_size = 2000;
  config.clip_fraction = 0.1;  // C = 10
  Eigen::VectorXd truth = OverlappingTopics(4, 2000, 20000, 3);
  std::mt19937_64 holes(9);
  for (auto& cell : truth) {
    if (holes() % 3 == 0) cell = 0;
  }
  const double sigma = 2, q = 0.5;
  const double rhos[] = {0.6, 0.4, 0.3};
  auto run = [&](uint64_t seed, bool noisy) {
    auto model = LdaModel::Create(config);
    EXPECT_TRUE(model.ok());
    const double s = (*privacy::NoiseStdPerBlock((*model)->statistic_layout(), sigma))[0];
    std::mt19937_64 rng(seed);
    std::normal_distribution<double> noise(0.0, s);
    for (double rho : rhos) {
      Eigen::VectorXd sum = truth * q;  // the step's sum; divided by q it is the truth
      if (noisy) {
        for (auto& entry : sum) entry += noise(rng);
      }
      EXPECT_TRUE((*model)->MStep(sum, {q, sigma}, rho).ok());
    }
    return std::move(*model);
  };
  const auto exact_model = run(0, false);
  const Eigen::MatrixXd exact = exact_model->lambda();
  const Eigen::MatrixXd counts = Eigen::Map<const Eigen::MatrixXd>(truth.data(), 4, 2000);
  constexpr int kDraws = 300;
  Eigen::MatrixXd sum = Eigen::MatrixXd::Zero(4, 2000), squares = sum;
  LdaModel::Noise stated;
  for (int draw = 0; draw < kDraws; ++draw) {
    const auto model = run(1000 + draw, true);
    const Eigen::MatrixXd difference = model->lambda() - exact;
    sum += difference;
    squares += difference.cwiseProduct(difference);
    stated = model->noise();  // the same for every draw (public σ, q, ρ)
  }
  const double step = stated.floor / (0.6 * 0.6 * 0.7 + 0.4 * 0.7 + 0.3);  // s/(q√(2π)) ≈ 80
  ASSERT_GT(stated.floor, 0);
  double empty_mean = 0, empty_square = 0, full_mean = 0, full_square = 0;
  int empty = 0, full = 0;
  for (Eigen::Index k = 0; k < 4; ++k) {
    for (Eigen::Index w = 0; w < 2000; ++w) {
      const double mean = sum(k, w) / kDraws;
      const double variance = squares(k, w) / kDraws - mean * mean;
      if (counts(k, w) == 0) {
        ++empty;
        empty_mean += mean;
        empty_square += variance;
      } else if (counts(k, w) > 12 * step) {  // > 4.8 noise sds every step
        ++full;
        full_mean += mean;
        full_square += variance;
      }
    }
  }
  ASSERT_GT(empty, 2000);
  ASSERT_GT(full, 30);
  EXPECT_NEAR(empty_mean / empty, stated.floor, 0.02 * stated.floor);
  EXPECT_NEAR(std::sqrt(empty_square / empty), std::sqrt(stated.floor_variance),
              0.05 * std::sqrt(stated.floor_variance));
  EXPECT_NEAR(full_mean / full, 0.0, 0.05 * std::sqrt(stated.variance));
  EXPECT_NEAR(std::sqrt(full_square / full), std::sqrt(stated.variance),
              0.1 * std::sqrt(stated.variance));
  // The floor is the clamp's mass: a third of the exact model's mass on
  // the empty cells would be zero; the noisy model holds f there.
  EXPECT_GT(stated.floor, 0.3 * std::sqrt(stated.variance));
}

TEST(LdaModelTest, MStepResultDoesNotDependOnItsThreadCount) {
  Eigen::MatrixXd lambda[3], expectations[3];
  for (int threads : {1, 2, 3}) {
    LdaConfig config = SmallConfig(10);
    config.num_topics = 7;  // odd: the expectation kernel's tails are exercised
    config.vocabulary_size = 1001;
    config.mstep_threads = threads;
    auto model = LdaModel::Create(config);
    ASSERT_TRUE(model.ok());
    std::mt19937_64 rng(4);
    std::exponential_distribution<double> value(0.5);
    for (int step = 0; step < 3; ++step) {
      Eigen::VectorXd sum(7 * 1001);
      for (auto& entry : sum) entry = (rng() % 3 == 0) ? value(rng) : 0.0;
      // Noisy steps too: the noise-aware estimate's reductions.
      ASSERT_TRUE((*model)->MStep(sum, {0.1, step == 1 ? 0.0 : 0.2}, 0.4).ok());
    }
    lambda[threads - 1] = (*model)->lambda();
    expectations[threads - 1] = (*model)->exp_elog_beta();
  }
  for (int i : {1, 2}) {
    EXPECT_EQ(lambda[0], lambda[i]);  // bit for bit
    EXPECT_EQ(expectations[0], expectations[i]);
  }
  // Every entry of exp(E[log β]) against Boost's ψ.
  const Eigen::MatrixXd& l = lambda[0];
  for (Eigen::Index v = 0; v < l.cols(); v += 37) {
    for (Eigen::Index k = 0; k < l.rows(); ++k) {
      const double expected =
          std::exp(boost::math::digamma(l(k, v)) - boost::math::digamma(l.row(k).sum()));
      EXPECT_NEAR(expectations[0](k, v), expected, 1e-13 * expected) << k << ", " << v;
    }
  }
}

TEST(LdaModelTest, ReleaseIsLambdaRowMajorWithTheNoise) {
  auto model = LdaModel::Create(SmallConfig(10));
  ASSERT_TRUE(model.ok());
  ASSERT_TRUE((*model)->MStep(Eigen::VectorXd::LinSpaced(15, 0, 7), {0.5, 1.0}, 0.5).ok());
  const auto arrays = (*model)->ReleaseArrays();
  std::vector<std::string> names;
  for (const auto& array : arrays) names.push_back(array.name);
  EXPECT_EQ(names, (std::vector<std::string>{"lambda", "noise_floor", "noise_floor_variance",
                                             "noise_variance", "noise_share"}));
  EXPECT_EQ(arrays[0].shape, (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(arrays[0].data[1 * 5 + 4], (*model)->lambda()(1, 4));
  EXPECT_EQ(arrays[1].data, (std::vector<double>{(*model)->noise().floor}));
  EXPECT_EQ(arrays[3].data, (std::vector<double>{(*model)->noise().variance}));
  ASSERT_EQ(arrays[4].shape, (std::vector<int64_t>{3}));
  for (int k = 0; k < 3; ++k) {
    const double mass = (*model)->lambda().row(k).sum() - 5 * 0.05;
    EXPECT_NEAR(arrays[4].data[k], std::min(5 * (*model)->noise().floor / mass, 1.0), 1e-12);
  }
}

TEST(LdaModelTest, CheckpointRestoresLambdaAndTheNoiseExactlyAndRejectsMismatches) {
  auto trained = LdaModel::Create(SmallConfig(10));
  ASSERT_TRUE(trained.ok());
  Eigen::VectorXd sum(15);
  for (int i = 0; i < 15; ++i) sum[i] = 0.7 * i - 3;
  ASSERT_TRUE((*trained)->MStep(sum, {0.5, 0.5}, 0.4).ok());
  const auto checkpoint = (*trained)->CheckpointArrays();
  ASSERT_EQ(checkpoint.size(), 4u);

  LdaConfig other_seed = SmallConfig(10);
  other_seed.init_seed = 99;  // a fresh model starts elsewhere
  auto restored = LdaModel::Create(other_seed);
  ASSERT_TRUE(restored.ok());
  ASSERT_NE((*restored)->lambda(), (*trained)->lambda());
  ASSERT_TRUE((*restored)->RestoreCheckpoint(checkpoint).ok());
  EXPECT_EQ((*restored)->lambda(), (*trained)->lambda());  // bit for bit
  EXPECT_EQ((*restored)->exp_elog_beta(), (*trained)->exp_elog_beta());
  EXPECT_EQ((*restored)->noise().floor, (*trained)->noise().floor);
  EXPECT_EQ((*restored)->noise().floor_variance, (*trained)->noise().floor_variance);
  EXPECT_EQ((*restored)->noise().variance, (*trained)->noise().variance);
  // The next step agrees too.
  ASSERT_TRUE((*trained)->MStep(sum, {0.5, 0.5}, 0.3).ok());
  ASSERT_TRUE((*restored)->MStep(sum, {0.5, 0.5}, 0.3).ok());
  EXPECT_EQ((*restored)->lambda(), (*trained)->lambda());
  EXPECT_EQ((*restored)->noise().floor, (*trained)->noise().floor);

  const auto before = (*restored)->lambda();
  auto wrong_shape = checkpoint;
  wrong_shape[0].shape = {5, 3};
  EXPECT_FALSE((*restored)->RestoreCheckpoint(wrong_shape).ok());
  auto wrong_name = checkpoint;
  wrong_name[0].name = "beta";
  EXPECT_FALSE((*restored)->RestoreCheckpoint(wrong_name).ok());
  auto swapped = checkpoint;
  std::swap(swapped[1], swapped[3]);
  EXPECT_FALSE((*restored)->RestoreCheckpoint(swapped).ok());
  auto negative_noise = checkpoint;
  negative_noise[3].data[0] = -1;
  EXPECT_FALSE((*restored)->RestoreCheckpoint(negative_noise).ok());
  auto negative = checkpoint;
  negative[0].data[3] = -1;
  const Status status = (*restored)->RestoreCheckpoint(negative);
  EXPECT_FALSE(status.ok());
  EXPECT_EQ((*restored)->lambda(), before);  // unchanged on error
}

// A checkpoint of the earlier format ("lambda" alone) restores to the same
// λ with no noise counted.
TEST(LdaModelTest, EarlierCheckpointFormatRestoresLambda) {
  auto trained = LdaModel::Create(SmallConfig(10));
  ASSERT_TRUE(trained.ok());
  ASSERT_TRUE((*trained)->MStep(Eigen::VectorXd::LinSpaced(15, 0, 7), {0.5, 1.0}, 0.5).ok());
  auto old = (*trained)->CheckpointArrays();
  old.resize(1);
  auto restored = LdaModel::Create(SmallConfig(10));
  ASSERT_TRUE(restored.ok());
  ASSERT_TRUE((*restored)->RestoreCheckpoint(old).ok());
  EXPECT_EQ((*restored)->lambda(), (*trained)->lambda());
  EXPECT_EQ((*restored)->noise().floor, 0.0);
  EXPECT_EQ((*restored)->noise().variance, 0.0);
}

TEST(LdaModelTest, RejectsOutOfVocabularyIdsWithoutEchoingThem) {
  auto model = LdaModel::Create(SmallConfig(10));
  ASSERT_TRUE(model.ok());
  model::Record record;
  record.word_ids = {1, 987654};
  model::RecordRng rng(1);
  auto scratch = (*model)->NewScratch();
  model::SparseStatistic statistic;
  Status status = (*model)->EStep(record, rng, *scratch, statistic);
  EXPECT_FALSE(status.ok());
  EXPECT_EQ(status.message().find("987654"), std::string::npos);
}

TEST(LdaModelTest, ConfigValidationNamesTheField) {
  LdaConfig config = SmallConfig(10);
  config.alpha = 0;
  auto model = LdaModel::Create(config);
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("lda.alpha"), std::string::npos);
  config = SmallConfig(10);
  config.clip_fraction = 1.5;
  EXPECT_FALSE(LdaModel::Create(config).ok());
  config = SmallConfig(-1);
  EXPECT_FALSE(LdaModel::Create(config).ok());
  config = SmallConfig(10);
  config.mstep_threads = 0;
  auto no_threads = LdaModel::Create(config);
  ASSERT_FALSE(no_threads.ok());
  EXPECT_NE(no_threads.status().message().find("lda.mstep_threads"), std::string::npos);
  EXPECT_TRUE(LdaModel::Create(SmallConfig(0)).ok());
  EXPECT_FALSE((*LdaModel::Create(SmallConfig(0)))->has_proven_bounds());
  EXPECT_TRUE((*LdaModel::Create(SmallConfig(10)))->has_proven_bounds());
}

// model.public_prior for LDA (lda.h, SetPublicPrior): the start blends the
// seeded random start R with the public λ P, each public topic rescaled to
// the random topic's mass, computed here by hand; the result does not depend
// on the λ before the call; no noise is counted for it.
TEST(LdaModelTest, ThePublicStartBlendsThePublicTopicsIntoTheSeededRandomStart) {
  const Eigen::MatrixXd random_start = (*LdaModel::Create(SmallConfig(10)))->lambda();
  std::vector<double> p(15);
  for (size_t i = 0; i < p.size(); ++i) p[i] = 0.5 + static_cast<double>((i * 7) % 11);
  const model::NamedArray public_lambda{"lambda", {3, 5}, p};
  for (const double m : {0.1, 0.5, 1.0}) {
    LdaConfig config = SmallConfig(10);
    config.public_start_weight = m;
    auto model = LdaModel::Create(config);
    ASSERT_TRUE(model.ok());
    // A λ set before (a restored release, a noisy step) is not blended in.
    ASSERT_TRUE((*model)->SetLambda(Eigen::MatrixXd::Constant(3, 5, 40.0)).ok());
    ASSERT_TRUE((*model)->MStep(Eigen::VectorXd::LinSpaced(15, 0, 7), {0.5, 1.0}, 0.5).ok());
    ASSERT_GT((*model)->noise().variance, 0);
    const model::NamedArray arrays[] = {{"noise_floor", {1}, {0.0}}, public_lambda};
    ASSERT_TRUE((*model)->SetPublicPrior(arrays).ok());
    for (int k = 0; k < 3; ++k) {
      double r_mass = 0, p_mass = 0;
      for (int v = 0; v < 5; ++v) {
        r_mass += random_start(k, v);
        p_mass += p[static_cast<size_t>(k * 5 + v)];
      }
      for (int v = 0; v < 5; ++v) {
        const double expected = (1 - m) * random_start(k, v) +
                                m * r_mass / p_mass * p[static_cast<size_t>(k * 5 + v)];
        EXPECT_NEAR((*model)->lambda()(k, v), expected, 1e-13 * expected) << m << " " << k;
      }
      // Every topic keeps the random start's mass.
      EXPECT_NEAR((*model)->lambda().row(k).sum(), r_mass, 1e-12 * r_mass);
    }
    EXPECT_EQ((*model)->noise().variance, 0);
    EXPECT_EQ((*model)->noise().floor, 0);
  }
}

TEST(LdaModelTest, AMalformedPublicStartIsRefusedAndLeavesTheModelUnchanged) {
  auto model = LdaModel::Create(SmallConfig(10));
  ASSERT_TRUE(model.ok());
  const Eigen::MatrixXd before = (*model)->lambda();
  std::vector<double> good(15, 2.0);
  auto with = [&](std::vector<double> data, std::vector<int64_t> shape = {3, 5},
                  std::string name = "lambda") {
    return std::vector<model::NamedArray>{{std::move(name), std::move(shape), std::move(data)}};
  };
  std::vector<double> zero = good, negative = good, infinite = good, nan = good;
  zero[4] = 0;
  negative[7] = -1;
  infinite[0] = std::numeric_limits<double>::infinity();
  nan[14] = std::nan("");
  const std::vector<std::pair<std::vector<model::NamedArray>, std::string>> cases = {
      {with(good, {3, 5}, "beta"), "no array \"lambda\""},
      {with(good, {5, 3}), "shape K x V = 3 x 5"},
      {with(std::vector<double>(14, 2.0), {3, 5}), "shape K x V = 3 x 5"},
      {with(zero), "finite and > 0"},
      {with(negative), "finite and > 0"},
      {with(infinite), "finite and > 0"},
      {with(nan), "finite and > 0"},
  };
  for (const auto& [arrays, says] : cases) {
    const Status set = (*model)->SetPublicPrior(arrays);
    ASSERT_FALSE(set.ok()) << says;
    EXPECT_NE(set.message().find(says), std::string::npos) << set.message();
    EXPECT_EQ((*model)->lambda(), before);
  }
  LdaConfig config = SmallConfig(10);
  for (const double m : {0.0, -0.5, 1.5, std::nan("")}) {
    config.public_start_weight = m;
    auto refused = LdaModel::Create(config);
    ASSERT_FALSE(refused.ok()) << m;
    EXPECT_NE(refused.status().message().find("public_start_weight"), std::string::npos);
  }
}

}  // namespace
}  // namespace vipsd::models
