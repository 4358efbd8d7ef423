#include "core/privacy/mechanisms/gaussian_mechanism.h"

#include <sodium.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

#include "core/privacy/mechanisms/distributed_noise.h"

namespace vipsd::privacy {
namespace {

__extension__ typedef unsigned __int128 U128;

bool SameLayout(const BlockLayout& a, const BlockLayout& b) {
  if (a.num_blocks() != b.num_blocks()) return false;
  for (size_t index = 0; index < a.num_blocks(); ++index) {
    const Block& x = a.block(index);
    const Block& y = b.block(index);
    if (x.name != y.name || x.kind != y.kind || x.dim != y.dim || x.offset != y.offset ||
        x.size != y.size || x.clip_bound != y.clip_bound) {
      return false;
    }
  }
  return true;
}

Status AlreadyReleasedError() {
  return FailedPreconditionError(
      "this step's sum has already been released; call Reset() before the next step");
}

// The largest coordinate magnitude a rounded block can hold, and the
// square root of its integer bound: 2^g + 2^(g−10).
uint64_t MaxGridValue(int g) {
  return (uint64_t{1} << g) + (uint64_t{1} << (g - kGridSlackBits));
}

// S_b = (2^g + 2^(g−10))², exact for 10 ≤ g ≤ 30.
uint64_t BlockBoundSquared(int g) { return MaxGridValue(g) * MaxGridValue(g); }

// |n| without overflow for every int64 (INT64_MIN included).
uint64_t Magnitude(int64_t n) {
  return n < 0 ? uint64_t{0} - static_cast<uint64_t>(n) : static_cast<uint64_t>(n);
}

}  // namespace

int GridExponent(size_t num_blocks) {
  // kMaxNoiseMultiplier² = 2^20. σ²·S ≤ 2^62 − 2^23 keeps
  // ⌈σ²·S·(1 + 2^-40)⌉ + τ² below 2^62 (DiscreteNoiseFor).
  const U128 limit = (static_cast<U128>(1) << 62) - (static_cast<U128>(1) << 23);
  if (num_blocks > (uint64_t{1} << 21)) return 10;  // (the product below stays < 2^128)
  for (int g = 20; g >= 10; --g) {
    const U128 total = (static_cast<U128>(1) << 20) * num_blocks * BlockBoundSquared(g);
    if (total <= limit) return g;
  }
  return 10;
}

StatusOr<DiscreteNoise> DiscreteNoiseFor(const BlockLayout& layout, double noise_multiplier) {
  if (!std::isfinite(noise_multiplier) || noise_multiplier <= 0) {
    return InvalidArgumentError("noise_multiplier must be finite and > 0, got " +
                                std::to_string(noise_multiplier));
  }
  if (noise_multiplier > kMaxNoiseMultiplier) {
    return OutOfRangeError("noise_multiplier " + std::to_string(noise_multiplier) +
                           " is above the largest the exact discrete sampler supports (" +
                           std::to_string(kMaxNoiseMultiplier) + ")");
  }
  DiscreteNoise noise;
  noise.noise_multiplier = noise_multiplier;
  noise.grid_exponent = GridExponent(layout.num_blocks());
  U128 total = 0;
  for (size_t b = 0; b < layout.num_blocks(); ++b) {
    noise.block_bound_squared.push_back(BlockBoundSquared(noise.grid_exponent));
    total += noise.block_bound_squared.back();
  }
  if (total >= (static_cast<U128>(1) << 62)) {
    return OutOfRangeError("the statistic has too many blocks for the exact discrete sampler");
  }
  noise.bound_squared = static_cast<uint64_t>(total);
  // ⌈σ²·S·(1 + 2^-40)⌉ + τ²: σ is exact in long double, σ·σ and the product
  // with S (< 2^62, exact) each round by < 2^-63 relative, which the factor
  // 1 + 2^-40 more than covers, so the result is ≥ σ²·S + τ².
  const long double sigma = noise_multiplier;
  const long double scaled = sigma * sigma * static_cast<long double>(noise.bound_squared) *
                             (1.0L + std::ldexp(1.0L, -40));
  const long double ceiling = std::ceil(scaled) + static_cast<long double>(kReductionTau2);
  if (!(ceiling < std::ldexp(1.0L, 62))) {
    return OutOfRangeError("noise_multiplier " + std::to_string(noise_multiplier) +
                           " needs sigma_g^2 >= 2^62 grid units for this statistic");
  }
  noise.sigma2 = Rational{static_cast<uint64_t>(ceiling), 1};
  return noise;
}

std::string DescribeDiscreteNoise(const DiscreteNoise& noise) {
  return "discrete-gaussian grid=2^-" + std::to_string(noise.grid_exponent) +
         " sensitivity^2=" + std::to_string(noise.bound_squared) +
         " sigma_g^2=" + std::to_string(noise.sigma2.numerator) + " (grid units)";
}

StatusOr<std::vector<double>> NoiseStdPerBlock(const BlockLayout& layout,
                                               double noise_multiplier) {
  if (!std::isfinite(noise_multiplier) || noise_multiplier < 0) {
    return InvalidArgumentError("noise_multiplier must be finite and >= 0, got " +
                                std::to_string(noise_multiplier));
  }
  std::vector<double> stds;
  stds.reserve(layout.num_blocks());
  if (noise_multiplier == 0) {
    stds.assign(layout.num_blocks(), 0.0);
    return stds;
  }
  VIPSD_ASSIGN_OR_RETURN(DiscreteNoise noise, DiscreteNoiseFor(layout, noise_multiplier));
  const double grid_std =
      std::ldexp(std::sqrt(static_cast<double>(noise.sigma2.numerator)), -noise.grid_exponent) *
      (1.0 + 4.0 * DBL_EPSILON);
  for (const Block& block : layout.blocks()) stds.push_back(grid_std * block.clip_bound);
  return stds;
}

GaussianSumMechanism::GaussianSumMechanism(BlockLayout layout, SumKind kind)
    : layout_(std::move(layout)),
      kind_(kind),
      grid_exponent_(GridExponent(layout_.num_blocks())),
      block_bound_squared_(layout_.num_blocks(), BlockBoundSquared(grid_exponent_)) {
  if (kind_ == SumKind::kGrid) {
    sum_.assign(layout_.total_size(), 0);
  } else {
    float_sum_.assign(layout_.total_size(), 0.0);
  }
}

void GaussianSumMechanism::RoundToGrid(std::span<double> scaled, size_t block_index) {
  const uint64_t bound = block_bound_squared_[block_index];
  grid_scratch_.resize(scaled.size());
  // |x| ≤ 1 (+ ulps) after the clipping, so x·2^g is exact and far inside
  // int64; the clamp to ±2^40 only matters for a value that escaped the
  // clipping (it then fails the bound below).
  constexpr double kClamp = 1099511627776.0;  // 2^40
  // x·2^g by a product with the power of two (g ∈ [10, 20]): exact for
  // every finite x, so the same value as std::ldexp(x, g), without its call
  // per coordinate (a few % of an E-step).
  const double grid_scale = std::ldexp(1.0, grid_exponent_);
  auto round_and_measure = [&]() -> U128 {
    U128 norm = 0;
    for (size_t i = 0; i < scaled.size(); ++i) {
      const double units = std::clamp(scaled[i] * grid_scale, -kClamp, kClamp);
      const auto n = static_cast<int64_t>(std::nearbyint(units));
      grid_scratch_[i] = n;
      const uint64_t magnitude = Magnitude(n);
      norm += static_cast<U128>(magnitude) * magnitude;
    }
    return norm;
  };
#ifdef VIPSD_AUDIT_BUILD_WITHOUT_CLIPPING
  // NOT PRIVATE. Only in privacy_audit_no_clip_test (tests/CMakeLists.txt):
  // the exact integer bound is a second clipping, which the audit must see
  // bypassed too.
  (void)bound;
  round_and_measure();
  return;
#endif
  if (round_and_measure() <= bound) return;
  // ||n|| ≤ ||x||·2^g + sqrt(m)/2: shrinking x by 1 − (sqrt(m)/2 + 1)/2^g
  // leaves ||n|| < 2^g (the + 1 covers the floating-point product).
  const double slack = (std::sqrt(static_cast<double>(scaled.size())) / 2 + 1) *
                       std::ldexp(1.0, -grid_exponent_);
  const double factor = slack < 1 ? 1 - slack : 0;
  for (double& value : scaled) value *= factor;
  if (round_and_measure() <= bound) return;
  std::fill(grid_scratch_.begin(), grid_scratch_.end(), 0);
}

Status GaussianSumMechanism::Add(std::span<const double> record) {
  if (released_) return AlreadyReleasedError();
  if (record.size() != layout_.total_size()) {
    ++counts_.rejected;
    return InvalidArgumentError("record statistic has " + std::to_string(record.size()) +
                                " coordinates but the block layout expects " +
                                std::to_string(layout_.total_size()));
  }
  if (counts_.accepted >= kMaxContributions) {
    ++counts_.rejected;
    return ResourceExhaustedError("this step's sum already holds the most records one sum can");
  }
  // Allocated on first use: sparse-only accumulators never need it.
  scratch_.resize(static_cast<Eigen::Index>(layout_.total_size()));
  std::copy(record.begin(), record.end(), scratch_.data());
  const std::span<double> clipped(scratch_.data(), layout_.total_size());
  if (Status status = ClipRecordStatistic(layout_, clipped); !status.ok()) {
    ++counts_.rejected;
    return status;
  }
  for (size_t b = 0; b < layout_.num_blocks(); ++b) {
    const Block& block = layout_.block(b);
    const std::span<double> segment = clipped.subspan(block.offset, block.size);
    // Correctly rounded division; |values| ≤ C_b so nothing overflows.
    for (double& value : segment) value /= block.clip_bound;
    // The division may round the scaled norm a few ulps above 1.
    ClipToL2Bound(segment, 1.0);
    if (kind_ == SumKind::kFloat) {
      for (size_t i = 0; i < block.size; ++i) float_sum_[block.offset + i] += segment[i];
      continue;
    }
    RoundToGrid(segment, b);
    for (size_t i = 0; i < block.size; ++i) sum_[block.offset + i] += grid_scratch_[i];
  }
  sum_is_zero_ = false;
  dense_ = true;
  ++counts_.accepted;
  return Status::Ok();
}

Status GaussianSumMechanism::AddSparse(std::span<const uint32_t> indices,
                                       std::span<const double> values) {
  if (released_) return AlreadyReleasedError();
  if (indices.size() != values.size()) {
    ++counts_.rejected;
    return InvalidArgumentError("sparse statistic: " + std::to_string(indices.size()) +
                                " indices but " + std::to_string(values.size()) + " values");
  }
  if (counts_.accepted >= kMaxContributions) {
    ++counts_.rejected;
    return ResourceExhaustedError("this step's sum already holds the most records one sum can");
  }
  const size_t total = layout_.total_size();
  for (size_t i = 0; i < indices.size(); ++i) {
    if (indices[i] >= total || (i > 0 && indices[i] <= indices[i - 1])) {
      ++counts_.rejected;
      return InvalidArgumentError(
          "sparse statistic: indices must be strictly increasing and below " +
          std::to_string(total));
    }
    if (!std::isfinite(values[i])) {
      ++counts_.rejected;
      return OutOfRangeError("sparse statistic: a coordinate is NaN or infinite");
    }
  }
  sparse_scratch_.assign(values.begin(), values.end());
  const std::span<double> scratch(sparse_scratch_);
  size_t begin = 0;
  for (size_t b = 0; b < layout_.num_blocks(); ++b) {
    const Block& block = layout_.block(b);
    // Indices are sorted and blocks are contiguous: this block's values are
    // the run of indices in [offset, offset + size).
    while (begin < indices.size() && indices[begin] < block.offset) ++begin;
    size_t end = begin;
    while (end < indices.size() && indices[end] < block.offset + block.size) ++end;
    if (end > begin) {
      const std::span<double> segment = scratch.subspan(begin, end - begin);
      ClipToL2Bound(segment, block.clip_bound);
      for (double& value : segment) value /= block.clip_bound;
      ClipToL2Bound(segment, 1.0);
      if (kind_ == SumKind::kFloat) {
        for (size_t i = begin; i < end; ++i) float_sum_[indices[i]] += segment[i - begin];
      } else {
        RoundToGrid(segment, b);
        for (size_t i = begin; i < end; ++i) sum_[indices[i]] += grid_scratch_[i - begin];
      }
    }
    begin = end;
  }
  if (!dense_) {
    // Indices increase: a page is marked once per run of its indices.
    size_t last_page = SIZE_MAX;
    for (const uint32_t index : indices) {
      const size_t page = index / kPage;
      if (page != last_page) MarkPage(page);
      last_page = page;
    }
  }
  if (!indices.empty()) sum_is_zero_ = false;
  ++counts_.accepted;
  return Status::Ok();
}

Status GaussianSumMechanism::Merge(GaussianSumMechanism&& other) {
  if (&other == this) return InvalidArgumentError("Merge: cannot merge a mechanism into itself");
  if (released_ || other.released_) return AlreadyReleasedError();
  if (!SameLayout(layout_, other.layout_)) {
    return InvalidArgumentError("Merge: the two mechanisms have different block layouts");
  }
  if (kind_ != other.kind_) {
    return InvalidArgumentError("Merge: a grid sum and a floating-point (non-private) sum");
  }
  if (counts_.accepted + other.counts_.accepted > kMaxContributions) {
    return ResourceExhaustedError("Merge: together the two sums hold more records than one sum can");
  }
  if (sum_is_zero_) {
    // 0 + x == x: take over the other buffer (and its tracking); the other
    // side is left with our zeros.
    sum_.swap(other.sum_);
    float_sum_.swap(other.float_sum_);
    sum_is_zero_ = other.sum_is_zero_;
    other.sum_is_zero_ = true;
    page_touched_.swap(other.page_touched_);
    touched_pages_.swap(other.touched_pages_);
    std::swap(dense_, other.dense_);
  } else if (!other.dense_ && !other.sum_is_zero_) {
    const size_t size = layout_.total_size();
    for (const uint32_t page : other.touched_pages_) {
      const size_t begin = static_cast<size_t>(page) * kPage;
      const size_t end = std::min(size, begin + kPage);
      if (kind_ == SumKind::kGrid) {
        for (size_t i = begin; i < end; ++i) sum_[i] += other.sum_[i];
      } else {
        for (size_t i = begin; i < end; ++i) float_sum_[i] += other.float_sum_[i];
      }
      if (!dense_) MarkPage(page);
    }
  } else if (!other.sum_is_zero_) {
    for (size_t i = 0; i < sum_.size(); ++i) sum_[i] += other.sum_[i];
    for (size_t i = 0; i < float_sum_.size(); ++i) float_sum_[i] += other.float_sum_[i];
    dense_ = true;
  }
  counts_.accepted += other.counts_.accepted;
  counts_.rejected += other.counts_.rejected;
  other.Reset();
  other.released_ = true;
  return Status::Ok();
}

GaussianRelease GaussianSumMechanism::ScaleBack(std::span<const int64_t> noise) const {
  Eigen::VectorXd out(static_cast<Eigen::Index>(layout_.total_size()));
  const double two_to_minus_g = std::ldexp(1.0, -grid_exponent_);
  for (const Block& block : layout_.blocks()) {
    if (kind_ == SumKind::kFloat) {
      for (size_t i = block.offset; i < block.offset + block.size; ++i) {
        out[static_cast<Eigen::Index>(i)] = float_sum_[i] * block.clip_bound;
      }
      continue;
    }
    for (size_t i = block.offset; i < block.offset + block.size; ++i) {
      // |sum| ≤ 2^61 and |noise| far below 2^62: no int64 overflow. The
      // conversion to double and the scaling are post-processing of the
      // integer (a power-of-two step, then one rounding for C_b).
      const int64_t value = noise.empty() ? sum_[i] : sum_[i] + noise[i];
      out[static_cast<Eigen::Index>(i)] = ReleasedValue(value, two_to_minus_g, block.clip_bound);
    }
  }
  GaussianRelease release;
  release.noisy_sum = std::move(out);
  return release;
}

GaussianSumMechanism::PreparedNoise::PreparedNoise(PreparedNoise&& other) noexcept
    : draws_(std::move(other.draws_)),
      parameters_(std::move(other.parameters_)),
      noise_multiplier_(other.noise_multiplier_),
      is_private_(other.is_private_),
      description_(std::move(other.description_)),
      ready_(std::exchange(other.ready_, false)) {
  other.draws_.clear();
}

GaussianSumMechanism::PreparedNoise& GaussianSumMechanism::PreparedNoise::operator=(
    PreparedNoise&& other) noexcept {
  if (this != &other) {
    Wipe();
    draws_ = std::move(other.draws_);
    other.draws_.clear();
    parameters_ = std::move(other.parameters_);
    noise_multiplier_ = other.noise_multiplier_;
    is_private_ = other.is_private_;
    description_ = std::move(other.description_);
    ready_ = std::exchange(other.ready_, false);
  }
  return *this;
}

GaussianSumMechanism::PreparedNoise::~PreparedNoise() { Wipe(); }

void GaussianSumMechanism::PreparedNoise::Wipe() {
  if (!draws_.empty()) sodium_memzero(draws_.data(), draws_.size() * sizeof(int64_t));
  draws_.clear();
  ready_ = false;
}

StatusOr<GaussianSumMechanism::PreparedNoise> GaussianSumMechanism::PrepareNoise(
    const BlockLayout& layout, NoiseSource& noise, double noise_multiplier, int threads) {
  if (!std::isfinite(noise_multiplier) || noise_multiplier <= 0) {
    return InvalidArgumentError(
        "noise_multiplier must be finite and > 0, got " + std::to_string(noise_multiplier) +
        "; the sigma = 0 baseline must use ReleaseNonPrivate()");
  }
  VIPSD_ASSIGN_OR_RETURN(DiscreteNoise parameters, DiscreteNoiseFor(layout, noise_multiplier));
  VIPSD_ASSIGN_OR_RETURN(DiscreteGaussianSampler sampler,
                         DiscreteGaussianSampler::Create(parameters.sigma2));
  PreparedNoise prepared;
  prepared.draws_.resize(layout.total_size());
  const Status filled = noise.FillDiscreteGaussianParallel(sampler, prepared.draws_, threads);
  if (!filled.ok()) return filled;  // `prepared` wipes what was drawn
  // A draw beyond 2^61 has probability below exp(−2^122/2^63): never; the
  // check keeps the integer addition in ScaleBack provably exact.
  constexpr int64_t kDrawLimit = int64_t{1} << 61;
  for (const int64_t z : prepared.draws_) {
    if (z > kDrawLimit || z < -kDrawLimit) {
      return InternalError("discrete Gaussian draw outside the exact-addition range");
    }
  }
  prepared.parameters_ = std::move(parameters);
  prepared.noise_multiplier_ = noise_multiplier;
  prepared.is_private_ = noise.is_private();
  prepared.description_ = noise.description();
  prepared.ready_ = true;
  return prepared;
}

StatusOr<GaussianRelease> GaussianSumMechanism::Release(NoiseSource& noise,
                                                        double noise_multiplier) {
  if (released_) return AlreadyReleasedError();
  if (kind_ != SumKind::kGrid) {
    return FailedPreconditionError(
        "a floating-point (non-private) sum cannot be released with noise; private sums use the "
        "grid");
  }
  VIPSD_ASSIGN_OR_RETURN(PreparedNoise prepared, PrepareNoise(layout_, noise, noise_multiplier));
  return Release(std::move(prepared));
}

StatusOr<GaussianRelease> GaussianSumMechanism::Release(PreparedNoise noise) {
  if (released_) return AlreadyReleasedError();
  if (kind_ != SumKind::kGrid) {
    return FailedPreconditionError(
        "a floating-point (non-private) sum cannot be released with noise; private sums use the "
        "grid");
  }
  if (!noise.ready_ || noise.draws_.size() != sum_.size() ||
      noise.parameters_.grid_exponent != grid_exponent_ ||
      noise.parameters_.block_bound_squared != block_bound_squared_) {
    return FailedPreconditionError(
        "noise drawn ahead for another statistic layout or grid, or used already");
  }
  GaussianRelease release = ScaleBack(noise.draws_);
  released_ = true;
  ClearSum();  // the private sum is no longer needed
  release.noise = noise.parameters_;
  release.noise_multiplier = noise.noise_multiplier_;
  release.is_private = noise.is_private_;
  release.noise_description = std::move(noise.description_);
  noise.Wipe();
  return release;
}

StatusOr<std::vector<int64_t>> GaussianSumMechanism::ReleaseShare(NoiseSource& noise,
                                                                  const DistributedNoise& shares) {
  if (released_) return AlreadyReleasedError();
  if (kind_ != SumKind::kGrid) {
    return FailedPreconditionError("a floating-point (non-private) sum has no noise share");
  }
  if (shares.central.grid_exponent != grid_exponent_ ||
      shares.central.block_bound_squared != block_bound_squared_) {
    return FailedPreconditionError("noise shares planned for another statistic layout or grid");
  }
  VIPSD_ASSIGN_OR_RETURN(DiscreteGaussianSampler sampler,
                         DiscreteGaussianSampler::Create(shares.share_sigma2));
  std::vector<int64_t> share(sum_.size(), 0);
  VIPSD_RETURN_IF_ERROR(noise.FillDiscreteGaussian(sampler, share));
  // |sum| ≤ 2^61 and the share far below 2^62: no overflow.
  for (size_t i = 0; i < share.size(); ++i) share[i] += sum_[i];
  released_ = true;
  ClearSum();
  return share;
}

StatusOr<GaussianRelease> GaussianSumMechanism::ReleaseFederatedTotal(
    const BlockLayout& layout, std::span<const int64_t> total, const DistributedNoise& shares,
    bool shares_private) {
  if (total.size() != layout.total_size()) {
    return InvalidArgumentError("federated total of " + std::to_string(total.size()) +
                                " coordinates for a statistic of " +
                                std::to_string(layout.total_size()));
  }
  const int g = GridExponent(layout.num_blocks());
  if (shares.central.grid_exponent != g ||
      shares.central.block_bound_squared.size() != layout.num_blocks()) {
    return InvalidArgumentError("noise shares planned for another statistic layout or grid");
  }
  Eigen::VectorXd out(static_cast<Eigen::Index>(layout.total_size()));
  for (const Block& block : layout.blocks()) {
    for (size_t i = block.offset; i < block.offset + block.size; ++i) {
      out[static_cast<Eigen::Index>(i)] =
          std::ldexp(static_cast<double>(total[i]), -g) * block.clip_bound;
    }
  }
  GaussianRelease release;
  release.noisy_sum = std::move(out);
  release.noise = shares.central;
  release.noise_multiplier = shares.central.noise_multiplier;
  release.is_private = shares_private;
  release.noise_description = "federated discrete-gaussian shares: " +
                              std::to_string(shares.holders) + " holders, tolerating " +
                              std::to_string(shares.tolerated) + ", share sigma^2=" +
                              std::to_string(shares.share_sigma2.numerator) + " (grid units)";
  return release;
}

StatusOr<GaussianRelease> GaussianSumMechanism::ReleaseNonPrivate() {
  if (released_) return AlreadyReleasedError();
  released_ = true;
  GaussianRelease release = ScaleBack({});
  if (kind_ == SumKind::kGrid) release.noise.grid_exponent = grid_exponent_;
  ClearSum();
  release.noise_multiplier = 0;
  release.is_private = false;
  release.noise_description = "none (sigma = 0, NOT PRIVATE)";
  return release;
}

void GaussianSumMechanism::Reset() {
  // Skipping the fill when nothing was added since the last one saves a
  // statistic-sized memset (e.g. Merge resets its argument, and the step
  // driver resets it again before reuse).
  ClearSum();
  counts_ = PrivateCounts{};
  released_ = false;
}

void GaussianSumMechanism::MarkPage(size_t page) {
  if (page_touched_.empty()) {
    page_touched_.assign((layout_.total_size() + kPage - 1) / kPage, 0);
  }
  if (page_touched_[page] == 0) {
    page_touched_[page] = 1;
    touched_pages_.push_back(static_cast<uint32_t>(page));
  }
}

void GaussianSumMechanism::ClearSum() {
  if (!sum_is_zero_) {
    if (dense_ || page_touched_.empty()) {
      std::fill(sum_.begin(), sum_.end(), 0);
      std::fill(float_sum_.begin(), float_sum_.end(), 0.0);
    } else {
      const size_t size = layout_.total_size();
      for (const uint32_t page : touched_pages_) {
        const size_t begin = static_cast<size_t>(page) * kPage;
        const size_t end = std::min(size, begin + kPage);
        for (size_t i = begin; i < end; ++i) {
          if (kind_ == SumKind::kGrid) {
            sum_[i] = 0;
          } else {
            float_sum_[i] = 0.0;
          }
        }
      }
    }
  }
  for (const uint32_t page : touched_pages_) page_touched_[page] = 0;
  touched_pages_.clear();
  sum_is_zero_ = true;
  dense_ = false;
}

namespace {

constexpr char kTransferMagic[4] = {'V', 'P', 'S', '3'};
// Grid partials of vipsd versions with fixed 8-byte coordinates (refused by
// name).
constexpr char kTransferMagicV2[4] = {'V', 'P', 'S', '2'};
constexpr char kFloatTransferMagic[4] = {'V', 'P', 'S', 'F'};
constexpr size_t kDigestBytes = 32;
enum TransferKind : uint8_t { kTransferZero = 0, kTransferPages = 1, kTransferDense = 2 };

void PutU64(std::string& out, uint64_t v) {
  for (int b = 0; b < 8; ++b) out.push_back(static_cast<char>(v >> (8 * b)));
}

// A signed integer as zigzag LEB128 (7 bits a byte, low first; at most 10
// bytes) at p, which it advances.
inline void PutZigzag(char*& p, int64_t m) {
  uint64_t z = (static_cast<uint64_t>(m) << 1) ^ static_cast<uint64_t>(m >> 63);
  while (z >= 0x80) {
    *p++ = static_cast<char>((z & 0x7f) | 0x80);
    z >>= 7;
  }
  *p++ = static_cast<char>(z);
}

// One LEB128 group sequence from [*p, end) as the unsigned z it encodes;
// false if truncated or beyond 64 bits.
inline bool GetVarint(const unsigned char*& p, const unsigned char* end, uint64_t* z) {
  *z = 0;
  for (int shift = 0;; shift += 7) {
    if (p == end) return false;
    const unsigned char byte = *p++;
    // A 64-bit value has at most 10 groups, the tenth only its top bit.
    if (shift == 63 && byte > 1) return false;
    *z |= static_cast<uint64_t>(byte & 0x7f) << shift;
    if ((byte & 0x80) == 0) return true;
  }
}

inline int64_t FromZigzag(uint64_t z) { return static_cast<int64_t>((z >> 1) ^ (~(z & 1) + 1)); }

// PutZigzag's inverse from [*p, end); false if truncated or beyond 64 bits.
inline bool GetZigzag(const unsigned char*& p, const unsigned char* end, int64_t* m) {
  uint64_t z;
  if (!GetVarint(p, end, &z)) return false;
  *m = FromZigzag(z);
  return true;
}

// `count` zigzag varints from [*p, end) into out[0, count), each of
// magnitude at most `reach`; false if truncated, beyond 64 bits or out of
// reach. The loop a step's owner spends a dense partial's decode in
// (500,000 coordinates at Wikipedia scale), so a one-byte value takes one
// branch. |v| ≤ reach exactly when the zigzag code z ≤ 2·reach (z is 2v for
// v ≥ 0 and 2|v| − 1 for v < 0).
bool GetZigzagRun(const unsigned char*& p, const unsigned char* end, int64_t* out,
                  size_t count, U128 reach) {
  const U128 twice = 2 * reach;
  const uint64_t limit = twice >= static_cast<U128>(UINT64_MAX) ? UINT64_MAX
                                                                 : static_cast<uint64_t>(twice);
  for (size_t i = 0; i < count; ++i) {
    uint64_t z;
    if (p != end && *p < 0x80) {
      z = *p++;
    } else if (!GetVarint(p, end, &z)) {
      return false;
    }
    if (z > limit) return false;
    out[i] = FromZigzag(z);
  }
  return true;
}
void PutF64(std::string& out, double d) {
  uint64_t v;
  std::memcpy(&v, &d, sizeof v);
  PutU64(out, v);
}

void Digest(std::string_view bytes, unsigned char (&out)[kDigestBytes]) {
  crypto_generichash(out, kDigestBytes, reinterpret_cast<const unsigned char*>(bytes.data()),
                     bytes.size(), nullptr, 0);
}

// BLAKE2b of everything that defines the layout and the grid, so that a
// partial made under another configuration (another K, V, block, bound or
// grid) is refused.
std::string LayoutDigest(const BlockLayout& layout) {
  std::string text;
  PutU64(text, static_cast<uint64_t>(GridExponent(layout.num_blocks())));
  PutU64(text, layout.num_blocks());
  for (size_t index = 0; index < layout.num_blocks(); ++index) {
    const Block& block = layout.block(index);
    PutU64(text, block.name.size());
    text += block.name;
    PutU64(text, static_cast<uint64_t>(block.kind));
    PutU64(text, block.dim);
    PutU64(text, block.offset);
    PutU64(text, block.size);
    PutF64(text, block.clip_bound);
  }
  unsigned char digest[kDigestBytes];
  Digest(text, digest);
  return std::string(reinterpret_cast<const char*>(digest), kDigestBytes);
}

class Reader {
 public:
  explicit Reader(std::string_view bytes) : bytes_(bytes) {}
  bool U64(uint64_t* v) {
    if (bytes_.size() - pos_ < 8) return false;
    *v = 0;
    for (int b = 7; b >= 0; --b) *v = (*v << 8) | static_cast<unsigned char>(bytes_[pos_ + b]);
    pos_ += 8;
    return true;
  }
  bool F64(double* d) {
    uint64_t v;
    if (!U64(&v)) return false;
    std::memcpy(d, &v, sizeof v);
    return true;
  }
  bool Bytes(size_t n, std::string_view* out) {
    if (bytes_.size() - pos_ < n) return false;
    *out = bytes_.substr(pos_, n);
    pos_ += n;
    return true;
  }
  // GetZigzagRun at the read position.
  bool ZigzagRun(int64_t* out, size_t count, U128 reach) {
    const auto* begin = reinterpret_cast<const unsigned char*>(bytes_.data());
    const unsigned char* p = begin + pos_;
    if (!GetZigzagRun(p, begin + bytes_.size(), out, count, reach)) return false;
    pos_ = static_cast<size_t>(p - begin);
    return true;
  }
  bool done() const { return pos_ == bytes_.size(); }

