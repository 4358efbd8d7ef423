// Sigmoid belief network (core/models/sbn.h): configuration, layout and
// bounds (random and adversarial records and parameters), the E-step against
// a brute-force enumeration of z ∈ {0,1}^K, the M-step formulas on a tiny
// case, release/checkpoint arrays and the bit-exact checkpoint round trip,
// and the public start (SetPublicPrior) from a release.
#include "core/models/sbn.h"

#include <gtest/gtest.h>

#include <Eigen/Cholesky>
#include <Eigen/Eigenvalues>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace vipsd::models {
namespace {

using RowMajorMatrix = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

SbnConfig Config(int64_t visible, int64_t hidden) {
  SbnConfig config;
  config.visible = visible;
  config.hidden = hidden;
  return config;
}

std::unique_ptr<SbnModel> MakeModel(const SbnConfig& config) {
  auto model = SbnModel::Create(config);
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  return std::move(*model);
}

// A posterior in mean/covariance form, turned into checkpoint arrays.
struct Posterior {
  Eigen::MatrixXd w_mean;               // J × K
  std::vector<Eigen::MatrixXd> w_cov;   // J of K × K
  Eigen::VectorXd b_mean, b_var, c_mean, c_var;
};

std::vector<model::NamedArray> CheckpointOf(const Posterior& p) {
  const auto j = p.w_mean.rows();
  const auto k = p.w_mean.cols();
  const auto packed = k * (k + 1) / 2;
  model::NamedArray precision{"w_precision", {j, packed}, {}};
  model::NamedArray precision_mean{"w_precision_mean", {j, k}, {}};
  for (Eigen::Index row = 0; row < j; ++row) {
    const Eigen::MatrixXd lambda = p.w_cov[row].inverse();
    for (Eigen::Index l = 0; l < k; ++l) {
      for (Eigen::Index i = 0; i <= l; ++i) precision.data.push_back(lambda(i, l));
    }
    const Eigen::VectorXd h = lambda * p.w_mean.row(row).transpose();
    for (Eigen::Index i = 0; i < k; ++i) precision_mean.data.push_back(h[i]);
  }
  auto vec = [](const std::string& name, const Eigen::VectorXd& v) {
    return model::NamedArray{name, {v.size()}, std::vector<double>(v.data(), v.data() + v.size())};
  };
  return {precision,
          precision_mean,
          vec("b_precision", p.b_var.cwiseInverse()),
          vec("b_precision_mean", p.b_mean.cwiseQuotient(p.b_var)),
          vec("c_precision", p.c_var.cwiseInverse()),
          vec("c_precision_mean", p.c_mean.cwiseQuotient(p.c_var))};
}

Posterior RandomPosterior(std::mt19937_64& rng, int64_t j, int64_t k, double mean_scale,
                          double variance_scale) {
  std::normal_distribution<double> normal(0.0, 1.0);
  Posterior p;
  p.w_mean.resize(j, k);
  for (Eigen::Index r = 0; r < j; ++r) {
    for (Eigen::Index c = 0; c < k; ++c) p.w_mean(r, c) = mean_scale * normal(rng);
    Eigen::MatrixXd a(k, k);
    for (Eigen::Index x = 0; x < k; ++x) {
      for (Eigen::Index y = 0; y < k; ++y) a(x, y) = normal(rng);
    }
    p.w_cov.push_back(variance_scale * (a * a.transpose() / static_cast<double>(k) +
                                        0.1 * Eigen::MatrixXd::Identity(k, k)));
  }
  p.b_mean.resize(k);
  p.b_var.resize(k);
  for (Eigen::Index c = 0; c < k; ++c) {
    p.b_mean[c] = mean_scale * normal(rng);
    p.b_var[c] = variance_scale * (0.1 + std::fabs(normal(rng)));
  }
  p.c_mean.resize(j);
  p.c_var.resize(j);
  for (Eigen::Index r = 0; r < j; ++r) {
    p.c_mean[r] = mean_scale * normal(rng);
    p.c_var[r] = variance_scale * (0.1 + std::fabs(normal(rng)));
  }
  return p;
}

Posterior ConstantPosterior(int64_t j, int64_t k, double w, double w_var, double b,
                            double c) {
  Posterior p;
  p.w_mean = Eigen::MatrixXd::Constant(j, k, w);
  p.w_cov.assign(static_cast<size_t>(j), w_var * Eigen::MatrixXd::Identity(k, k));
  p.b_mean = Eigen::VectorXd::Constant(k, b);
  p.b_var = Eigen::VectorXd::Constant(k, w_var);
  p.c_mean = Eigen::VectorXd::Constant(j, c);
  p.c_var = Eigen::VectorXd::Constant(j, w_var);
  return p;
}

model::Record RecordOf(std::vector<double> y) {
  model::Record record;
  record.features = std::move(y);
  return record;
}

// L2 norm of each block, in long double (independent of the clipping code).
std::vector<long double> BlockNorms(const privacy::BlockLayout& layout,
                                    const model::SparseStatistic& s) {
  std::vector<long double> norms(layout.num_blocks(), 0.0L);
  size_t b = 0;
  for (size_t i = 0; i < s.indices.size(); ++i) {
    while (s.indices[i] >= layout.block(b).offset + layout.block(b).size) ++b;
    norms[b] += static_cast<long double>(s.values[i]) * s.values[i];
  }
  for (auto& norm : norms) norm = std::sqrt(norm);
  return norms;
}

// ---------------------------------------------------------------- config --

TEST(SbnConfigTest, ValidationNamesTheField) {
  struct Case {
    std::string field;
    void (*mutate)(SbnConfig&);
  };
  const std::vector<Case> cases = {
      {"sbn.visible", [](SbnConfig& c) { c.visible = 0; }},
      {"sbn.hidden", [](SbnConfig& c) { c.hidden = 0; }},
      {"sbn.hidden", [](SbnConfig& c) { c.hidden = 2000; }},
      {"statistic size", [](SbnConfig& c) { c.visible = 60000; c.hidden = 100; }},
      {"sbn.weight_prior_precision", [](SbnConfig& c) { c.weight_prior_precision = 0; }},
      {"sbn.visible_bias_prior_precision",
       [](SbnConfig& c) { c.visible_bias_prior_precision = NAN; }},
      {"sbn.hidden_bias_prior_precision",
       [](SbnConfig& c) { c.hidden_bias_prior_precision = -1; }},
      {"sbn.init_weight_std", [](SbnConfig& c) { c.init_weight_std = -0.1; }},
      {"sbn.init_variance", [](SbnConfig& c) { c.init_variance = 0; }},
      {"sbn.estep_max_iterations", [](SbnConfig& c) { c.estep_max_iterations = 0; }},
      {"sbn.estep_tolerance", [](SbnConfig& c) { c.estep_tolerance = 0; }},
      {"sbn.clip_fractions.xi_zz", [](SbnConfig& c) { c.clip_fractions.xi_zz = 1.5; }},
      {"sbn.clip_fractions.count", [](SbnConfig& c) { c.clip_fractions.count = 0; }},
  };
  ASSERT_TRUE(ValidateSbnConfig(Config(784, 50)).ok());
  for (const auto& test_case : cases) {
    SbnConfig config = Config(784, 50);
    test_case.mutate(config);
    const Status status = ValidateSbnConfig(config);
    EXPECT_FALSE(status.ok()) << test_case.field;
    EXPECT_NE(status.message().find(test_case.field), std::string::npos)
        << status.message();
    EXPECT_FALSE(SbnModel::Create(config).ok());
  }
}

TEST(SbnLayoutTest, SevenBlocksWithProvenBoundsTimesFractions) {
  SbnConfig config = Config(5, 3);
  config.clip_fractions.xi_zz = 0.25;
  config.clip_fractions.y = 0.5;
  auto model = MakeModel(config);
  const auto& layout = model->statistic_layout();
  ASSERT_EQ(layout.num_blocks(), kSbnNumBlocks);
  const std::vector<size_t> sizes = {1, 3, 5, 5, 15, 15, 30};
  const std::vector<double> bounds = {1.0,
                                      std::sqrt(3.0) / 2,
                                      std::sqrt(5.0) / 2,
                                      std::sqrt(5.0) / 4,
                                      std::sqrt(15.0) / 4,
                                      std::sqrt(15.0) / 2,
                                      std::sqrt(30.0) / 4};
  for (size_t b = 0; b < kSbnNumBlocks; ++b) {
    EXPECT_EQ(layout.block(b).name, kSbnBlockNames[b]);
    EXPECT_EQ(layout.block(b).size, sizes[b]);
    EXPECT_EQ(layout.block(b).kind, privacy::BlockKind::kVector);
    EXPECT_DOUBLE_EQ(model->proven_bounds()[b], bounds[b]);
    const double fraction = b == kSbnXiZZ ? 0.25 : b == kSbnY ? 0.5 : 1.0;
    EXPECT_DOUBLE_EQ(layout.block(b).clip_bound, fraction * bounds[b]);
  }
  EXPECT_EQ(layout.total_size(), 74u);
  EXPECT_EQ(model->type(), "sbn");
  EXPECT_TRUE(model->has_proven_bounds());
  const auto dims = model->dimensions();
  ASSERT_EQ(dims.size(), 2u);
  EXPECT_EQ(dims[0], (std::pair<std::string, int64_t>{"J", 5}));
  EXPECT_EQ(dims[1], (std::pair<std::string, int64_t>{"K", 3}));
  // The size quoted in the header for J = 784, K = 50.
  auto big = MakeModel(Config(784, 50));
  EXPECT_EQ(big->statistic_layout().total_size(), 1079619u);
  EXPECT_EQ(big->statistic_layout().block(kSbnXiZZ).size, 999600u);
}

// The Pólya-Gamma mean is shared with BLR (core/models/polya_gamma.h) and
// tested against its series oracle in blr_test.cc.
TEST(SbnSigmoidTest, Limits) {
  EXPECT_EQ(sbn::Sigmoid(NAN), 0.5);
  EXPECT_EQ(sbn::Sigmoid(1e300), 1.0);
  EXPECT_EQ(sbn::Sigmoid(-1e300), 0.0);
}

// -------------------------------------------------------------- bounds --

void ExpectWithinBounds(const SbnModel& model, const model::Record& record,
                        std::vector<long double>* norms_out = nullptr) {
  auto scratch = model.NewScratch();
  model::RecordRng rng(1);
  model::SparseStatistic statistic;
  ASSERT_TRUE(model.EStep(record, rng, *scratch, statistic).ok());
  const auto& layout = model.statistic_layout();
  ASSERT_EQ(statistic.indices.size(), layout.total_size());
  for (size_t i = 0; i < statistic.indices.size(); ++i) {
    ASSERT_EQ(statistic.indices[i], i);
    ASSERT_TRUE(std::isfinite(statistic.values[i]));
  }
  const auto norms = BlockNorms(layout, statistic);
  for (size_t b = 0; b < kSbnNumBlocks; ++b) {
    EXPECT_LE(norms[b], static_cast<long double>(model.proven_bounds()[b]))
        << "block " << kSbnBlockNames[b];
  }
  if (norms_out) *norms_out = norms;
}

std::vector<std::vector<double>> AdversarialRecords(int64_t j, std::mt19937_64& rng) {
  std::vector<std::vector<double>> records = {std::vector<double>(j, 1.0),
                                              std::vector<double>(j, 0.0)};
  std::vector<double> alternating(j);
  for (int64_t i = 0; i < j; ++i) alternating[i] = i % 2;
  records.push_back(alternating);
  std::bernoulli_distribution coin(0.5);
  for (int r = 0; r < 5; ++r) {
    std::vector<double> y(j);
    for (auto& v : y) v = coin(rng) ? 1.0 : 0.0;
    records.push_back(y);
  }
  return records;
}

TEST(SbnBoundsTest, RandomAndAdversarialRecordsAndParametersStayWithinEveryBound) {
  std::mt19937_64 rng(7);
  for (auto [j, k] : {std::pair<int64_t, int64_t>{1, 1}, {3, 1}, {1, 4}, {12, 5}, {30, 8}}) {
    std::vector<Posterior> posteriors = {
        ConstantPosterior(j, k, 0.0, 1e-12, 50.0, 0.0),    // m → 1, ξ → ¼
        ConstantPosterior(j, k, 0.0, 1e-12, -50.0, 0.0),   // m → 0, ξ → ¼
        ConstantPosterior(j, k, 1e6, 1e-12, 0.0, -1e6),    // huge weights
        ConstantPosterior(j, k, -1e3, 1e6, 1e3, 1e3),      // huge variances
        ConstantPosterior(j, k, 0.0, 1e6, 0.0, 0.0),
        RandomPosterior(rng, j, k, 1.0, 1.0),
        RandomPosterior(rng, j, k, 30.0, 1e-6),
        RandomPosterior(rng, j, k, 1e-3, 100.0),
    };
    for (const auto& posterior : posteriors) {
      auto model = MakeModel(Config(j, k));
      ASSERT_TRUE(model->RestoreCheckpoint(CheckpointOf(posterior)).ok());
      for (const auto& y : AdversarialRecords(j, rng)) {
        ExpectWithinBounds(*model, RecordOf(y));
      }
    }
  }
}

TEST(SbnBoundsTest, AdversarialParametersReachTheBounds) {
  // With W ≈ 0, c ≈ 0 (tiny variance) and b = +50, every m_k → 1 and
  // ξ_j → ¼: all blocks except "y" sit at their bound (which is therefore
  // tight), and still none exceeds it.
  const int64_t j = 20, k = 6;
  auto model = MakeModel(Config(j, k));
  ASSERT_TRUE(model->RestoreCheckpoint(CheckpointOf(ConstantPosterior(j, k, 0.0, 1e-14, 50.0, 0.0))).ok());
  for (const auto& y : {std::vector<double>(j, 1.0), std::vector<double>(j, 0.0)}) {
    std::vector<long double> norms;
    ExpectWithinBounds(*model, RecordOf(y), &norms);
    for (size_t b = 0; b < kSbnNumBlocks; ++b) {
      EXPECT_GE(norms[b], 0.999999L * model->proven_bounds()[b]) << kSbnBlockNames[b];
    }
  }
}

TEST(SbnEStepTest, RejectsMalformedRecordsWithoutContent) {
  auto model = MakeModel(Config(4, 2));
  auto scratch = model->NewScratch();
  model::RecordRng rng(1);
  model::SparseStatistic statistic;
  for (const auto& y : {std::vector<double>{1, 0, 1}, std::vector<double>{1, 0, 1, 0, 1},
                        std::vector<double>{1, 0, 0.5, 0}, std::vector<double>{1, 0, 2, 0},
                        std::vector<double>{1, 0, NAN, 0}}) {
    const Status status = model->EStep(RecordOf(y), rng, *scratch, statistic);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(status.message().find("0.5"), std::string::npos);
  }
}

// ------------------------------------------------------ E-step oracle --

// Brute-force local ELBO (header: E-step) by enumerating z ∈ {0,1}^K:
// L(m, t) = Σ_z q_m(z) { Σ_j [log σ(t_j) + (y_j − ½)E[ψ_j|z] − t_j/2
//           − λ(t_j)(E[ψ_j²|z] − t_j²)] + Σ_k z_k E[b_k] } + H(q_m),
// λ(t) = tanh(t/2)/(4t), with E over W and c from the posterior.
struct Oracle {
  const Posterior& p;
  const std::vector<double>& y;
  int64_t J() const { return p.w_mean.rows(); }
  int64_t K() const { return p.w_mean.cols(); }

