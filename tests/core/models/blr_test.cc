// Unit tests of the BLR model (core/models/blr.h): configuration, the
// Pólya-Gamma mean against an independent series, the statistic bounds on
// random and adversarial records, the E-step values, the M-step formulas on
// a 2-d case worked by hand, the PD projection, release and checkpoint.
#include "core/models/blr.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <Eigen/Eigenvalues>
#include <cmath>
#include <numbers>
#include <random>
#include <string>
#include <vector>

#include "core/privacy/block_layout.h"

namespace vipsd::models {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<BlrModel> MakeModel(int64_t dim, double a0 = 1.0, double b0 = 1.0) {
  BlrConfig config;
  config.dim = dim;
  config.prior_shape = a0;
  config.prior_rate = b0;
  auto model = BlrModel::Create(config);
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  return std::move(*model);
}

// Independent oracle: E[ω] for ω ~ PG(1, c) from the infinite-sum
// representation ω = (1/(2π²)) Σ_k g_k / ((k − ½)² + c²/(4π²)), g_k ~ Exp(1)
// (Polson, Scott, Windle 2013, Definition 1), so E[ω] = (1/(2π²)) Σ_k 1/((k−½)² + a²)
// with a = c/(2π). The tail beyond K is its midpoint-rule integral
// ∫_K^∞ dx/(x² + a²), accurate to O(K⁻⁴).
double PolyaGammaMeanSeries(double c) {
  const double a = c / (2 * std::numbers::pi);
  constexpr int kTerms = 200000;
  long double sum = 0;
  for (int k = kTerms; k >= 1; --k) {  // small terms first
    const long double h = k - 0.5L;
    sum += 1.0L / (h * h + static_cast<long double>(a) * a);
  }
  const double tail = a > 0 ? (std::numbers::pi / 2 - std::atan(kTerms / a)) / a : 1.0 / kTerms;
  return static_cast<double>((sum + tail) / (2 * std::numbers::pi * std::numbers::pi));
}

// Block norms of a sparse E-step output in long double (independent of the
// library's norm code).
struct BlockNorms {
  long double s1 = 0, s2 = 0;
};
BlockNorms NormsOf(const model::SparseStatistic& statistic, size_t dim) {
  BlockNorms norms;
  for (size_t k = 0; k < statistic.indices.size(); ++k) {
    const long double v = statistic.values[k];
    (statistic.indices[k] < dim ? norms.s1 : norms.s2) += v * v;
  }
  norms.s1 = std::sqrt(norms.s1);
  norms.s2 = std::sqrt(norms.s2);
  return norms;
}

// Sets a model's q(m) to N(μ, Σ) with Σ = precision⁻¹ via its checkpoint.
void SetPosterior(BlrModel& model, const Eigen::MatrixXd& precision, const Eigen::VectorXd& mean,
                  double shape = 1.0, double rate = 1.0) {
  const Eigen::MatrixXd symmetric = 0.5 * (precision + precision.transpose());
  const Eigen::VectorXd eta = symmetric * mean;
  std::vector<model::NamedArray> arrays = {
      {"precision", {symmetric.rows(), symmetric.cols()},
       std::vector<double>(symmetric.data(), symmetric.data() + symmetric.size())},
      {"precision_mean", {eta.size()}, std::vector<double>(eta.data(), eta.data() + eta.size())},
      {"alpha_shape", {}, {shape}},
      {"alpha_rate", {}, {rate}}};
  ASSERT_TRUE(model.RestoreCheckpoint(arrays).ok());
}

model::Record MakeRecord(std::vector<double> x, double y) {
  model::Record record;
  record.features = std::move(x);
  record.label = y;
  return record;
}

TEST(BlrConfigTest, ValidatesEveryFieldByName) {
  BlrConfig good;
  good.dim = 3;
  EXPECT_TRUE(ValidateBlrConfig(good).ok());
  auto message = [](BlrConfig c) { return ValidateBlrConfig(c).message(); };
  BlrConfig c = good;
  c.dim = 0;
  EXPECT_THAT(message(c), HasSubstr("blr.dim must be in [1, 1024]"));
  c.dim = 1025;
  EXPECT_THAT(message(c), HasSubstr("blr.dim"));
  c = good;
  c.prior_shape = 0;
  EXPECT_THAT(message(c), HasSubstr("blr.prior_shape must be finite and > 0"));
  c = good;
  c.prior_rate = std::nan("");
  EXPECT_THAT(message(c), HasSubstr("blr.prior_rate"));
  c = good;
  c.eigenvalue_floor = 0;
  EXPECT_THAT(message(c), HasSubstr("blr.eigenvalue_floor must be in (0, 1e6]"));
  c.eigenvalue_floor = INFINITY;
  EXPECT_THAT(message(c), HasSubstr("blr.eigenvalue_floor"));
  EXPECT_FALSE(BlrModel::Create(c).ok());
}

TEST(BlrModelTest, LayoutDeclaresTheTwoBlocksWithTheirProvenBounds) {
  auto model = MakeModel(4);
  const privacy::BlockLayout& layout = model->statistic_layout();
  ASSERT_EQ(layout.num_blocks(), 2u);
  EXPECT_EQ(layout.block(0).name, "s1");
  EXPECT_EQ(layout.block(0).kind, privacy::BlockKind::kVector);
  EXPECT_EQ(layout.block(0).size, 4u);
  EXPECT_EQ(layout.block(0).clip_bound, 0.5);
  EXPECT_EQ(layout.block(1).name, "s2");
  EXPECT_EQ(layout.block(1).kind, privacy::BlockKind::kSymmetricMatrix);
  EXPECT_EQ(layout.block(1).size, 10u);
  EXPECT_EQ(layout.block(1).clip_bound, 0.25);
  EXPECT_TRUE(model->has_proven_bounds());
  EXPECT_EQ(model->type(), "blr");
  EXPECT_EQ(model->dimensions(), (std::vector<std::pair<std::string, int64_t>>{{"d", 4}}));
}

TEST(PolyaGammaMeanTest, MatchesTheInfiniteSumRepresentation) {
  for (double c : {0.0, 1e-6, 1e-3, 0.5, 1.0, 2.0, 5.0, 20.0, 100.0}) {
    const double oracle = PolyaGammaMeanSeries(c);
    EXPECT_NEAR(PolyaGammaMean(c), oracle, 1e-9 * oracle) << c;
  }
}

TEST(PolyaGammaMeanTest, ZeroLimitSymmetryAndExtremes) {
  EXPECT_EQ(PolyaGammaMean(0.0), 0.25);
  EXPECT_EQ(PolyaGammaMean(-0.0), 0.25);
  EXPECT_EQ(PolyaGammaMean(-3.0), PolyaGammaMean(3.0));
  EXPECT_EQ(PolyaGammaMean(INFINITY), 0.0);
  EXPECT_LE(PolyaGammaMean(std::nan("")), 0.25);
  // Both sides of the series/closed-form switch agree and decrease.
  const double below = PolyaGammaMean(std::nextafter(1e-3, 0.0));
  const double above = PolyaGammaMean(1e-3);
  EXPECT_NEAR(below, above, 1e-15);
  double previous = 0.25;
  for (double c = 1e-8; c < 1e4; c *= 1.7) {
    const double mean = PolyaGammaMean(c);
    EXPECT_LE(mean, previous) << c;
    EXPECT_GT(mean, 0.0) << c;
    EXPECT_LE(mean, 0.25);
    previous = mean;
  }
  // Large c: tanh → 1, so E[ω] → 1/(2c).
  EXPECT_NEAR(PolyaGammaMean(1e6), 0.5e-6, 1e-18);
}

TEST(BlrEStepTest, EmitsTheExactStatisticAgainstTheReleasedPosterior) {
  constexpr int kDim = 4;
  auto model = MakeModel(kDim);
  Eigen::MatrixXd precision(kDim, kDim);
  precision << 4, 1, 0, 0.5, 1, 3, 0.2, 0, 0, 0.2, 2, 0.1, 0.5, 0, 0.1, 5;
  Eigen::VectorXd mean(kDim);
  mean << 1.5, -2.0, 0.3, 0.8;
  SetPosterior(*model, precision, mean);
  const std::vector<double> x = {0.3, 0.0, -0.5, 0.4};  // one zero coordinate
  auto scratch = model->NewScratch();
  model::RecordRng rng(1);
  model::SparseStatistic out;
  ASSERT_TRUE(model->EStep(MakeRecord(x, 1.0), rng, *scratch, out).ok());

  // Independent computation: c² = xᵀ(μμᵀ + Σ)x with Σ from a dense inverse.
  const Eigen::Map<const Eigen::VectorXd> xv(x.data(), kDim);
  const Eigen::MatrixXd sigma = precision.inverse();
  const double c = std::sqrt(std::pow(xv.dot(mean), 2) + xv.dot(sigma * xv));
  const double xi = std::tanh(c / 2) / (2 * c);
  EXPECT_NEAR(model->ExpectedXi(x), xi, 1e-14);

  Eigen::VectorXd dense = Eigen::VectorXd::Zero(kDim + kDim * (kDim + 1) / 2);
  for (size_t k = 0; k < out.indices.size(); ++k) {
    if (k > 0) {
      EXPECT_LT(out.indices[k - 1], out.indices[k]);
    }
    dense[out.indices[k]] = out.values[k];
  }
  for (int i = 0; i < kDim; ++i) EXPECT_DOUBLE_EQ(dense[i], 0.5 * x[i]) << i;
  auto s2 = privacy::UnpackSymmetric(
      std::span<const double>(dense.data() + kDim, kDim * (kDim + 1) / 2), kDim);
  ASSERT_TRUE(s2.ok());
  EXPECT_LT(((*s2) - xi * xv * xv.transpose()).cwiseAbs().maxCoeff(), 1e-15);
  // Zero coordinates are not listed: 3 of s1, 6 of s2.
  EXPECT_EQ(out.indices.size(), 3u + 6u);

  // y = 0 flips the sign of s1 only.
  model::SparseStatistic negative;
  ASSERT_TRUE(model->EStep(MakeRecord(x, 0.0), rng, *scratch, negative).ok());
  ASSERT_EQ(negative.indices, out.indices);
  for (size_t k = 0; k < 3; ++k) EXPECT_EQ(negative.values[k], -out.values[k]);
  for (size_t k = 3; k < out.values.size(); ++k) EXPECT_EQ(negative.values[k], out.values[k]);
}

TEST(BlrEStepTest, ZeroFeaturesGiveTheZeroStatistic) {
  auto model = MakeModel(3);
  auto scratch = model->NewScratch();
  model::RecordRng rng(1);
  model::SparseStatistic out;
  out.indices = {1};
  out.values = {2.0};
  ASSERT_TRUE(model->EStep(MakeRecord({0, 0, 0}, 1), rng, *scratch, out).ok());
  EXPECT_TRUE(out.indices.empty());
  EXPECT_TRUE(out.values.empty());
}

TEST(BlrEStepTest, CGoingToZeroGivesTheQuarterLimit) {
  constexpr int kDim = 3;
  auto model = MakeModel(kDim);
  // Σ = 1e-14 I, μ = 0: c = 1e-7 ‖x‖.
  SetPosterior(*model, 1e14 * Eigen::MatrixXd::Identity(kDim, kDim), Eigen::VectorXd::Zero(kDim));
  const std::vector<double> x = {0.6, 0.0, 0.8};
  EXPECT_NEAR(model->ExpectedXi(x), 0.25, 1e-15);
  EXPECT_LE(model->ExpectedXi(x), 0.25);
}

TEST(BlrEStepTest, RejectsMalformedRecordsWithoutRevealingContent) {
  auto model = MakeModel(3);
  auto scratch = model->NewScratch();
  model::RecordRng rng(1);
  model::SparseStatistic out;
  const std::vector<model::Record> bad = {
      MakeRecord({0.123456, 0.2}, 1),                 // wrong length
      MakeRecord({0.123456, NAN, 0.1}, 1),            // non-finite
      MakeRecord({0.123456, 0.2, 0.1}, 0.5),          // label
      MakeRecord({0.123456, 0.9, 0.9}, 1),            // norm > 1
      MakeRecord({0.123456, 1e200, 0.0}, 0)};         // norm overflows
  for (const auto& record : bad) {
    const Status status = model->EStep(record, rng, *scratch, out);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(), ::testing::Not(HasSubstr("0.123456")));
    EXPECT_THAT(status.message(), ::testing::Not(HasSubstr("0.9")));
  }
}

