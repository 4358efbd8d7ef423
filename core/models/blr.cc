#include "core/models/blr.h"

#include <Eigen/Cholesky>
#include <Eigen/Eigenvalues>

#include <algorithm>
#include <cmath>
#include <string>

namespace vipsd::models {
namespace {

constexpr double kS1Bound = 0.5;   // ‖(y − ½) x‖₂ ≤ ½
constexpr double kS2Bound = 0.25;  // ‖⟨ξ⟩ x xᵀ‖_F ≤ ¼
constexpr int64_t kMaxDim = 1024;

using RowMajorMatrix = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

struct BlrScratch final : model::EStepScratch {
  std::vector<uint32_t> nonzero;  // indices i with x_i ≠ 0, increasing
};

Status FieldError(const std::string& field, const std::string& allowed) {
  return InvalidArgumentError("blr." + field + " must be " + allowed);
}

bool IsPositiveFinite(double value) { return value > 0 && std::isfinite(value); }

// Σ = Λ⁻¹ and μ = Λ⁻¹η from the natural parameters.
struct Moments {
  Eigen::MatrixXd covariance;
  Eigen::VectorXd mean;
};

StatusOr<Moments> DeriveMoments(const Eigen::MatrixXd& precision,
                                const Eigen::VectorXd& precision_mean) {
  const Eigen::LLT<Eigen::MatrixXd> cholesky(precision);
  if (cholesky.info() != Eigen::Success) {
    return OutOfRangeError("blr precision matrix is not positive definite");
  }
  Moments moments;
  moments.covariance =
      cholesky.solve(Eigen::MatrixXd::Identity(precision.rows(), precision.cols()));
  moments.covariance = 0.5 * (moments.covariance + moments.covariance.transpose()).eval();
  moments.mean = cholesky.solve(precision_mean);
  if (!moments.covariance.allFinite() || !moments.mean.allFinite() ||
      !(moments.covariance.diagonal().array() > 0).all()) {
    return OutOfRangeError("blr posterior moments are not finite");
  }
  return moments;
}

model::NamedArray VectorArray(const std::string& name, const Eigen::VectorXd& vector) {
  return {name, {vector.size()}, std::vector<double>(vector.data(), vector.data() + vector.size())};
}

model::NamedArray MatrixArray(const std::string& name, const Eigen::MatrixXd& matrix) {
  model::NamedArray array{name, {matrix.rows(), matrix.cols()}, {}};
  array.data.resize(static_cast<size_t>(matrix.size()));
  Eigen::Map<RowMajorMatrix>(array.data.data(), matrix.rows(), matrix.cols()) = matrix;
  return array;
}

model::NamedArray ScalarArray(const std::string& name, double value) {
  return {name, {}, {value}};
}

}  // namespace

Status ValidateBlrConfig(const BlrConfig& c) {
  if (c.dim < 1 || c.dim > kMaxDim) return FieldError("dim", "in [1, 1024]");
  if (!IsPositiveFinite(c.prior_shape)) return FieldError("prior_shape", "finite and > 0");
  if (!IsPositiveFinite(c.prior_rate)) return FieldError("prior_rate", "finite and > 0");
  if (!IsPositiveFinite(c.eigenvalue_floor) || c.eigenvalue_floor > 1e6) {
    return FieldError("eigenvalue_floor", "in (0, 1e6]");
  }
  return Status::Ok();
}

double FeatureSquaredNorm(std::span<const double> x) {
  double sum = 0;
  for (double value : x) sum += value * value;
  return sum;
}

StatusOr<Eigen::MatrixXd> ProjectToEigenvalueFloor(const Eigen::MatrixXd& matrix, double floor) {
  if (matrix.rows() != matrix.cols()) {
    return InvalidArgumentError("eigenvalue projection needs a square matrix");
  }
  if (!matrix.allFinite() || !std::isfinite(floor)) {
    return InvalidArgumentError("eigenvalue projection needs finite values");
  }
  const Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> solver(matrix);
  if (solver.info() != Eigen::Success) {
    return OutOfRangeError("symmetric eigendecomposition did not converge");
  }
  const Eigen::VectorXd floored = solver.eigenvalues().cwiseMax(floor);
  const Eigen::MatrixXd& vectors = solver.eigenvectors();
  const Eigen::MatrixXd projected = vectors * floored.asDiagonal() * vectors.transpose();
  return Eigen::MatrixXd(0.5 * (projected + projected.transpose()));
}

StatusOr<std::unique_ptr<BlrModel>> BlrModel::Create(const BlrConfig& config) {
  VIPSD_RETURN_IF_ERROR(ValidateBlrConfig(config));
  const auto dim = static_cast<size_t>(config.dim);
  VIPSD_ASSIGN_OR_RETURN(
      auto layout,
      privacy::BlockLayout::Create(
          {privacy::BlockSpec{"s1", privacy::BlockKind::kVector, dim, kS1Bound},
           privacy::BlockSpec{"s2", privacy::BlockKind::kSymmetricMatrix, dim, kS2Bound}}));
  std::unique_ptr<BlrModel> model(new BlrModel(config, std::move(layout)));
  // The prior: q(α) = Gamma(a0, b0), q(m) = N(0, I / E[α]).
  const double prior_alpha = config.prior_shape / config.prior_rate;
  VIPSD_RETURN_IF_ERROR(model->SetState(
      prior_alpha * Eigen::MatrixXd::Identity(config.dim, config.dim),
      Eigen::VectorXd::Zero(config.dim), config.prior_shape, config.prior_rate));
  return model;
}

BlrModel::BlrModel(const BlrConfig& config, privacy::BlockLayout layout)
    : config_(config), layout_(std::move(layout)) {}

std::vector<std::pair<std::string, int64_t>> BlrModel::dimensions() const {
  return {{"d", config_.dim}};
}

std::unique_ptr<model::EStepScratch> BlrModel::NewScratch() const {
  return std::make_unique<BlrScratch>();
}

Status BlrModel::SetState(Eigen::MatrixXd precision, Eigen::VectorXd precision_mean,
                          double alpha_shape, double alpha_rate) {
  if (!precision.allFinite() || !precision_mean.allFinite()) {
    return OutOfRangeError("blr natural parameters are not finite");
  }
  if (!IsPositiveFinite(alpha_shape) || !IsPositiveFinite(alpha_rate) ||
      !IsPositiveFinite(alpha_shape / alpha_rate)) {
    return OutOfRangeError("blr q(alpha) parameters must be finite and > 0");
  }
  VIPSD_ASSIGN_OR_RETURN(Moments moments, DeriveMoments(precision, precision_mean));
  precision_ = std::move(precision);
  precision_mean_ = std::move(precision_mean);
  alpha_shape_ = alpha_shape;
  alpha_rate_ = alpha_rate;
  covariance_ = std::move(moments.covariance);
  mean_ = std::move(moments.mean);
  second_moment_ = covariance_ + mean_ * mean_.transpose();
  return Status::Ok();
}

double BlrModel::ExpectedXi(std::span<const double> x) const {
  // c² = xᵀ E[mmᵀ] x over the non-zero coordinates; ≥ 0 exactly, so a
  // rounding-negative value is clamped (any c ≥ 0 keeps ⟨ξ⟩ ∈ [0, ¼]).
  double c2 = 0;
  for (size_t j = 0; j < x.size(); ++j) {
    if (x[j] == 0) continue;
    double row = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      if (x[i] != 0) row += second_moment_(static_cast<Eigen::Index>(i),
                                           static_cast<Eigen::Index>(j)) * x[i];
    }
    c2 += x[j] * row;
  }
  return PolyaGammaMean(std::sqrt(std::max(c2, 0.0)));
}