  double PsiMean(int64_t j, const Eigen::VectorXd& z) const {
    return p.w_mean.row(j).dot(z) + p.c_mean[j];
  }
  double PsiSecond(int64_t j, const Eigen::VectorXd& z) const {
    const Eigen::MatrixXd q =
        p.w_mean.row(j).transpose() * p.w_mean.row(j) + p.w_cov[static_cast<size_t>(j)];
    return z.dot(q * z) + 2 * p.c_mean[j] * p.w_mean.row(j).dot(z) +
           p.c_mean[j] * p.c_mean[j] + p.c_var[j];
  }
  template <typename F>
  void ForEachZ(const Eigen::VectorXd& m, F f) const {
    const int64_t k = K();
    for (int64_t bits = 0; bits < (int64_t{1} << k); ++bits) {
      Eigen::VectorXd z(k);
      double q = 1;
      for (int64_t i = 0; i < k; ++i) {
        z[i] = (bits >> i) & 1;
        q *= z[i] == 1 ? m[i] : 1 - m[i];
      }
      f(z, q);
    }
  }
  Eigen::VectorXd OptimalT(const Eigen::VectorXd& m) const {
    Eigen::VectorXd t = Eigen::VectorXd::Zero(J());
    ForEachZ(m, [&](const Eigen::VectorXd& z, double q) {
      for (int64_t j = 0; j < J(); ++j) t[j] += q * PsiSecond(j, z);
    });
    return t.cwiseSqrt();
  }
  static double Lambda(double t) { return t < 1e-6 ? 0.125 : std::tanh(t / 2) / (4 * t); }
  static double LogSigmoid(double x) { return -std::log1p(std::exp(-x)); }
  double Elbo(const Eigen::VectorXd& m, const Eigen::VectorXd& t) const {
    double value = 0;
    ForEachZ(m, [&](const Eigen::VectorXd& z, double q) {
      if (q == 0) return;
      double inner = 0;
      for (int64_t j = 0; j < J(); ++j) {
        inner += LogSigmoid(t[j]) + (y[j] - 0.5) * PsiMean(j, z) - t[j] / 2 -
                 Lambda(t[j]) * (PsiSecond(j, z) - t[j] * t[j]);
      }
      inner += z.dot(p.b_mean);
      value += q * (inner - std::log(q));
    });
    return value;
  }
  // log p(y) = log Σ_z p(y|z) p(z) at the posterior means (exact).
  double ExactLogLikelihood() const {
    double total = 0;
    ForEachZ(Eigen::VectorXd::Constant(K(), 0.5), [&](const Eigen::VectorXd& z, double) {
      double log_joint = 0;
      for (int64_t j = 0; j < J(); ++j) log_joint += LogSigmoid((2 * y[j] - 1) * PsiMean(j, z));
      for (int64_t i = 0; i < K(); ++i) log_joint += LogSigmoid((2 * z[i] - 1) * p.b_mean[i]);
      total += std::exp(log_joint);
    });
    return std::log(total);
  }
};

TEST(SbnEStepTest, FixedPointIsCoordinateOptimalUnderBruteForceElbo) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 6; ++trial) {
    const int64_t j = 5, k = 3;
    const Posterior p = RandomPosterior(rng, j, k, 1.5, trial % 2 ? 0.3 : 0.01);
    SbnConfig config = Config(j, k);
    config.estep_tolerance = 1e-12;
    config.estep_max_iterations = 10000;
    auto model = MakeModel(config);
    ASSERT_TRUE(model->RestoreCheckpoint(CheckpointOf(p)).ok());
    for (const auto& y : AdversarialRecords(j, rng)) {
      auto fit = model->FitRecord(y);
      ASSERT_TRUE(fit.ok());
      ASSERT_TRUE(fit->converged);
      const Oracle oracle{p, y};
      const Eigen::VectorXd t = oracle.OptimalT(fit->z_mean);
      // ⟨ξ⟩ is the PG mean at the optimal t (t-optimality).
      for (int64_t i = 0; i < j; ++i) {
        EXPECT_NEAR(fit->xi[i], 2 * Oracle::Lambda(t[i]), 1e-9);
      }
      // Each m_k maximises L(·, t) along coordinate k (m-optimality).
      const double best = oracle.Elbo(fit->z_mean, t);
      for (int64_t i = 0; i < k; ++i) {
        for (int g = 1; g < 400; ++g) {
          Eigen::VectorXd m = fit->z_mean;
          m[i] = g / 400.0;
          EXPECT_LE(oracle.Elbo(m, t), best + 1e-9) << "k=" << i << " m_k=" << m[i];
        }
        // And the derivative vanishes there (interior stationary point).
        const double h = 1e-6;
        Eigen::VectorXd up = fit->z_mean, down = fit->z_mean;
        if (up[i] > 2 * h && up[i] < 1 - 2 * h) {
          up[i] += h;
          down[i] -= h;
          EXPECT_NEAR((oracle.Elbo(up, t) - oracle.Elbo(down, t)) / (2 * h), 0.0, 1e-4);
        }
      }
    }
  }
}