// The bounds of the header, on random records against random posteriors
// and on adversarial ones: ‖x‖ exactly 1 (basis vectors and spread-out
// vectors), c = 0 in the limit (tiny covariance, zero mean), y all ones.
TEST(BlrEStepTest, NoRecordEverExceedsABlockBound) {
  constexpr int kDim = 7;
  auto model = MakeModel(kDim);
  auto scratch = model->NewScratch();
  model::RecordRng rng(1);
  model::SparseStatistic out;
  std::mt19937_64 gen(42);
  std::normal_distribution<double> normal;
  std::uniform_real_distribution<double> uniform(0, 1);
  long double max_s1 = 0, max_s2 = 0;
  auto check = [&](const std::vector<double>& x, double y) {
    if (FeatureSquaredNorm(x) > 1) return;  // the decoder never passes these
    ASSERT_TRUE(model->EStep(MakeRecord(x, y), rng, *scratch, out).ok());
    const BlockNorms norms = NormsOf(out, kDim);
    EXPECT_LE(norms.s1, 0.5L);
    EXPECT_LE(norms.s2, 0.25L);
    max_s1 = std::max(max_s1, norms.s1);
    max_s2 = std::max(max_s2, norms.s2);
  };
  std::vector<std::pair<Eigen::MatrixXd, Eigen::VectorXd>> posteriors;
  posteriors.emplace_back(1e15 * Eigen::MatrixXd::Identity(kDim, kDim),
                          Eigen::VectorXd::Zero(kDim));  // c → 0: ⟨ξ⟩ = ¼
  posteriors.emplace_back(Eigen::MatrixXd::Identity(kDim, kDim), Eigen::VectorXd::Zero(kDim));
  for (int p = 0; p < 3; ++p) {
    Eigen::MatrixXd a = Eigen::MatrixXd::NullaryExpr(kDim, kDim, [&] { return normal(gen); });
    posteriors.emplace_back(a * a.transpose() + 0.1 * Eigen::MatrixXd::Identity(kDim, kDim),
                            Eigen::VectorXd::NullaryExpr(kDim, [&] { return 5 * normal(gen); }));
  }
  for (const auto& [precision, mean] : posteriors) {
    SetPosterior(*model, precision, mean);
    // Adversarial: unit basis vectors (attain both bounds as c → 0).
    for (int i = 0; i < kDim; ++i) {
      std::vector<double> x(kDim, 0.0);
      x[i] = 1.0;
      check(x, 1.0);
      x[i] = -1.0;
      check(x, 0.0);
    }
    // Spread-out vectors of norm 1 in floating point, and nudged up by ulps
    // as long as the computed squared norm stays ≤ 1.
    for (int nonzero = 2; nonzero <= kDim; ++nonzero) {
      std::vector<double> x(kDim, 0.0);
      for (int i = 0; i < nonzero; ++i) x[i] = 1.0 / std::sqrt(static_cast<double>(nonzero));
      for (int nudge = 0; nudge < 8; ++nudge) {
        check(x, 1.0);
        std::vector<double> up = x;
        for (double& v : up) {
          if (v != 0) v = std::nextafter(v, 2.0);
        }
        if (FeatureSquaredNorm(up) > 1) break;
        x = up;
      }
    }
    // Random directions, norm uniform in [0.9, 1], labels all ones.
    for (int r = 0; r < 300; ++r) {
      std::vector<double> x(kDim);
      double norm = 0;
      for (double& v : x) {
        v = normal(gen);
        norm += v * v;
      }
      const double scale = (0.9 + 0.1 * uniform(gen)) / std::sqrt(norm);
      for (double& v : x) v *= scale;
      check(x, 1.0);
    }
  }
  // The bounds are attained (so they are tight), up to the clipping margin.
  EXPECT_GT(max_s1, 0.5L * (1 - 1e-12L));
  EXPECT_GT(max_s2, 0.25L * (1 - 1e-12L));
}