Status BlrModel::EStep(const model::Record& record, model::RecordRng& /*rng*/,
                       model::EStepScratch& scratch_base, model::SparseStatistic& out) const {
  auto& scratch = static_cast<BlrScratch&>(scratch_base);
  out.Clear();
  const std::vector<double>& x = record.features;
  if (x.size() != static_cast<size_t>(config_.dim)) {
    return InvalidArgumentError("record has a feature vector whose length is not blr.dim");
  }
  for (double value : x) {
    if (!std::isfinite(value)) return InvalidArgumentError("record has a non-finite feature");
  }
  if (!(record.label == 0.0 || record.label == 1.0)) {
    return InvalidArgumentError("record label must be 0 or 1");
  }
#ifndef VIPSD_AUDIT_BUILD_WITHOUT_CLIPPING
  // (The test-only audit build removes this bound to show that the privacy
  // audit would catch its absence; see tests/core/privacy/privacy_audit_test.cc.)
  if (!(FeatureSquaredNorm(x) <= 1.0)) {
    return InvalidArgumentError(
        "record features have L2 norm above 1 (the decoder's norm rule must reject or rescale)");
  }
#endif
  scratch.nonzero.clear();
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i] != 0) scratch.nonzero.push_back(static_cast<uint32_t>(i));
  }
  const std::vector<uint32_t>& nz = scratch.nonzero;
  if (nz.empty()) return Status::Ok();  // x = 0: both blocks are zero

  double c2 = 0;
  for (uint32_t j : nz) {
    double row = 0;
    for (uint32_t i : nz) row += second_moment_(i, j) * x[i];
    c2 += x[j] * row;
  }
  const double xi = PolyaGammaMean(std::sqrt(std::max(c2, 0.0)));
  const double centred_label = record.label - 0.5;  // ±½

  const size_t n = nz.size();
  out.indices.reserve(n + n * (n + 1) / 2);
  out.values.reserve(out.indices.capacity());
  for (uint32_t i : nz) {
    out.indices.push_back(i);
    out.values.push_back(centred_label * x[i]);
  }
  // Packed upper triangle, LAPACK 'U' order: A(i, j), i ≤ j, at
  // i + j(j+1)/2; iterating j then i ≤ j keeps the indices increasing.
  const auto offset = static_cast<uint32_t>(config_.dim);
  for (size_t jj = 0; jj < n; ++jj) {
    const uint32_t j = nz[jj];
    const uint32_t column_start = offset + j * (j + 1) / 2;
    const double xi_xj = xi * x[j];
    for (size_t ii = 0; ii <= jj; ++ii) {
      const uint32_t i = nz[ii];
      out.indices.push_back(column_start + i);
      out.values.push_back(xi_xj * x[i]);
    }
  }
  // Exact-arithmetic bounds hold (header); this makes them hold after
  // rounding too. A no-op for blocks clearly inside their bound.
  privacy::ClipToL2Bound(std::span<double>(out.values.data(), n), kS1Bound);
  privacy::ClipToL2Bound(std::span<double>(out.values.data() + n, out.values.size() - n),
                         kS2Bound);
  return Status::Ok();
}