TEST(SbnEStepTest, ElboLowerBoundsExactLogLikelihoodAndIsTightForOneUnit) {
  std::mt19937_64 rng(5);
  for (int64_t k : {1, 3}) {
    const int64_t j = 6;
    Posterior p = RandomPosterior(rng, j, k, 1.0, 1e-10);  // ≈ point mass
    SbnConfig config = Config(j, k);
    config.estep_tolerance = 1e-12;
    config.estep_max_iterations = 10000;
    auto model = MakeModel(config);
    ASSERT_TRUE(model->RestoreCheckpoint(CheckpointOf(p)).ok());
    for (const auto& y : AdversarialRecords(j, rng)) {
      auto fit = model->FitRecord(y);
      ASSERT_TRUE(fit.ok());
      const Oracle oracle{p, y};
      double prior_constant = 0;  // Σ_k log σ(−b_k), dropped from Elbo()
      for (int64_t i = 0; i < k; ++i) prior_constant += Oracle::LogSigmoid(-p.b_mean[i]);
      const double elbo = oracle.Elbo(fit->z_mean, oracle.OptimalT(fit->z_mean)) + prior_constant;
      const double exact = oracle.ExactLogLikelihood();
      EXPECT_LE(elbo, exact + 1e-9);
      if (k == 1) {
        // One hidden unit: mean field is exact in z; only the PG/JJ bound
        // separates the two. The fit must beat a fine grid over m.
        for (int g = 1; g < 2000; ++g) {
          Eigen::VectorXd m = Eigen::VectorXd::Constant(1, g / 2000.0);
          EXPECT_LE(oracle.Elbo(m, oracle.OptimalT(m)) + prior_constant, elbo + 1e-9);
        }
      }
    }
  }
}

