// End-to-end BLR through the unchanged svi::StepDriver on synthetic data
// (n = 20,000, d = 20): non-private SVI recovers the generating weights and
// matches a non-private L2-regularised logistic regression fitted here by
// Newton's method (an independent oracle) on held-out AUC; private runs
// charge the RDP accountant exactly once per step that ran.
#include <gtest/gtest.h>

#include <Eigen/Cholesky>
#include <cmath>
#include <random>
#include <vector>

#include "core/models/blr.h"
#include "core/models/blr_eval.h"
#include "core/privacy/accounting/rdp_accountant.h"
#include "core/privacy/mechanisms/secure_noise.h"
#include "core/svi/step_driver.h"
#include "tests/testing/testing_noise.h"

namespace vipsd::models {
namespace {

constexpr int kDim = 20;
constexpr int kTrain = 20000;
constexpr int kTest = 5000;

struct Data {
  Eigen::VectorXd true_weights;
  std::vector<model::Record> train;
  std::vector<std::vector<double>> test_x;
  std::vector<double> test_y;
};

// x: a uniformly random direction with length uniform in [0.5, 1];
// y ~ Bernoulli(σ(wᵀx)), w ~ N(0, 9 I) (held-out logits have std ≈ 2.4).
Data Generate(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal;
  std::uniform_real_distribution<double> uniform(0, 1);
  Data data;
  data.true_weights = Eigen::VectorXd::NullaryExpr(kDim, [&] { return 3.0 * normal(rng); });
  auto sample = [&](std::vector<double>& x, double& y) {
    x.resize(kDim);
    double norm = 0;
    for (double& v : x) {
      v = normal(rng);
      norm += v * v;
    }
    const double scale = (0.5 + 0.5 * uniform(rng)) / std::sqrt(norm);
    double logit = 0;
    for (int i = 0; i < kDim; ++i) {
      x[i] *= scale;
      logit += x[i] * data.true_weights[i];
    }
    y = uniform(rng) < Sigmoid(logit) ? 1.0 : 0.0;
  };
  data.train.resize(kTrain);
  for (auto& record : data.train) sample(record.features, record.label);
  data.test_x.resize(kTest);
  data.test_y.resize(kTest);
  for (int n = 0; n < kTest; ++n) sample(data.test_x[n], data.test_y[n]);
  return data;
}

// Independent oracle: argmin_w Σ_n [log(1 + e^{wᵀx_n}) − y_n wᵀx_n] + (λ/2)‖w‖²
// by Newton's method (the objective is strictly convex).
Eigen::VectorXd NewtonLogisticRegression(const std::vector<model::Record>& train, double l2) {
  Eigen::VectorXd w = Eigen::VectorXd::Zero(kDim);
  for (int iteration = 0; iteration < 50; ++iteration) {
    Eigen::VectorXd gradient = l2 * w;
    Eigen::MatrixXd hessian = l2 * Eigen::MatrixXd::Identity(kDim, kDim);
    for (const auto& record : train) {
      const Eigen::Map<const Eigen::VectorXd> x(record.features.data(), kDim);
      const double p = Sigmoid(w.dot(x));
      gradient += (p - record.label) * x;
      hessian.noalias() += p * (1 - p) * x * x.transpose();
    }
    const Eigen::VectorXd step = hessian.llt().solve(gradient);
    w -= step;
    if (step.norm() < 1e-10 * (1 + w.norm())) break;
  }
  return w;
}

double Correlation(const Eigen::VectorXd& a, const Eigen::VectorXd& b) {
  const Eigen::VectorXd ac = a.array() - a.mean();
  const Eigen::VectorXd bc = b.array() - b.mean();
  return ac.dot(bc) / std::sqrt(ac.squaredNorm() * bc.squaredNorm());
}

double HeldOutAuc(const BlrPosterior& posterior, const Data& data) {
  auto evaluation = EvaluateBlr(posterior, data.test_x, data.test_y);
  EXPECT_TRUE(evaluation.ok());
  return evaluation.ok() ? evaluation->auc : 0.0;
}

std::unique_ptr<BlrModel> NewModel() {
  BlrConfig config;
  config.dim = kDim;
  auto model = BlrModel::Create(config);
  EXPECT_TRUE(model.ok());
  return std::move(*model);
}

svi::DriverConfig Schedule(double sigma) {
  svi::DriverConfig config;
  config.mechanism.sampling_rate = 0.05;
  config.mechanism.noise_multiplier = sigma;
  config.tau0 = 1;
  config.kappa = 0.7;
  config.threads = 2;
  config.delta = 1e-5;
  config.epsilon_ceiling = 100;
  return config;
}

TEST(BlrRecoveryTest, NonPrivateSviRecoversWeightsAndMatchesNewton) {
  const Data data = Generate(2026);
  auto model = NewModel();
  testing::ZeroNoiseSource sampling_bits(11);  // σ = 0: only sampling bits are used
  auto driver = svi::StepDriver::Create(model.get(), &sampling_bits, nullptr, Schedule(0));
  ASSERT_TRUE(driver.ok());
  for (int t = 0; t < 150; ++t) ASSERT_TRUE((*driver)->Step(data.train).ok());

  const double correlation = Correlation(model->mean(), data.true_weights);
  EXPECT_GE(correlation, 0.95);

  auto posterior = BlrPosteriorFromArrays(model->ReleaseArrays());
  ASSERT_TRUE(posterior.ok());
  const double blr_auc = HeldOutAuc(*posterior, data);
  const Eigen::VectorXd newton = NewtonLogisticRegression(data.train, /*l2=*/1.0);
  const BlrPosterior newton_point{newton, Eigen::MatrixXd::Zero(kDim, kDim)};
  const double newton_auc = HeldOutAuc(newton_point, data);
  EXPECT_NEAR(blr_auc, newton_auc, 0.01);
  EXPECT_GT(newton_auc, 0.8);  // the data are informative
  // The posterior mean is close to the penalised MLE, not just its AUC.
  EXPECT_GE(Correlation(model->mean(), newton), 0.99);
  RecordProperty("blr_auc", std::to_string(blr_auc));
  RecordProperty("newton_auc", std::to_string(newton_auc));
  RecordProperty("correlation", std::to_string(correlation));
}

TEST(BlrRecoveryTest, PrivateRunChargesTheAccountantOncePerStep) {
  const Data data = Generate(7);
  auto model = NewModel();
  // Reproducible ChaCha20 stream: real Gaussian noise, repeatable test.
  auto noise = privacy::SecureNoiseSource::CreateReproducible(99);
  ASSERT_TRUE(noise.ok());
  privacy::RdpAccountant accountant;
  auto driver = svi::StepDriver::Create(model.get(), noise->get(), &accountant, Schedule(1.0));
  ASSERT_TRUE(driver.ok());
  constexpr int kSteps = 120;
  for (int t = 1; t <= kSteps; ++t) {
    auto result = (*driver)->Step(data.train);
    ASSERT_TRUE(result.ok());
    ASSERT_EQ(result->outcome, svi::StepResult::Outcome::kRan);
    EXPECT_EQ(accountant.steps(), t);
    auto spent = accountant.GetEpsilon(1e-5);
    ASSERT_TRUE(spent.ok());
    EXPECT_DOUBLE_EQ(result->epsilon_spent, spent->epsilon);
  }
  // One mechanism per step over both blocks: the accountant holds exactly
  // kSteps steps of (q, σ), i.e. the same curve as composing them at once.
  privacy::RdpAccountant expected;
  ASSERT_TRUE(expected.Compose({0.05, 1.0}, kSteps).ok());
  EXPECT_NEAR(accountant.GetEpsilon(1e-5)->epsilon, expected.GetEpsilon(1e-5)->epsilon, 1e-9);
  // Still a useful model at this noise level.
  EXPECT_GE(Correlation(model->mean(), data.true_weights), 0.9);
  auto posterior = BlrPosteriorFromArrays(model->ReleaseArrays());
  ASSERT_TRUE(posterior.ok());
  EXPECT_GT(HeldOutAuc(*posterior, data), 0.8);
}

TEST(BlrRecoveryTest, CeilingRefusesStepsWithoutChargingThem) {
  const Data data = Generate(8);
  auto model = NewModel();
  auto noise = privacy::SecureNoiseSource::CreateReproducible(3);
  ASSERT_TRUE(noise.ok());
  privacy::RdpAccountant accountant;
  svi::DriverConfig config = Schedule(1.0);
  config.epsilon_ceiling = 2.0;
  auto driver = svi::StepDriver::Create(model.get(), noise->get(), &accountant, config);
  ASSERT_TRUE(driver.ok());
  int ran = 0;
  for (int t = 0; t < 400; ++t) {
    auto result = (*driver)->Step(data.train);
    ASSERT_TRUE(result.ok());
    if (result->outcome == svi::StepResult::Outcome::kRefusedCeiling) break;
    ++ran;
  }
  ASSERT_GT(ran, 0);
  ASSERT_LT(ran, 400);
  EXPECT_EQ(accountant.steps(), ran);
  const auto release_before = model->ReleaseArrays();
  auto refused = (*driver)->Step(data.train);
  ASSERT_TRUE(refused.ok());
  EXPECT_EQ(refused->outcome, svi::StepResult::Outcome::kRefusedCeiling);
  EXPECT_EQ(accountant.steps(), ran);
  EXPECT_EQ(model->ReleaseArrays()[0].data, release_before[0].data);
  EXPECT_LE(accountant.GetEpsilon(1e-5)->epsilon, 2.0);
}

}  // namespace
}  // namespace vipsd::models
