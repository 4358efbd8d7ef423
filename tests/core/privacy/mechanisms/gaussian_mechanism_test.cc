// Tests of the one-Gaussian-mechanism-per-step accumulator (docs/privacy_accounting.md §1).
//
// Most layouts use power-of-two clip bounds: scaling by 1/C_b and back by C_b
// is then exact, so the released sum divided by C_b is bit-for-bit the
// internal scaled sum and exact equalities can be asserted.
#include "core/privacy/mechanisms/gaussian_mechanism.h"

#include <gmock/gmock.h>
#include <sodium.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/privacy/mechanisms/secure_noise.h"
#include "tests/testing/testing_noise.h"

namespace vipsd::privacy {
namespace {

using ::testing::HasSubstr;

// Test fake: every noise draw is exactly 1 (one grid step), so release −
// sum is exactly the grid step 2^-g·C_b. NOT PRIVATE.
class OnesNoiseSource final : public NoiseSource {
 public:
  void FillStandardNormal(std::span<double> out) override {
    std::fill(out.begin(), out.end(), 1.0);
  }
  Status FillDiscreteGaussian(const DiscreteGaussianSampler&, std::span<int64_t> out) override {
    std::fill(out.begin(), out.end(), 1);
    return Status::Ok();
  }
  void FillUniformBits(std::span<uint64_t> out) override {
    std::fill(out.begin(), out.end(), 0);
  }
  bool is_private() const override { return false; }
  std::string description() const override { return "ones (TEST ONLY)"; }
};

BlockLayout MakeLayout(std::vector<BlockSpec> specs) {
  auto layout = BlockLayout::Create(std::move(specs));
  EXPECT_TRUE(layout.ok()) << layout.status().ToString();
  return std::move(layout).value();
}

// Three blocks (B = 3), power-of-two bounds, 5 + 6 + 4 = 15 coordinates.
BlockLayout PowerOfTwoLayout() {
  return MakeLayout({
      {"a", BlockKind::kVector, 5, 2.0},
      {"s", BlockKind::kSymmetricMatrix, 3, 0.5},
      {"b", BlockKind::kVector, 4, 8.0},
  });
}

std::unique_ptr<NoiseSource> Reproducible(uint64_t seed) {
  auto source = SecureNoiseSource::CreateReproducible(seed);
  EXPECT_TRUE(source.ok());
  return std::move(source).value();
}

// Random records whose blocks are sometimes under, sometimes far over their
// bounds (norms from ~1e-3 to ~1e3, so nothing underflows).
std::vector<std::vector<double>> RandomRecords(const BlockLayout& layout, int count,
                                               uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal;
  std::uniform_real_distribution<double> log10_scale(-3.0, 3.0);
  std::vector<std::vector<double>> records;
  for (int r = 0; r < count; ++r) {
    std::vector<double> record(layout.total_size());
    for (const Block& block : layout.blocks()) {
      const double scale = std::pow(10.0, log10_scale(rng));
      for (size_t i = block.offset; i < block.offset + block.size; ++i) {
        record[i] = normal(rng) * scale;
      }
    }
    records.push_back(std::move(record));
  }
  return records;
}

Eigen::VectorXd ReleaseExactly(GaussianSumMechanism& mechanism) {
  auto release = mechanism.ReleaseNonPrivate();
  EXPECT_TRUE(release.ok()) << release.status().ToString();
  return release->noisy_sum;
}

// The internal scaled sum, recovered exactly from a σ = 0 release when every
// C_b is a power of two.
Eigen::VectorXd ScaledFromRelease(const BlockLayout& layout, Eigen::VectorXd released) {
  for (const Block& block : layout.blocks()) {
    released.segment(block.offset, block.size) /= block.clip_bound;
  }
  return released;
}

long double Norm(const Eigen::VectorXd& v, size_t offset, size_t size) {
  long double sum = 0;
  for (size_t i = offset; i < offset + size; ++i) sum += static_cast<long double>(v[i]) * v[i];
  return std::sqrt(sum);
}

// What the mechanism adds for one record, in grid units: clip, scale by
// 1/C_b, re-check, round each coordinate to the nearest multiple of 2^-g
// (the path of the header comment, replayed here).
std::vector<int64_t> GridContribution(const BlockLayout& layout, std::vector<double> record) {
  EXPECT_TRUE(ClipRecordStatistic(layout, record).ok());
  const int g = GridExponent(layout.num_blocks());
  std::vector<int64_t> out(record.size());
  for (const Block& block : layout.blocks()) {
    const std::span<double> segment(record.data() + block.offset, block.size);
    for (double& value : segment) value /= block.clip_bound;
    ClipToL2Bound(segment, 1.0);
    for (size_t i = 0; i < block.size; ++i) {
      out[block.offset + i] = static_cast<int64_t>(std::nearbyint(std::ldexp(segment[i], g)));
    }
  }
  return out;
}

// A release's values back in grid units; fails the test if one is not an
// exact integer multiple of its block's grid step 2^-g·C_b.
std::vector<int64_t> GridUnits(const BlockLayout& layout, const Eigen::VectorXd& released) {
  const int g = GridExponent(layout.num_blocks());
  std::vector<int64_t> out(static_cast<size_t>(released.size()));
  for (const Block& block : layout.blocks()) {
    for (size_t i = block.offset; i < block.offset + block.size; ++i) {
      const double units = std::ldexp(released[static_cast<Eigen::Index>(i)] / block.clip_bound, g);
      EXPECT_EQ(units, std::nearbyint(units)) << block.name << " " << i << " is off the grid";
      out[i] = static_cast<int64_t>(units);
    }
  }
  return out;
}

TEST(GaussianMechanismTest, ZeroNoiseReleaseIsTheGridRoundedClippedSumExactly) {
  const BlockLayout layout = PowerOfTwoLayout();
  EXPECT_EQ(GridExponent(layout.num_blocks()), 20);
  GaussianSumMechanism mechanism(layout);
  std::vector<int64_t> expected(layout.total_size(), 0);
  for (std::vector<double> record : RandomRecords(layout, 500, 1)) {
    ASSERT_TRUE(mechanism.Add(record).ok());
    const std::vector<int64_t> units = GridContribution(layout, record);
    for (size_t i = 0; i < units.size(); ++i) expected[i] += units[i];
  }
  testing::ZeroNoiseSource zero;
  auto release = mechanism.Release(zero, 1.5);
  ASSERT_TRUE(release.ok()) << release.status().ToString();
  EXPECT_EQ(GridUnits(layout, release->noisy_sum), expected);
  EXPECT_FALSE(release->is_private);  // the zero source is not private
  EXPECT_EQ(mechanism.private_counts().accepted, 500u);
  EXPECT_EQ(release->noise.grid_exponent, 20);
}

TEST(GaussianMechanismTest, ZeroNoiseReleaseMatchesClippedSumForGeneralBounds) {
  const BlockLayout layout = MakeLayout({
      {"a", BlockKind::kVector, 6, 0.3},
      {"s", BlockKind::kSymmetricMatrix, 2, 1.7},
      {"b", BlockKind::kVector, 3, 1e3},
  });
  GaussianSumMechanism mechanism(layout);
  Eigen::VectorXd expected = Eigen::VectorXd::Zero(layout.total_size());
  Eigen::VectorXd magnitude = Eigen::VectorXd::Zero(layout.total_size());
  constexpr int kRecords = 500;
  for (std::vector<double> record : RandomRecords(layout, kRecords, 2)) {
    ASSERT_TRUE(mechanism.Add(record).ok());
    ASSERT_TRUE(ClipRecordStatistic(layout, record).ok());
    const Eigen::Map<const Eigen::VectorXd> clipped(record.data(), record.size());
    expected += clipped;
    magnitude += clipped.cwiseAbs();
  }
  testing::ZeroNoiseSource zero;
  auto release = mechanism.Release(zero, 0.8);
  ASSERT_TRUE(release.ok());
  const int g = GridExponent(layout.num_blocks());
  for (const Block& block : layout.blocks()) {
    // Each record's coordinate moves by at most half a grid step.
    const double rounding = kRecords * std::ldexp(0.5, -g) * block.clip_bound;
    for (size_t i = block.offset; i < block.offset + block.size; ++i) {
      const auto j = static_cast<Eigen::Index>(i);
      EXPECT_NEAR(release->noisy_sum[j], expected[j], rounding + 1e-13 * magnitude[j]) << i;
    }
  }
}

TEST(GaussianMechanismTest, NoiseScaleIsSigmaTimesSqrtBlocksTimesBoundPlusTheGridSlack) {
  const BlockLayout layout = PowerOfTwoLayout();
  constexpr double kSigma = 1.3;
  auto stds = NoiseStdPerBlock(layout, kSigma);
  ASSERT_TRUE(stds.ok());
  ASSERT_EQ(stds->size(), 3u);
  for (size_t b = 0; b < 3; ++b) {
    const double exact = kSigma * std::sqrt(3.0) * layout.block(b).clip_bound;
    EXPECT_GE((*stds)[b], exact);  // never below what the accountant assumes
    // ... and above it by the grid slack 2^-10 (0.098 %) and no more.
    EXPECT_NEAR((*stds)[b], exact * (1 + std::ldexp(1.0, -10)), 1e-9 * exact);
  }
  auto noise = DiscreteNoiseFor(layout, kSigma);
  ASSERT_TRUE(noise.ok());
  const uint64_t root = (uint64_t{1} << 20) + (uint64_t{1} << 10);
  EXPECT_EQ(noise->bound_squared, 3 * root * root);
  // σ_g² = ⌈σ²·S·(1 + 2^-40)⌉ + 100, checked in long double against the
  // pieces: at least σ²·S + 100, at most 1 + 2^-39 relative above.
  const long double target = 1.3L * 1.3L * static_cast<long double>(noise->bound_squared);
  EXPECT_GE(static_cast<long double>(noise->sigma2.numerator), target + 100);
  EXPECT_LE(static_cast<long double>(noise->sigma2.numerator),
            target * (1 + std::ldexp(1.0L, -39)) + 101);
  EXPECT_EQ(noise->sigma2.denominator, 1u);
  // Deterministic check of the plumbing: with every draw equal to 1, each
  // coordinate of block b moves by exactly one grid step 2^-20·C_b.
  GaussianSumMechanism mechanism(layout);
  OnesNoiseSource ones;
  auto release = mechanism.Release(ones, kSigma);
  ASSERT_TRUE(release.ok());
  for (size_t b = 0; b < 3; ++b) {
    const Block& block = layout.block(b);
    for (size_t i = block.offset; i < block.offset + block.size; ++i) {
      EXPECT_EQ(release->noisy_sum[i], std::ldexp(block.clip_bound, -20)) << block.name << " " << i;
    }
  }
  EXPECT_EQ(release->noise.sigma2.numerator, noise->sigma2.numerator);
  EXPECT_THAT(DescribeDiscreteNoise(release->noise),
              HasSubstr("discrete-gaussian grid=2^-20 sensitivity^2=" +
                        std::to_string(3 * root * root)));
  // Above the sampler's range: refused, nothing released.
  GaussianSumMechanism big(layout);
  EXPECT_EQ(big.Release(ones, kMaxNoiseMultiplier * 2).status().code(), StatusCode::kOutOfRange);
  EXPECT_FALSE(big.released());
}

TEST(GaussianMechanismTest, EmpiricalNoiseStdPerBlockMatchesConfiguration) {
  const BlockLayout layout = PowerOfTwoLayout();
  constexpr double kSigma = 1.3;
  constexpr int kReleases = 3000;
  const auto records = RandomRecords(layout, 20, 3);
  auto noise = Reproducible(77);
  std::vector<std::vector<double>> noise_by_block(layout.num_blocks());
  GaussianSumMechanism noisy(layout);
  GaussianSumMechanism exact(layout);
  for (int release_index = 0; release_index < kReleases; ++release_index) {
    noisy.Reset();
    exact.Reset();
    if (release_index % 2 == 1) {  // half the releases carry records
      for (const auto& record : records) {
        ASSERT_TRUE(noisy.Add(record).ok());
        ASSERT_TRUE(exact.Add(record).ok());
      }
    }
    auto release = noisy.Release(*noise, kSigma);
    ASSERT_TRUE(release.ok());
    const Eigen::VectorXd sum = ReleaseExactly(exact);
    for (size_t b = 0; b < layout.num_blocks(); ++b) {
      const Block& block = layout.block(b);
      for (size_t i = block.offset; i < block.offset + block.size; ++i) {
        noise_by_block[b].push_back(release->noisy_sum[i] - sum[i]);
      }
    }
  }
  for (size_t b = 0; b < layout.num_blocks(); ++b) {
    const double expected_std = kSigma * std::sqrt(3.0) * layout.block(b).clip_bound;
    const auto& draws = noise_by_block[b];
    const double n = static_cast<double>(draws.size());
    double sum = 0, sum2 = 0;
    for (const double d : draws) {
      sum += d;
      sum2 += d * d;
    }
    const double mean = sum / n;
    const double std = std::sqrt(sum2 / n - mean * mean);
    EXPECT_NEAR(mean, 0.0, 5.0 * expected_std / std::sqrt(n)) << layout.block(b).name;
    // Standard error of the sample std of a normal: std / √(2n).
    EXPECT_NEAR(std, expected_std, 5.0 * expected_std / std::sqrt(2.0 * n))
        << layout.block(b).name;
  }
}

TEST(GaussianMechanismTest, RejectedRecordsAreNeverSummed) {
  const BlockLayout layout = PowerOfTwoLayout();
  GaussianSumMechanism mechanism(layout);
  GaussianSumMechanism reference(layout);
  const auto valid = RandomRecords(layout, 2, 4);
  const double specials[] = {std::numeric_limits<double>::quiet_NaN(),
                             std::numeric_limits<double>::infinity(),
                             -std::numeric_limits<double>::infinity()};
  ASSERT_TRUE(mechanism.Add(valid[0]).ok());
  for (const double special : specials) {
    std::vector<double> bad(layout.total_size(), 1.0);
    bad[7] = special;
    const Status status = mechanism.Add(bad);
    EXPECT_EQ(status.code(), StatusCode::kOutOfRange);
  }
  EXPECT_EQ(mechanism.Add(std::vector<double>(layout.total_size() + 1, 1.0)).code(),
            StatusCode::kInvalidArgument);
  ASSERT_TRUE(mechanism.Add(valid[1]).ok());
  ASSERT_TRUE(reference.Add(valid[0]).ok());
  ASSERT_TRUE(reference.Add(valid[1]).ok());

  EXPECT_EQ(mechanism.private_counts().accepted, 2u);
  EXPECT_EQ(mechanism.private_counts().rejected, 4u);
  const Eigen::VectorXd released = ReleaseExactly(mechanism);
  const Eigen::VectorXd expected = ReleaseExactly(reference);
  EXPECT_TRUE((released.array() == expected.array()).all());
  EXPECT_TRUE(released.allFinite());
}

TEST(GaussianMechanismTest, EmptySumIsStillNoised) {
  const BlockLayout layout = PowerOfTwoLayout();
  GaussianSumMechanism mechanism(layout);
  auto noise = Reproducible(5);
  auto release = mechanism.Release(*noise, 2.0);
  ASSERT_TRUE(release.ok());
  ASSERT_EQ(release->noisy_sum.size(), static_cast<Eigen::Index>(layout.total_size()));
  for (Eigen::Index i = 0; i < release->noisy_sum.size(); ++i) {
    EXPECT_NE(release->noisy_sum[i], 0.0) << "coordinate " << i << " was not noised";
  }
  EXPECT_EQ(mechanism.private_counts().accepted, 0u);
}

TEST(GaussianMechanismTest, AddingOneAdversarialRecordMovesTheIntegerSumAtMostItsExactBound) {
  const BlockLayout layout = PowerOfTwoLayout();
  const size_t n = layout.total_size();
  const long double sqrt_blocks = std::sqrt(3.0L);
  std::vector<std::vector<double>> adversarial;
  adversarial.push_back(std::vector<double>(n, 1e308));
  adversarial.push_back(std::vector<double>(n, -DBL_MAX));
  adversarial.push_back(std::vector<double>(n, 1e-320));
  adversarial.push_back(std::vector<double>(n, DBL_MIN));
  std::vector<double> single(n, 0.0);
  for (const Block& block : layout.blocks()) single[block.offset] = 1e308;
  adversarial.push_back(single);
  std::vector<double> on_bound(n, 0.0);  // each block exactly at C_b, no clipping
  for (const Block& block : layout.blocks()) {
    const double coordinate = block.clip_bound / std::sqrt(static_cast<double>(block.size));
    for (size_t i = block.offset; i < block.offset + block.size; ++i) on_bound[i] = coordinate;
  }
  adversarial.push_back(on_bound);
  for (auto& record : RandomRecords(layout, 200, 6)) {
    for (double& value : record) value *= 1e3;  // mostly far above the bounds
    adversarial.push_back(record);
  }

  const auto base_records = RandomRecords(layout, 100, 7);
  GaussianSumMechanism base(layout);
  for (const auto& record : base_records) ASSERT_TRUE(base.Add(record).ok());
  const std::vector<int64_t> base_units = GridUnits(layout, ReleaseExactly(base));
  const int g = GridExponent(layout.num_blocks());
  const long double block_bound = std::ldexp(1.0L, g) * (1 + std::ldexp(1.0L, -10));

  for (size_t r = 0; r < adversarial.size(); ++r) {
    SCOPED_TRACE("record " + std::to_string(r));
    // Alone: the record's contribution v in grid units, exactly.
    GaussianSumMechanism alone(layout);
    ASSERT_TRUE(alone.Add(adversarial[r]).ok());
    const Eigen::VectorXd alone_released = ReleaseExactly(alone);
    const std::vector<int64_t> v = GridUnits(layout, alone_released);
    const Eigen::VectorXd contribution = ScaledFromRelease(layout, alone_released);
    long double total_squared = 0;
    for (const Block& block : layout.blocks()) {
      // Exact in integers: Σ v_i² ≤ S_b = (2^g + 2^(g−10))².
      Uint128 squared = 0;
      for (size_t i = block.offset; i < block.offset + block.size; ++i) {
        const auto magnitude = static_cast<Uint128>(v[i] < 0 ? -v[i] : v[i]);
        squared += magnitude * magnitude;
      }
      const uint64_t root = (uint64_t{1} << g) + (uint64_t{1} << (g - 10));
      EXPECT_LE(squared, static_cast<Uint128>(root) * root) << block.name;
      const long double block_norm = Norm(contribution, block.offset, block.size);
      EXPECT_LE(block_norm, 1.0L + std::ldexp(1.0L, -10)) << block.name;
      total_squared += std::ldexp(static_cast<long double>(squared), 0) / (block_bound * block_bound);
    }
    EXPECT_LE(std::sqrt(total_squared), sqrt_blocks);

    // Added to a non-empty sum, the record contributes exactly v whatever
    // the sum holds (integer addition).
    GaussianSumMechanism with_record(layout);
    for (const auto& record : base_records) ASSERT_TRUE(with_record.Add(record).ok());
    ASSERT_TRUE(with_record.Add(adversarial[r]).ok());
    const std::vector<int64_t> new_units = GridUnits(layout, ReleaseExactly(with_record));
    for (size_t i = 0; i < new_units.size(); ++i) {
      EXPECT_EQ(new_units[i], base_units[i] + v[i]) << "coordinate " << i;
    }
  }
}

TEST(GaussianMechanismTest, ARoundingThatWouldPassTheBoundIsShrunkUntilTheIntegerNormFits) {
  // 5·10^6 coordinates, each just past half-way to the next grid point and
  // rounded up: the block's norm is ≤ 1, the rounded one would exceed
  // (1 + 2^-10)·2^g. The mechanism must shrink it and still keep Σ n² ≤ S_b.
  constexpr size_t kSize = 5'000'000;
  const BlockLayout layout = MakeLayout({{"big", BlockKind::kVector, kSize, 1.0}});
  const int g = GridExponent(1);
  // All but one coordinate at 460.51 grid units (rounded up to 461), one
  // coordinate padding the norm to 0.99999.
  constexpr double kFraction = 460.51;
  const long double unit = std::ldexp(1.0L, g);
  const long double rest = 0.99999L * unit * unit - (kSize - 1) * static_cast<long double>(kFraction) * kFraction;
  ASSERT_GT(rest, 0);
  std::vector<double> record(kSize, std::ldexp(kFraction, -g));
  record[0] = static_cast<double>(std::sqrt(rest) / unit);
  long double norm2 = 0, rounded2 = 0;
  for (const double x : record) {
    norm2 += static_cast<long double>(x) * x;
    const long double n = std::nearbyint(std::ldexp(static_cast<long double>(x), g));
    rounded2 += n * n;
  }
  ASSERT_LE(norm2, 1.0L);
  const long double bound_root = unit + std::ldexp(1.0L, g - 10);
  ASSERT_GT(rounded2, bound_root * bound_root);  // plain rounding would break the bound
  GaussianSumMechanism mechanism(layout);
  ASSERT_TRUE(mechanism.Add(record).ok());
  const std::vector<int64_t> units = GridUnits(layout, ReleaseExactly(mechanism));
  Uint128 squared = 0;
  for (const int64_t n : units) squared += static_cast<Uint128>(n * n);
  const uint64_t root = (uint64_t{1} << g) + (uint64_t{1} << (g - 10));
  EXPECT_LE(squared, static_cast<Uint128>(root) * root);
  EXPECT_GT(squared, 0u);  // shrunk, not zeroed
}

TEST(GaussianMechanismTest, IntegerSumsAreIdenticalForAnyRecordOrderAndMergeTree) {
  const BlockLayout layout = MakeLayout({
      {"a", BlockKind::kVector, 7, 0.3},
      {"s", BlockKind::kSymmetricMatrix, 3, 1.7},
  });
  auto records = RandomRecords(layout, 300, 11);
  GaussianSumMechanism forward(layout);
  for (const auto& record : records) ASSERT_TRUE(forward.Add(record).ok());
  const Eigen::VectorXd reference = ReleaseExactly(forward);
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 5; ++trial) {
    std::shuffle(records.begin(), records.end(), rng);
    // Spread the shuffled records over 1..4 partials, merged in a random order.
    const size_t parts = 1 + trial % 4;
    std::vector<std::unique_ptr<GaussianSumMechanism>> partials;
    for (size_t p = 0; p < parts; ++p) partials.push_back(std::make_unique<GaussianSumMechanism>(layout));
    for (size_t r = 0; r < records.size(); ++r) {
      ASSERT_TRUE(partials[(r * 7 + trial) % parts]->Add(records[r]).ok());
    }
    std::shuffle(partials.begin(), partials.end(), rng);
    GaussianSumMechanism total(layout);
    for (auto& partial : partials) ASSERT_TRUE(total.Merge(std::move(*partial)).ok());
    const Eigen::VectorXd released = ReleaseExactly(total);
    EXPECT_TRUE((released.array() == reference.array()).all()) << "trial " << trial;
  }
  // The floating-point sum of the same records is not order-independent:
  // this is what the test would catch in the old mechanism.
  double forward_sum = 0, backward_sum = 0;
  for (size_t r = 0; r < records.size(); ++r) forward_sum += records[r][0] * 1e-3 + 1.0 / (r + 3);
  for (size_t r = records.size(); r-- > 0;) backward_sum += records[r][0] * 1e-3 + 1.0 / (r + 3);
  EXPECT_NE(forward_sum, backward_sum);
}

TEST(GaussianMechanismTest, EveryReleasedValueIsOnTheGridWhateverTheNeighbouringData) {
  // Two neighbouring datasets (D and D plus one record), many private
  // releases each: every value on both sides is an integer number of grid
  // steps, so no output can occur on one side and be impossible on the other
  // (the low-order-bit attack). The continuous Gaussian fails this.
  const BlockLayout layout = MakeLayout({
      {"a", BlockKind::kVector, 4, 0.75},
      {"s", BlockKind::kSymmetricMatrix, 2, 3.0},
  });
  const auto records = RandomRecords(layout, 30, 12);
  auto noise = Reproducible(99);
  std::vector<std::vector<int64_t>> residues(2);
  for (int side = 0; side < 2; ++side) {
    for (int release_index = 0; release_index < 2000; ++release_index) {
      GaussianSumMechanism mechanism(layout);
      for (size_t r = 0; r < records.size() - (side == 0 ? 1 : 0); ++r) {
        ASSERT_TRUE(mechanism.Add(records[r]).ok());
      }
      auto release = mechanism.Release(*noise, 0.7);
      ASSERT_TRUE(release.ok());
      const std::vector<int64_t> units = GridUnits(layout, release->noisy_sum);
      if (::testing::Test::HasFailure()) return;
      residues[side].push_back(units[0] & 0xff);
    }
  }
  // Low bits are spread over the same classes on both sides.
  std::vector<int> seen0(256, 0), seen1(256, 0);
  for (const int64_t r : residues[0]) ++seen0[static_cast<size_t>(r)];
  for (const int64_t r : residues[1]) ++seen1[static_cast<size_t>(r)];
  int both = 0;
  for (int c = 0; c < 256; ++c) both += seen0[c] > 0 && seen1[c] > 0;
  EXPECT_GT(both, 200);
  // The floating-point mechanism's outputs x + σ·N(0, 1) are off the grid.
  auto floating = Reproducible(100);
  std::vector<double> draws(100);
  floating->FillStandardNormal(draws);
  int off_grid = 0;
  for (const double z : draws) {
    const double units = std::ldexp((0.3 + 0.7 * std::sqrt(2.0) * 0.75 * z) / 0.75, 20);
    off_grid += units != std::nearbyint(units);
  }
  EXPECT_GT(off_grid, 95);
}

TEST(GaussianMechanismTest, ReleaseRequiresAPositiveFiniteNoiseMultiplier) {
  const BlockLayout layout = PowerOfTwoLayout();
  GaussianSumMechanism mechanism(layout);
  auto noise = Reproducible(1);
  for (const double sigma : {0.0, -1.0, std::numeric_limits<double>::quiet_NaN(),
                             std::numeric_limits<double>::infinity()}) {
    auto release = mechanism.Release(*noise, sigma);
    ASSERT_FALSE(release.ok()) << sigma;
    EXPECT_EQ(release.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(release.status().message(), HasSubstr("ReleaseNonPrivate()"));
    EXPECT_FALSE(mechanism.released());
  }
  EXPECT_TRUE(mechanism.Release(*noise, 1.0).ok());
}

TEST(GaussianMechanismTest, PrivacyFlagOfEachReleasePath) {
  const BlockLayout layout = PowerOfTwoLayout();
  GaussianSumMechanism mechanism(layout);
  auto secure = SecureNoiseSource::Create();
  ASSERT_TRUE(secure.ok());
  auto private_release = mechanism.Release(**secure, 1.0);
  ASSERT_TRUE(private_release.ok());
  EXPECT_TRUE(private_release->is_private);
  EXPECT_EQ(private_release->noise_multiplier, 1.0);
  EXPECT_EQ(private_release->noise_description, "chacha20-os-seeded");

  mechanism.Reset();
  auto seeded = Reproducible(2);
  auto seeded_release = mechanism.Release(*seeded, 1.0);
  ASSERT_TRUE(seeded_release.ok());
  EXPECT_FALSE(seeded_release->is_private);

  mechanism.Reset();
  auto baseline = mechanism.ReleaseNonPrivate();
  ASSERT_TRUE(baseline.ok());
  EXPECT_FALSE(baseline->is_private);
  EXPECT_EQ(baseline->noise_multiplier, 0.0);
  EXPECT_THAT(baseline->noise_description, HasSubstr("NOT PRIVATE"));
}

TEST(GaussianMechanismTest, OneReleasePerStepUntilReset) {
  const BlockLayout layout = PowerOfTwoLayout();
  GaussianSumMechanism mechanism(layout);
  const auto records = RandomRecords(layout, 3, 8);
  ASSERT_TRUE(mechanism.Add(records[0]).ok());
  auto noise = Reproducible(3);
  ASSERT_TRUE(mechanism.Release(*noise, 1.0).ok());
  EXPECT_TRUE(mechanism.released());
  EXPECT_EQ(mechanism.Add(records[1]).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(mechanism.Release(*noise, 1.0).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(mechanism.ReleaseNonPrivate().status().code(), StatusCode::kFailedPrecondition);

  mechanism.Reset();
  EXPECT_FALSE(mechanism.released());
  EXPECT_EQ(mechanism.private_counts().accepted, 0u);
  EXPECT_EQ(mechanism.private_counts().rejected, 0u);
  // The previous step's records are gone.
  EXPECT_TRUE(ReleaseExactly(mechanism).isZero(0.0));
}

// Issue 30: noise drawn ahead (before the sum is complete, on another
// thread) is the noise Release would have drawn at that point of the
// source's stream, so the release is bit for bit the same; it covers one
// release of its own layout and grid only.
TEST(GaussianMechanismTest, NoiseDrawnAheadIsTheNoiseReleaseWouldDrawAndIsUsedOnce) {
  const BlockLayout layout = PowerOfTwoLayout();
  const auto records = RandomRecords(layout, 5, 11);
  GaussianSumMechanism inline_noise(layout), ahead(layout);
  auto source_a = Reproducible(9);
  auto source_b = Reproducible(9);
  auto prepared = GaussianSumMechanism::PrepareNoise(layout, *source_b, 1.5);
  ASSERT_TRUE(prepared.ok()) << prepared.status().ToString();
  EXPECT_TRUE(prepared->ready());
  for (const auto& record : records) {
    ASSERT_TRUE(inline_noise.Add(record).ok());
    ASSERT_TRUE(ahead.Add(record).ok());
  }
  auto expected = inline_noise.Release(*source_a, 1.5);
  auto released = ahead.Release(std::move(*prepared));
  ASSERT_TRUE(expected.ok() && released.ok()) << released.status().ToString();
  EXPECT_FALSE(prepared->ready());  // consumed by the move
  EXPECT_EQ(released->noisy_sum, expected->noisy_sum);  // bit for bit
  EXPECT_EQ(released->noise_multiplier, 1.5);
  EXPECT_EQ(released->noise_description, expected->noise_description);
  EXPECT_EQ(DescribeDiscreteNoise(released->noise), DescribeDiscreteNoise(expected->noise));
  EXPECT_FALSE(released->is_private);  // a fixed-seed source says so
  // Not the zero noise: the release differs from the exact sum.
  GaussianSumMechanism exact(layout);
  for (const auto& record : records) ASSERT_TRUE(exact.Add(record).ok());
  EXPECT_NE(released->noisy_sum, ReleaseExactly(exact));

  // A consumed (moved-from) draw, or one for another layout, releases nothing.
  GaussianSumMechanism again(layout);
  ASSERT_TRUE(again.Add(records[0]).ok());
  GaussianSumMechanism::PreparedNoise consumed = std::move(*prepared);
  EXPECT_EQ(again.Release(std::move(consumed)).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_FALSE(again.released());
  const BlockLayout other = MakeLayout({{"a", BlockKind::kVector, 7, 2.0}});
  auto foreign = GaussianSumMechanism::PrepareNoise(other, *source_b, 1.5);
  ASSERT_TRUE(foreign.ok());
  EXPECT_EQ(again.Release(std::move(*foreign)).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_FALSE(again.released());
  EXPECT_EQ(GaussianSumMechanism::PrepareNoise(layout, *source_b, 0).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(GaussianMechanismTest, ResetEmptiesAnUnreleasedSum) {
  // A step abandoned before its release (the step driver reuses its
  // accumulators): Reset must drop what was added, dense or sparse, and a
  // reset of an already empty sum must leave it empty.
  const BlockLayout layout = PowerOfTwoLayout();
  GaussianSumMechanism mechanism(layout);
  const auto records = RandomRecords(layout, 2, 10);
  const std::vector<uint32_t> indices = {1, 4};
  const std::vector<double> values = {0.5, -0.25};
  for (int round = 0; round < 3; ++round) {
    ASSERT_TRUE(mechanism.AddSparse(indices, values).ok());  // sparse only
    mechanism.Reset();
    EXPECT_TRUE(ReleaseExactly(mechanism).isZero(0.0)) << round;
    mechanism.Reset();
    ASSERT_TRUE(mechanism.Add(records[0]).ok());  // dense only
    mechanism.Reset();
    EXPECT_TRUE(ReleaseExactly(mechanism).isZero(0.0)) << round;
    mechanism.Reset();
    ASSERT_TRUE(mechanism.Add(records[0]).ok());
    ASSERT_TRUE(mechanism.AddSparse(indices, values).ok());
    mechanism.Reset();
    mechanism.Reset();
    EXPECT_TRUE(ReleaseExactly(mechanism).isZero(0.0)) << round;
    mechanism.Reset();
    ASSERT_TRUE(mechanism.Add(records[1]).ok());
    GaussianSumMechanism expected(layout);
    ASSERT_TRUE(expected.Add(records[1]).ok());
    EXPECT_EQ(ReleaseExactly(mechanism), ReleaseExactly(expected)) << round;
    mechanism.Reset();
  }
}

TEST(GaussianMechanismTest, MergeCombinesSumsAndCounts) {
  const BlockLayout layout = PowerOfTwoLayout();
  const auto records = RandomRecords(layout, 40, 9);
  GaussianSumMechanism all(layout), first(layout), second(layout);
  for (size_t r = 0; r < records.size(); ++r) {
    ASSERT_TRUE(all.Add(records[r]).ok());
    ASSERT_TRUE((r < 25 ? first : second).Add(records[r]).ok());
  }
  ASSERT_EQ(second.Add(std::vector<double>(3, 0.0)).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(first.Merge(std::move(second)).ok());
  EXPECT_EQ(first.private_counts().accepted, 40u);
  EXPECT_EQ(first.private_counts().rejected, 1u);
  const Eigen::VectorXd merged = ReleaseExactly(first);
  const Eigen::VectorXd sequential = ReleaseExactly(all);
  EXPECT_TRUE(merged.isApprox(sequential, 1e-13));
  EXPECT_GT(merged.norm(), 1.0);

  // The merged-from accumulator is consumed: its records cannot be released
  // a second time, and after Reset it starts empty.
  EXPECT_TRUE(second.released());
  EXPECT_EQ(second.ReleaseNonPrivate().status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(second.Add(records[0]).code(), StatusCode::kFailedPrecondition);
  second.Reset();
  EXPECT_TRUE(ReleaseExactly(second).isZero(0.0));

  // Merging into an empty accumulator (it takes over the other's buffer)
  // gives exactly what adding gives; the consumed side is empty after Reset
  // and usable again.
  GaussianSumMechanism into_empty(layout), into_nonempty(layout), head(layout), tail(layout),
      tail_copy(layout);
  for (size_t r = 0; r < records.size(); ++r) {
    if (r < 10) {
      ASSERT_TRUE(head.Add(records[r]).ok());
      ASSERT_TRUE(into_nonempty.Add(records[r]).ok());
    } else {
      ASSERT_TRUE(tail.Add(records[r]).ok());
      ASSERT_TRUE(tail_copy.Add(records[r]).ok());
    }
  }
  ASSERT_TRUE(into_empty.Merge(std::move(head)).ok());          // takes the buffer
  ASSERT_TRUE(into_empty.Merge(std::move(tail)).ok());          // adds
  ASSERT_TRUE(into_nonempty.Merge(std::move(tail_copy)).ok());  // adds
  EXPECT_EQ(into_empty.private_counts().accepted, into_nonempty.private_counts().accepted);
  EXPECT_EQ(ReleaseExactly(into_empty), ReleaseExactly(into_nonempty));  // bit for bit
  head.Reset();
  EXPECT_TRUE(ReleaseExactly(head).isZero(0.0));
  head.Reset();
  GaussianSumMechanism single(layout);
  ASSERT_TRUE(head.Add(records[0]).ok());
  ASSERT_TRUE(single.Add(records[0]).ok());
  EXPECT_EQ(ReleaseExactly(head), ReleaseExactly(single));

  GaussianSumMechanism other_layout(MakeLayout({{"a", BlockKind::kVector, 15, 2.0}}));
  GaussianSumMechanism fresh(layout);
  ASSERT_TRUE(fresh.Add(records[0]).ok());
  EXPECT_EQ(fresh.Merge(std::move(other_layout)).code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(other_layout.released());  // untouched on error
  EXPECT_EQ(fresh.Merge(std::move(first)).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(fresh.Merge(std::move(fresh)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(fresh.private_counts().accepted, 1u);
}

TEST(GaussianMechanismTest, MovedFromMechanismIsEmpty) {
  const BlockLayout layout = PowerOfTwoLayout();
  GaussianSumMechanism original(layout);
  ASSERT_TRUE(original.Add(RandomRecords(layout, 1, 10)[0]).ok());
  GaussianSumMechanism moved(std::move(original));
  EXPECT_EQ(moved.private_counts().accepted, 1u);
  EXPECT_FALSE(ReleaseExactly(moved).isZero(0.0));
  // NOLINTNEXTLINE(bugprone-use-after-move): checking the moved-from state.
  EXPECT_EQ(original.layout().total_size(), 0u);
  EXPECT_EQ(original.Add(std::vector<double>(layout.total_size(), 1.0)).code(),
            StatusCode::kInvalidArgument);
}

TEST(GaussianMechanismTest, NoiseStdPerBlockValidatesSigma) {
  const BlockLayout layout = PowerOfTwoLayout();
  EXPECT_EQ(NoiseStdPerBlock(layout, -0.1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(NoiseStdPerBlock(layout, std::numeric_limits<double>::quiet_NaN()).status().code(),
            StatusCode::kInvalidArgument);
  auto zero = NoiseStdPerBlock(layout, 0.0);
  ASSERT_TRUE(zero.ok());
  EXPECT_EQ(*zero, std::vector<double>(3, 0.0));
}

TEST(GaussianMechanismTest, SparseAddIsExactlyTheDenseAdd) {
  // Three blocks with unequal bounds; random sparse records with norms from
  // tiny to huge, some far above their bounds.
  auto layout = BlockLayout::Create({{"a", BlockKind::kVector, 7, 0.3},
                                     {"b", BlockKind::kSymmetricMatrix, 3, 2.5},
                                     {"c", BlockKind::kVector, 11, 1e-3}});
  ASSERT_TRUE(layout.ok());
  GaussianSumMechanism dense(*layout), sparse(*layout);
  std::mt19937_64 rng(12);
  std::uniform_real_distribution<double> unit(-1, 1), exponent(-200, 200);
  for (int r = 0; r < 2000; ++r) {
    std::vector<double> record(layout->total_size(), 0.0);
    std::vector<uint32_t> indices;
    std::vector<double> values;
    for (uint32_t i = 0; i < record.size(); ++i) {
      if (rng() % 3 == 0) continue;
      record[i] = unit(rng) * std::pow(10.0, exponent(rng) / 10);
      indices.push_back(i);
      values.push_back(record[i]);
    }
    ASSERT_TRUE(dense.Add(record).ok());
    ASSERT_TRUE(sparse.AddSparse(indices, values).ok());
  }
  auto a = dense.ReleaseNonPrivate();
  auto b = sparse.ReleaseNonPrivate();
  ASSERT_TRUE(a.ok() && b.ok());
  // Equal up to the pessimistic rounding margin, which counts the listed
  // coordinates (sparse) rather than the block size (dense).
  EXPECT_LE((a->noisy_sum - b->noisy_sum).cwiseAbs().maxCoeff(),
            1e-12 * a->noisy_sum.cwiseAbs().maxCoeff());
}

TEST(GaussianMechanismTest, MergingSparseChunkSumsIsBitwiseOneSum) {
  // The step driver sums chunks of records into reused accumulators and
  // merges them in order; Merge and Reset of a sparse sum only visit the
  // pages it touched. The result must be bit-for-bit the sum of the chunk
  // sums added densely, also when an accumulator is reused after Reset (stale
  // pages would leak into the next chunk), when one chunk is dense, and when
  // a layout's size is not a multiple of the page size.
  auto layout = BlockLayout::Create({{"a", BlockKind::kVector, 1003, 4.0},
                                     {"b", BlockKind::kVector, 37, 0.5}});
  ASSERT_TRUE(layout.ok());
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> unit(0, 1);
  auto random_sparse = [&](std::vector<uint32_t>* indices, std::vector<double>* values) {
    indices->clear();
    values->clear();
    for (uint32_t i = 0; i < layout->total_size(); ++i) {
      if (rng() % 50 != 0) continue;
      indices->push_back(i);
      values->push_back(unit(rng));
    }
  };
  GaussianSumMechanism total(*layout);
  Eigen::VectorXd expected = Eigen::VectorXd::Zero(static_cast<Eigen::Index>(layout->total_size()));
  GaussianSumMechanism chunk(*layout);
  std::vector<uint32_t> indices;
  std::vector<double> values;
  for (int c = 0; c < 30; ++c) {
    GaussianSumMechanism reference(*layout);  // the chunk's sum, built densely
    for (int r = 0; r < 5; ++r) {
      random_sparse(&indices, &values);
      if (c == 11 && r == 2) {  // one dense record: the chunk is tracked as dense
        std::vector<double> dense(layout->total_size(), 0.0);
        for (size_t i = 0; i < indices.size(); ++i) dense[indices[i]] = values[i];
        ASSERT_TRUE(chunk.Add(dense).ok());
        ASSERT_TRUE(reference.Add(dense).ok());
        continue;
      }
      ASSERT_TRUE(chunk.AddSparse(indices, values).ok());
      ASSERT_TRUE(reference.AddSparse(indices, values).ok());
    }
    auto chunk_sum = reference.ReleaseNonPrivate();
    ASSERT_TRUE(chunk_sum.ok());
    Eigen::VectorXd scaled = chunk_sum->noisy_sum;
    scaled.head(1003) /= 4.0;  // power-of-two bounds: exact
    scaled.tail(37) /= 0.5;
    expected += scaled;
    ASSERT_TRUE(total.Merge(std::move(chunk)).ok());
    chunk.Reset();  // reused, as the driver does
  }
  auto released = total.ReleaseNonPrivate();
  ASSERT_TRUE(released.ok());
  Eigen::VectorXd got = released->noisy_sum;
  got.head(1003) /= 4.0;
  got.tail(37) /= 0.5;
  for (Eigen::Index i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], expected[i]) << i;
  // After the release and a Reset the accumulator is all zeros again.
  total.Reset();
  auto empty = total.ReleaseNonPrivate();
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->noisy_sum.cwiseAbs().maxCoeff(), 0.0);
}

TEST(GaussianMechanismTest, SparseAddRejectsMalformedInputAndSumsNothing) {
  auto layout = BlockLayout::Create({{"a", BlockKind::kVector, 5, 1.0}});
  ASSERT_TRUE(layout.ok());
  GaussianSumMechanism mechanism(*layout);
  const std::vector<double> two = {0.5, 0.5};
  EXPECT_FALSE(mechanism.AddSparse(std::vector<uint32_t>{1, 1}, two).ok());  // duplicate
  EXPECT_FALSE(mechanism.AddSparse(std::vector<uint32_t>{3, 1}, two).ok());  // unsorted
  EXPECT_FALSE(mechanism.AddSparse(std::vector<uint32_t>{1, 5}, two).ok());  // out of range
  EXPECT_FALSE(mechanism.AddSparse(std::vector<uint32_t>{1}, two).ok());     // length
  EXPECT_FALSE(mechanism.AddSparse(std::vector<uint32_t>{0, 1},
                                   std::vector<double>{1.0, NAN}).ok());
  EXPECT_FALSE(mechanism.AddSparse(std::vector<uint32_t>{0, 1},
                                   std::vector<double>{INFINITY, 1.0}).ok());
  EXPECT_EQ(mechanism.private_counts().accepted, 0u);
  EXPECT_EQ(mechanism.private_counts().rejected, 6u);
  auto release = mechanism.ReleaseNonPrivate();
  ASSERT_TRUE(release.ok());
  EXPECT_EQ(release->noisy_sum, Eigen::VectorXd::Zero(5));
}


// ---- Partial-sum transfer (scale-out, issue 16) ----

// A sum over a large sparse layout (pages tracked) and a dense one.
void FillSparse(GaussianSumMechanism& m, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (int r = 0; r < 20; ++r) {
    std::vector<uint32_t> indices;
    std::vector<double> values;
    for (uint32_t i = static_cast<uint32_t>(rng() % 50); i < 4000; i += 1 + rng() % 400) {
      indices.push_back(i);
      values.push_back(std::ldexp(static_cast<double>(rng() % 1000) - 500, -7));
    }
    ASSERT_TRUE(m.AddSparse(indices, values).ok());
  }
}

TEST(GaussianMechanismTest, TransferredPartialSumsMergeToTheSameBits) {
  const BlockLayout layout = MakeLayout({{"w", BlockKind::kVector, 4000, 3.0}});
  for (const bool dense : {false, true}) {
    // Local: a + b merged in one process. Remote: b encoded, decoded, merged.
    GaussianSumMechanism a1(layout), b1(layout), a2(layout), b2(layout);
    FillSparse(a1, 1);
    FillSparse(a2, 1);
    FillSparse(b1, 2);
    FillSparse(b2, 2);
    if (dense) {
      std::vector<double> record(4000, 0.25);
      ASSERT_TRUE(b1.Add(record).ok());
      ASSERT_TRUE(b2.Add(record).ok());
    }
    auto bytes = b2.EncodeUnreleased();
    ASSERT_TRUE(bytes.ok());
    EXPECT_FALSE(b2.released());  // encoding releases nothing
    auto decoded = GaussianSumMechanism::DecodeUnreleased(layout, *bytes);
    ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
    EXPECT_EQ((*decoded)->private_counts().accepted, b2.private_counts().accepted);
    ASSERT_TRUE(a1.Merge(std::move(b1)).ok());
    ASSERT_TRUE(a2.Merge(std::move(**decoded)).ok());
    auto x = a1.ReleaseNonPrivate();
    auto y = a2.ReleaseNonPrivate();
    ASSERT_TRUE(x.ok() && y.ok());
    ASSERT_EQ(x->noisy_sum.size(), y->noisy_sum.size());
    EXPECT_EQ(std::memcmp(x->noisy_sum.data(), y->noisy_sum.data(),
                          sizeof(double) * static_cast<size_t>(x->noisy_sum.size())),
              0)
        << (dense ? "dense" : "sparse");
    // A zero partial round-trips to a zero partial.
    GaussianSumMechanism zero(layout);
    auto zero_bytes = zero.EncodeUnreleased();
    ASSERT_TRUE(zero_bytes.ok());
    auto zero_back = GaussianSumMechanism::DecodeUnreleased(layout, *zero_bytes);
    ASSERT_TRUE(zero_back.ok());
    auto zero_release = (*zero_back)->ReleaseNonPrivate();
    ASSERT_TRUE(zero_release.ok());
    EXPECT_EQ(zero_release->noisy_sum.cwiseAbs().maxCoeff(), 0.0);
  }
}

TEST(GaussianMechanismTest, TransferRefusesCorruptForeignAndReleasedPartials) {
  const BlockLayout layout = MakeLayout({{"w", BlockKind::kVector, 4000, 3.0}});
  GaussianSumMechanism m(layout);
  FillSparse(m, 3);
  auto bytes = m.EncodeUnreleased();
  ASSERT_TRUE(bytes.ok());
  // Every single flipped bit in a sample of positions is caught (checksum).
  for (size_t pos = 0; pos < bytes->size(); pos += 97) {
    std::string bad = *bytes;
    bad[pos] = static_cast<char>(bad[pos] ^ 0x10);
    EXPECT_EQ(GaussianSumMechanism::DecodeUnreleased(layout, bad).status().code(),
              StatusCode::kDataLoss)
        << pos;
  }
  EXPECT_EQ(GaussianSumMechanism::DecodeUnreleased(layout, bytes->substr(0, 50)).status().code(),
            StatusCode::kDataLoss);
  EXPECT_EQ(GaussianSumMechanism::DecodeUnreleased(layout, "").status().code(),
            StatusCode::kDataLoss);
  // Same size, another clip bound: another mechanism, refused.
  const BlockLayout other = MakeLayout({{"w", BlockKind::kVector, 4000, 3.5}});
  auto foreign = GaussianSumMechanism::DecodeUnreleased(other, *bytes);
  EXPECT_EQ(foreign.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(foreign.status().message(), HasSubstr("another statistic layout"));
  // A released sum cannot be exported (it could be released a second time).
  auto release = m.ReleaseNonPrivate();
  ASSERT_TRUE(release.ok());
  EXPECT_EQ(m.EncodeUnreleased().status().code(), StatusCode::kFailedPrecondition);
}

// Issue 30: a partial's grid integers go as zigzag varints (a dense sum of
// clipped records is mostly small numbers), and a partial of the earlier
// fixed-width format is named, not taken for junk.
TEST(GaussianMechanismTest, APartialsIntegersGoAsVarintsAndAnOlderFormatIsNamed) {
  const BlockLayout layout = PowerOfTwoLayout();
  const BlockLayout wide = MakeLayout({{"w", BlockKind::kVector, 4000, 3.0}});
  GaussianSumMechanism dense(wide);
  for (const auto& record : RandomRecords(wide, 50, 8)) ASSERT_TRUE(dense.Add(record).ok());
  auto bytes = dense.EncodeUnreleased();
  ASSERT_TRUE(bytes.ok());
  EXPECT_LT(bytes->size(), 5 * wide.total_size()) << "not smaller than 8-byte integers";
  auto back = GaussianSumMechanism::DecodeUnreleased(wide, *bytes);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*(*back)->EncodeUnreleased(), *bytes);  // the same integers
  // The magic of the fixed-width format, re-signed: refused by name.
  GaussianSumMechanism small(layout);
  for (const auto& record : RandomRecords(layout, 3, 9)) ASSERT_TRUE(small.Add(record).ok());
  std::string old = *small.EncodeUnreleased();
  old[3] = '2';
  unsigned char digest[32];
  crypto_generichash(digest, sizeof digest, reinterpret_cast<const unsigned char*>(old.data()),
                     old.size() - sizeof digest, nullptr, 0);
  old.replace(old.size() - sizeof digest, sizeof digest, reinterpret_cast<const char*>(digest),
              sizeof digest);
  const auto refused = GaussianSumMechanism::DecodeUnreleased(layout, old);
  EXPECT_EQ(refused.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(refused.status().message(), HasSubstr("older vipsd"));
}

// A partial's coordinates are checked against what its records can reach
// (accepted × the largest grid value of one record), at the boundary and
// in both checksum modes: kVerifiedByCaller skips only the trailing digest.
TEST(GaussianMechanismTest, APartialsCoordinatesBeyondWhatItsRecordsCanReachAreRefused) {
  const BlockLayout layout = MakeLayout({{"w", BlockKind::kVector, 4, 1.0}});
  const int g = GridExponent(layout.num_blocks());
  const int64_t reach = 3 * ((int64_t{1} << g) + (int64_t{1} << (g - kGridSlackBits)));
  // Magic, layout digest and total size from a real encoding.
  const std::string prefix = GaussianSumMechanism(layout).EncodeUnreleased()->substr(0, 4 + 32 + 8);
  auto put_u64 = [](std::string& out, uint64_t v) {
    for (int b = 0; b < 8; ++b) out.push_back(static_cast<char>(v >> (8 * b)));
  };
  auto put_zigzag = [](std::string& out, int64_t m) {
    uint64_t z = (static_cast<uint64_t>(m) << 1) ^ static_cast<uint64_t>(m >> 63);
    while (z >= 0x80) {
      out.push_back(static_cast<char>((z & 0x7f) | 0x80));
      z >>= 7;
    }
    out.push_back(static_cast<char>(z));
  };
  // A dense partial of 3 records with these coordinates; `truncated` sets
  // the continuation bit of the last varint's last byte.
  auto partial = [&](const std::vector<int64_t>& values, bool truncated) {
    std::string out = prefix;
    put_u64(out, 3);  // accepted
    put_u64(out, 0);  // rejected
    out.push_back(2);  // dense
    for (const int64_t v : values) put_zigzag(out, v);
    if (truncated) out.back() = static_cast<char>(out.back() | 0x80);
    unsigned char digest[32];
    crypto_generichash(digest, sizeof digest, reinterpret_cast<const unsigned char*>(out.data()),
                       out.size(), nullptr, 0);
    out.append(reinterpret_cast<const char*>(digest), sizeof digest);
    return out;
  };
  using Checksum = GaussianSumMechanism::Checksum;
  for (const Checksum checksum : {Checksum::kVerify, Checksum::kVerifiedByCaller}) {
    SCOPED_TRACE(checksum == Checksum::kVerify ? "verify" : "verified by caller");
    for (const std::vector<int64_t>& values :
         std::vector<std::vector<int64_t>>{{reach, -reach, 0, 1}, {63, 64, -64, -65}}) {
      const std::string bytes = partial(values, false);
      auto back = GaussianSumMechanism::DecodeUnreleased(layout, bytes, checksum);
      ASSERT_TRUE(back.ok()) << back.status().ToString();
      EXPECT_EQ(*(*back)->EncodeUnreleased(), bytes);  // the same integers
    }
    for (const std::vector<int64_t>& values : std::vector<std::vector<int64_t>>{
             {reach + 1, 0, 0, 0}, {0, 0, 0, -reach - 1}, {0, std::numeric_limits<int64_t>::min(), 0, 0}}) {
      auto back = GaussianSumMechanism::DecodeUnreleased(layout, partial(values, false), checksum);
      EXPECT_EQ(back.status().code(), StatusCode::kDataLoss);
      EXPECT_THAT(back.status().message(), HasSubstr("out of reach"));
    }
    auto truncated = GaussianSumMechanism::DecodeUnreleased(layout, partial({1, 2, 3, 4}, true), checksum);
    EXPECT_EQ(truncated.status().code(), StatusCode::kDataLoss);
  }
  // A wrong trailing digest: refused when verified here, not when the
  // caller verified a checksum over these bytes.
  std::string unsigned_bytes = partial({1, 2, 3, 4}, false);
  unsigned_bytes.back() = static_cast<char>(unsigned_bytes.back() ^ 1);
  EXPECT_THAT(GaussianSumMechanism::DecodeUnreleased(layout, unsigned_bytes).status().message(),
              HasSubstr("checksum mismatch"));
  EXPECT_TRUE(GaussianSumMechanism::DecodeUnreleased(layout, unsigned_bytes,
                                                     Checksum::kVerifiedByCaller)
                  .ok());
}

// Issue 30: a plan carries the released sum as grid integers; decoding
// gives back the release's doubles bit for bit, in fewer bytes.
TEST(GaussianMechanismTest, AReleasedSumRoundTripsBitForBitInFewerBytes) {
  // Bounds that are not powers of two: the scaling by C_b rounds.
  const BlockLayout layout = MakeLayout({{"a", BlockKind::kVector, 3000, 0.7},
                                         {"s", BlockKind::kSymmetricMatrix, 20, 3.3},
                                         {"b", BlockKind::kVector, 1000, 1e-3}});
  for (const double sigma : {0.5, 1.0, 4.0}) {
    SCOPED_TRACE(sigma);
    GaussianSumMechanism sum(layout);
    for (const auto& record : RandomRecords(layout, 50, 3)) ASSERT_TRUE(sum.Add(record).ok());
    auto noise = Reproducible(5);
    auto release = sum.Release(*noise, sigma);
    ASSERT_TRUE(release.ok()) << release.status().ToString();
    auto bytes = GaussianSumMechanism::EncodeReleased(layout, release->noisy_sum);
    ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
    auto back = GaussianSumMechanism::DecodeReleased(layout, *bytes);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    ASSERT_EQ(back->size(), release->noisy_sum.size());
    EXPECT_EQ(std::memcmp(back->data(), release->noisy_sum.data(),
                          sizeof(double) * static_cast<size_t>(back->size())),
              0);
    // The noise is ~σ·2^20 grid units a coordinate: 3-4 bytes, not 8.
    EXPECT_LT(bytes->size(), 5 * layout.total_size() + 100) << bytes->size();
  }
  // The extremes of the grid's range, zero and the smallest steps.
  const double step = std::ldexp(1.0, -GridExponent(layout.num_blocks()));
  Eigen::VectorXd edge = Eigen::VectorXd::Zero(static_cast<Eigen::Index>(layout.total_size()));
  const int64_t limit = int64_t{1} << 62;
  const int64_t values[] = {limit, -limit, 1, -1, 0, (int64_t{1} << 53) + 1};
  for (size_t i = 0; i < std::size(values); ++i) {
    edge[static_cast<Eigen::Index>(i)] = ReleasedValue(values[i], step, 0.7);
  }
  auto edge_bytes = GaussianSumMechanism::EncodeReleased(layout, edge);
  ASSERT_TRUE(edge_bytes.ok()) << edge_bytes.status().ToString();
  auto edge_back = GaussianSumMechanism::DecodeReleased(layout, *edge_bytes);
  ASSERT_TRUE(edge_back.ok()) << edge_back.status().ToString();
  EXPECT_EQ(std::memcmp(edge_back->data(), edge.data(),
                        sizeof(double) * static_cast<size_t>(edge.size())),
            0);
}

TEST(GaussianMechanismTest, AReleasedSumOffTheGridOrOfAnotherLayoutIsRefused) {
  const BlockLayout layout = MakeLayout({{"w", BlockKind::kVector, 100, 3.0}});
  const double step = std::ldexp(1.0, -GridExponent(layout.num_blocks()));
  Eigen::VectorXd on(100);
  for (Eigen::Index i = 0; i < 100; ++i) on[i] = ReleasedValue(i * 977 - 40000, step, 3.0);
  // Off the grid (a non-private release's floats, or anything else), not
  // finite, beyond the grid's range, or of another size: the model goes instead.
  for (const double bad : {0.1234, std::nan(""), HUGE_VAL, 3.0 * 1e30, -0.0}) {
    Eigen::VectorXd off = on;
    off[7] = bad;
    EXPECT_EQ(GaussianSumMechanism::EncodeReleased(layout, off).status().code(),
              StatusCode::kFailedPrecondition)
        << bad;
  }
  EXPECT_EQ(GaussianSumMechanism::EncodeReleased(layout, on.head(99)).status().code(),
            StatusCode::kFailedPrecondition);
  const std::string bytes = *GaussianSumMechanism::EncodeReleased(layout, on);
  ASSERT_TRUE(GaussianSumMechanism::DecodeReleased(layout, bytes).ok());
  // Another statistic layout (another bound), cut short, one byte more, a
  // varint of 11 bytes, another magic: DATA_LOSS.
  const BlockLayout other = MakeLayout({{"w", BlockKind::kVector, 100, 2.0}});
  EXPECT_EQ(GaussianSumMechanism::DecodeReleased(other, bytes).status().code(),
            StatusCode::kDataLoss);
  EXPECT_EQ(GaussianSumMechanism::DecodeReleased(layout, bytes.substr(0, bytes.size() - 1))
                .status()
                .code(),
            StatusCode::kDataLoss);
  EXPECT_EQ(GaussianSumMechanism::DecodeReleased(layout, bytes + '\0').status().code(),
            StatusCode::kDataLoss);
  std::string overlong = bytes.substr(0, bytes.size() - 1) + std::string(10, '\xff') + '\x01';
  EXPECT_EQ(GaussianSumMechanism::DecodeReleased(layout, overlong).status().code(),
            StatusCode::kDataLoss);
  std::string magic = bytes;
  magic[3] = '2';
  EXPECT_EQ(GaussianSumMechanism::DecodeReleased(layout, magic).status().code(),
            StatusCode::kDataLoss);
}

}  // namespace
}  // namespace vipsd::privacy