// --------------------------------------------------------------- M-step --

Eigen::VectorXd Segment(const SbnModel& model, const Eigen::VectorXd& sum, SbnBlock b) {
  const auto& block = model.statistic_layout().block(b);
  return sum.segment(static_cast<Eigen::Index>(block.offset),
                     static_cast<Eigen::Index>(block.size));
}

std::map<std::string, model::NamedArray> ByName(const std::vector<model::NamedArray>& arrays) {
  std::map<std::string, model::NamedArray> out;
  for (const auto& a : arrays) out[a.name] = a;
  return out;
}

TEST(SbnMStepTest, TinyCaseMatchesTheFormulas) {
  const int64_t j = 2, k = 2;
  SbnConfig config = Config(j, k);
  config.weight_prior_precision = 2.0;
  config.visible_bias_prior_precision = 3.0;
  config.hidden_bias_prior_precision = 5.0;
  auto model = MakeModel(config);
  Posterior p;
  p.w_mean.resize(2, 2);
  p.w_mean << 0.5, -1.0, 2.0, 0.25;
  p.w_cov = {Eigen::Matrix2d{{0.5, 0.1}, {0.1, 0.4}}, Eigen::Matrix2d{{0.3, 0.0}, {0.0, 0.2}}};
  p.b_mean = Eigen::Vector2d(0.3, -0.7);
  p.b_var = Eigen::Vector2d(0.2, 0.1);
  p.c_mean = Eigen::Vector2d(-1.0, 0.5);
  p.c_var = Eigen::Vector2d(0.3, 0.6);
  ASSERT_TRUE(model->RestoreCheckpoint(CheckpointOf(p)).ok());
  const auto before = ByName(model->CheckpointArrays());

  const double q = 0.5;
  Eigen::VectorXd sum(model->statistic_layout().total_size());
  // count 10 → N̂ = 20; z, y, xi, xi_z, y_z, xi_zz (rows: [[2,1],[1,2]] and
  // [[0,5],[5,0]], the second indefinite). y[1] = 15 is infeasible (> N̂/2·q).
  sum << 10,                       // count
      1.0, -2.0,                   // z
      3.0, 15.0,                   // y  (15/q = 30 > N̂/2 = 10: clamped)
      1.5, 0.5,                    // xi
      0.8, 0.6, 0.2, 0.1,          // xi_z (row-major j, k)
      2.0, -1.0, 0.5, 0.3,         // y_z
      2.0, 1.0, 2.0,               // xi_zz row 0 packed (0,0),(0,1),(1,1)
      0.0, 5.0, 0.0;               // xi_zz row 1
  const double rho = 0.5;
  ASSERT_TRUE(model->MStep(sum, {q, 0.0}, rho).ok());
  const auto after = ByName(model->CheckpointArrays());

  const double n = 20.0;
  const double ceiling = 2.0 + n * (2 + 0.25) / 4;
  const Eigen::MatrixXd xi_z = Eigen::Map<const RowMajorMatrix>(Segment(*model, sum, kSbnXiZ).data(), 2, 2) / q;
  const Eigen::MatrixXd y_z = Eigen::Map<const RowMajorMatrix>(Segment(*model, sum, kSbnYZ).data(), 2, 2) / q;
  const std::vector<Eigen::Matrix2d> s = {Eigen::Matrix2d{{2, 1}, {1, 2}} / q,
                                          Eigen::Matrix2d{{0, 5}, {5, 0}} / q};
  for (int row = 0; row < 2; ++row) {
    // Project: floor the eigenvalues of S at r = max(0, −λ_min(S)), add α_W,
    // cap at the ceiling.
    Eigen::SelfAdjointEigenSolver<Eigen::Matrix2d> solver(s[row]);
    const double radius = std::max(0.0, -solver.eigenvalues().minCoeff());
    const Eigen::Vector2d eig =
        (solver.eigenvalues().array().max(radius) + 2.0).min(ceiling).matrix();
    if (row == 1) {  // eigenvalues ±10 → both floored at 10, + α_W = 12
      EXPECT_NEAR(eig[0], 12.0, 1e-12);
      EXPECT_NEAR(eig[1], 12.0, 1e-12);
    }
    if (row == 0) {  // PSD: eigenvalues 2 and 6 (/q) unchanged, + α_W
      EXPECT_NEAR(eig[0], 4.0, 1e-12);
      EXPECT_NEAR(eig[1], 8.0, 1e-12);
    }
    const Eigen::Matrix2d lambda_hat = solver.eigenvectors() * eig.asDiagonal() * solver.eigenvectors().transpose();
    const std::vector<double> packed_hat = {lambda_hat(0, 0), lambda_hat(0, 1), lambda_hat(1, 1)};
    for (int i = 0; i < 3; ++i) {
      EXPECT_NEAR(after.at("w_precision").data[row * 3 + i],
                  0.5 * before.at("w_precision").data[row * 3 + i] + 0.5 * packed_hat[i], 1e-9);
    }
    const Eigen::Vector2d h_hat = y_z.row(row).transpose() - p.c_mean[row] * xi_z.row(row).transpose();
    for (int i = 0; i < 2; ++i) {
      EXPECT_NEAR(after.at("w_precision_mean").data[row * 2 + i],
                  0.5 * before.at("w_precision_mean").data[row * 2 + i] + 0.5 * h_hat[i], 1e-9);
    }
    // c: λ̂ = α_c + X_j, ĥ = Y_j (clamped to ±N̂/2) − μ_jᵀ XZ_j.
    const double x = Segment(*model, sum, kSbnXi)[row] / q;
    const double y = std::clamp(Segment(*model, sum, kSbnY)[row] / q, -n / 2, n / 2);
    EXPECT_NEAR(after.at("c_precision").data[row],
                0.5 * before.at("c_precision").data[row] + 0.5 * (3.0 + x), 1e-9);
    EXPECT_NEAR(after.at("c_precision_mean").data[row],
                0.5 * before.at("c_precision_mean").data[row] +
                    0.5 * (y - p.w_mean.row(row).dot(xi_z.row(row))),
                1e-9);
  }
  for (int i = 0; i < 2; ++i) {
    const double b_second = p.b_mean[i] * p.b_mean[i] + p.b_var[i];
    const double t = std::sqrt(b_second);
    const double xi1 = std::tanh(t / 2) / (2 * t);
    EXPECT_NEAR(after.at("b_precision").data[i],
                0.5 * before.at("b_precision").data[i] + 0.5 * (5.0 + n * xi1), 1e-9);
    EXPECT_NEAR(after.at("b_precision_mean").data[i],
                0.5 * before.at("b_precision_mean").data[i] + 0.5 * Segment(*model, sum, kSbnZ)[i] / q,
                1e-9);
  }
  // The indefinite row stays positive definite.
  Eigen::Matrix2d lambda1;
  const auto& packed = after.at("w_precision").data;
  lambda1 << packed[3], packed[4], packed[4], packed[5];
  EXPECT_GT(Eigen::SelfAdjointEigenSolver<Eigen::Matrix2d>(lambda1).eigenvalues().minCoeff(), 1.0);
}

