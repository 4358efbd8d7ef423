// Tests of BLR held-out evaluation (core/models/blr_eval.h): AUC against a
// brute-force pair count (ties as ½), log-loss against the direct formula,
// the probit approximation against numerical integration, and reading a
// posterior from release arrays.
#include "core/models/blr_eval.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <random>
#include <vector>

#include "core/models/blr.h"

namespace vipsd::models {
namespace {

using ::testing::HasSubstr;

double BruteForceAuc(const std::vector<double>& scores, const std::vector<double>& labels) {
  double wins = 0, pairs = 0;
  for (size_t i = 0; i < scores.size(); ++i) {
    for (size_t j = 0; j < scores.size(); ++j) {
      if (labels[i] != 1.0 || labels[j] != 0.0) continue;
      pairs += 1;
      wins += scores[i] > scores[j] ? 1.0 : scores[i] == scores[j] ? 0.5 : 0.0;
    }
  }
  return wins / pairs;
}

TEST(AreaUnderRocCurveTest, KnownCases) {
  EXPECT_DOUBLE_EQ(*AreaUnderRocCurve(std::vector<double>{0.1, 0.2, 0.8, 0.9},
                                      std::vector<double>{0, 0, 1, 1}),
                   1.0);
  EXPECT_DOUBLE_EQ(*AreaUnderRocCurve(std::vector<double>{0.9, 0.8, 0.2, 0.1},
                                      std::vector<double>{0, 0, 1, 1}),
                   0.0);
  // All tied: every pair counts ½.
  EXPECT_DOUBLE_EQ(*AreaUnderRocCurve(std::vector<double>(6, 0.3),
                                      std::vector<double>{0, 1, 0, 1, 1, 0}),
                   0.5);
  // One tie between a positive and a negative among four pairs: (3 + ½)/4.
  EXPECT_DOUBLE_EQ(*AreaUnderRocCurve(std::vector<double>{0.1, 0.5, 0.5, 0.9},
                                      std::vector<double>{0, 0, 1, 1}),
                   3.5 / 4.0);
}

TEST(AreaUnderRocCurveTest, MatchesPairCountWithHeavyTies) {
  std::mt19937_64 gen(4);
  std::uniform_int_distribution<int> level(0, 7);  // 8 distinct scores: many ties
  std::bernoulli_distribution coin(0.3);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<double> scores(300), labels(300);
    for (size_t i = 0; i < scores.size(); ++i) {
      labels[i] = coin(gen) ? 1.0 : 0.0;
      scores[i] = level(gen) + (labels[i] == 1.0 ? 1 : 0);
    }
    EXPECT_NEAR(*AreaUnderRocCurve(scores, labels), BruteForceAuc(scores, labels), 1e-12);
  }
}

TEST(AreaUnderRocCurveTest, RejectsDegenerateInput) {
  EXPECT_EQ(AreaUnderRocCurve(std::vector<double>{0.1, 0.2}, std::vector<double>{1, 1})
                .status()
                .code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(AreaUnderRocCurve(std::vector<double>{0.1}, std::vector<double>{1, 0}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(AreaUnderRocCurve(std::vector<double>{0.1, NAN}, std::vector<double>{1, 0})
                .status()
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(AreaUnderRocCurve(std::vector<double>{0.1, 0.2}, std::vector<double>{1, 2})
                .status()
                .code(),
            StatusCode::kInvalidArgument);
}

TEST(LogLossTest, MatchesTheDirectFormulaAndIsStableForLargeLogits) {
  const std::vector<double> logits = {-2.0, 0.0, 0.7, 3.5};
  const std::vector<double> labels = {0, 1, 0, 1};
  double expected = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    const double p = 1.0 / (1.0 + std::exp(-logits[i]));
    expected -= labels[i] * std::log(p) + (1 - labels[i]) * std::log(1 - p);
  }
  expected /= 4;
  EXPECT_NEAR(*LogLossFromLogits(logits, labels), expected, 1e-14);
  // A confidently wrong prediction costs |z| nats, not infinity.
  EXPECT_NEAR(*LogLossFromLogits(std::vector<double>{800.0}, std::vector<double>{0}), 800.0,
              1e-9);
  EXPECT_NEAR(*LogLossFromLogits(std::vector<double>{800.0}, std::vector<double>{1}), 0.0, 1e-300);
  EXPECT_FALSE(LogLossFromLogits(std::vector<double>{}, std::vector<double>{}).ok());
}

TEST(PredictiveLogitTest, ProbitApproximationIsCloseToTheIntegral) {
  // ∫ σ(a) N(a | μ_a, s²) da by Gauss–Hermite-free brute force (Simpson on
  // ±12 s), versus σ(κ(s²) μ_a): the probit approximation is accurate to
  // about 0.02 in probability over this range.
  BlrPosterior posterior;
  posterior.mean = Eigen::VectorXd(2);
  posterior.covariance = Eigen::MatrixXd::Zero(2, 2);
  for (double mu : {-3.0, -0.5, 0.0, 1.0, 4.0}) {
    for (double s2 : {0.0, 0.5, 2.0, 10.0}) {
      posterior.mean << mu, 0.0;
      posterior.covariance(0, 0) = s2;
      const std::vector<double> x = {1.0, 0.0};
      const double approx = Sigmoid(PredictiveLogit(posterior, x));
      double integral;
      if (s2 == 0) {
        integral = Sigmoid(mu);
        EXPECT_DOUBLE_EQ(approx, integral);
      } else {
        const double s = std::sqrt(s2);
        const int n = 4000;
        const double lo = mu - 12 * s, h = 24 * s / n;
        integral = 0;
        for (int k = 0; k <= n; ++k) {
          const double a = lo + k * h;
          const double weight = (k == 0 || k == n) ? 1 : (k % 2 ? 4 : 2);
          integral += weight * Sigmoid(a) * std::exp(-0.5 * (a - mu) * (a - mu) / s2);
        }
        integral *= h / 3 / (s * std::sqrt(2 * std::numbers::pi));
      }
      EXPECT_NEAR(approx, integral, 0.02) << mu << " " << s2;
    }
  }
}

TEST(BlrPosteriorFromArraysTest, ReadsAModelReleaseAndRejectsBadArrays) {
  BlrConfig config;
  config.dim = 3;
  auto model = BlrModel::Create(config);
  ASSERT_TRUE(model.ok());
  const auto arrays = (*model)->ReleaseArrays();
  auto posterior = BlrPosteriorFromArrays(arrays);
  ASSERT_TRUE(posterior.ok());
  EXPECT_EQ(posterior->mean, (*model)->mean());
  EXPECT_EQ(posterior->covariance, (*model)->covariance());

  std::vector<release::ReleaseArray> release_arrays;
  for (const auto& array : arrays) release_arrays.push_back({array.name, array.shape, array.data});
  EXPECT_TRUE(BlrPosteriorFromArrays(release_arrays).ok());
  auto broken = release_arrays;
  broken.erase(broken.begin());
  EXPECT_THAT(BlrPosteriorFromArrays(broken).status().message(), HasSubstr("\"mean\""));
  broken = release_arrays;
  broken[1].shape = {3, 2};
  broken[1].data.resize(6);
  EXPECT_THAT(BlrPosteriorFromArrays(broken).status().message(), HasSubstr("\"covariance\""));
  broken = release_arrays;
  broken[1].data[1] = 0.5;  // (0, 1) ≠ (1, 0)
  EXPECT_THAT(BlrPosteriorFromArrays(broken).status().message(), HasSubstr("not symmetric"));
  broken = release_arrays;
  broken[0].data[0] = NAN;
  EXPECT_THAT(BlrPosteriorFromArrays(broken).status().message(), HasSubstr("not finite"));
}

TEST(EvaluateBlrTest, CombinesLogitsAucLogLossAndAccuracy) {
  BlrPosterior posterior;
  posterior.mean = Eigen::Vector2d(2.0, -1.0);
  posterior.covariance = 0.1 * Eigen::Matrix2d::Identity();
  const std::vector<std::vector<double>> x = {{0.5, 0.0}, {0.0, 0.5}, {0.3, 0.3}, {-0.4, 0.1}};
  const std::vector<double> y = {1, 0, 1, 0};
  auto evaluation = EvaluateBlr(posterior, x, y);
  ASSERT_TRUE(evaluation.ok());
  std::vector<double> logits;
  for (const auto& row : x) logits.push_back(PredictiveLogit(posterior, row));
  EXPECT_DOUBLE_EQ(evaluation->auc, *AreaUnderRocCurve(logits, y));
  EXPECT_DOUBLE_EQ(evaluation->log_loss, *LogLossFromLogits(logits, y));
  EXPECT_EQ(evaluation->records, 4);
  EXPECT_EQ(evaluation->positives, 2);
  EXPECT_DOUBLE_EQ(evaluation->accuracy, 1.0);
  const std::vector<std::vector<double>> short_x = {{0.5}, {0.1}};
  EXPECT_FALSE(EvaluateBlr(posterior, short_x, std::vector<double>{1, 0}).ok());
}

}  // namespace
}  // namespace vipsd::models
