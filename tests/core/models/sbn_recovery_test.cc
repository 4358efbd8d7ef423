// End-to-end SVI with the sigmoid belief network through the real step
// driver (core/svi/step_driver.h): on data drawn from a known small network
// ("bars": each hidden unit switches on one row of a 4 × 4 image),
// non-private SVI improves held-out reconstruction over steps and beats the
// per-pixel marginal baseline; a private run charges the accountant exactly
// once per step and still learns the visible biases; a public start helps a
// private run at large noise.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "core/models/sbn.h"
#include "core/models/sbn_eval.h"
#include "core/privacy/accounting/planner.h"
#include "core/privacy/accounting/rdp_accountant.h"
#include "core/privacy/mechanisms/secure_noise.h"
#include "core/svi/step_driver.h"
#include "tests/testing/testing_noise.h"

namespace vipsd::models {
namespace {

constexpr int kSide = 4;
constexpr int kVisible = kSide * kSide;
constexpr int kHidden = 4;       // true network
constexpr int kModelHidden = 8;  // over-complete model: mean-field SVI with
                                 // exactly K = 4 can stall in a distributed
                                 // local optimum (seed-dependent)

// True network: W(j, k) = 6 if pixel j is in row k, c = −3, b = 0.
std::vector<double> SampleImage(std::mt19937_64& rng) {
  std::bernoulli_distribution unit(0.5);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::vector<double> y(kVisible);
  for (int k = 0; k < kHidden; ++k) {
    const bool on = unit(rng);
    for (int col = 0; col < kSide; ++col) {
      const double activation = (on ? 6.0 : 0.0) - 3.0;
      y[k * kSide + col] = uniform(rng) < 1.0 / (1.0 + std::exp(-activation)) ? 1.0 : 0.0;
    }
  }
  return y;
}

struct Data {
  std::vector<model::Record> pool;
  std::vector<std::vector<double>> train, test;
};

Data Generate(uint64_t seed, int train_size, int test_size) {
  std::mt19937_64 rng(seed);
  Data data;
  for (int i = 0; i < train_size; ++i) {
    data.train.push_back(SampleImage(rng));
    model::Record record;
    record.features = data.train.back();
    data.pool.push_back(std::move(record));
  }
  for (int i = 0; i < test_size; ++i) data.test.push_back(SampleImage(rng));
  return data;
}

SbnConfig ModelConfig() {
  SbnConfig config;
  config.visible = kVisible;
  config.hidden = kModelHidden;
  config.init_seed = 3;
  return config;
}

SbnHeldOutResult Evaluate(const SbnModel& model, const Data& data) {
  SbnEvalOptions options;
  options.importance_samples = 50;
  auto result = EvaluateSbnHeldOut(model.expectations(), data.test, options);
  EXPECT_TRUE(result.ok()) << result.status().ToString();
  return *result;
}

TEST(SbnRecoveryTest, NonPrivateSviImprovesReconstructionAndBeatsTheMarginalBaseline) {
  const Data data = Generate(1, 2000, 400);
  auto model = SbnModel::Create(ModelConfig());
  ASSERT_TRUE(model.ok());
  testing::ZeroNoiseSource bits(5);  // σ = 0: only the sampling bits are used
  svi::DriverConfig config;
  config.mechanism.sampling_rate = 0.05;
  config.mechanism.noise_multiplier = 0;
  config.tau0 = 1;
  config.kappa = 0.7;
  auto driver = svi::StepDriver::Create(model->get(), &bits, nullptr, config);
  ASSERT_TRUE(driver.ok());

  const SbnHeldOutResult initial = Evaluate(**model, data);
  SbnHeldOutResult early;
  for (int step = 1; step <= 80; ++step) {
    auto result = (*driver)->Step(data.pool);
    ASSERT_TRUE(result.ok()) << result.status().ToString();
    if (step == 5) early = Evaluate(**model, data);
  }
  const SbnHeldOutResult final_result = Evaluate(**model, data);
  auto baseline = SbnMarginalBaseline(data.train, data.test);
  ASSERT_TRUE(baseline.ok());
  // The rows are on half the time: the marginal baseline is near chance,
  // while the bars model reconstructs ~95% of pixels (σ(3) ≈ 0.953).
  EXPECT_LT(baseline->accuracy, 0.6);
  EXPECT_GT(final_result.accuracy_mean, 0.9);
  EXPECT_GT(final_result.accuracy_sampled, 0.85);
  EXPECT_GT(final_result.accuracy_mean, baseline->accuracy + 0.25);
  EXPECT_GT(final_result.accuracy_mean, initial.accuracy_mean + 0.2);
  // Still improving after the first few steps (the sampled reconstruction
  // and the likelihood keep sharpening after E[z]-reconstruction saturates).
  EXPECT_GT(final_result.accuracy_sampled, early.accuracy_sampled + 0.02);
  EXPECT_GT(final_result.loglik_per_record, early.loglik_per_record + 1.0);
  EXPECT_GT(early.loglik_per_record, initial.loglik_per_record);
  EXPECT_GT(final_result.loglik_per_record, baseline->loglik_per_record);
}

TEST(SbnRecoveryTest, PrivateRunChargesTheAccountantOncePerStep) {
  const Data data = Generate(2, 1000, 200);
  auto model = SbnModel::Create(ModelConfig());
  ASSERT_TRUE(model.ok());
  auto noise = privacy::SecureNoiseSource::CreateReproducible(9);  // test: not private
  ASSERT_TRUE(noise.ok());
  privacy::RdpAccountant accountant;
  svi::DriverConfig config;
  config.mechanism.sampling_rate = 0.2;
  config.mechanism.noise_multiplier = 1.5;
  config.tau0 = 1;
  config.kappa = 0.7;
  config.delta = 1e-5;
  config.epsilon_ceiling = 1e6;
  auto driver = svi::StepDriver::Create(model->get(), noise->get(), &accountant, config);
  ASSERT_TRUE(driver.ok());
  const int steps = 12;
  for (int step = 1; step <= steps; ++step) {
    auto result = (*driver)->Step(data.pool);
    ASSERT_TRUE(result.ok()) << result.status().ToString();
    ASSERT_EQ(result->outcome, svi::StepResult::Outcome::kRan);
    EXPECT_EQ(accountant.steps(), step);  // exactly one mechanism per step
  }
  auto spent = accountant.GetEpsilon(1e-5);
  ASSERT_TRUE(spent.ok());
  auto planned = privacy::EstimateEpsilon(privacy::AccountantKind::kRdp, {0.2, 1.5}, steps, 1e-5);
  ASSERT_TRUE(planned.ok());
  EXPECT_NEAR(spent->epsilon, planned->epsilon, 1e-9 * planned->epsilon);
  // The posterior stays finite and usable after noisy steps.
  EXPECT_TRUE(model->get()->w_mean().allFinite());
  const SbnHeldOutResult result = Evaluate(**model, data);
  EXPECT_GT(result.accuracy_mean, 0.3);
}

// A public start (SbnModel::SetPublicPrior; docs/models.md, "Public
// priors"): a non-private fit on separate public records drawn from the same
// network, used as the start of a private run at large noise, ends with a
// better held-out likelihood and reconstruction than the same private run
// (same records, same noise) from the usual random start.
std::unique_ptr<SbnModel> FitPublic(uint64_t seed, int records, int steps) {
  const Data data = Generate(seed, records, 0);
  auto model = SbnModel::Create(ModelConfig());
  EXPECT_TRUE(model.ok());
  testing::ZeroNoiseSource bits(seed);
  svi::DriverConfig config;
  config.mechanism.sampling_rate = 0.1;
  config.mechanism.noise_multiplier = 0;
  config.tau0 = 1;
  config.kappa = 0.7;
  auto driver = svi::StepDriver::Create(model->get(), &bits, nullptr, config);
  EXPECT_TRUE(driver.ok());
  for (int step = 0; step < steps; ++step) EXPECT_TRUE((*driver)->Step(data.pool).ok());
  return std::move(*model);
}

// `steps` private steps (σ, q) from the usual start or from `start`.
SbnHeldOutResult RunPrivate(const Data& data, const std::vector<model::NamedArray>* start,
                            uint64_t noise_seed, double sigma, double q, int steps) {
  auto model = SbnModel::Create(ModelConfig());
  EXPECT_TRUE(model.ok());
  if (start != nullptr) {
    const Status set = (*model)->SetPublicPrior(*start);
    EXPECT_TRUE(set.ok()) << set.ToString();
  }
  auto noise = privacy::SecureNoiseSource::CreateReproducible(noise_seed);  // test: not private
  EXPECT_TRUE(noise.ok());
  privacy::RdpAccountant accountant;
  svi::DriverConfig config;
  config.mechanism.sampling_rate = q;
  config.mechanism.noise_multiplier = sigma;
  config.tau0 = 1;
  config.kappa = 0.7;
  config.delta = 1e-5;
  config.epsilon_ceiling = 1e6;
  auto driver = svi::StepDriver::Create(model->get(), noise->get(), &accountant, config);
  EXPECT_TRUE(driver.ok());
  for (int step = 0; step < steps; ++step) {
    auto result = (*driver)->Step(data.pool);
    EXPECT_TRUE(result.ok() && result->outcome == svi::StepResult::Outcome::kRan);
  }
  EXPECT_EQ(accountant.steps(), steps);  // the public start costs no step
  return Evaluate(**model, data);
}

// Measured (seeds 0, 1, 2; held-out accuracy from E[z] / IS log-likelihood
// per image): usual start 0.570 / −11.04, 0.603 / −11.07, 0.677 / −11.01;
// public start 0.793 / −10.73, 0.791 / −10.84, 0.856 / −10.71 (marginal
// baseline ≈ 0.50 / −11.10, the public fit alone ≈ 0.95 / −6.9: the
// private steps pull the start towards their noisy estimates). The gain
// shrinks with more steps (20 steps: +0.05 to +0.14 accuracy over 10
// seeds) and is all but gone at σ ≥ 2, where both runs end near the
// baseline (differences within 0.07 accuracy and 0.03 log-likelihood).
TEST(SbnRecoveryTest, APublicStartHelpsAPrivateRunAtLargeNoise) {
  // σ = 1 at q = 0.2 (about 200 of 1,000 records per step) for 5 steps,
  // ε ≈ 4.5 at δ = 1e-5: noise of the size of the W statistics.
  constexpr double kSigma = 1.0;
  constexpr double kRate = 0.2;
  constexpr int kSteps = 5;
  constexpr int kSeeds = 3;
  double accuracy_gain = 0;
  double loglik_gain = 0;
  for (uint64_t seed = 0; seed < kSeeds; ++seed) {
    const Data data = Generate(10 + seed, 1000, 400);
    const auto public_model = FitPublic(20 + seed, 1000, 20);  // other records, same network
    const std::vector<model::NamedArray> start = public_model->ReleaseArrays();
    const SbnHeldOutResult usual = RunPrivate(data, nullptr, 30 + seed, kSigma, kRate, kSteps);
    const SbnHeldOutResult from_public =
        RunPrivate(data, &start, 30 + seed, kSigma, kRate, kSteps);
    EXPECT_GT(from_public.accuracy_mean, usual.accuracy_mean + 0.05) << "seed " << seed;
    EXPECT_GT(from_public.loglik_per_record, usual.loglik_per_record + 0.05) << "seed " << seed;
    accuracy_gain += (from_public.accuracy_mean - usual.accuracy_mean) / kSeeds;
    loglik_gain += (from_public.loglik_per_record - usual.loglik_per_record) / kSeeds;
  }
  EXPECT_GT(accuracy_gain, 0.1);
  EXPECT_GT(loglik_gain, 0.1);
}

}  // namespace
}  // namespace vipsd::models