TEST(SbnMStepTest, ValidatesInputsAndLeavesModelUnchangedOnError) {
  auto model = MakeModel(Config(3, 2));
  const auto before = model->CheckpointArrays();
  const auto size = static_cast<Eigen::Index>(model->statistic_layout().total_size());
  EXPECT_FALSE(model->MStep(Eigen::VectorXd::Zero(size - 1), {0.5, 0.0}, 0.5).ok());
  EXPECT_FALSE(model->MStep(Eigen::VectorXd::Zero(size), {0.0, 0.0}, 0.5).ok());
  EXPECT_FALSE(model->MStep(Eigen::VectorXd::Zero(size), {0.5, 0.0}, 1.5).ok());
  Eigen::VectorXd bad = Eigen::VectorXd::Zero(size);
  bad[4] = NAN;
  EXPECT_EQ(model->MStep(bad, {0.5, 0.0}, 0.5).code(), StatusCode::kOutOfRange);
  const auto after = model->CheckpointArrays();
  for (size_t i = 0; i < before.size(); ++i) EXPECT_EQ(before[i].data, after[i].data);
  // A zero (empty-batch) sum is a valid step: the posterior moves to the prior.
  EXPECT_TRUE(model->MStep(Eigen::VectorXd::Zero(size), {0.5, 0.0}, 1.0).ok());
  EXPECT_NEAR(model->w_mean().norm(), 0.0, 1e-12);
  EXPECT_NEAR(model->c_variance()[0], 1.0, 1e-12);  // α_c = 1
}

