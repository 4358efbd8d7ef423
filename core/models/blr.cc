#include "core/models/blr.h"

#include <Eigen/Eigenvalues>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "core/privacy/gaussian_mechanism.h"

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

// The posterior derived from the state (blr.h, "M-step", steps 1–3).
struct Posterior {
  Eigen::MatrixXd precision;         // P
  Eigen::MatrixXd data_covariance;   // Σ_data
  Eigen::MatrixXd noise_covariance;  // the first-order spread of μ from A's noise
  Eigen::VectorXd mean;              // μ
};

// `noise_share`: also the noise covariance (O(d³)); the M-step's q(α)
// update needs only μ and Σ_data.
StatusOr<Posterior> DerivePosterior(const BlrModel::Spectrum& spectrum,
                                    const Eigen::VectorXd& statistic_s1, double noise_variance_s1,
                                    double noise_variance_s2, double expected_alpha,
                                    double eigenvalue_floor, bool noise_share) {
  const Eigen::Index d = spectrum.values.size();
  const Eigen::VectorXd& a = spectrum.values;
  const Eigen::MatrixXd& v = spectrum.vectors;
  const double threshold =
      kSignalEdgeFraction * 2.0 * std::sqrt(static_cast<double>(d) * noise_variance_s2);
  // Per eigenvalue a_i: λ_i, p_i, the mean map φ(a_i) = f_i / p_i (μ = V
  // diag(φ) Vᵀ B) and its derivative φ'(a_i).
  Eigen::VectorXd p(d), phi(d), phi_prime(d);
  for (Eigen::Index i = 0; i < d; ++i) {
    double lambda = 0, lambda_prime = 0;
    if (a[i] > threshold) {
      const double root = std::sqrt(std::max(a[i] * a[i] - threshold * threshold, 0.0));
      lambda = 0.5 * (a[i] + root);
      lambda_prime = root > 0 ? 0.5 * (1.0 + a[i] / root) : 0.0;
    }
    const double denominator = lambda + noise_variance_s1;
    const double f = denominator > 0 ? lambda / denominator : 1.0;
    const double g = f * lambda;  // λ²/(λ + v1)
    const double pi = expected_alpha + g;
    p[i] = std::max(pi, eigenvalue_floor);
    phi[i] = f / p[i];
    if (lambda > 0 && pi >= eigenvalue_floor) {
      // f' = v1/(λ + v1)², g' = λ(λ + 2 v1)/(λ + v1)², φ' = (f' p − f g')/p².
      const double f_prime = noise_variance_s1 / (denominator * denominator);
      const double g_prime = lambda * (lambda + 2 * noise_variance_s1) / (denominator * denominator);
      phi_prime[i] = lambda_prime * (f_prime * p[i] - f * g_prime) / (p[i] * p[i]);
    } else {
      phi_prime[i] = 0;
    }
  }
  Posterior out;
  out.precision = v * p.asDiagonal() * v.transpose();
  out.precision = 0.5 * (out.precision + out.precision.transpose()).eval();
  out.data_covariance = v * p.cwiseInverse().asDiagonal() * v.transpose();
  out.data_covariance = 0.5 * (out.data_covariance + out.data_covariance.transpose()).eval();
  const Eigen::VectorXd b = v.transpose() * statistic_s1;  // B in the eigenbasis
  out.mean = v * phi.cwiseProduct(b);
  if (noise_share && noise_variance_s2 > 0) {
    // First-order propagation of the noise E left in A through the mean map
    // μ = Φ(A) B: dΦ[E] = V (D ∘ VᵀEV) Vᵀ with the divided differences D_ij
    // = (φ(a_i) − φ(a_j))/(a_i − a_j) (D_ii = φ'(a_i)). With the entries of
    // VᵀEV taken independent of variance v2 (exact for the off-diagonal
    // ones of a rotation-invariant noise), δμ̃_i = Σ_j D_ij Ẽ_ij b_j has
    //   Cov(δμ̃)_ii = v2 Σ_j D_ij² b_j²,  Cov(δμ̃)_ik = v2 D_ik² b_i b_k.
    Eigen::MatrixXd divided(d, d);
    for (Eigen::Index i = 0; i < d; ++i) {
      for (Eigen::Index j = 0; j < d; ++j) {
        const double gap = a[i] - a[j];
        divided(i, j) = i == j || std::abs(gap) <= 1e-12 * (std::abs(a[i]) + std::abs(a[j]) + 1)
                            ? 0.5 * (phi_prime[i] + phi_prime[j])
                            : (phi[i] - phi[j]) / gap;
      }
    }
    const Eigen::MatrixXd squared = divided.cwiseAbs2();
    Eigen::MatrixXd spread = squared.cwiseProduct(b * b.transpose());
    spread.diagonal() = squared * b.cwiseAbs2();
    out.noise_covariance = noise_variance_s2 * (v * spread * v.transpose());
    out.noise_covariance = 0.5 * (out.noise_covariance + out.noise_covariance.transpose()).eval();
  } else {
    out.noise_covariance = Eigen::MatrixXd::Zero(d, d);
  }
  if (!out.precision.allFinite() || !out.data_covariance.allFinite() || !out.mean.allFinite() ||
      !out.noise_covariance.allFinite() || !(out.data_covariance.diagonal().array() > 0).all()) {
    return OutOfRangeError("blr posterior moments are not finite");
  }
  return out;
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

StatusOr<BlrModel::Spectrum> BlrModel::Decompose(const Eigen::MatrixXd& statistic_s2) {
  const Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> solver(statistic_s2);
  if (solver.info() != Eigen::Success) {
    return OutOfRangeError("blr: symmetric eigendecomposition did not converge");
  }
  return Spectrum{solver.eigenvalues(), solver.eigenvectors()};
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
  VIPSD_RETURN_IF_ERROR(model->SetState(Eigen::MatrixXd::Zero(config.dim, config.dim),
                                        Eigen::VectorXd::Zero(config.dim), 0, 0,
                                        config.prior_shape, config.prior_rate));
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

Status BlrModel::SetState(Eigen::MatrixXd statistic_s2, Eigen::VectorXd statistic_s1,
                          double noise_variance_s1, double noise_variance_s2, double alpha_shape,
                          double alpha_rate, const Spectrum* spectrum) {
  if (!statistic_s2.allFinite() || !statistic_s1.allFinite()) {
    return OutOfRangeError("blr statistics are not finite");
  }
  if (!(noise_variance_s1 >= 0 && std::isfinite(noise_variance_s1) && noise_variance_s2 >= 0 &&
        std::isfinite(noise_variance_s2))) {
    return OutOfRangeError("blr noise variances must be finite and >= 0");
  }
  if (!IsPositiveFinite(alpha_shape) || !IsPositiveFinite(alpha_rate) ||
      !IsPositiveFinite(alpha_shape / alpha_rate)) {
    return OutOfRangeError("blr q(alpha) parameters must be finite and > 0");
  }
  if (spectrum == nullptr) {
    VIPSD_ASSIGN_OR_RETURN(const Spectrum decomposed, Decompose(statistic_s2));
    return SetState(std::move(statistic_s2), std::move(statistic_s1), noise_variance_s1,
                    noise_variance_s2, alpha_shape, alpha_rate, &decomposed);
  }
  VIPSD_ASSIGN_OR_RETURN(Posterior posterior,
                         DerivePosterior(*spectrum, statistic_s1, noise_variance_s1,
                                         noise_variance_s2, alpha_shape / alpha_rate,
                                         config_.eigenvalue_floor, /*noise_share=*/true));
  statistic_s2_ = std::move(statistic_s2);
  statistic_s1_ = std::move(statistic_s1);
  noise_variance_s1_ = noise_variance_s1;
  noise_variance_s2_ = noise_variance_s2;
  alpha_shape_ = alpha_shape;
  alpha_rate_ = alpha_rate;
  precision_ = std::move(posterior.precision);
  data_covariance_ = std::move(posterior.data_covariance);
  noise_covariance_ = std::move(posterior.noise_covariance);
  mean_ = std::move(posterior.mean);
  covariance_ = data_covariance_ + noise_covariance_;
  second_moment_ = data_covariance_ + mean_ * mean_.transpose();
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

Status BlrModel::MStep(const Eigen::VectorXd& statistic_sum, double sampling_rate, double rho,
                       double noise_multiplier) {
  const auto dim = static_cast<size_t>(config_.dim);
  VIPSD_RETURN_IF_ERROR(model::CheckMStepInputs("blr", statistic_sum, layout_, sampling_rate, rho,
                                                noise_multiplier));
  VIPSD_ASSIGN_OR_RETURN(const std::vector<double> noise_std,
                         privacy::NoiseStdPerBlock(layout_, noise_multiplier));
  const Eigen::VectorXd s1 = statistic_sum.head(config_.dim);
  VIPSD_ASSIGN_OR_RETURN(
      Eigen::MatrixXd s2,
      privacy::UnpackSymmetric(
          std::span<const double>(statistic_sum.data() + dim, privacy::PackedSymmetricSize(dim)),
          dim));
  // The running unbiased estimates of the pool-wide sums and the variance
  // of the noise left in them (header, "M-step").
  const double keep = 1.0 - rho;
  Eigen::MatrixXd statistic_s2 = keep * statistic_s2_ + (rho / sampling_rate) * s2;
  Eigen::VectorXd statistic_s1 = keep * statistic_s1_ + (rho / sampling_rate) * s1;
  const double step_s1 = rho * noise_std[0] / sampling_rate;
  const double step_s2 = rho * noise_std[1] / sampling_rate;
  const double noise_variance_s1 = keep * keep * noise_variance_s1_ + step_s1 * step_s1;
  const double noise_variance_s2 = keep * keep * noise_variance_s2_ + step_s2 * step_s2;
  if (!statistic_s2.allFinite() || !statistic_s1.allFinite()) {
    return OutOfRangeError("statistic sum / q is not finite");
  }
  // q(α) from q(m) with the new statistics (and the current E[α]); then the
  // posterior again with the new E[α] (SetState), on the same spectrum.
  VIPSD_ASSIGN_OR_RETURN(const Spectrum spectrum, Decompose(statistic_s2));
  VIPSD_ASSIGN_OR_RETURN(Posterior posterior,
                         DerivePosterior(spectrum, statistic_s1, noise_variance_s1,
                                         noise_variance_s2, expected_alpha(),
                                         config_.eigenvalue_floor, /*noise_share=*/false));
  const double shape_target = config_.prior_shape + 0.5 * static_cast<double>(config_.dim);
  const double rate_target =
      config_.prior_rate +
      0.5 * (posterior.mean.squaredNorm() + posterior.data_covariance.trace());
  const double alpha_shape = keep * alpha_shape_ + rho * shape_target;
  const double alpha_rate = keep * alpha_rate_ + rho * rate_target;
  return SetState(std::move(statistic_s2), std::move(statistic_s1), noise_variance_s1,
                  noise_variance_s2, alpha_shape, alpha_rate, &spectrum);
}

std::vector<model::NamedArray> BlrModel::ReleaseArrays() const {
  return {VectorArray("mean", mean_),
          MatrixArray("covariance", covariance_),
          MatrixArray("noise_covariance", noise_covariance_),
          ScalarArray("alpha_shape", alpha_shape_),
          ScalarArray("alpha_rate", alpha_rate_),
          ScalarArray("noise_variance_s1", noise_variance_s1_),
          ScalarArray("noise_variance_s2", noise_variance_s2_)};
}

std::vector<model::NamedArray> BlrModel::CheckpointArrays() const {
  return {VectorArray("statistic_s1", statistic_s1_),
          MatrixArray("statistic_s2", statistic_s2_),
          ScalarArray("noise_variance_s1", noise_variance_s1_),
          ScalarArray("noise_variance_s2", noise_variance_s2_),
          ScalarArray("alpha_shape", alpha_shape_),
          ScalarArray("alpha_rate", alpha_rate_)};
}

Status BlrModel::RestoreCheckpoint(std::span<const model::NamedArray> arrays) {
  const int64_t d = config_.dim;
  // Current format, and the earlier one ("precision", "precision_mean"):
  // name → expected shape.
  const std::vector<std::pair<std::string, std::vector<int64_t>>> known = {
      {"statistic_s1", {d}},      {"statistic_s2", {d, d}},   {"noise_variance_s1", {}},
      {"noise_variance_s2", {}},  {"alpha_shape", {}},        {"alpha_rate", {}},
      {"precision", {d, d}},      {"precision_mean", {d}}};
  std::map<std::string, const model::NamedArray*> found;
  for (const model::NamedArray& array : arrays) {
    const auto entry = std::find_if(known.begin(), known.end(),
                                    [&](const auto& k) { return k.first == array.name; });
    if (entry == known.end()) {
      return InvalidArgumentError("unexpected array \"" + array.name + "\" in a BLR checkpoint");
    }
    if (found.count(array.name) > 0) {
      return InvalidArgumentError("array \"" + array.name + "\" appears twice in a BLR checkpoint");
    }
    size_t size = 1;
    for (int64_t extent : entry->second) size *= static_cast<size_t>(extent);
    if (array.shape != entry->second || array.data.size() != size) {
      return InvalidArgumentError("checkpoint array \"" + array.name +
                                  "\" has the wrong shape for d = " + std::to_string(d));
    }
    for (double value : array.data) {
      if (!std::isfinite(value)) {
        return InvalidArgumentError("checkpoint array \"" + array.name + "\" is not finite");
      }
    }
    found[array.name] = &array;
  }
  const bool current = found.count("statistic_s1") + found.count("statistic_s2") +
                           found.count("noise_variance_s1") + found.count("noise_variance_s2") ==
                       4;
  const bool earlier = found.count("precision") + found.count("precision_mean") == 2;
  if (current == earlier || found.count("alpha_shape") + found.count("alpha_rate") != 2 ||
      found.size() != (current ? 6u : 4u)) {
    return InvalidArgumentError(
        "a BLR checkpoint holds \"statistic_s1\", \"statistic_s2\", \"noise_variance_s1\", "
        "\"noise_variance_s2\", \"alpha_shape\" and \"alpha_rate\" (or, written by an earlier "
        "vipsd, \"precision\", \"precision_mean\", \"alpha_shape\" and \"alpha_rate\")");
  }
  const double alpha_shape = found["alpha_shape"]->data[0];
  const double alpha_rate = found["alpha_rate"]->data[0];
  if (!(alpha_shape > 0) || !(alpha_rate > 0)) {
    return InvalidArgumentError("checkpoint arrays \"alpha_shape\" and \"alpha_rate\" must be > 0");
  }
  const std::string matrix_name = current ? "statistic_s2" : "precision";
  Eigen::MatrixXd matrix = Eigen::Map<const RowMajorMatrix>(found[matrix_name]->data.data(), d, d);
  if (matrix != matrix.transpose()) {
    return InvalidArgumentError("checkpoint array \"" + matrix_name + "\" is not symmetric");
  }
  const std::string vector_name = current ? "statistic_s1" : "precision_mean";
  Eigen::VectorXd vector = Eigen::Map<const Eigen::VectorXd>(found[vector_name]->data.data(), d);
  double noise_variance_s1 = 0, noise_variance_s2 = 0;
  if (current) {
    noise_variance_s1 = found["noise_variance_s1"]->data[0];
    noise_variance_s2 = found["noise_variance_s2"]->data[0];
  } else {
    // Λ = E[α] I + (the running estimate of S2/q), η = the one of S1/q.
    matrix.diagonal().array() -= alpha_shape / alpha_rate;
  }
  Status status = SetState(std::move(matrix), std::move(vector), noise_variance_s1,
                           noise_variance_s2, alpha_shape, alpha_rate);
  if (!status.ok()) {
    return InvalidArgumentError("checkpoint arrays give no valid posterior: " + status.message());
  }
  return Status::Ok();
}

}  // namespace vipsd::models
