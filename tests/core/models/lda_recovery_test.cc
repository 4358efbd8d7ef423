// End-to-end check of non-private SVI with LDA (σ = 0, docs/models.md, "The stochastic step"): on a
// corpus drawn from known topics, the step driver recovers the topics and
// held-out perplexity falls over steps.
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "core/models/lda.h"
#include "core/models/lda_eval.h"
#include "core/privacy/accounting/rdp_accountant.h"
#include "core/privacy/mechanisms/secure_noise.h"
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

Corpus Generate(uint64_t seed, int train_documents = 1500) {
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
  for (int d = 0; d < train_documents; ++d) corpus.train.push_back(document());
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
  driver_config.mechanism.sampling_rate = 0.05;
  driver_config.mechanism.noise_multiplier = 0;
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

// Fits `config` on `documents` with the step driver: σ = 0 and no
// accountant, or σ > 0 with an RDP accountant (ceiling far away) and the
// reproducible noise of `noise_seed`; q = 1 for `steps` steps.
std::unique_ptr<LdaModel> Fit(const LdaConfig& config,
                              const std::vector<std::vector<int32_t>>& documents, double sigma,
                              int steps, uint64_t noise_seed,
                              const std::vector<model::NamedArray>* public_prior) {
  auto model = LdaModel::Create(config);
  EXPECT_TRUE(model.ok());
  if (public_prior != nullptr) {
    EXPECT_TRUE((*model)->SetPublicPrior(*public_prior).ok());
  }
  std::vector<model::Record> pool(documents.size());
  for (size_t d = 0; d < pool.size(); ++d) pool[d].word_ids = documents[d];
  auto noise = privacy::SecureNoiseSource::CreateReproducible(noise_seed);
  EXPECT_TRUE(noise.ok());
  privacy::RdpAccountant accountant;
  svi::DriverConfig driver_config;
  driver_config.mechanism.sampling_rate = 1.0;
  driver_config.mechanism.noise_multiplier = sigma;
  driver_config.tau0 = 1;
  driver_config.kappa = 0.7;
  driver_config.threads = 2;
  driver_config.delta = 1e-5;
  driver_config.epsilon_ceiling = 1e6;
  auto driver = svi::StepDriver::Create(model->get(), noise->get(), sigma > 0 ? &accountant : nullptr,
                                        driver_config);
  EXPECT_TRUE(driver.ok());
  for (int t = 0; t < steps; ++t) EXPECT_TRUE((*driver)->Step(pool).ok());
  return std::move(*model);
}

// model.public_prior (docs/models.md, "Public priors"): a model fitted
// non-privately on a small public corpus drawn from the same topics, blended
// into the private run's start at the default weight, recovers the topics
// better at the same σ than a private run from the random start, and better
// than the public model alone. A public model of other topics costs much
// less in the blended start than as the whole start (weight 1). (It still
// costs something on this small model: 0.02–0.07 of matched cosine below
// the random start for weights 0.005–0.1, against 0.19 at weight 1.)
TEST(LdaRecoveryTest, APublicStartRecoversTopicsBetterAtTheSameNoise) {
  const Corpus corpus = Generate(2026, 1200);
  const Corpus public_corpus = [&] {
    Corpus drawn = Generate(2026, 1200 + 150);  // same topics, 150 further documents
    drawn.train.erase(drawn.train.begin(), drawn.train.begin() + 1200);
    return drawn;
  }();
  for (int k = 0; k < kTopics; ++k) ASSERT_EQ(public_corpus.topics[k], corpus.topics[k]);
  LdaConfig config;
  config.num_topics = kTopics;
  config.vocabulary_size = kVocabulary;
  config.alpha = 0.3;
  config.eta = 0.05;
  config.resample_length = 0;
  config.init_seed = 1;
  const auto public_model = Fit(config, public_corpus.train, 0, 20, 1, nullptr);
  const auto public_arrays = public_model->ReleaseArrays();
  const double public_only = MatchedMeanCosine(corpus, public_model->lambda());
  // A poor source: 150 documents of other topics.
  const Corpus other_corpus = Generate(7, 150);
  const auto poor_arrays = Fit(config, other_corpus.train, 0, 20, 1, nullptr)->ReleaseArrays();

  config.resample_length = 60;  // private: N draws, C = a·N
  config.clip_fraction = 0.1;
  const double sigma = 4;
  double with_public = 0, without = 0, with_poor = 0, full_poor = 0;
  constexpr int kSeeds = 3;
  for (int seed = 0; seed < kSeeds; ++seed) {
    without += MatchedMeanCosine(corpus, Fit(config, corpus.train, sigma, 10, 100 + seed,
                                             nullptr)->lambda()) / kSeeds;
    with_public += MatchedMeanCosine(corpus, Fit(config, corpus.train, sigma, 10, 100 + seed,
                                                 &public_arrays)->lambda()) / kSeeds;
    with_poor += MatchedMeanCosine(corpus, Fit(config, corpus.train, sigma, 10, 100 + seed,
                                               &poor_arrays)->lambda()) / kSeeds;
    LdaConfig full = config;
    full.public_start_weight = 1;
    full_poor += MatchedMeanCosine(corpus, Fit(full, corpus.train, sigma, 10, 100 + seed,
                                               &poor_arrays)->lambda()) / kSeeds;
  }
  RecordProperty("cosine_public_only", std::to_string(public_only));
  RecordProperty("cosine_private", std::to_string(without));
  RecordProperty("cosine_private_with_public_start", std::to_string(with_public));
  RecordProperty("cosine_private_with_poor_start", std::to_string(with_poor));
  std::cout << "matched mean cosine: public only " << public_only << ", private " << without
            << ", private with the public start " << with_public << ", with a poor start "
            << with_poor << " (" << full_poor << " at weight 1)\n";
  EXPECT_GT(with_public, without + 0.02);
  EXPECT_GT(with_public, public_only);
  EXPECT_GT(with_poor, full_poor + 0.1);
  EXPECT_GT(with_poor, without - 0.1);
}

}  // namespace
}  // namespace vipsd::models
