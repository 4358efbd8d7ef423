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

// Step 2 with a prior that is not E[α] I (blr.h, "Prior groups", "Public
// prior"): Λ0 = diag(E[α_g(j)]) for prior groups, or Λ0 = E[α] R with the
// public prior's precision R and mean m0. P = Λ0 + V diag(f·λ) Vᵀ is then
// not diagonal in A's eigenbasis, so it is inverted by Cholesky; the mean is
// P⁻¹ (V diag(f) Vᵀ B + Λ0 m0). The floor bounds each group's precision,
// or the public precision's scale, from below (P ⪰ Λ0 since f·λ ≥ 0), so
// P stays positive definite where the noise leaves no signal.
struct DenseMoments {
  Eigen::MatrixXd precision, data_covariance;
  Eigen::VectorXd mean;
};
StatusOr<DenseMoments> DensePosterior(const Eigen::VectorXd& a, const Eigen::MatrixXd& v,
                                          const Eigen::VectorXd& statistic_s1,
                                          const EigenvalueMap& map, const BlrPrior& prior) {
  const Eigen::Index d = a.size();
  Eigen::VectorXd kept(d), shrinkage(d);
  for (Eigen::Index i = 0; i < d; ++i) {
    const double lambda = map.Signal(a[i]);
    shrinkage[i] = map.Shrinkage(lambda);
    kept[i] = shrinkage[i] * lambda;
  }
  DenseMoments out;
  out.precision = v * kept.asDiagonal() * v.transpose();
  Eigen::VectorXd rhs = v * shrinkage.cwiseProduct(v.transpose() * statistic_s1);
  if (prior.public_precision != nullptr) {
    const double scale = std::max(prior.diagonal[0], map.eigenvalue_floor);
    out.precision += scale * *prior.public_precision;
    rhs += scale * (*prior.public_precision * *prior.public_mean);
  } else {
    out.precision.diagonal() += prior.diagonal.cwiseMax(map.eigenvalue_floor);
  }
  out.precision = 0.5 * (out.precision + out.precision.transpose()).eval();
  const Eigen::LLT<Eigen::MatrixXd> cholesky(out.precision);
  if (cholesky.info() != Eigen::Success) {
    return OutOfRangeError("blr posterior precision is not positive definite");
  }
  out.data_covariance = cholesky.solve(Eigen::MatrixXd::Identity(d, d));
  out.data_covariance = 0.5 * (out.data_covariance + out.data_covariance.transpose()).eval();
  out.mean = cholesky.solve(rhs);
  return out;
}