TEST(SbnMStepTest, ExactStatisticsGiveTheBatchPosterior) {
  // ρ = 1, q = 1 and the exact summed statistic of two records: the new
  // q(W) row precision equals α I + Σ_n ξ_nj ⟨z_n z_nᵀ⟩ computed from the
  // records' own fits.
  std::mt19937_64 rng(3);
  const int64_t j = 4, k = 3;
  auto model = MakeModel(Config(j, k));
  ASSERT_TRUE(model->RestoreCheckpoint(CheckpointOf(RandomPosterior(rng, j, k, 1.0, 0.1))).ok());
  const std::vector<std::vector<double>> ys = {{1, 0, 1, 1}, {0, 0, 1, 0}};
  Eigen::VectorXd sum = Eigen::VectorXd::Zero(model->statistic_layout().total_size());
  std::vector<Eigen::MatrixXd> expected(j, Eigen::MatrixXd::Identity(k, k));  // α_W = 1
  auto scratch = model->NewScratch();
  model::RecordRng record_rng(1);
  for (const auto& y : ys) {
    model::SparseStatistic statistic;
    ASSERT_TRUE(model->EStep(RecordOf(y), record_rng, *scratch, statistic).ok());
    for (size_t i = 0; i < statistic.indices.size(); ++i) sum[statistic.indices[i]] += statistic.values[i];
    auto fit = model->FitRecord(y);
    ASSERT_TRUE(fit.ok());
    Eigen::MatrixXd zz = fit->z_mean * fit->z_mean.transpose();
    zz.diagonal() = fit->z_mean;
    for (int64_t row = 0; row < j; ++row) expected[row] += fit->xi[row] * zz;
  }
  ASSERT_TRUE(model->MStep(sum, {1.0, 0.0}, 1.0).ok());
  const auto arrays = ByName(model->CheckpointArrays());
  for (int64_t row = 0; row < j; ++row) {
    int index = 0;
    for (int64_t l = 0; l < k; ++l) {
      for (int64_t i = 0; i <= l; ++i) {
        EXPECT_NEAR(arrays.at("w_precision").data[row * 6 + index++], expected[row](i, l), 1e-10);
      }
    }
  }
}

// ------------------------------------------------ release / checkpoint --