 private:
  std::string_view bytes_;
  size_t pos_ = 0;
};

}  // namespace

StatusOr<std::string> GaussianSumMechanism::EncodeUnreleased() const {
  if (released_) return AlreadyReleasedError();
  std::string out(kind_ == SumKind::kGrid ? kTransferMagic : kFloatTransferMagic,
                  sizeof kTransferMagic);
  out += LayoutDigest(layout_);
  PutU64(out, layout_.total_size());
  PutU64(out, counts_.accepted);
  PutU64(out, counts_.rejected);
  const size_t size = layout_.total_size();
  // Coordinates [begin, end), written into room made once (a dense LDA
  // partial is 500,000 coordinates: one push_back per byte cost more than
  // the digest) and cut to size: grid integers as zigzag varints (a sum of
  // clipped, rounded records is mostly small: 1-3 bytes where 8 went
  // before), a float sum's doubles as little-endian words.
  auto put = [&](size_t begin, size_t end) {
    const size_t at = out.size();
    out.resize(at + (kind_ == SumKind::kGrid ? 10 : 8) * (end - begin));
    char* p = out.data() + at;
    for (size_t i = begin; i < end; ++i) {
      if (kind_ == SumKind::kGrid) {
        PutZigzag(p, sum_[i]);
        continue;
      }
      uint64_t v;
      std::memcpy(&v, &float_sum_[i], sizeof v);
      for (int b = 0; b < 8; ++b) *p++ = static_cast<char>(v >> (8 * b));
    }
    out.resize(static_cast<size_t>(p - out.data()));
  };
  if (sum_is_zero_) {
    out.push_back(static_cast<char>(kTransferZero));
  } else if (!dense_ && !page_touched_.empty()) {
    out.push_back(static_cast<char>(kTransferPages));
    std::vector<uint32_t> pages = touched_pages_;
    std::sort(pages.begin(), pages.end());
    out.reserve(out.size() + 8 + pages.size() * (8 + 10 * kPage) + kDigestBytes);
    PutU64(out, pages.size());
    for (const uint32_t page : pages) {
      PutU64(out, page);
      const size_t begin = static_cast<size_t>(page) * kPage;
      put(begin, std::min(size, begin + kPage));
    }
  } else {
    out.push_back(static_cast<char>(kTransferDense));
    out.reserve(out.size() + 10 * size + kDigestBytes);
    put(0, size);
  }
  unsigned char digest[kDigestBytes];
  Digest(out, digest);
  out.append(reinterpret_cast<const char*>(digest), kDigestBytes);
  return out;
}

StatusOr<std::unique_ptr<GaussianSumMechanism>> GaussianSumMechanism::DecodeUnreleased(
    const BlockLayout& layout, std::string_view bytes, Checksum checksum) {
  auto bad = [](const std::string& what) {
    return DataLossError("partial sum transfer: " + what);
  };
  if (bytes.size() < sizeof kTransferMagic + 2 * kDigestBytes + 3 * 8 + 1) {
    return bad("truncated");
  }
  SumKind kind = SumKind::kGrid;
  if (std::memcmp(bytes.data(), kFloatTransferMagic, sizeof kTransferMagic) == 0) {
    kind = SumKind::kFloat;
  } else if (std::memcmp(bytes.data(), kTransferMagicV2, sizeof kTransferMagic) == 0) {
    return bad("a VPS2 partial sum (fixed 8-byte coordinates) of an older vipsd: every process "
               "of a job must run one vipsd version");
  } else if (std::memcmp(bytes.data(), kTransferMagic, sizeof kTransferMagic) != 0) {
    return bad("not a VPS3 (or VPSF) partial sum");
  }
  if (checksum == Checksum::kVerify) {
    unsigned char digest[kDigestBytes];
    Digest(bytes.substr(0, bytes.size() - kDigestBytes), digest);
    if (std::memcmp(digest, bytes.data() + bytes.size() - kDigestBytes, kDigestBytes) != 0) {
      return bad("checksum mismatch");
    }
  }
  Reader in(bytes.substr(sizeof kTransferMagic, bytes.size() - sizeof kTransferMagic - kDigestBytes));
  std::string_view layout_digest;
  uint64_t total = 0, accepted = 0, rejected = 0;
  if (!in.Bytes(kDigestBytes, &layout_digest) || !in.U64(&total) || !in.U64(&accepted) ||
      !in.U64(&rejected)) {
    return bad("truncated header");
  }
  if (layout_digest != LayoutDigest(layout) || total != layout.total_size()) {
    return bad("made under another statistic layout (model or clip configuration)");
  }
  if (accepted > kMaxContributions) return bad("more records than one sum can hold");
  auto mechanism = std::make_unique<GaussianSumMechanism>(layout, kind);
  mechanism->counts_.accepted = accepted;
  mechanism->counts_.rejected = rejected;
  std::string_view kind_byte;
  if (!in.Bytes(1, &kind_byte)) return bad("truncated");
  const auto size = static_cast<size_t>(layout.total_size());
  int64_t* sum = mechanism->sum_.data();
  // No sum of `accepted` rounded records can exceed this in magnitude.
  const U128 reach = static_cast<U128>(accepted) * MaxGridValue(GridExponent(layout.num_blocks()));
  // Coordinates [begin, end).
  auto read_values = [&](size_t begin, size_t end) -> bool {
    if (kind == SumKind::kGrid) return in.ZigzagRun(sum + begin, end - begin, reach);
    for (size_t i = begin; i < end; ++i) {
      // Each record adds at most 1 per scaled coordinate (its block norm
      // is ≤ 1), so no sum of `accepted` records is larger (found by
      // fuzz_partial_sum: a huge value overflowed the release).
      double d;
      if (!in.F64(&d) || !std::isfinite(d)) return false;
      if (std::fabs(d) > static_cast<double>(accepted) * (1 + std::ldexp(1.0, -20)) + 1) return false;
      mechanism->float_sum_[i] = d;
    }
    return true;
  };
  switch (static_cast<uint8_t>(kind_byte[0])) {
    case kTransferZero:
      break;
    case kTransferPages: {
      uint64_t count = 0;
      if (!in.U64(&count)) return bad("truncated page count");
      const size_t num_pages = (size + kPage - 1) / kPage;
      if (count > num_pages) return bad("more pages than the layout has");
      uint64_t previous = 0;
      for (uint64_t p = 0; p < count; ++p) {
        uint64_t page = 0;
        if (!in.U64(&page) || page >= num_pages || (p > 0 && page <= previous)) {
          return bad("page index out of order or out of range");
        }
        previous = page;
        const size_t begin = static_cast<size_t>(page) * kPage;
        if (!read_values(begin, std::min(size, begin + kPage))) {
          return bad("truncated, or a coordinate out of reach");
        }
        mechanism->MarkPage(static_cast<size_t>(page));
      }
      mechanism->sum_is_zero_ = count == 0;
      break;
    }
    case kTransferDense:
      if (!read_values(0, size)) return bad("truncated, or a coordinate out of reach");
      mechanism->dense_ = true;
      mechanism->sum_is_zero_ = false;
      break;
    default:
      return bad("unknown sum encoding");
  }
  if (!in.done()) return bad("trailing bytes");
  return mechanism;
}

namespace {

constexpr char kReleasedMagic[4] = {'V', 'R', 'S', '1'};

}  // namespace

StatusOr<std::string> GaussianSumMechanism::EncodeReleased(const BlockLayout& layout,
                                                           const Eigen::VectorXd& noisy_sum) {
  if (static_cast<uint64_t>(noisy_sum.size()) != layout.total_size()) {
    return FailedPreconditionError("released sum of another size than the layout");
  }
  const int g = GridExponent(layout.num_blocks());
  const double two_to_g = std::ldexp(1.0, g), two_to_minus_g = std::ldexp(1.0, -g);
  std::string out(kReleasedMagic, sizeof kReleasedMagic);
  out += LayoutDigest(layout);
  PutU64(out, layout.total_size());
  const size_t header = out.size();
  // At most 10 bytes a coordinate; the room is made once and cut to size.
  out.resize(header + 10 * layout.total_size());
  char* p = out.data() + header;
  const double* x = noisy_sum.data();
  constexpr double kLimit = 4611686018427387904.0;  // 2^62
  for (const Block& block : layout.blocks()) {
    const double c = block.clip_bound;
    for (size_t i = block.offset; i < block.offset + block.size; ++i) {
      const double grid = std::nearbyint(x[i] / c * two_to_g);
      if (!(std::fabs(grid) <= kLimit)) {
        return FailedPreconditionError("released sum: a coordinate off the grid");
      }
      const auto m = static_cast<int64_t>(grid);
      const double back = ReleasedValue(m, two_to_minus_g, c);
      if (std::memcmp(&back, &x[i], sizeof back) != 0) {
        return FailedPreconditionError("released sum: a coordinate off the grid");
      }
      PutZigzag(p, m);
    }
  }
  out.resize(static_cast<size_t>(p - out.data()));
  return out;
}

StatusOr<Eigen::VectorXd> GaussianSumMechanism::DecodeReleased(const BlockLayout& layout,
                                                               std::string_view bytes) {
  auto bad = [](const std::string& what) { return DataLossError("released sum: " + what); };
  if (bytes.size() < sizeof kReleasedMagic ||
      std::memcmp(bytes.data(), kReleasedMagic, sizeof kReleasedMagic) != 0) {
    return bad("not a VRS1 released sum");
  }
  Reader in(bytes.substr(sizeof kReleasedMagic));
  std::string_view layout_digest;
  uint64_t total = 0;
  if (!in.Bytes(kDigestBytes, &layout_digest) || !in.U64(&total)) return bad("truncated header");
  if (layout_digest != LayoutDigest(layout) || total != layout.total_size()) {
    return bad("made under another statistic layout (model or clip configuration)");
  }
  const size_t header = sizeof kReleasedMagic + kDigestBytes + 8;
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data()) + header;
  const auto* end = reinterpret_cast<const unsigned char*>(bytes.data()) + bytes.size();
  const double two_to_minus_g = std::ldexp(1.0, -GridExponent(layout.num_blocks()));
  Eigen::VectorXd out(static_cast<Eigen::Index>(total));
  double* x = out.data();
  for (const Block& block : layout.blocks()) {
    const double c = block.clip_bound;
    for (size_t i = block.offset; i < block.offset + block.size; ++i) {
      int64_t m = 0;
      if (!GetZigzag(p, end, &m)) return bad("truncated, or a coordinate beyond 64 bits");
      if (m > (int64_t{1} << 62) || m < -(int64_t{1} << 62)) {
        return bad("a coordinate beyond the grid's range");
      }
      x[i] = ReleasedValue(m, two_to_minus_g, c);
    }
  }
  if (p != end) return bad("trailing bytes");
  return out;
}

}  // namespace vipsd::privacy