Status BlrModel::MStep(const Eigen::VectorXd& statistic_sum, double sampling_rate, double rho) {
  const auto dim = static_cast<size_t>(config_.dim);
  VIPSD_RETURN_IF_ERROR(
      model::CheckMStepInputs("blr", statistic_sum, layout_, sampling_rate, rho));

  const Eigen::VectorXd s1 = statistic_sum.head(config_.dim);
  VIPSD_ASSIGN_OR_RETURN(
      Eigen::MatrixXd s2,
      privacy::UnpackSymmetric(
          std::span<const double>(statistic_sum.data() + dim, privacy::PackedSymmetricSize(dim)),
          dim));
  const double expected_alpha_now = expected_alpha();
  // Intermediate estimate Λ̂ = Project(E[α] I + S̃2/q), η̂ = S̃1/q.
  Eigen::MatrixXd target = s2 / sampling_rate;
  target.diagonal().array() += expected_alpha_now;
  if (!target.allFinite()) return OutOfRangeError("statistic sum / q is not finite");
  VIPSD_ASSIGN_OR_RETURN(
      Eigen::MatrixXd projected,
      ProjectToEigenvalueFloor(target, std::max(config_.eigenvalue_floor, expected_alpha_now)));
  Eigen::MatrixXd precision = (1.0 - rho) * precision_ + rho * projected;
  Eigen::VectorXd precision_mean = (1.0 - rho) * precision_mean_ + rho * (s1 / sampling_rate);
  VIPSD_ASSIGN_OR_RETURN(Moments moments, DeriveMoments(precision, precision_mean));
  // q(α) from the new q(m): â = a0 + d/2, b̂ = b0 + ½(μᵀμ + tr Σ).
  const double shape_target = config_.prior_shape + 0.5 * static_cast<double>(config_.dim);
  const double rate_target =
      config_.prior_rate + 0.5 * (moments.mean.squaredNorm() + moments.covariance.trace());
  const double alpha_shape = (1.0 - rho) * alpha_shape_ + rho * shape_target;
  const double alpha_rate = (1.0 - rho) * alpha_rate_ + rho * rate_target;
  return SetState(std::move(precision), std::move(precision_mean), alpha_shape, alpha_rate);
}