// Step 3 (blr.h): the covariance of μ(A + E) − its mean over draws of E,
// a symmetric matrix with one N(0, v2) entry per element of the packed
// upper triangle (the mechanism's noise), each draw's mean map derived as
// in step 2. The generator's seed is fixed: the noise share is a
// deterministic function of (A, B, v1, v2, E[α]).
StatusOr<Eigen::MatrixXd> NoiseShare(const Eigen::MatrixXd& statistic_s2,
                                     const Eigen::VectorXd& statistic_s1,
                                     double noise_variance_s2, const EigenvalueMap& map,
                                     const BlrPrior* prior) {
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
    if (prior == nullptr) {
      for (Eigen::Index i = 0; i < d; ++i) phi[i] = map.Mean(solver.eigenvalues()[i]);
      means.col(k) = solver.eigenvectors() *
                     phi.cwiseProduct(solver.eigenvectors().transpose() * statistic_s1);
    } else {
      VIPSD_ASSIGN_OR_RETURN(const DenseMoments moments,
                             DensePosterior(solver.eigenvalues(), solver.eigenvectors(),
                                              statistic_s1, map, *prior));
      means.col(k) = moments.mean;
    }
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
                                    double noise_variance_s2, const BlrPrior& prior,
                                    double eigenvalue_floor, bool noise_share) {
  const Eigen::Index d = spectrum.values.size();
  const Eigen::VectorXd& a = spectrum.values;
  const Eigen::MatrixXd& v = spectrum.vectors;
  // One prior precision for every coordinate and a zero prior mean: P is
  // diagonal in A's eigenbasis (blr.h, step 2). Otherwise the general
  // derivation.
  const bool isotropic = prior.public_precision == nullptr &&
                         (prior.diagonal.array() == prior.diagonal[0]).all();
  const EigenvalueMap map{
      kSignalEdgeFraction * 2.0 * std::sqrt(static_cast<double>(d) * noise_variance_s2),
      noise_variance_s1, prior.diagonal[0], eigenvalue_floor};
  Posterior out;
  if (isotropic) {
    Eigen::VectorXd p(d), phi(d);
    for (Eigen::Index i = 0; i < d; ++i) {
      const double lambda = map.Signal(a[i]);
      p[i] = map.Precision(lambda);
      phi[i] = map.Shrinkage(lambda) / p[i];
    }
    out.precision = v * p.asDiagonal() * v.transpose();
    out.precision = 0.5 * (out.precision + out.precision.transpose()).eval();
    out.data_covariance = v * p.cwiseInverse().asDiagonal() * v.transpose();
    out.data_covariance = 0.5 * (out.data_covariance + out.data_covariance.transpose()).eval();
    out.mean = v * phi.cwiseProduct(v.transpose() * statistic_s1);
  } else {
    VIPSD_ASSIGN_OR_RETURN(DenseMoments moments,
                           DensePosterior(a, v, statistic_s1, map, prior));
    out.precision = std::move(moments.precision);
    out.data_covariance = std::move(moments.data_covariance);
    out.mean = std::move(moments.mean);
  }
  if (noise_share && noise_variance_s2 > 0) {
    VIPSD_ASSIGN_OR_RETURN(out.noise_covariance,
                           NoiseShare(statistic_s2, statistic_s1, noise_variance_s2, map,
                                      isotropic ? nullptr : &prior));
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

int64_t PriorGroupCount(const BlrConfig& c) {
  int64_t groups = 1;
  for (int32_t g : c.prior_group) groups = std::max<int64_t>(groups, int64_t{g} + 1);
  return groups;
}

Status ValidateBlrConfig(const BlrConfig& c) {
  if (c.dim < 1 || c.dim > kMaxDim) return FieldError("dim", "in [1, 1024]");
  if (!c.prior_group.empty()) {
    if (c.prior_group.size() != static_cast<size_t>(c.dim)) {
      return FieldError("prior_group", "empty or one group index per coefficient (blr.dim = " +
                                           std::to_string(c.dim) + " entries)");
    }
    const int64_t groups = PriorGroupCount(c);
    std::vector<bool> used(static_cast<size_t>(std::min<int64_t>(groups, c.dim)), false);
    for (int32_t g : c.prior_group) {
      if (g < 0 || g >= c.dim) {
        return FieldError("prior_group", "made of group indices in [0, blr.dim)");
      }
      used[static_cast<size_t>(g)] = true;
    }
    for (size_t g = 0; g < used.size(); ++g) {
      if (!used[g]) {
        return FieldError("prior_group", "made of the group indices 0 .. G-1, each used (group " +
                                             std::to_string(g) + " has no coefficient)");
      }
    }
  }
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
  // The prior: q(α_g) = Gamma(a0, b0) for every group, q(m) = N(0, I / E[α]).
  const int64_t groups = PriorGroupCount(config);
  VIPSD_RETURN_IF_ERROR(model->SetState(
      Eigen::MatrixXd::Zero(config.dim, config.dim), Eigen::VectorXd::Zero(config.dim), 0, 0,
      Eigen::VectorXd::Constant(groups, config.prior_shape),
      Eigen::VectorXd::Constant(groups, config.prior_rate)));
  return model;
}

BlrModel::BlrModel(const BlrConfig& config, privacy::BlockLayout layout)
    : config_(config), layout_(std::move(layout)) {
  group_of_.assign(static_cast<size_t>(config.dim), 0);
  if (!config.prior_group.empty()) {
    std::copy(config.prior_group.begin(), config.prior_group.end(), group_of_.begin());
  }
}

Eigen::VectorXd BlrModel::expected_alpha() const { return alpha_shape_.cwiseQuotient(alpha_rate_); }

Eigen::VectorXd BlrModel::prior_precision() const { return PriorPrecision(expected_alpha()); }

BlrPrior BlrModel::PriorOf(const Eigen::VectorXd& expected_alpha) const {
  if (public_precision_.size() == 0) return BlrPrior{PriorPrecision(expected_alpha)};
  return BlrPrior{expected_alpha, &public_precision_, &public_mean_};
}

Eigen::VectorXd BlrModel::PriorPrecision(const Eigen::VectorXd& expected_alpha) const {
  Eigen::VectorXd out(config_.dim);
  for (Eigen::Index j = 0; j < config_.dim; ++j) out[j] = expected_alpha[group_of_[j]];
  return out;
}

std::vector<std::pair<std::string, int64_t>> BlrModel::dimensions() const {
  return {{"d", config_.dim}};
}

std::unique_ptr<model::EStepScratch> BlrModel::NewScratch() const {
  return std::make_unique<BlrScratch>();
}

Status BlrModel::SetState(Eigen::MatrixXd statistic_s2, Eigen::VectorXd statistic_s1,
                          double noise_variance_s1, double noise_variance_s2,
                          Eigen::VectorXd alpha_shape, Eigen::VectorXd alpha_rate,
                          const Spectrum* spectrum) {
  if (!statistic_s2.allFinite() || !statistic_s1.allFinite()) {
    return OutOfRangeError("blr statistics are not finite");
  }
  if (!(noise_variance_s1 >= 0 && std::isfinite(noise_variance_s1) && noise_variance_s2 >= 0 &&
        std::isfinite(noise_variance_s2))) {
    return OutOfRangeError("blr noise variances must be finite and >= 0");
  }
  for (Eigen::Index g = 0; g < alpha_shape.size(); ++g) {
    if (!IsPositiveFinite(alpha_shape[g]) || !IsPositiveFinite(alpha_rate[g]) ||
        !IsPositiveFinite(alpha_shape[g] / alpha_rate[g])) {
      return OutOfRangeError("blr q(alpha) parameters must be finite and > 0");
    }
  }
  if (spectrum == nullptr) {
    VIPSD_ASSIGN_OR_RETURN(const Spectrum decomposed, Decompose(statistic_s2));
    return SetState(std::move(statistic_s2), std::move(statistic_s1), noise_variance_s1,
                    noise_variance_s2, std::move(alpha_shape), std::move(alpha_rate),
                    &decomposed);
  }
  VIPSD_ASSIGN_OR_RETURN(
      Posterior posterior,
      DerivePosterior(*spectrum, statistic_s2, statistic_s1, noise_variance_s1, noise_variance_s2,
                      PriorOf(alpha_shape.cwiseQuotient(alpha_rate)), config_.eigenvalue_floor,
                      /*noise_share=*/true));
  statistic_s2_ = std::move(statistic_s2);
  statistic_s1_ = std::move(statistic_s1);
  noise_variance_s1_ = noise_variance_s1;
  noise_variance_s2_ = noise_variance_s2;
  alpha_shape_ = std::move(alpha_shape);
  alpha_rate_ = std::move(alpha_rate);
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
  // The evidence update (blr.h, "q(α)"), per group g: the γ_g = d_g −
  // E[α_g] Σ_{j∈g} Σ_data,jj directions the data determine, against the
  // squared norm of the group's mean and noise share N (taken from the
  // current release: the share is derived once per step, in SetState).
  VIPSD_ASSIGN_OR_RETURN(const Spectrum spectrum, Decompose(statistic_s2));
  const Eigen::VectorXd alpha = expected_alpha();
  VIPSD_ASSIGN_OR_RETURN(Posterior posterior,
                         DerivePosterior(spectrum, statistic_s2, statistic_s1, noise_variance_s1,
                                         noise_variance_s2, PriorOf(alpha),
                                         config_.eigenvalue_floor, /*noise_share=*/false));
  const Eigen::Index groups = alpha.size();
  Eigen::VectorXd size = Eigen::VectorXd::Zero(groups), variance = Eigen::VectorXd::Zero(groups),
                  norm = Eigen::VectorXd::Zero(groups);
  if (has_public_prior()) {
    // Λ0 = E[α] R: γ = d − E[α] tr(R Σ_data) against the prior's
    // Mahalanobis norm E[(m − m0)ᵀ R (m − m0)] (mean and noise share).
    const Eigen::VectorXd offset = posterior.mean - public_mean_;
    size[0] = static_cast<double>(config_.dim);
    variance[0] = public_precision_.cwiseProduct(posterior.data_covariance).sum();
    norm[0] = offset.dot(public_precision_ * offset) +
              public_precision_.cwiseProduct(noise_covariance_).sum();
  } else if (groups == 1) {
    size[0] = static_cast<double>(config_.dim);
    variance[0] = posterior.data_covariance.trace();
    norm[0] = posterior.mean.squaredNorm() + noise_covariance_.trace();
  } else {
    for (Eigen::Index j = 0; j < config_.dim; ++j) {
      const int32_t g = group_of_[j];
      size[g] += 1;
      variance[g] += posterior.data_covariance(j, j);
      norm[g] += posterior.mean[j] * posterior.mean[j] + noise_covariance_(j, j);
    }
  }
  Eigen::VectorXd alpha_shape(groups), alpha_rate(groups);
  for (Eigen::Index g = 0; g < groups; ++g) {
    const double determined = std::max(size[g] - alpha[g] * variance[g], 0.0);
    alpha_shape[g] = keep * alpha_shape_[g] + rho * (config_.prior_shape + 0.5 * determined);
    alpha_rate[g] = keep * alpha_rate_[g] + rho * (config_.prior_rate + 0.5 * norm[g]);
  }
  return SetState(std::move(statistic_s2), std::move(statistic_s1), noise_variance_s1,
                  noise_variance_s2, std::move(alpha_shape), std::move(alpha_rate), &spectrum);
}

Status BlrModel::SetPublicPrior(std::span<const model::NamedArray> arrays) {
  if (alpha_shape_.size() > 1) {
    return FailedPreconditionError(
        "blr: a public prior has one scale for its precision; it cannot be combined with "
        "prior groups");
  }
  const int64_t d = config_.dim;
  const model::NamedArray* mean = nullptr;
  const model::NamedArray* covariance = nullptr;
  for (const model::NamedArray& array : arrays) {
    if (array.name == "mean") mean = &array;
    if (array.name == "covariance") covariance = &array;
  }
  if (mean == nullptr || mean->shape != std::vector<int64_t>{d} ||
      mean->data.size() != static_cast<size_t>(d)) {
    return InvalidArgumentError("its array \"mean\" is missing or not of length d = " +
                                std::to_string(d));
  }
  if (covariance == nullptr || covariance->shape != std::vector<int64_t>{d, d} ||
      covariance->data.size() != static_cast<size_t>(d * d)) {
    return InvalidArgumentError("its array \"covariance\" is missing or not d x d (d = " +
                                std::to_string(d) + ")");
  }
  Eigen::VectorXd public_mean = Eigen::Map<const Eigen::VectorXd>(mean->data.data(), d);
  const Eigen::MatrixXd sigma = Eigen::Map<const RowMajorMatrix>(covariance->data.data(), d, d);
  if (!public_mean.allFinite() || !sigma.allFinite() ||
      (sigma - sigma.transpose()).cwiseAbs().maxCoeff() > 1e-9 * sigma.cwiseAbs().maxCoeff()) {
    return InvalidArgumentError("its \"mean\" and \"covariance\" must be finite and the "
                                "covariance symmetric");
  }
  const Eigen::LLT<Eigen::MatrixXd> cholesky(0.5 * (sigma + sigma.transpose()));
  if (cholesky.info() != Eigen::Success) {
    return InvalidArgumentError("its \"covariance\" is not positive definite");
  }
  Eigen::MatrixXd precision = cholesky.solve(Eigen::MatrixXd::Identity(d, d));
  precision = 0.5 * (precision + precision.transpose()).eval();
  if (!precision.allFinite()) {
    return InvalidArgumentError("its \"covariance\" cannot be inverted in double precision");
  }
  // The state restarts from the prior: q(α) = Gamma(a0, b0), A = B = 0, so
  // q(m) = N(m0, (E[α] R)⁻¹).
  Eigen::VectorXd saved_mean = std::move(public_mean_);
  Eigen::MatrixXd saved_precision = std::move(public_precision_);
  public_mean_ = std::move(public_mean);
  public_precision_ = std::move(precision);
  Status status = SetState(Eigen::MatrixXd::Zero(d, d), Eigen::VectorXd::Zero(d), 0, 0,
                           Eigen::VectorXd::Constant(1, config_.prior_shape),
                           Eigen::VectorXd::Constant(1, config_.prior_rate));
  if (!status.ok()) {
    public_mean_ = std::move(saved_mean);
    public_precision_ = std::move(saved_precision);
    return InvalidArgumentError("it gives no valid prior: " + status.message());
  }
  return Status::Ok();
}

std::vector<model::NamedArray> BlrModel::AlphaArrays() const {
  if (alpha_shape_.size() == 1) {
    return {ScalarArray("alpha_shape", alpha_shape_[0]),
            ScalarArray("alpha_rate", alpha_rate_[0])};
  }
  model::NamedArray group{"prior_group", {config_.dim}, {}};
  for (int32_t g : group_of_) group.data.push_back(g);
  return {VectorArray("alpha_shape", alpha_shape_), VectorArray("alpha_rate", alpha_rate_),
          std::move(group)};
}

std::vector<model::NamedArray> BlrModel::ReleaseArrays() const {
  std::vector<model::NamedArray> out = {VectorArray("mean", mean_),
                                        MatrixArray("covariance", covariance_),
                                        MatrixArray("noise_covariance", noise_covariance_)};
  for (model::NamedArray& array : AlphaArrays()) out.push_back(std::move(array));
  out.push_back(ScalarArray("noise_variance_s1", noise_variance_s1_));
  out.push_back(ScalarArray("noise_variance_s2", noise_variance_s2_));
  return out;
}

std::vector<model::NamedArray> BlrModel::CheckpointArrays() const {
  std::vector<model::NamedArray> out = {VectorArray("statistic_s1", statistic_s1_),
                                        MatrixArray("statistic_s2", statistic_s2_),
                                        ScalarArray("noise_variance_s1", noise_variance_s1_),
                                        ScalarArray("noise_variance_s2", noise_variance_s2_)};
  for (model::NamedArray& array : AlphaArrays()) out.push_back(std::move(array));
  return out;
}

Status BlrModel::RestoreCheckpoint(std::span<const model::NamedArray> arrays) {
  const int64_t d = config_.dim;
  const int64_t groups = alpha_shape_.size();
  // Current format, and the earlier one ("precision", "precision_mean"):
  // name → expected shape. q(α) is a scalar pair with one prior group, one
  // entry per group (and the group of every coefficient) with several.
  const std::vector<int64_t> alpha_shape_of =
      groups == 1 ? std::vector<int64_t>{} : std::vector<int64_t>{groups};
  std::vector<std::pair<std::string, std::vector<int64_t>>> known = {
      {"statistic_s1", {d}},     {"statistic_s2", {d, d}},        {"noise_variance_s1", {}},
      {"noise_variance_s2", {}}, {"alpha_shape", alpha_shape_of}, {"alpha_rate", alpha_shape_of},
      {"precision", {d, d}},     {"precision_mean", {d}}};
  if (groups > 1) known.push_back({"prior_group", {d}});
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
  const size_t grouped = groups > 1 ? 1 : 0;
  if (current == earlier || found.count("alpha_shape") + found.count("alpha_rate") != 2 ||
      found.count("prior_group") != grouped || found.size() != (current ? 6u : 4u) + grouped) {
    return InvalidArgumentError(
        "a BLR checkpoint holds \"statistic_s1\", \"statistic_s2\", \"noise_variance_s1\", "
        "\"noise_variance_s2\", \"alpha_shape\" and \"alpha_rate\" (or, written by an earlier "
        "vipsd, \"precision\", \"precision_mean\", \"alpha_shape\" and \"alpha_rate\"), and "
        "with several prior groups also \"prior_group\"");
  }
  if (groups > 1) {
    for (Eigen::Index j = 0; j < d; ++j) {
      if (found["prior_group"]->data[static_cast<size_t>(j)] != group_of_[j]) {
        return InvalidArgumentError(
            "checkpoint array \"prior_group\" differs from this model's blr.prior_group");
      }
    }
  }
  Eigen::VectorXd alpha_shape = Eigen::Map<const Eigen::VectorXd>(
      found["alpha_shape"]->data.data(), static_cast<Eigen::Index>(groups));
  Eigen::VectorXd alpha_rate = Eigen::Map<const Eigen::VectorXd>(
      found["alpha_rate"]->data.data(), static_cast<Eigen::Index>(groups));
  if (!(alpha_shape.array() > 0).all() || !(alpha_rate.array() > 0).all()) {
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
    if (has_public_prior()) {
      return InvalidArgumentError(
          "a BLR checkpoint of the earlier format (\"precision\", \"precision_mean\") predates "
          "public priors and cannot be restored into a model with one");
    }
    // Λ = E[α] I + (the running estimate of S2/q), η = the one of S1/q.
    matrix.diagonal() -= PriorPrecision(alpha_shape.cwiseQuotient(alpha_rate));
  }
  Status status = SetState(std::move(matrix), std::move(vector), noise_variance_s1,
                           noise_variance_s2, std::move(alpha_shape), std::move(alpha_rate));
  if (!status.ok()) {
    return InvalidArgumentError("checkpoint arrays give no valid posterior: " + status.message());
  }
  return Status::Ok();
}

}  // namespace vipsd::models