TEST(SbnCheckpointTest, RoundTripIsBitExactAndReproducesTheEStep) {
  std::mt19937_64 rng(9);
  const int64_t j = 6, k = 3;
  auto model = MakeModel(Config(j, k));
  // A few M-steps from E-step sums, so the state is not the initial one.
  auto scratch = model->NewScratch();
  model::RecordRng record_rng(1);
  for (int step = 0; step < 3; ++step) {
    Eigen::VectorXd sum = Eigen::VectorXd::Zero(model->statistic_layout().total_size());
    for (const auto& y : AdversarialRecords(j, rng)) {
      model::SparseStatistic statistic;
      ASSERT_TRUE(model->EStep(RecordOf(y), record_rng, *scratch, statistic).ok());
      for (size_t i = 0; i < statistic.indices.size(); ++i) sum[statistic.indices[i]] += statistic.values[i];
    }
    ASSERT_TRUE(model->MStep(sum, {0.3, 0.0}, 0.6).ok());
  }
  const auto checkpoint = model->CheckpointArrays();
  SbnConfig other_config = Config(j, k);
  other_config.init_seed = 12345;
  auto restored = MakeModel(other_config);
  ASSERT_TRUE(restored->RestoreCheckpoint(checkpoint).ok());
  const auto again = restored->CheckpointArrays();
  ASSERT_EQ(again.size(), checkpoint.size());
  for (size_t i = 0; i < again.size(); ++i) {
    EXPECT_EQ(again[i].name, checkpoint[i].name);
    EXPECT_EQ(again[i].shape, checkpoint[i].shape);
    EXPECT_EQ(again[i].data, checkpoint[i].data);  // bit-exact
  }
  const auto release_a = model->ReleaseArrays();
  const auto release_b = restored->ReleaseArrays();
  for (size_t i = 0; i < release_a.size(); ++i) EXPECT_EQ(release_a[i].data, release_b[i].data);
  const std::vector<double> y = {1, 1, 0, 1, 0, 0};
  model::SparseStatistic a, b;
  auto scratch_b = restored->NewScratch();
  ASSERT_TRUE(model->EStep(RecordOf(y), record_rng, *scratch, a).ok());
  ASSERT_TRUE(restored->EStep(RecordOf(y), record_rng, *scratch_b, b).ok());
  EXPECT_EQ(a.values, b.values);
  // The release holds what the evaluation needs.
  auto expectations = SbnExpectationsFromRelease(release_a);
  ASSERT_TRUE(expectations.ok()) << expectations.status().ToString();
  EXPECT_TRUE(expectations->w_second_packed.isApprox(model->expectations().w_second_packed, 1e-14));
  EXPECT_TRUE(expectations->c_second.isApprox(model->expectations().c_second, 1e-14));
  EXPECT_EQ(expectations->b_mean, model->b_mean());
}

TEST(SbnCheckpointTest, InvalidCheckpointsAreRejectedAndLeaveTheModelUnchanged) {
  const int64_t j = 3, k = 2;
  auto model = MakeModel(Config(j, k));
  const auto good = model->CheckpointArrays();
  const auto before = model->ReleaseArrays();
  struct Case {
    std::string name;
    std::function<void(std::vector<model::NamedArray>&)> mutate;
  };
  const std::vector<Case> cases = {
      {"w_precision_mean", [](auto& a) { a.erase(a.begin() + 1); }},
      {"extra", [](auto& a) { a.push_back({"extra", {1}, {1.0}}); }},
      {"twice", [](auto& a) { a.push_back(a[2]); }},
      {"w_precision", [](auto& a) { a[0].shape = {3, 2}; a[0].data.resize(6); }},
      {"b_precision", [](auto& a) { a[2].data[0] = -1.0; }},
      {"c_precision", [](auto& a) { a[4].data[1] = 0.0; }},
      {"c_precision_mean", [](auto& a) { a[5].data[0] = NAN; }},
      // Row 1 precision [[1, 2], [2, 1]] is indefinite.
      {"w_precision", [](auto& a) { a[0].data[3] = 1; a[0].data[4] = 2; a[0].data[5] = 1; }},
  };
  for (const auto& test_case : cases) {
    auto arrays = good;
    test_case.mutate(arrays);
    const Status status = model->RestoreCheckpoint(arrays);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << test_case.name;
    EXPECT_NE(status.message().find(test_case.name), std::string::npos) << status.message();
    const auto after = model->ReleaseArrays();
    for (size_t i = 0; i < before.size(); ++i) EXPECT_EQ(before[i].data, after[i].data);
  }
}

// ---------------------------------------------------------- public start --

const model::NamedArray& Named(const std::vector<model::NamedArray>& arrays,
                               const std::string& name) {
  return *std::find_if(arrays.begin(), arrays.end(),
                       [&](const model::NamedArray& a) { return a.name == name; });
}

// The state a public release describes is exactly where the model starts:
// its checkpoint (natural parameters) is the public model's and its release
// the public release, up to the rounding of Σ → Λ → Σ; nothing of the
// model's own random start survives.
TEST(SbnPublicPriorTest, TheStartIsThePublicReleasesState) {
  std::mt19937_64 rng(21);
  const int64_t j = 6, k = 3;
  auto public_model = MakeModel(Config(j, k));
  ASSERT_TRUE(public_model->RestoreCheckpoint(CheckpointOf(RandomPosterior(rng, j, k, 1.5, 0.3)))
                  .ok());
  std::vector<model::NamedArray> release = public_model->ReleaseArrays();
  release.push_back({"unrelated", {1}, {7.0}});  // other arrays are ignored
  SbnConfig config = Config(j, k);
  config.init_seed = 99;
  auto model = MakeModel(config);
  const auto before = model->CheckpointArrays();
  ASSERT_TRUE(model->SetPublicPrior(release).ok());
  auto close = [](const std::vector<double>& a, const std::vector<double>& b, double tolerance) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (std::fabs(a[i] - b[i]) > tolerance * (1 + std::fabs(b[i]))) return false;
    }
    return true;
  };
  const auto expected = public_model->CheckpointArrays();
  const auto got = model->CheckpointArrays();
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].name, expected[i].name);
    EXPECT_EQ(got[i].shape, expected[i].shape);
    EXPECT_TRUE(close(got[i].data, expected[i].data, 1e-10)) << got[i].name;
    EXPECT_FALSE(close(got[i].data, before[i].data, 1e-3)) << got[i].name;  // moved
  }
  for (const auto& array : public_model->ReleaseArrays()) {
    EXPECT_TRUE(close(Named(model->ReleaseArrays(), array.name).data, array.data, 1e-10))
        << array.name;
  }
  // So the E-step sees the public parameters.
  const std::vector<double> y = {1, 0, 0, 1, 1, 0};
  auto fit = model->FitRecord(y);
  auto public_fit = public_model->FitRecord(y);
  ASSERT_TRUE(fit.ok() && public_fit.ok());
  EXPECT_TRUE(fit->z_mean.isApprox(public_fit->z_mean, 1e-8));
}