std::vector<model::NamedArray> BlrModel::ReleaseArrays() const {
  return {VectorArray("mean", mean_), MatrixArray("covariance", covariance_),
          ScalarArray("alpha_shape", alpha_shape_), ScalarArray("alpha_rate", alpha_rate_)};
}

std::vector<model::NamedArray> BlrModel::CheckpointArrays() const {
  return {MatrixArray("precision", precision_), VectorArray("precision_mean", precision_mean_),
          ScalarArray("alpha_shape", alpha_shape_), ScalarArray("alpha_rate", alpha_rate_)};
}

Status BlrModel::RestoreCheckpoint(std::span<const model::NamedArray> arrays) {
  const int64_t d = config_.dim;
  const model::NamedArray* precision = nullptr;
  const model::NamedArray* precision_mean = nullptr;
  const model::NamedArray* alpha_shape = nullptr;
  const model::NamedArray* alpha_rate = nullptr;
  for (const model::NamedArray& array : arrays) {
    const model::NamedArray** slot = nullptr;
    std::vector<int64_t> shape;
    if (array.name == "precision") {
      slot = &precision;
      shape = {d, d};
    } else if (array.name == "precision_mean") {
      slot = &precision_mean;
      shape = {d};
    } else if (array.name == "alpha_shape") {
      slot = &alpha_shape;
    } else if (array.name == "alpha_rate") {
      slot = &alpha_rate;
    } else {
      return InvalidArgumentError("unexpected array \"" + array.name + "\" in a BLR checkpoint");
    }
    if (*slot != nullptr) {
      return InvalidArgumentError("array \"" + array.name + "\" appears twice in a BLR checkpoint");
    }
    size_t size = 1;
    for (int64_t extent : shape) size *= static_cast<size_t>(extent);
    if (array.shape != shape || array.data.size() != size) {
      return InvalidArgumentError("checkpoint array \"" + array.name +
                                  "\" has the wrong shape for d = " + std::to_string(d));
    }
    for (double value : array.data) {
      if (!std::isfinite(value)) {
        return InvalidArgumentError("checkpoint array \"" + array.name + "\" is not finite");
      }
    }
    *slot = &array;
  }
  if (!precision || !precision_mean || !alpha_shape || !alpha_rate) {
    return InvalidArgumentError(
        "a BLR checkpoint holds \"precision\", \"precision_mean\", \"alpha_shape\" and "
        "\"alpha_rate\"");
  }
  Eigen::MatrixXd lambda = Eigen::Map<const RowMajorMatrix>(precision->data.data(), d, d);
  if (lambda != lambda.transpose()) {
    return InvalidArgumentError("checkpoint array \"precision\" is not symmetric");
  }
  if (!(alpha_shape->data[0] > 0) || !(alpha_rate->data[0] > 0)) {
    return InvalidArgumentError("checkpoint arrays \"alpha_shape\" and \"alpha_rate\" must be > 0");
  }
  Eigen::VectorXd eta = Eigen::Map<const Eigen::VectorXd>(precision_mean->data.data(), d);
  Status status = SetState(std::move(lambda), std::move(eta), alpha_shape->data[0],
                           alpha_rate->data[0]);
  if (!status.ok()) {
    return InvalidArgumentError("checkpoint array \"precision\" is not positive definite or "
                                "gives non-finite moments: " + status.message());
  }
  return Status::Ok();
}

}  // namespace vipsd::models
