// End-to-end check of non-private SVI with LDA (σ = 0, docs/models.md, "The stochastic step"): on a
// corpus drawn from known topics, the step driver recovers the topics and
// held-out perplexity falls over steps.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "core/models/lda.h"
#include "core/models/lda_eval.h"
#include "core/svi/step_driver.h"
#include "tests/testing/testing_noise.h"

namespace vipsd::models {
namespace {

constexpr int kTopics = 5;
constexpr int kVocabulary = 60;

std::vector<double> SampleDirichlet(std::mt19937_64& rng, int n, double concentration) {
  std::gamma_distribution<double> gamma(concentration, 1.0);
  std::vector<double> x(n);
  for (double& v : x) v = gamma(rng);
  const double sum = std::accumulate(x.begin(), x.end(), 0.0);
  for (double& v : x) v /= sum;
  return x;
}

struct Corpus {
  std::vector<std::vector<double>> topics;  // K × V
  std::vector<std::vector<int32_t>> train, test;
};

Corpus Generate(uint64_t seed) {
  std::mt19937_64 rng(seed);
  Corpus corpus;
  for (int k = 0; k < kTopics; ++k) corpus.topics.push_back(SampleDirichlet(rng, kVocabulary, 0.1));
  auto document = [&]() {
    const auto theta = SampleDirichlet(rng, kTopics, 0.3);
    std::discrete_distribution<int> topic(theta.begin(), theta.end());
    std::vector<int32_t> words(60);
    for (auto& w : words) {
      const auto& beta = corpus.topics[topic(rng)];
      w = std::discrete_distribution<int32_t>(beta.begin(), beta.end())(rng);
    }
    return words;
  };
  for (int d = 0; d < 1500; ++d) corpus.train.push_back(document());
  for (int d = 0; d < 300; ++d) corpus.test.push_back(document());
  return corpus;
}

double Cosine(const std::vector<double>& a, const Eigen::VectorXd& b) {
  double dot = 0, na = 0, nb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    dot += a[i] * b[i];
    na += a[i] * a[i];
    nb += b[i] * b[i];
  }
  return dot / std::sqrt(na * nb);
}

// Best assignment of learned topics to true topics (exhaustive Hungarian
// for K = 5: 120 permutations).
double MatchedMeanCosine(const Corpus& corpus, const Eigen::MatrixXd& lambda) {
  const Eigen::MatrixXd beta = lambda.array().colwise() / lambda.rowwise().sum().array();
  std::vector<int> permutation(kTopics);
  std::iota(permutation.begin(), permutation.end(), 0);
  double best = -1;
  do {
    double total = 0;
    for (int k = 0; k < kTopics; ++k) {
      total += Cosine(corpus.topics[k], beta.row(permutation[k]).transpose());
    }
    best = std::max(best, total / kTopics);
  } while (std::next_permutation(permutation.begin(), permutation.end()));
  return best;
}

TEST(LdaRecoveryTest, NonPrivateSviRecoversKnownTopics) {
  const Corpus corpus = Generate(2026);
  LdaConfig config;
  config.num_topics = kTopics;
  config.vocabulary_size = kVocabulary;
  config.alpha = 0.3;
  config.eta = 0.05;
  config.resample_length = 0;  // actual counts: standard SVI
  config.init_seed = 1;
  auto model = LdaModel::Create(config);
  ASSERT_TRUE(model.ok());
  std::vector<model::Record> pool(corpus.train.size());
  for (size_t d = 0; d < pool.size(); ++d) pool[d].word_ids = corpus.train[d];
  testing::ZeroNoiseSource noise(7);  // sampling bits only; σ = 0 adds no noise
  svi::DriverConfig driver_config;
  driver_config.sampling_rate = 0.05;
  driver_config.noise_multiplier = 0;
  driver_config.tau0 = 10;
  driver_config.kappa = 0.7;
  driver_config.threads = 2;
  auto driver = svi::StepDriver::Create(model->get(), &noise, nullptr, driver_config);
  ASSERT_TRUE(driver.ok());

  std::vector<double> perplexity;
  auto evaluate = [&]() {
    auto result = DocumentCompletion((*model)->lambda(), config.alpha, corpus.test);
    ASSERT_TRUE(result.ok());
    perplexity.push_back(result->perplexity);
  };
  evaluate();
  for (int checkpoint = 0; checkpoint < 6; ++checkpoint) {
    for (int t = 0; t < 50; ++t) ASSERT_TRUE((*driver)->Step(pool).ok());
    evaluate();
  }
  // Falls over steps: clearly overall, and never rises by more than 2%
  // between checkpoints (SVI is stochastic).
  EXPECT_LT(perplexity.back(), 0.8 * perplexity.front());
  for (size_t i = 1; i < perplexity.size(); ++i) {
    EXPECT_LT(perplexity[i], perplexity[i - 1] * 1.02) << i;
  }
  const double cosine = MatchedMeanCosine(corpus, (*model)->lambda());
  EXPECT_GE(cosine, 0.9);
  RecordProperty("mean_cosine", std::to_string(cosine));
  RecordProperty("final_perplexity", std::to_string(perplexity.back()));
  // Better than the unigram baseline on the same held-out halves.
  auto unigram = UnigramBaseline(corpus.train, corpus.test, kVocabulary, config.eta);
  ASSERT_TRUE(unigram.ok());
  EXPECT_LT(perplexity.back(), unigram->completion_perplexity);
  // The per-word bound is a finite perplexity above the completion one's floor.
  auto bound = PerWordPerplexityBound(**model, corpus.test);
  ASSERT_TRUE(bound.ok());
  EXPECT_TRUE(std::isfinite(bound->perplexity));
  EXPECT_GT(bound->perplexity, 1.0);
  EXPECT_EQ(bound->documents, 300);
}

}  // namespace
}  // namespace vipsd::models
