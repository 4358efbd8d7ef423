#include "core/models/sbn.h"

#include <Eigen/Cholesky>
#include <Eigen/Eigenvalues>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <string>

namespace vipsd::models {
namespace {

// Upper limit of the statistic size (coordinates per record): 2^26 doubles
// is 512 MiB per accumulator, far above any sensible configuration.
constexpr int64_t kMaxStatisticSize = int64_t{1} << 26;
// Sweeps over k for a fixed ⟨ξ⟩ (each O(K²)).
constexpr int kMaxSweeps = 100;

struct SbnScratch final : model::EStepScratch {
  SbnFitScratch fit_scratch;
  SbnLocalFit fit;
};

Status FieldError(const std::string& field, const std::string& allowed) {
  return InvalidArgumentError("sbn." + field + " must be " + allowed);
}

bool FiniteIn(double value, double low, double high) {
  return std::isfinite(value) && value >= low && value <= high;
}

int64_t StatisticSize(int64_t visible, int64_t hidden) {
  return visible * (2 + 2 * hidden + SbnPackedSize(hidden)) + hidden + 1;
}

// Packed 'U' index of (i, l), i ≤ l.
inline Eigen::Index PackedIndex(Eigen::Index i, Eigen::Index l) { return i + l * (l + 1) / 2; }

// Row `row` of a J × P packed array → symmetric K × K matrix.
void UnpackRow(const Eigen::MatrixXd& packed, Eigen::Index row, Eigen::MatrixXd& out) {
  const Eigen::Index k = out.rows();
  for (Eigen::Index l = 0; l < k; ++l) {
    for (Eigen::Index i = 0; i <= l; ++i) {
      const double value = packed(row, PackedIndex(i, l));
      out(i, l) = value;
      out(l, i) = value;
    }
  }
}

// Upper triangle of `matrix` → row `row` of a J × P packed array.
void PackRow(const Eigen::MatrixXd& matrix, Eigen::Index row, Eigen::MatrixXd& packed) {
  const Eigen::Index k = matrix.rows();
  for (Eigen::Index l = 0; l < k; ++l) {
    for (Eigen::Index i = 0; i <= l; ++i) packed(row, PackedIndex(i, l)) = matrix(i, l);
  }
}

// For each row r of `packed` (J rows, each a packed SPD K × K matrix A_r)
// and of `vectors` (J × K): `inverse` row r = A_r⁻¹ (packed, symmetrised)
// and `solved` row r = A_r⁻¹ v_r, by one Cholesky factorisation per row.
// Returns the first row whose A_r is not positive definite or whose results
// are not finite, or -1 when every row is; rows from there on are unset.
Eigen::Index InvertPackedRows(const Eigen::MatrixXd& packed, const Eigen::MatrixXd& vectors,
                              Eigen::MatrixXd& inverse, Eigen::MatrixXd& solved) {
  const Eigen::Index k = vectors.cols();
  inverse.resize(packed.rows(), packed.cols());
  solved.resize(vectors.rows(), k);
  Eigen::MatrixXd matrix(k, k);
  Eigen::LLT<Eigen::MatrixXd> llt(k);
  const Eigen::MatrixXd identity = Eigen::MatrixXd::Identity(k, k);
  for (Eigen::Index row = 0; row < packed.rows(); ++row) {
    UnpackRow(packed, row, matrix);
    llt.compute(matrix);
    if (llt.info() != Eigen::Success) return row;
    Eigen::MatrixXd inverted = llt.solve(identity);
    inverted = 0.5 * (inverted + inverted.transpose()).eval();
    solved.row(row) = llt.solve(vectors.row(row).transpose()).transpose();
    if (!inverted.allFinite() || !solved.row(row).allFinite()) return row;
    PackRow(inverted, row, inverse);
  }
  return -1;
}

using RowMajorMatrix = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

model::NamedArray MatrixArray(const std::string& name, const Eigen::MatrixXd& matrix) {
  model::NamedArray array{name, {matrix.rows(), matrix.cols()}, {}};
  array.data.resize(static_cast<size_t>(matrix.size()));
  Eigen::Map<RowMajorMatrix>(array.data.data(), matrix.rows(), matrix.cols()) = matrix;
  return array;
}

model::NamedArray VectorArray(const std::string& name, const Eigen::VectorXd& vector) {
  return {name, {vector.size()}, std::vector<double>(vector.data(), vector.data() + vector.size())};
}

const model::NamedArray* FindArray(std::span<const model::NamedArray> arrays,
                                   std::string_view name) {
  for (const auto& array : arrays) {
    if (array.name == name) return &array;
  }
  return nullptr;
}

StatusOr<Eigen::MatrixXd> MatrixFrom(const model::NamedArray* array, std::string_view name,
                                     int64_t rows, int64_t cols) {
  if (array == nullptr) return InvalidArgumentError("array \"" + std::string(name) + "\" is missing");
  if (array->shape != std::vector<int64_t>{rows, cols} ||
      array->data.size() != static_cast<size_t>(rows * cols)) {
    return InvalidArgumentError("array \"" + std::string(name) + "\" must have shape (" +
                                std::to_string(rows) + ", " + std::to_string(cols) + ")");
  }
  Eigen::MatrixXd matrix = Eigen::Map<const RowMajorMatrix>(array->data.data(), rows, cols);
  if (!matrix.allFinite()) {
    return InvalidArgumentError("array \"" + std::string(name) + "\" has a non-finite value");
  }
  return matrix;
}

StatusOr<Eigen::VectorXd> VectorFrom(const model::NamedArray* array, std::string_view name,
                                     int64_t size) {
  if (array == nullptr) return InvalidArgumentError("array \"" + std::string(name) + "\" is missing");
  if (array->shape != std::vector<int64_t>{size} || array->data.size() != static_cast<size_t>(size)) {
    return InvalidArgumentError("array \"" + std::string(name) + "\" must have shape (" +
                                std::to_string(size) + ",)");
  }
  Eigen::VectorXd vector = Eigen::Map<const Eigen::VectorXd>(array->data.data(), size);
  if (!vector.allFinite()) {
    return InvalidArgumentError("array \"" + std::string(name) + "\" has a non-finite value");
  }
  return vector;
}

// ⟨ξ⟩ for the current m (header: E[ψ_j²], clamped at 0).
void UpdateXi(const SbnExpectations& e, const Eigen::VectorXd& m, SbnFitScratch& s,
              Eigen::VectorXd& xi) {
  const Eigen::Index k = e.hidden;
  // u: packed weights with mᵀQm = Σ_p Q_p u_p.
  for (Eigen::Index l = 0; l < k; ++l) {
    for (Eigen::Index i = 0; i < l; ++i) s.u[PackedIndex(i, l)] = 2.0 * m[i] * m[l];
    s.u[PackedIndex(l, l)] = m[l] * m[l];
  }
  s.m_var.array() = m.array() * (1.0 - m.array());
  s.r.noalias() = e.w_mean * m;
  s.quad.noalias() = e.w_second_packed * s.u;
  s.diag_term.noalias() = e.w_second_diag * s.m_var;
  s.second.array() = s.quad.array() + s.diag_term.array() +
                     2.0 * e.c_mean.array() * s.r.array() + e.c_second.array();
  for (Eigen::Index j = 0; j < xi.size(); ++j) {
    xi[j] = PolyaGammaMean(std::sqrt(std::max(s.second[j], 0.0)));
  }
}

}  // namespace

namespace sbn {

double Sigmoid(double x) {
  if (std::isnan(x)) return 0.5;
  return std::clamp(1.0 / (1.0 + std::exp(-x)), 0.0, 1.0);
}

}  // namespace sbn

Status ValidateSbnConfig(const SbnConfig& c) {
  if (c.visible < 1 || c.visible > 65536) return FieldError("visible", "in [1, 65536]");
  if (c.hidden < 1 || c.hidden > 1024) return FieldError("hidden", "in [1, 1024]");
  if (StatisticSize(c.visible, c.hidden) > kMaxStatisticSize) {
    return FieldError("visible * (2 + 2 * hidden + hidden * (hidden + 1) / 2) + hidden + 1",
                      "at most 2^26 (the per-record statistic size)");
  }
  if (!FiniteIn(c.weight_prior_precision, 0, 1e12) || c.weight_prior_precision <= 0) {
    return FieldError("weight_prior_precision", "finite and in (0, 1e12]");
  }
  if (!FiniteIn(c.visible_bias_prior_precision, 0, 1e12) || c.visible_bias_prior_precision <= 0) {
    return FieldError("visible_bias_prior_precision", "finite and in (0, 1e12]");
  }
  if (!FiniteIn(c.hidden_bias_prior_precision, 0, 1e12) || c.hidden_bias_prior_precision <= 0) {
    return FieldError("hidden_bias_prior_precision", "finite and in (0, 1e12]");
  }
  if (!FiniteIn(c.init_weight_std, 0, 1e3)) return FieldError("init_weight_std", "in [0, 1000]");
  if (!FiniteIn(c.init_variance, 0, 1e6) || c.init_variance < 1e-12) {
    return FieldError("init_variance", "in [1e-12, 1e6]");
  }
  if (c.estep_max_iterations < 1 || c.estep_max_iterations > 100000) {
    return FieldError("estep_max_iterations", "in [1, 100000]");
  }
  if (!(c.estep_tolerance > 0) || !std::isfinite(c.estep_tolerance)) {
    return FieldError("estep_tolerance", "finite and > 0");
  }
  const std::array<std::pair<const char*, double>, kSbnNumBlocks> fractions = {{
      {"count", c.clip_fractions.count},
      {"z", c.clip_fractions.z},
      {"y", c.clip_fractions.y},
      {"xi", c.clip_fractions.xi},
      {"xi_z", c.clip_fractions.xi_z},
      {"y_z", c.clip_fractions.y_z},
      {"xi_zz", c.clip_fractions.xi_zz},
  }};
  for (const auto& [name, value] : fractions) {
    if (!(value > 0 && value <= 1) || value < 1e-6) {
      return FieldError(std::string("clip_fractions.") + name, "in [1e-6, 1]");
    }
  }
  return Status::Ok();
}

std::array<double, kSbnNumBlocks> SbnProvenBounds(int64_t visible, int64_t hidden) {
  const auto j = static_cast<double>(visible);
  const auto k = static_cast<double>(hidden);
  const auto p = static_cast<double>(SbnPackedSize(hidden));
  return {1.0,
          std::sqrt(k) / 2.0,
          std::sqrt(j) / 2.0,
          std::sqrt(j) / 4.0,
          std::sqrt(j * k) / 4.0,
          std::sqrt(j * k) / 2.0,
          std::sqrt(j * p) / 4.0};
}

StatusOr<SbnExpectations> MakeSbnExpectations(const Eigen::MatrixXd& w_mean,
                                              const Eigen::MatrixXd& w_covariance_packed,
                                              const Eigen::VectorXd& b_mean,
                                              const Eigen::VectorXd& c_mean,
                                              const Eigen::VectorXd& c_variance) {
  const Eigen::Index j = w_mean.rows();
  const Eigen::Index k = w_mean.cols();
  if (j < 1 || k < 1) return InvalidArgumentError("w_mean must be J x K with J, K >= 1");
  if (w_covariance_packed.rows() != j || w_covariance_packed.cols() != SbnPackedSize(k)) {
    return InvalidArgumentError("w_covariance must be J x K(K+1)/2 = " + std::to_string(j) +
                                " x " + std::to_string(SbnPackedSize(k)));
  }
  if (b_mean.size() != k) return InvalidArgumentError("b_mean must have K entries");
  if (c_mean.size() != j || c_variance.size() != j) {
    return InvalidArgumentError("c_mean and c_variance must have J entries");
  }
  if (!w_mean.allFinite()) return InvalidArgumentError("w_mean has a non-finite value");
  if (!w_covariance_packed.allFinite()) {
    return InvalidArgumentError("w_covariance has a non-finite value");
  }
  if (!b_mean.allFinite()) return InvalidArgumentError("b_mean has a non-finite value");
  if (!c_mean.allFinite()) return InvalidArgumentError("c_mean has a non-finite value");
  if (!c_variance.allFinite() || (c_variance.array() < 0).any()) {
    return InvalidArgumentError("c_variance must be finite and >= 0");
  }
  for (Eigen::Index l = 0; l < k; ++l) {
    if ((w_covariance_packed.col(PackedIndex(l, l)).array() < 0).any()) {
      return InvalidArgumentError("w_covariance has a negative variance on its diagonal");
    }
  }
  SbnExpectations e;
  e.visible = j;
  e.hidden = k;
  e.w_mean = w_mean;
  e.w_second_packed = w_covariance_packed;
  for (Eigen::Index l = 0; l < k; ++l) {
    for (Eigen::Index i = 0; i <= l; ++i) {
      e.w_second_packed.col(PackedIndex(i, l)).array() +=
          w_mean.col(i).array() * w_mean.col(l).array();
    }
  }
  e.w_second_diag.resize(j, k);
  for (Eigen::Index l = 0; l < k; ++l) {
    e.w_second_diag.col(l) = e.w_second_packed.col(PackedIndex(l, l));
  }
  e.c_mean = c_mean;
  e.c_second = c_mean.array().square() + c_variance.array();
  e.b_mean = b_mean;
  return e;
}

StatusOr<SbnExpectations> SbnExpectationsFromRelease(std::span<const model::NamedArray> arrays) {
  const model::NamedArray* w_mean_array = FindArray(arrays, "w_mean");
  if (w_mean_array == nullptr) return InvalidArgumentError("array \"w_mean\" is missing");
  if (w_mean_array->shape.size() != 2 || w_mean_array->shape[0] < 1 ||
      w_mean_array->shape[1] < 1 || w_mean_array->shape[1] > 1024) {
    return InvalidArgumentError("array \"w_mean\" must have shape (J, K), K <= 1024");
  }
  const int64_t j = w_mean_array->shape[0];
  const int64_t k = w_mean_array->shape[1];
  VIPSD_ASSIGN_OR_RETURN(Eigen::MatrixXd w_mean, MatrixFrom(w_mean_array, "w_mean", j, k));
  VIPSD_ASSIGN_OR_RETURN(
      Eigen::MatrixXd w_covariance,
      MatrixFrom(FindArray(arrays, "w_covariance"), "w_covariance", j, SbnPackedSize(k)));
  VIPSD_ASSIGN_OR_RETURN(Eigen::VectorXd b_mean, VectorFrom(FindArray(arrays, "b_mean"), "b_mean", k));
  VIPSD_ASSIGN_OR_RETURN(Eigen::VectorXd c_mean, VectorFrom(FindArray(arrays, "c_mean"), "c_mean", j));
  VIPSD_ASSIGN_OR_RETURN(Eigen::VectorXd c_variance,
                         VectorFrom(FindArray(arrays, "c_variance"), "c_variance", j));
  return MakeSbnExpectations(w_mean, w_covariance, b_mean, c_mean, c_variance);
}

void FitSbnLocal(const SbnExpectations& e, std::span<const double> y, int max_iterations,
                 double tolerance, SbnFitScratch& s, SbnLocalFit& fit) {
  const Eigen::Index num_visible = e.visible;
  const Eigen::Index num_hidden = e.hidden;
  const Eigen::Index packed = SbnPackedSize(num_hidden);
  s.y_half.resize(num_visible);
  for (Eigen::Index j = 0; j < num_visible; ++j) s.y_half[j] = y[static_cast<size_t>(j)] - 0.5;
  s.g.noalias() = e.w_mean.transpose() * s.y_half;
  s.u.resize(packed);
  s.packed_m.resize(packed);
  s.r.resize(num_visible);
  s.quad.resize(num_visible);
  s.diag_term.resize(num_visible);
  s.second.resize(num_visible);
  s.m_var.resize(num_hidden);
  s.interaction.resize(num_hidden, num_hidden);
  fit.xi.resize(num_visible);
  fit.z_mean.resize(num_hidden);
  for (Eigen::Index k = 0; k < num_hidden; ++k) fit.z_mean[k] = sbn::Sigmoid(e.b_mean[k]);
  Eigen::VectorXd& m = fit.z_mean;
  fit.converged = false;
  fit.iterations = 0;
  for (int iteration = 1; iteration <= max_iterations; ++iteration) {
    fit.iterations = iteration;
    s.m_prev = m;
    UpdateXi(e, m, s, fit.xi);
    // M = Σ_j ξ_j Q_j (packed), v = μᵀ(ξ ⊙ E[c]).
    s.packed_m.noalias() = e.w_second_packed.transpose() * fit.xi;
    for (Eigen::Index l = 0; l < num_hidden; ++l) {
      for (Eigen::Index i = 0; i <= l; ++i) {
        const double value = s.packed_m[PackedIndex(i, l)];
        s.interaction(i, l) = value;
        s.interaction(l, i) = value;
      }
    }
    s.r.array() = fit.xi.array() * e.c_mean.array();  // reuse r as ξ ⊙ E[c]
    s.v.noalias() = e.w_mean.transpose() * s.r;
    s.base = e.b_mean + s.g - s.v - 0.5 * s.interaction.diagonal();
    for (int sweep = 0; sweep < kMaxSweeps; ++sweep) {
      double change = 0;
      for (Eigen::Index k = 0; k < num_hidden; ++k) {
        const double coupling = s.interaction.col(k).dot(m) - s.interaction(k, k) * m[k];
        const double updated = sbn::Sigmoid(s.base[k] - coupling);
        change = std::max(change, std::fabs(updated - m[k]));
        m[k] = updated;
      }
      if (change < tolerance) break;
    }
    if ((m - s.m_prev).cwiseAbs().maxCoeff() < tolerance) {
      fit.converged = true;
      break;
    }
  }
  UpdateXi(e, m, s, fit.xi);
}

StatusOr<std::unique_ptr<SbnModel>> SbnModel::Create(const SbnConfig& config) {
  VIPSD_RETURN_IF_ERROR(ValidateSbnConfig(config));
  const int64_t j = config.visible;
  const int64_t k = config.hidden;
  const int64_t p = SbnPackedSize(k);
  const std::array<double, kSbnNumBlocks> bounds = SbnProvenBounds(j, k);
  const std::array<double, kSbnNumBlocks> fractions = {
      config.clip_fractions.count, config.clip_fractions.z,    config.clip_fractions.y,
      config.clip_fractions.xi,    config.clip_fractions.xi_z, config.clip_fractions.y_z,
      config.clip_fractions.xi_zz};
  const std::array<size_t, kSbnNumBlocks> sizes = {
      1, static_cast<size_t>(k), static_cast<size_t>(j), static_cast<size_t>(j),
      static_cast<size_t>(j * k), static_cast<size_t>(j * k), static_cast<size_t>(j * p)};
  std::vector<privacy::BlockSpec> specs;
  for (size_t b = 0; b < kSbnNumBlocks; ++b) {
    specs.push_back(privacy::BlockSpec{std::string(kSbnBlockNames[b]), privacy::BlockKind::kVector,
                                       sizes[b], fractions[b] * bounds[b]});
  }
  VIPSD_ASSIGN_OR_RETURN(auto layout, privacy::BlockLayout::Create(std::move(specs)));
  std::unique_ptr<SbnModel> model(new SbnModel(config, std::move(layout)));
  model->proven_bounds_ = bounds;

  std::mt19937_64 rng(config.init_seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  Eigen::MatrixXd w_mean(j, k);
  for (Eigen::Index row = 0; row < j; ++row) {
    for (Eigen::Index col = 0; col < k; ++col) {
      w_mean(row, col) = config.init_weight_std * normal(rng);
    }
  }
  const double init_precision = 1.0 / config.init_variance;
  Eigen::MatrixXd w_precision = Eigen::MatrixXd::Zero(j, p);
  for (Eigen::Index l = 0; l < k; ++l) w_precision.col(PackedIndex(l, l)).setConstant(init_precision);
  Eigen::MatrixXd w_precision_mean = init_precision * w_mean;
  VIPSD_RETURN_IF_ERROR(model->SetState(
      std::move(w_precision), std::move(w_precision_mean), Eigen::VectorXd::Constant(k, init_precision),
      Eigen::VectorXd::Zero(k), Eigen::VectorXd::Constant(j, init_precision),
      Eigen::VectorXd::Zero(j)));
  return model;
}

SbnModel::SbnModel(const SbnConfig& config, privacy::BlockLayout layout)
    : config_(config), layout_(std::move(layout)) {}

std::vector<std::pair<std::string, int64_t>> SbnModel::dimensions() const {
  return {{"J", config_.visible}, {"K", config_.hidden}};
}

Status SbnModel::SetState(Eigen::MatrixXd w_precision, Eigen::MatrixXd w_precision_mean,
                          Eigen::VectorXd b_precision, Eigen::VectorXd b_precision_mean,
                          Eigen::VectorXd c_precision, Eigen::VectorXd c_precision_mean) {
  if (!w_precision.allFinite() || !w_precision_mean.allFinite() || !b_precision.allFinite() ||
      !b_precision_mean.allFinite() || !c_precision.allFinite() || !c_precision_mean.allFinite()) {
    return OutOfRangeError("sbn: updated natural parameters are not finite");
  }
  if (!(b_precision.array() > 0).all() || !(c_precision.array() > 0).all()) {
    return OutOfRangeError("sbn: updated bias precisions are not all > 0");
  }
  Eigen::MatrixXd w_covariance;
  Eigen::MatrixXd w_mean;
  if (const Eigen::Index bad =
          InvertPackedRows(w_precision, w_precision_mean, w_covariance, w_mean);
      bad >= 0) {
    return OutOfRangeError("sbn: a W row precision is not positive definite with a finite "
                           "inverse (row " + std::to_string(bad) + ")");
  }
  Eigen::VectorXd b_variance = b_precision.cwiseInverse();
  Eigen::VectorXd c_variance = c_precision.cwiseInverse();
  Eigen::VectorXd b_mean = b_precision_mean.cwiseProduct(b_variance);
  Eigen::VectorXd c_mean = c_precision_mean.cwiseProduct(c_variance);
  VIPSD_ASSIGN_OR_RETURN(SbnExpectations expectations,
                         MakeSbnExpectations(w_mean, w_covariance, b_mean, c_mean, c_variance));
  if (!expectations.w_second_packed.allFinite() || !expectations.c_second.allFinite() ||
      !b_variance.allFinite()) {
    return OutOfRangeError("sbn: derived expectations are not finite");
  }
  w_precision_ = std::move(w_precision);
  w_precision_mean_ = std::move(w_precision_mean);
  b_precision_ = std::move(b_precision);
  b_precision_mean_ = std::move(b_precision_mean);
  c_precision_ = std::move(c_precision);
  c_precision_mean_ = std::move(c_precision_mean);
  w_covariance_packed_ = std::move(w_covariance);
  b_variance_ = std::move(b_variance);
  c_variance_ = std::move(c_variance);
  expectations_ = std::move(expectations);
  return Status::Ok();
}

std::unique_ptr<model::EStepScratch> SbnModel::NewScratch() const {
  return std::make_unique<SbnScratch>();
}

StatusOr<SbnLocalFit> SbnModel::FitRecord(std::span<const double> y) const {
  if (y.size() != static_cast<size_t>(config_.visible)) {
    return InvalidArgumentError("sbn record must have J = " + std::to_string(config_.visible) +
                                " observations");
  }
  for (double value : y) {
    if (value != 0.0 && value != 1.0) {
      return InvalidArgumentError("sbn record observations must be 0 or 1");
    }
  }
  SbnFitScratch scratch;
  SbnLocalFit fit;
  FitSbnLocal(expectations_, y, config_.estep_max_iterations, config_.estep_tolerance, scratch,
              fit);
  return fit;
}

Status SbnModel::EStep(const model::Record& record, model::RecordRng& /*rng*/,
                       model::EStepScratch& scratch_base, model::SparseStatistic& out) const {
  auto& scratch = static_cast<SbnScratch&>(scratch_base);
  out.Clear();
  const std::vector<double>& y = record.features;
  if (y.size() != static_cast<size_t>(config_.visible)) {
    return InvalidArgumentError("sbn record must have J = " + std::to_string(config_.visible) +
                                " observations");
  }
  for (double value : y) {
    if (value != 0.0 && value != 1.0) {
      return InvalidArgumentError("sbn record observations must be 0 or 1");
    }
  }
  SbnLocalFit& fit = scratch.fit;
  FitSbnLocal(expectations_, y, config_.estep_max_iterations, config_.estep_tolerance,
              scratch.fit_scratch, fit);
  const Eigen::Index num_visible = config_.visible;
  const Eigen::Index num_hidden = config_.hidden;
  const Eigen::Index packed = SbnPackedSize(num_hidden);
  const size_t total = layout_.total_size();
  out.indices.resize(total);
  for (size_t i = 0; i < total; ++i) out.indices[i] = static_cast<uint32_t>(i);
  out.values.resize(total);
  double* values = out.values.data();
  const Eigen::VectorXd& m = fit.z_mean;
  const Eigen::VectorXd& xi = fit.xi;
  auto block = [&](SbnBlock b) { return values + layout_.block(b).offset; };
  block(kSbnCount)[0] = 1.0;
  for (Eigen::Index k = 0; k < num_hidden; ++k) block(kSbnZ)[k] = m[k] - 0.5;
  for (Eigen::Index j = 0; j < num_visible; ++j) {
    block(kSbnY)[j] = y[static_cast<size_t>(j)] - 0.5;
    block(kSbnXi)[j] = xi[j];
  }
  // v = packed ⟨zzᵀ⟩.
  Eigen::VectorXd& v = scratch.fit_scratch.u;
  v.resize(packed);
  for (Eigen::Index l = 0; l < num_hidden; ++l) {
    for (Eigen::Index i = 0; i < l; ++i) v[PackedIndex(i, l)] = m[i] * m[l];
    v[PackedIndex(l, l)] = m[l];
  }
  double* xi_z = block(kSbnXiZ);
  double* y_z = block(kSbnYZ);
  double* xi_zz = block(kSbnXiZZ);
  for (Eigen::Index j = 0; j < num_visible; ++j) {
    const double y_half = y[static_cast<size_t>(j)] - 0.5;
    for (Eigen::Index k = 0; k < num_hidden; ++k) {
      xi_z[j * num_hidden + k] = xi[j] * m[k];
      y_z[j * num_hidden + k] = y_half * m[k];
    }
    Eigen::Map<Eigen::VectorXd>(xi_zz + j * packed, packed) = xi[j] * v;
  }
  // Pessimistic enforcement of the proven bounds (header, "Rounding").
  for (size_t b = 0; b < kSbnNumBlocks; ++b) {
    const privacy::Block& spec = layout_.block(b);
    privacy::ClipToL2Bound(std::span<double>(values + spec.offset, spec.size), proven_bounds_[b]);
  }
  return Status::Ok();
}

Status SbnModel::MStep(const Eigen::VectorXd& statistic_sum,
                       const privacy::SampledGaussian& released_by, double rho) {
  const double sampling_rate = released_by.sampling_rate;
  const double noise_multiplier = released_by.noise_multiplier;
  VIPSD_RETURN_IF_ERROR(model::CheckMStepInputs("sbn", statistic_sum, layout_, sampling_rate, rho,
                                                noise_multiplier));
  const Eigen::Index num_visible = config_.visible;
  const Eigen::Index num_hidden = config_.hidden;
  const Eigen::Index packed = SbnPackedSize(num_hidden);
  const double inv_q = 1.0 / sampling_rate;
  auto segment = [&](SbnBlock b) {
    const privacy::Block& spec = layout_.block(b);
    return statistic_sum.segment(static_cast<Eigen::Index>(spec.offset),
                                 static_cast<Eigen::Index>(spec.size));
  };
  const double count = std::max(statistic_sum[0] * inv_q, 0.0);
  const double half = 0.5 * count;
  const double quarter = 0.25 * count;
  const Eigen::VectorXd z_sum = (segment(kSbnZ) * inv_q).cwiseMax(-half).cwiseMin(half);
  const Eigen::VectorXd y_sum = (segment(kSbnY) * inv_q).cwiseMax(-half).cwiseMin(half);
  const Eigen::VectorXd xi_sum = (segment(kSbnXi) * inv_q).cwiseMax(0.0).cwiseMin(quarter);
  // Row-major J × K blocks → column-major matrices.
  const Eigen::MatrixXd xi_z =
      (Eigen::Map<const RowMajorMatrix>(segment(kSbnXiZ).data(), num_visible, num_hidden) * inv_q)
          .cwiseMax(0.0)
          .cwiseMin(quarter);
  const Eigen::MatrixXd y_z =
      (Eigen::Map<const RowMajorMatrix>(segment(kSbnYZ).data(), num_visible, num_hidden) * inv_q)
          .cwiseMax(-half)
          .cwiseMin(half);
  const Eigen::Map<const RowMajorMatrix> xi_zz(segment(kSbnXiZZ).data(), num_visible, packed);

  const double alpha_w = config_.weight_prior_precision;
  const double ceiling = alpha_w + count * (static_cast<double>(num_hidden) + 0.25) / 4.0;
  const Eigen::MatrixXd& w_mean = expectations_.w_mean;
  const Eigen::VectorXd& c_mean = expectations_.c_mean;

  Eigen::MatrixXd w_precision_hat(num_visible, packed);
  Eigen::MatrixXd w_precision_mean_hat(num_visible, num_hidden);
  Eigen::MatrixXd matrix(num_hidden, num_hidden);
  Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> solver(num_hidden);
  for (Eigen::Index j = 0; j < num_visible; ++j) {
    for (Eigen::Index l = 0; l < num_hidden; ++l) {
      for (Eigen::Index i = 0; i <= l; ++i) {
        const double value = xi_zz(j, PackedIndex(i, l)) * inv_q;
        matrix(i, l) = value;
        matrix(l, i) = value;
      }
    }
    solver.compute(matrix);
    if (solver.info() != Eigen::Success) {
      return OutOfRangeError("sbn: eigendecomposition of a W precision did not converge");
    }
    // Project (header): raise every eigenvalue to at least the noise
    // radius |min λ|, add α_W, cap at the ceiling.
    const double noise_radius = std::max(0.0, -solver.eigenvalues().minCoeff());
    const Eigen::VectorXd clamped =
        (solver.eigenvalues().array().max(noise_radius) + alpha_w).min(ceiling).matrix();
    matrix.noalias() = solver.eigenvectors() * clamped.asDiagonal() *
                       solver.eigenvectors().transpose();
    PackRow(matrix, j, w_precision_hat);  // upper triangle; symmetric by construction
    w_precision_mean_hat.row(j) = y_z.row(j) - c_mean[j] * xi_z.row(j);
  }
  const Eigen::VectorXd c_precision_hat =
      (config_.visible_bias_prior_precision + xi_sum.array()).matrix();
  const Eigen::VectorXd c_precision_mean_hat =
      y_sum - (w_mean.array() * xi_z.array()).rowwise().sum().matrix();
  Eigen::VectorXd b_precision_hat(num_hidden);
  for (Eigen::Index k = 0; k < num_hidden; ++k) {
    const double b_second = expectations_.b_mean[k] * expectations_.b_mean[k] + b_variance_[k];
    b_precision_hat[k] = config_.hidden_bias_prior_precision +
                         count * PolyaGammaMean(std::sqrt(b_second));
  }
  const Eigen::VectorXd& b_precision_mean_hat = z_sum;

  return SetState((1.0 - rho) * w_precision_ + rho * w_precision_hat,
                  (1.0 - rho) * w_precision_mean_ + rho * w_precision_mean_hat,
                  (1.0 - rho) * b_precision_ + rho * b_precision_hat,
                  (1.0 - rho) * b_precision_mean_ + rho * b_precision_mean_hat,
                  (1.0 - rho) * c_precision_ + rho * c_precision_hat,
                  (1.0 - rho) * c_precision_mean_ + rho * c_precision_mean_hat);
}

std::vector<model::NamedArray> SbnModel::ReleaseArrays() const {
  return {MatrixArray("w_mean", expectations_.w_mean),
          MatrixArray("w_covariance", w_covariance_packed_),
          VectorArray("b_mean", expectations_.b_mean),
          VectorArray("b_variance", b_variance_),
          VectorArray("c_mean", expectations_.c_mean),
          VectorArray("c_variance", c_variance_)};
}

std::vector<model::NamedArray> SbnModel::CheckpointArrays() const {
  return {MatrixArray("w_precision", w_precision_),
          MatrixArray("w_precision_mean", w_precision_mean_),
          VectorArray("b_precision", b_precision_),
          VectorArray("b_precision_mean", b_precision_mean_),
          VectorArray("c_precision", c_precision_),
          VectorArray("c_precision_mean", c_precision_mean_)};
}

Status SbnModel::RestoreCheckpoint(std::span<const model::NamedArray> arrays) {
  static const std::set<std::string> kNames = {"w_precision", "w_precision_mean", "b_precision",
                                               "b_precision_mean", "c_precision",
                                               "c_precision_mean"};
  std::set<std::string> seen;
  for (const auto& array : arrays) {
    if (!kNames.count(array.name)) {
      return InvalidArgumentError("unexpected array \"" + array.name + "\" in an sbn checkpoint");
    }
    if (!seen.insert(array.name).second) {
      return InvalidArgumentError("array \"" + array.name + "\" appears twice in the checkpoint");
    }
  }
  const int64_t j = config_.visible;
  const int64_t k = config_.hidden;
  VIPSD_ASSIGN_OR_RETURN(
      Eigen::MatrixXd w_precision,
      MatrixFrom(FindArray(arrays, "w_precision"), "w_precision", j, SbnPackedSize(k)));
  VIPSD_ASSIGN_OR_RETURN(
      Eigen::MatrixXd w_precision_mean,
      MatrixFrom(FindArray(arrays, "w_precision_mean"), "w_precision_mean", j, k));
  VIPSD_ASSIGN_OR_RETURN(Eigen::VectorXd b_precision,
                         VectorFrom(FindArray(arrays, "b_precision"), "b_precision", k));
  VIPSD_ASSIGN_OR_RETURN(Eigen::VectorXd b_precision_mean,
                         VectorFrom(FindArray(arrays, "b_precision_mean"), "b_precision_mean", k));
  VIPSD_ASSIGN_OR_RETURN(Eigen::VectorXd c_precision,
                         VectorFrom(FindArray(arrays, "c_precision"), "c_precision", j));
  VIPSD_ASSIGN_OR_RETURN(Eigen::VectorXd c_precision_mean,
                         VectorFrom(FindArray(arrays, "c_precision_mean"), "c_precision_mean", j));
  if (!(b_precision.array() > 0).all()) {
    return InvalidArgumentError("array \"b_precision\" must be > 0");
  }
  if (!(c_precision.array() > 0).all()) {
    return InvalidArgumentError("array \"c_precision\" must be > 0");
  }
  Status status = SetState(std::move(w_precision), std::move(w_precision_mean),
                           std::move(b_precision), std::move(b_precision_mean),
                           std::move(c_precision), std::move(c_precision_mean));
  if (!status.ok()) {
    return InvalidArgumentError("array \"w_precision\" (or the derived state) is invalid: " +
                                status.message());
  }
  return Status::Ok();
}

Status SbnModel::SetPublicPrior(std::span<const model::NamedArray> arrays) {
  const int64_t j = config_.visible;
  const int64_t k = config_.hidden;
  const int64_t p = SbnPackedSize(k);
  // Messages: "the public prior's array \"w_mean\" must have shape (J, K) = (…)".
  auto named = [](const Status& status, std::string_view shape) {
    std::string message(status.message());
    const std::string must = "must have shape ";
    if (const size_t at = message.find(must); at != std::string::npos) {
      message.insert(at + must.size(), std::string(shape) + " = ");
    }
    return InvalidArgumentError("the public prior's " + message + " (an sbn release)");
  };
  auto matrix = [&](std::string_view name, int64_t rows, int64_t cols,
                    std::string_view shape) -> StatusOr<Eigen::MatrixXd> {
    auto out = MatrixFrom(FindArray(arrays, name), name, rows, cols);
    if (!out.ok()) return named(out.status(), shape);
    return out;
  };
  auto vector = [&](std::string_view name, int64_t size,
                    std::string_view shape) -> StatusOr<Eigen::VectorXd> {
    auto out = VectorFrom(FindArray(arrays, name), name, size);
    if (!out.ok()) return named(out.status(), shape);
    return out;
  };
  VIPSD_ASSIGN_OR_RETURN(const Eigen::MatrixXd w_mean, matrix("w_mean", j, k, "(J, K)"));
  VIPSD_ASSIGN_OR_RETURN(const Eigen::MatrixXd w_covariance,
                         matrix("w_covariance", j, p, "(J, K(K+1)/2)"));
  VIPSD_ASSIGN_OR_RETURN(const Eigen::VectorXd b_mean, vector("b_mean", k, "(K,)"));
  VIPSD_ASSIGN_OR_RETURN(const Eigen::VectorXd b_variance, vector("b_variance", k, "(K,)"));
  VIPSD_ASSIGN_OR_RETURN(const Eigen::VectorXd c_mean, vector("c_mean", j, "(J,)"));
  VIPSD_ASSIGN_OR_RETURN(const Eigen::VectorXd c_variance, vector("c_variance", j, "(J,)"));
  // A variance gives a valid precision iff it is > 0 and its inverse finite.
  for (const auto& [name, variance] :
       {std::pair<const char*, const Eigen::VectorXd*>{"b_variance", &b_variance},
        std::pair<const char*, const Eigen::VectorXd*>{"c_variance", &c_variance}}) {
    if (!(variance->array() > 0).all() || !variance->cwiseInverse().allFinite()) {
      return InvalidArgumentError("the public prior's array \"" + std::string(name) +
                                  "\" must be > 0 (a variance whose inverse is finite)");
    }
  }
  // Λ_j = Σ_j⁻¹ and h_j = Λ_j μ_j = Σ_j⁻¹ μ_j.
  Eigen::MatrixXd w_precision;
  Eigen::MatrixXd w_precision_mean;
  if (const Eigen::Index bad =
          InvertPackedRows(w_covariance, w_mean, w_precision, w_precision_mean);
      bad >= 0) {
    return InvalidArgumentError("the public prior's array \"w_covariance\" has a row (" +
                                std::to_string(bad) +
                                ") that is not positive definite with a finite inverse");
  }
  const Eigen::VectorXd b_precision = b_variance.cwiseInverse();
  const Eigen::VectorXd c_precision = c_variance.cwiseInverse();
  Status status = SetState(std::move(w_precision), std::move(w_precision_mean), b_precision,
                           b_mean.cwiseProduct(b_precision), c_precision,
                           c_mean.cwiseProduct(c_precision));
  if (!status.ok()) {
    return InvalidArgumentError("the public prior's array \"w_covariance\" (or the state derived "
                                "from its arrays) is invalid: " + status.message());
  }
  return Status::Ok();
}

}  // namespace vipsd::models