TEST(ProjectToEigenvalueFloorTest, FloorsEigenvaluesAndKeepsEigenvectors) {
  Eigen::MatrixXd matrix(2, 2);
  matrix << 1, 2, 2, 1;  // eigenvalues 3 and −1 on (1, 1)/√2 and (1, −1)/√2
  auto projected = ProjectToEigenvalueFloor(matrix, 0.5);
  ASSERT_TRUE(projected.ok());
  Eigen::MatrixXd expected(2, 2);
  expected << 1.75, 1.25, 1.25, 1.75;  // V diag(3, 0.5) Vᵀ
  EXPECT_LT((*projected - expected).cwiseAbs().maxCoeff(), 1e-14);
  EXPECT_EQ(*projected, projected->transpose());

  // Random symmetric matrices: eigenvalues become max(λ, floor); a matrix
  // already above the floor is (numerically) unchanged.
  std::mt19937_64 gen(3);
  std::normal_distribution<double> normal;
  for (int trial = 0; trial < 20; ++trial) {
    Eigen::MatrixXd a = Eigen::MatrixXd::NullaryExpr(6, 6, [&] { return normal(gen); });
    a = (a + a.transpose()).eval();
    const double floor = 0.3;
    auto result = ProjectToEigenvalueFloor(a, floor);
    ASSERT_TRUE(result.ok());
    Eigen::VectorXd before = Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd>(a).eigenvalues();
    Eigen::VectorXd after = Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd>(*result).eigenvalues();
    for (int i = 0; i < 6; ++i) EXPECT_NEAR(after[i], std::max(before[i], floor), 1e-12);
    auto again = ProjectToEigenvalueFloor(*result, floor);
    ASSERT_TRUE(again.ok());
    EXPECT_LT((*again - *result).cwiseAbs().maxCoeff(), 1e-12);
  }
  EXPECT_FALSE(ProjectToEigenvalueFloor(Eigen::MatrixXd::Zero(2, 3), 1).ok());
  Eigen::MatrixXd nan_matrix = Eigen::MatrixXd::Identity(2, 2);
  nan_matrix(0, 1) = NAN;
  EXPECT_FALSE(ProjectToEigenvalueFloor(nan_matrix, 1).ok());
}

