#include "core/models/blr.h"

#include <Eigen/Eigenvalues>

#include <algorithm>
#include <cmath>
#include <map>
#include <numbers>
#include <random>
#include <string>

#include "core/privacy/mechanisms/gaussian_mechanism.h"

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
  Eigen::MatrixXd noise_covariance;  // the spread of μ from the noise left in A
  Eigen::VectorXd mean;              // μ
};

// Step 2's eigenvalue maps (blr.h): the kept signal λ(a), the precision
// p(a) and the mean map φ(a) = f/p of one eigenvalue a of A.
struct EigenvalueMap {
  double threshold, noise_variance_s1, expected_alpha, eigenvalue_floor;

  double Signal(double a) const {
    return a > threshold ? 0.5 * (a + std::sqrt(std::max(a * a - threshold * threshold, 0.0)))
                         : 0.0;
  }
  // f = λ/(λ + v1) (1 where λ = v1 = 0: an exact sum with no signal).
  double Shrinkage(double lambda) const {
    const double denominator = lambda + noise_variance_s1;
    return denominator > 0 ? lambda / denominator : 1.0;
  }
  double Precision(double lambda) const {
    return std::max(expected_alpha + Shrinkage(lambda) * lambda, eigenvalue_floor);
  }
  double Mean(double a) const {
    const double lambda = Signal(a);
    return Shrinkage(lambda) / Precision(lambda);
  }
};

// Uniform in (0, 1) from the generator's bits, and a standard normal by
// Box–Muller: both fixed by the standard (std::normal_distribution is not),
// so every build derives the same noise share from the same state.
double OpenUnit(std::mt19937_64& bits) {
  return (static_cast<double>(bits() >> 11) + 0.5) * 0x1.0p-53;
}
double StandardNormal(std::mt19937_64& bits) {
  const double radius = std::sqrt(-2.0 * std::log(OpenUnit(bits)));
  return radius * std::cos(2.0 * std::numbers::pi * OpenUnit(bits));
}

// Step 3 (blr.h): the covariance of μ(A + E) − its mean over draws of E,
// a symmetric matrix with one N(0, v2) entry per element of the packed
// upper triangle (the mechanism's noise), each draw's mean map derived as
// in step 2. The generator's seed is fixed: the noise share is a
// deterministic function of (A, B, v1, v2, E[α]).
StatusOr<Eigen::MatrixXd> NoiseShare(const Eigen::MatrixXd& statistic_s2,
                                     const Eigen::VectorXd& statistic_s1,
                                     double noise_variance_s2, const EigenvalueMap& map) {
  const Eigen::Index d = statistic_s1.size();
  const int draws = BlrNoiseShareDraws(d);
  std::mt19937_64 bits(kNoiseShareSeed);
  const double sd = std::sqrt(noise_variance_s2);
  Eigen::MatrixXd means(d, draws);
  Eigen::MatrixXd perturbed(d, d);
  Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> solver(d);
  Eigen::VectorXd phi(d);
  for (int k = 0; k < draws; ++k) {
    perturbed = statistic_s2;
    for (Eigen::Index j = 0; j < d; ++j) {
      for (Eigen::Index i = 0; i <= j; ++i) {
        const double e = sd * StandardNormal(bits);
        perturbed(i, j) += e;
        if (i != j) perturbed(j, i) += e;
      }
    }
    solver.compute(perturbed);
    if (solver.info() != Eigen::Success) {
      return OutOfRangeError("blr: symmetric eigendecomposition did not converge");
    }
    for (Eigen::Index i = 0; i < d; ++i) phi[i] = map.Mean(solver.eigenvalues()[i]);
    means.col(k) =
        solver.eigenvectors() * phi.cwiseProduct(solver.eigenvectors().transpose() * statistic_s1);
  }
  const Eigen::VectorXd center = means.rowwise().mean();
  means.colwise() -= center;
  return Eigen::MatrixXd(means * means.transpose() / static_cast<double>(draws - 1));
}

// `noise_share`: also the noise covariance (draws of O(d³) each); the
// M-step's q(α) update needs only μ and Σ_data.
StatusOr<Posterior> DerivePosterior(const BlrModel::Spectrum& spectrum,
                                    const Eigen::MatrixXd& statistic_s2,
                                    const Eigen::VectorXd& statistic_s1, double noise_variance_s1,
                                    double noise_variance_s2, double expected_alpha,
                                    double eigenvalue_floor, bool noise_share) {
  const Eigen::Index d = spectrum.values.size();
  const Eigen::VectorXd& a = spectrum.values;
  const Eigen::MatrixXd& v = spectrum.vectors;
  const EigenvalueMap map{
      kSignalEdgeFraction * 2.0 * std::sqrt(static_cast<double>(d) * noise_variance_s2),
      noise_variance_s1, expected_alpha, eigenvalue_floor};
  Eigen::VectorXd p(d), phi(d);
  for (Eigen::Index i = 0; i < d; ++i) {
    const double lambda = map.Signal(a[i]);
    p[i] = map.Precision(lambda);
    phi[i] = map.Shrinkage(lambda) / p[i];
  }
  Posterior out;
  out.precision = v * p.asDiagonal() * v.transpose();
  out.precision = 0.5 * (out.precision + out.precision.transpose()).eval();
  out.data_covariance = v * p.cwiseInverse().asDiagonal() * v.transpose();
  out.data_covariance = 0.5 * (out.data_covariance + out.data_covariance.transpose()).eval();
  out.mean = v * phi.cwiseProduct(v.transpose() * statistic_s1);
  if (noise_share && noise_variance_s2 > 0) {
    VIPSD_ASSIGN_OR_RETURN(out.noise_covariance,
                           NoiseShare(statistic_s2, statistic_s1, noise_variance_s2, map));
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
                         DerivePosterior(*spectrum, statistic_s2, statistic_s1, noise_variance_s1,
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

Status BlrModel::MStep(const Eigen::VectorXd& statistic_sum,
                       const privacy::SampledGaussian& released_by, double rho) {
  const double sampling_rate = released_by.sampling_rate;
  const double noise_multiplier = released_by.noise_multiplier;
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
  // The evidence update (blr.h, "q(α)"): the γ = d − E[α] tr Σ_data
  // directions the data determine, against the squared norm of the mean
  // and the noise share N (taken from the current release: the share is
  // derived once per step, in SetState).
  VIPSD_ASSIGN_OR_RETURN(const Spectrum spectrum, Decompose(statistic_s2));
  VIPSD_ASSIGN_OR_RETURN(Posterior posterior,
                         DerivePosterior(spectrum, statistic_s2, statistic_s1, noise_variance_s1,
                                         noise_variance_s2, expected_alpha(),
                                         config_.eigenvalue_floor, /*noise_share=*/false));
  const double determined = std::max(
      static_cast<double>(config_.dim) - expected_alpha() * posterior.data_covariance.trace(), 0.0);
  const double shape_target = config_.prior_shape + 0.5 * determined;
  const double rate_target =
      config_.prior_rate + 0.5 * (posterior.mean.squaredNorm() + noise_covariance_.trace());
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
