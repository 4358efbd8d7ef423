// Held-out evaluation of the sigmoid belief network (core/models/sbn_eval.h):
// the marginal baseline on hand-computed data, reconstruction on a model
// whose posterior over z is nearly deterministic, the importance-sampling
// log-likelihood against exact enumeration over z ∈ {0,1}^K, thread-count
// independence and input validation.
#include "core/models/sbn_eval.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/models/sbn.h"

namespace vipsd::models {
namespace {

double LogSigmoid(double x) { return -std::log1p(std::exp(-x)); }

// Exact log p(y) = log Σ_z Π_j σ((2y_j − 1)ψ_j) Π_k σ((2z_k − 1)b_k) at the
// posterior means (the quantity the IS estimate targets).
double ExactLogLikelihood(const SbnExpectations& e, const std::vector<double>& y) {
  const int64_t k = e.hidden;
  double total = 0;
  for (int64_t bits = 0; bits < (int64_t{1} << k); ++bits) {
    Eigen::VectorXd z(k);
    for (int64_t i = 0; i < k; ++i) z[i] = (bits >> i) & 1;
    const Eigen::VectorXd psi = e.w_mean * z + e.c_mean;
    double log_joint = 0;
    for (int64_t j = 0; j < e.visible; ++j) log_joint += LogSigmoid((2 * y[j] - 1) * psi[j]);
    for (int64_t i = 0; i < k; ++i) log_joint += LogSigmoid((2 * z[i] - 1) * e.b_mean[i]);
    total += std::exp(log_joint);
  }
  return std::log(total);
}

SbnExpectations Expectations(const Eigen::MatrixXd& w, const Eigen::VectorXd& b,
                             const Eigen::VectorXd& c, double variance) {
  const int64_t k = w.cols();
  Eigen::MatrixXd covariance = Eigen::MatrixXd::Zero(w.rows(), k * (k + 1) / 2);
  for (int64_t l = 0; l < k; ++l) covariance.col(l + l * (l + 1) / 2).setConstant(variance);
  auto e = MakeSbnExpectations(w, covariance, b, c, Eigen::VectorXd::Constant(w.rows(), variance));
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return *e;
}

TEST(SbnMarginalBaselineTest, HandComputed) {
  const std::vector<std::vector<double>> train = {{1, 0, 1}, {1, 1, 0}, {1, 0, 0}};
  const std::vector<std::vector<double>> test = {{1, 0, 0}, {0, 1, 1}};
  auto result = SbnMarginalBaseline(train, test);
  ASSERT_TRUE(result.ok());
  // p = (0.8, 0.4, 0.4) → predict (1, 0, 0): 3 of 6 pixels right.
  EXPECT_DOUBLE_EQ(result->accuracy, 0.5);
  const double expected = 0.5 * ((std::log(0.8) + 2 * std::log(0.6)) +
                                 (std::log(0.2) + 2 * std::log(0.4)));
  EXPECT_NEAR(result->loglik_per_record, expected, 1e-12);
  EXPECT_EQ(result->records, 2);
  EXPECT_EQ(result->train_records, 3);
  EXPECT_FALSE(SbnMarginalBaseline({}, test).ok());
  const std::vector<std::vector<double>> ragged = {{1, 0}};
  EXPECT_FALSE(SbnMarginalBaseline(train, ragged).ok());
}

TEST(SbnEvalTest, ReconstructsRecordsOfANearDeterministicModel) {
  // Bars: unit k switches on pixels 3k..3k+2 with weight 20; c = −10.
  const int64_t k = 3, j = 9;
  Eigen::MatrixXd w = Eigen::MatrixXd::Zero(j, k);
  for (int64_t i = 0; i < k; ++i) w.block(3 * i, i, 3, 1).setConstant(20.0);
  const SbnExpectations e =
      Expectations(w, Eigen::VectorXd::Zero(k), Eigen::VectorXd::Constant(j, -10.0), 1e-8);
  std::vector<std::vector<double>> records;
  for (int bits = 0; bits < 8; ++bits) {
    std::vector<double> y(j, 0.0);
    for (int i = 0; i < 3; ++i) {
      if ((bits >> i) & 1) std::fill(y.begin() + 3 * i, y.begin() + 3 * i + 3, 1.0);
    }
    records.push_back(y);
  }
  SbnEvalOptions options;
  options.importance_samples = 200;
  auto result = EvaluateSbnHeldOut(e, records, options);
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  EXPECT_EQ(result->records, 8);
  EXPECT_EQ(result->pixels, 72);
  EXPECT_DOUBLE_EQ(result->accuracy_mean, 1.0);
  EXPECT_DOUBLE_EQ(result->accuracy_sampled, 1.0);
  EXPECT_EQ(result->records_at_max_iterations, 0);
  // Each record has one explanation of probability ≈ 1/8 (b = 0).
  EXPECT_NEAR(result->loglik_per_record, std::log(1.0 / 8.0), 0.01);
}

TEST(SbnEvalTest, ImportanceSamplingMatchesExactEnumeration) {
  std::mt19937_64 rng(4);
  std::normal_distribution<double> normal(0.0, 1.0);
  const int64_t k = 4, j = 10;
  Eigen::MatrixXd w(j, k);
  for (int64_t r = 0; r < j; ++r) {
    for (int64_t c = 0; c < k; ++c) w(r, c) = 2.0 * normal(rng);
  }
  Eigen::VectorXd b(k), c(j);
  for (auto& v : b) v = normal(rng);
  for (auto& v : c) v = normal(rng);
  const SbnExpectations e = Expectations(w, b, c, 1e-9);
  std::vector<std::vector<double>> records;
  std::bernoulli_distribution coin(0.4);
  for (int r = 0; r < 6; ++r) {
    std::vector<double> y(j);
    for (auto& v : y) v = coin(rng) ? 1.0 : 0.0;
    records.push_back(y);
  }
  double exact = 0;
  for (const auto& y : records) exact += ExactLogLikelihood(e, y);
  exact /= static_cast<double>(records.size());

  SbnEvalOptions many;
  many.importance_samples = 20000;
  auto precise = EvaluateSbnHeldOut(e, records, many);
  ASSERT_TRUE(precise.ok());
  EXPECT_NEAR(precise->loglik_per_record, exact, 0.02);
  EXPECT_NEAR(precise->loglik_per_pixel * j, precise->loglik_per_record, 1e-12);

  // With one sample the estimate is a lower bound in expectation (Jensen):
  // averaged over seeds it sits below the exact value.
  double one_sample = 0;
  const int seeds = 200;
  for (int seed = 0; seed < seeds; ++seed) {
    SbnEvalOptions single;
    single.importance_samples = 1;
    single.seed = static_cast<uint64_t>(seed);
    auto estimate = EvaluateSbnHeldOut(e, records, single);
    ASSERT_TRUE(estimate.ok());
    one_sample += estimate->loglik_per_record / seeds;
  }
  EXPECT_LT(one_sample, exact);
}

TEST(SbnEvalTest, ThreadCountDoesNotChangeTheResultAndReleaseArraysSuffice) {
  SbnConfig config;
  config.visible = 12;
  config.hidden = 3;
  config.init_weight_std = 1.0;
  config.init_variance = 0.5;
  auto model = SbnModel::Create(config);
  ASSERT_TRUE(model.ok());
  std::mt19937_64 rng(8);
  std::bernoulli_distribution coin(0.5);
  std::vector<std::vector<double>> records(25, std::vector<double>(12));
  for (auto& y : records) {
    for (auto& v : y) v = coin(rng) ? 1.0 : 0.0;
  }
  auto from_release = SbnExpectationsFromRelease((*model)->ReleaseArrays());
  ASSERT_TRUE(from_release.ok());
  SbnEvalOptions options;
  options.importance_samples = 30;
  options.seed = 77;
  auto one = EvaluateSbnHeldOut((*model)->expectations(), records, options);
  options.threads = 3;
  auto three = EvaluateSbnHeldOut(*from_release, records, options);
  ASSERT_TRUE(one.ok());
  ASSERT_TRUE(three.ok());
  EXPECT_EQ(one->accuracy_sampled, three->accuracy_sampled);
  EXPECT_EQ(one->accuracy_mean, three->accuracy_mean);
  EXPECT_NEAR(one->loglik_per_record, three->loglik_per_record, 1e-9);
}

TEST(SbnEvalTest, RejectsBadRecordsAndOptionsWithoutContent) {
  const SbnExpectations e = Expectations(Eigen::MatrixXd::Zero(3, 2), Eigen::VectorXd::Zero(2),
                                         Eigen::VectorXd::Zero(3), 0.1);
  SbnEvalOptions options;
  EXPECT_FALSE(EvaluateSbnHeldOut(e, {}, options).ok());
  const std::vector<std::vector<double>> short_record = {{1, 0, 1}, {1, 0}};
  auto status = EvaluateSbnHeldOut(e, short_record, options).status();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("record 1"), std::string::npos);
  const std::vector<std::vector<double>> not_binary = {{1, 0.25, 1}};
  status = EvaluateSbnHeldOut(e, not_binary, options).status();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message().find("0.25"), std::string::npos);
  options.importance_samples = -1;
  EXPECT_FALSE(EvaluateSbnHeldOut(e, std::vector<std::vector<double>>{{1, 0, 1}}, options).ok());
  // Inconsistent release arrays are refused by name.
  EXPECT_FALSE(MakeSbnExpectations(Eigen::MatrixXd::Zero(3, 2), Eigen::MatrixXd::Zero(3, 2),
                                   Eigen::VectorXd::Zero(2), Eigen::VectorXd::Zero(3),
                                   Eigen::VectorXd::Zero(3))
                   .ok());
  auto missing = SbnExpectationsFromRelease(std::vector<model::NamedArray>{
      {"w_mean", {3, 2}, std::vector<double>(6, 0.0)}});
  EXPECT_NE(missing.status().message().find("w_covariance"), std::string::npos);
}

}  // namespace
}  // namespace vipsd::models