// The M-step of the header on a 2-d case, checked against closed-form 2 × 2
// algebra.
TEST(BlrMStepTest, MatchesTheHandWorkedTwoDimensionalCase) {
  auto model = MakeModel(2, /*a0=*/2.0, /*b0=*/4.0);  // E[α] = ½; Λ = ½ I, η = 0
  EXPECT_EQ(model->expected_alpha(), 0.5);
  const double q = 0.5, rho = 0.25;
  // Sum: s1 = (0.3, −0.2); s2 = [[0.2, 0.05], [0.05, 0.1]] packed (a11, a12, a22).
  Eigen::VectorXd sum(5);
  sum << 0.3, -0.2, 0.2, 0.05, 0.1;
  ASSERT_TRUE(model->MStep(sum, q, rho).ok());

  // Λ̂ = ½ I + S2/q (PSD S2: nothing to floor).
  const double l11 = 0.75 * 0.5 + 0.25 * (0.5 + 0.4);
  const double l12 = 0.25 * 0.1;
  const double l22 = 0.75 * 0.5 + 0.25 * (0.5 + 0.2);
  const double e1 = 0.25 * 0.6, e2 = 0.25 * -0.4;
  const double det = l11 * l22 - l12 * l12;
  const double s11 = l22 / det, s12 = -l12 / det, s22 = l11 / det;
  const double m1 = s11 * e1 + s12 * e2, m2 = s12 * e1 + s22 * e2;
  EXPECT_NEAR(model->precision()(0, 0), l11, 1e-15);
  EXPECT_NEAR(model->precision()(0, 1), l12, 1e-15);
  EXPECT_NEAR(model->precision()(1, 1), l22, 1e-15);
  EXPECT_NEAR(model->precision_mean()[0], e1, 1e-15);
  EXPECT_NEAR(model->precision_mean()[1], e2, 1e-15);
  EXPECT_NEAR(model->covariance()(0, 0), s11, 1e-13);
  EXPECT_NEAR(model->covariance()(0, 1), s12, 1e-13);
  EXPECT_NEAR(model->covariance()(1, 1), s22, 1e-13);
  EXPECT_NEAR(model->mean()[0], m1, 1e-13);
  EXPECT_NEAR(model->mean()[1], m2, 1e-13);
  // q(α): â = a0 + d/2 = 3, b̂ = b0 + ½(μᵀμ + tr Σ), blended with ρ.
  const double rate_target = 4.0 + 0.5 * (m1 * m1 + m2 * m2 + s11 + s22);
  EXPECT_NEAR(model->alpha_shape(), 0.75 * 2.0 + 0.25 * 3.0, 1e-15);
  EXPECT_NEAR(model->alpha_rate(), 0.75 * 4.0 + 0.25 * rate_target, 1e-13);
}