// A release that is not an SBN release of this J and K, or whose values are
// not a valid posterior, is refused by array name (and expected shape), and
// the model keeps its state.
TEST(SbnPublicPriorTest, MalformedPublicReleasesAreRefusedByArrayAndLeaveTheModelUnchanged) {
  std::mt19937_64 rng(22);
  const int64_t j = 6, k = 3;
  auto public_model = MakeModel(Config(j, k));
  ASSERT_TRUE(public_model->RestoreCheckpoint(CheckpointOf(RandomPosterior(rng, j, k, 1.0, 0.5)))
                  .ok());
  const std::vector<model::NamedArray> good = public_model->ReleaseArrays();
  auto at = [](std::vector<model::NamedArray>& arrays, const std::string& name) -> auto& {
    return *std::find_if(arrays.begin(), arrays.end(),
                         [&](const model::NamedArray& a) { return a.name == name; });
  };
  struct Case {
    std::string says;
    std::function<void(std::vector<model::NamedArray>&)> mutate;
  };
  const std::vector<Case> cases = {
      {"array \"w_mean\" is missing",
       [&](auto& a) { a.erase(std::find_if(a.begin(), a.end(), [](const auto& x) {
                        return x.name == "w_mean";
                      })); }},
      // A checkpoint (natural parameters) is not a release.
      {"array \"w_mean\" is missing", [&](auto& a) { a = public_model->CheckpointArrays(); }},
      {"array \"w_mean\" must have shape (J, K) = (6, 3)",
       [&](auto& a) { at(a, "w_mean").shape = {3, 6}; }},
      {"array \"w_covariance\" must have shape (J, K(K+1)/2) = (6, 6)",
       [&](auto& a) { at(a, "w_covariance").shape = {6, 9}; at(a, "w_covariance").data.resize(54); }},
      {"array \"b_mean\" must have shape (K,) = (3,)",
       [&](auto& a) { at(a, "b_mean").data.push_back(0); at(a, "b_mean").shape = {4}; }},
      {"array \"b_variance\" must have shape (K,) = (3,)",
       [&](auto& a) { at(a, "b_variance").shape = {1, 3}; }},
      {"array \"c_mean\" must have shape (J,) = (6,)",
       [&](auto& a) { at(a, "c_mean").data.pop_back(); at(a, "c_mean").shape = {5}; }},
      {"array \"c_variance\" is missing",
       [&](auto& a) { at(a, "c_variance").name = "c_var"; }},
      {"array \"w_mean\" has a non-finite value", [&](auto& a) { at(a, "w_mean").data[4] = INFINITY; }},
      {"array \"w_covariance\" has a non-finite value",
       [&](auto& a) { at(a, "w_covariance").data[7] = NAN; }},
      {"array \"c_mean\" has a non-finite value", [&](auto& a) { at(a, "c_mean").data[2] = NAN; }},
      {"array \"b_variance\" must be > 0", [&](auto& a) { at(a, "b_variance").data[1] = 0.0; }},
      {"array \"c_variance\" must be > 0", [&](auto& a) { at(a, "c_variance").data[5] = -0.5; }},
      // A variance whose precision is not finite.
      {"array \"c_variance\" must be > 0", [&](auto& a) { at(a, "c_variance").data[0] = 1e-320; }},
      // Row 1's covariance [[1, 2, 0], [2, 1, 0], [0, 0, 1]] is indefinite
      // (packed 'U': (0,0) (0,1) (1,1) (0,2) (1,2) (2,2)).
      {"array \"w_covariance\" has a row (1) that is not positive definite",
       [&](auto& a) {
         auto& data = at(a, "w_covariance").data;
         const std::vector<double> row = {1, 2, 1, 0, 0, 1};
         std::copy(row.begin(), row.end(), data.begin() + 6);
       }},
      // Singular: a zero variance on the diagonal.
      {"array \"w_covariance\" has a row (4) that is not positive definite",
       [&](auto& a) {
         auto& data = at(a, "w_covariance").data;
         std::fill(data.begin() + 24, data.begin() + 30, 0.0);
       }},
  };
  auto model = MakeModel(Config(j, k));
  const auto before = model->CheckpointArrays();
  for (const Case& c : cases) {
    std::vector<model::NamedArray> arrays = good;
    c.mutate(arrays);
    const Status status = model->SetPublicPrior(arrays);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << c.says;
    EXPECT_NE(status.message().find("the public prior's " + c.says), std::string::npos)
        << status.message();
    const auto after = model->CheckpointArrays();
    for (size_t i = 0; i < before.size(); ++i) EXPECT_EQ(before[i].data, after[i].data) << c.says;
  }
  // The unchanged release is accepted by the same model.
  EXPECT_TRUE(model->SetPublicPrior(good).ok());
}

TEST(SbnInitTest, InitialisationIsSeededAndSmall) {
  SbnConfig config = Config(10, 4);
  auto a = MakeModel(config);
  auto b = MakeModel(config);
  config.init_seed = 1;
  auto c = MakeModel(config);
  EXPECT_EQ(a->w_mean(), b->w_mean());
  EXPECT_NE(a->w_mean(), c->w_mean());
  EXPECT_LT(a->w_mean().cwiseAbs().maxCoeff(), 1.0);
  EXPECT_NEAR(a->w_covariance_packed()(0, 0), 0.01, 1e-15);
  EXPECT_NEAR(a->w_covariance_packed()(0, 1), 0.0, 1e-15);
  EXPECT_EQ(a->b_mean(), Eigen::VectorXd::Zero(4));
  EXPECT_NEAR(a->c_variance()[3], 0.01, 1e-15);
}

}  // namespace
}  // namespace vipsd::models