TEST(BlrMStepTest, IndefiniteNoiseIsProjectedAboveTheExpectedAlpha) {
  auto model = MakeModel(2, 1.0, 2.0);  // E[α] = ½
  Eigen::VectorXd sum(5);
  sum << 0.1, 0.1, -3.0, 2.0, 0.5;  // S2 = [[−3, 2], [2, 0.5]]: indefinite
  ASSERT_TRUE(model->MStep(sum, 1.0, 1.0).ok());  // ρ = 1: Λ = Λ̂
  Eigen::MatrixXd raw(2, 2);
  raw << 0.5 - 3.0, 2.0, 2.0, 0.5 + 0.5;
  auto expected = ProjectToEigenvalueFloor(raw, 0.5);
  ASSERT_TRUE(expected.ok());
  EXPECT_LT((model->precision() - *expected).cwiseAbs().maxCoeff(), 1e-14);
  const Eigen::VectorXd eigenvalues =
      Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd>(model->precision()).eigenvalues();
  EXPECT_NEAR(eigenvalues.minCoeff(), 0.5, 1e-12);
  // A very negative noise draw: still positive definite, finite moments.
  sum << 0, 0, -1e6, 0, -1e6;
  ASSERT_TRUE(model->MStep(sum, 0.01, 0.5).ok());
  EXPECT_TRUE(model->covariance().allFinite());
  EXPECT_GT(Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd>(model->precision())
                .eigenvalues()
                .minCoeff(),
            0);
}

TEST(BlrMStepTest, RejectsBadInputAndLeavesTheModelUnchanged) {
  auto model = MakeModel(2);
  const auto before = model->CheckpointArrays();
  Eigen::VectorXd sum = Eigen::VectorXd::Constant(5, 0.1);
  EXPECT_EQ(model->MStep(Eigen::VectorXd::Zero(4), 0.5, 0.5).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(model->MStep(sum, 0.0, 0.5).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(model->MStep(sum, 1.5, 0.5).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(model->MStep(sum, 0.5, 0.0).code(), StatusCode::kInvalidArgument);
  sum[3] = NAN;
  EXPECT_EQ(model->MStep(sum, 0.5, 0.5).code(), StatusCode::kOutOfRange);
  sum[3] = 1e308;
  EXPECT_FALSE(model->MStep(sum, 1e-10, 0.5).ok());  // S/q overflows
  const auto after = model->CheckpointArrays();
  ASSERT_EQ(before.size(), after.size());
  for (size_t i = 0; i < before.size(); ++i) EXPECT_EQ(before[i].data, after[i].data);
}

TEST(BlrModelTest, ReleaseHoldsMeanCovarianceAndQAlpha) {
  auto model = MakeModel(3, 2.0, 5.0);
  Eigen::VectorXd sum(3 + 6);
  sum << 0.4, -0.1, 0.2, 0.3, 0.05, 0.2, 0.0, 0.01, 0.25;
  ASSERT_TRUE(model->MStep(sum, 0.1, 0.6).ok());
  const auto arrays = model->ReleaseArrays();
  ASSERT_EQ(arrays.size(), 4u);
  EXPECT_EQ(arrays[0].name, "mean");
  EXPECT_EQ(arrays[0].shape, (std::vector<int64_t>{3}));
  EXPECT_EQ(arrays[1].name, "covariance");
  EXPECT_EQ(arrays[1].shape, (std::vector<int64_t>{3, 3}));
  EXPECT_EQ(arrays[2].name, "alpha_shape");
  EXPECT_TRUE(arrays[2].shape.empty());
  EXPECT_EQ(arrays[3].name, "alpha_rate");
  const Eigen::Map<const Eigen::Matrix<double, 3, 3, Eigen::RowMajor>> covariance(
      arrays[1].data.data());
  EXPECT_LT((covariance * model->precision() - Eigen::Matrix3d::Identity()).cwiseAbs().maxCoeff(),
            1e-12);
  const Eigen::Map<const Eigen::Vector3d> mean(arrays[0].data.data());
  EXPECT_LT((model->precision() * mean - model->precision_mean()).cwiseAbs().maxCoeff(), 1e-12);
  EXPECT_EQ(arrays[2].data[0] / arrays[3].data[0], model->expected_alpha());
}

TEST(BlrModelTest, CheckpointRoundTripIsBitExactAndResumesIdentically) {
  auto a = MakeModel(3);
  std::mt19937_64 gen(5);
  std::normal_distribution<double> normal;
  auto random_sum = [&] {
    return Eigen::VectorXd(Eigen::VectorXd::NullaryExpr(9, [&] { return normal(gen); }));
  };
  for (int t = 0; t < 4; ++t) ASSERT_TRUE(a->MStep(random_sum(), 0.2, 0.3).ok());
  const auto checkpoint = a->CheckpointArrays();
  auto b = MakeModel(3);
  ASSERT_TRUE(b->RestoreCheckpoint(checkpoint).ok());
  const auto restored = b->CheckpointArrays();
  ASSERT_EQ(restored.size(), checkpoint.size());
  for (size_t i = 0; i < checkpoint.size(); ++i) {
    EXPECT_EQ(restored[i].name, checkpoint[i].name);
    EXPECT_EQ(restored[i].shape, checkpoint[i].shape);
    EXPECT_EQ(restored[i].data, checkpoint[i].data);
  }
  const Eigen::VectorXd next = random_sum();
  ASSERT_TRUE(a->MStep(next, 0.2, 0.25).ok());
  ASSERT_TRUE(b->MStep(next, 0.2, 0.25).ok());
  const auto release_a = a->ReleaseArrays();
  const auto release_b = b->ReleaseArrays();
  for (size_t i = 0; i < release_a.size(); ++i) EXPECT_EQ(release_a[i].data, release_b[i].data);
}

TEST(BlrModelTest, RestoreRejectsBadCheckpointsByArrayNameAndKeepsState) {
  auto model = MakeModel(2);
  const auto good = model->CheckpointArrays();
  const auto before = model->ReleaseArrays();
  auto expect_error = [&](std::vector<model::NamedArray> arrays, const std::string& text) {
    const Status status = model->RestoreCheckpoint(arrays);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(status.message(), HasSubstr(text));
    EXPECT_EQ(model->ReleaseArrays()[1].data, before[1].data);
  };
  auto arrays = good;
  arrays.pop_back();
  expect_error(arrays, "alpha_rate");
  arrays = good;
  arrays[0].shape = {4};
  expect_error(arrays, "\"precision\"");
  arrays = good;
  arrays[0].data = {1.0, 0.5, 0.4, 1.0};
  expect_error(arrays, "not symmetric");
  arrays = good;
  arrays[0].data = {1.0, 2.0, 2.0, 1.0};
  expect_error(arrays, "positive definite");
  arrays = good;
  arrays[1].data[0] = INFINITY;
  expect_error(arrays, "\"precision_mean\"");
  arrays = good;
  arrays[2].data[0] = 0;
  expect_error(arrays, "alpha_shape");
  arrays = good;
  arrays.push_back(good[0]);
  expect_error(arrays, "twice");
  arrays = good;
  arrays[3].name = "lambda";
  expect_error(arrays, "unexpected array \"lambda\"");
}

}  // namespace
}  // namespace vipsd::models
