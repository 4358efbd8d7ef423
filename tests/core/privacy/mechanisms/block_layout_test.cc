// Tests of the block layout, symmetric packing and per-block L2 clipping.
//
// The reference norm is computed in long double without any scaling: its
// exponent range (x87 extended: up to ~1e4932) holds the square of DBL_MAX
// and of the smallest subnormal, so it shares nothing with the scaled,
// error-bounded norm inside ClipRecordStatistic.
#include "core/privacy/mechanisms/block_layout.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace vipsd::privacy {
namespace {

using ::testing::HasSubstr;

static_assert(std::numeric_limits<long double>::max_exponent10 > 700 &&
                  std::numeric_limits<long double>::min_exponent10 < -700,
              "the reference norm needs a long double wider than double");

long double ReferenceNorm(std::span<const double> values) {
  long double sum = 0;
  for (const double value : values) sum += static_cast<long double>(value) * value;
  return std::sqrt(sum);
}

std::span<const double> BlockOf(const std::vector<double>& record, const Block& block) {
  return std::span<const double>(record).subspan(block.offset, block.size);
}

bool BitwiseEqual(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return false;
  return a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

BlockLayout MakeLayout(std::vector<BlockSpec> specs) {
  auto layout = BlockLayout::Create(std::move(specs));
  EXPECT_TRUE(layout.ok()) << layout.status().ToString();
  return std::move(layout).value();
}

// Bounds from tiny to huge, vector and symmetric blocks, sizes 1 to 50.
BlockLayout MixedLayout() {
  return MakeLayout({
      {"theta", BlockKind::kVector, 7, 1.0},
      {"cov", BlockKind::kSymmetricMatrix, 4, 3.5},
      {"scalar", BlockKind::kVector, 1, 1e-3},
      {"wide", BlockKind::kVector, 50, 1e5},
      {"tiny_bound", BlockKind::kVector, 3, 1e-300},
      {"huge_bound", BlockKind::kVector, 3, 1e300},
  });
}

// Relative precision the clipping documents for an n-coordinate block:
// δ = (n + 4)·DBL_EPSILON.
long double Delta(size_t n) { return (static_cast<long double>(n) + 4) * DBL_EPSILON; }

// Every block's exact norm is ≤ its bound; a block above its bound is always
// clipped, one clearly under it never is; clipped blocks end within 8δ below
// the bound and point in the original direction; unclipped blocks are
// bit-for-bit unchanged. `original` is the record before clipping.
void ExpectClippedCorrectly(const BlockLayout& layout, const std::vector<double>& original,
                            const std::vector<double>& clipped, const ClipReport& report) {
  ASSERT_EQ(report.block_clipped.size(), layout.num_blocks());
  for (size_t index = 0; index < layout.num_blocks(); ++index) {
    const Block& block = layout.block(index);
    const long double bound = block.clip_bound;
    const long double delta = Delta(block.size);
    const long double before = ReferenceNorm(BlockOf(original, block));
    const long double after = ReferenceNorm(BlockOf(clipped, block));
    ASSERT_LE(after, bound) << "block " << block.name << " above its bound";
    // Margin for the reference norm's own long-double rounding.
    if (before > bound * (1 + 1e-19L * (block.size + 10))) {
      ASSERT_TRUE(report.block_clipped[index]) << block.name;
    }
    if (before < bound * (1 - 2 * delta)) {
      ASSERT_FALSE(report.block_clipped[index]) << block.name;
    }
    if (report.block_clipped[index]) {
      ASSERT_GE(after, bound * (1 - 8 * delta)) << "block " << block.name << " over-shrunk";
      const long double factor = bound / before;
      for (size_t i = block.offset; i < block.offset + block.size; ++i) {
        ASSERT_NEAR(static_cast<long double>(clipped[i]), original[i] * factor,
                    8 * delta * bound + 1e-320L)
            << block.name << " coordinate " << i;
      }
    } else {
      for (size_t i = block.offset; i < block.offset + block.size; ++i) {
        ASSERT_EQ(std::memcmp(&clipped[i], &original[i], sizeof(double)), 0)
            << "unclipped block " << block.name << " changed at " << i;
      }
    }
  }
}

TEST(BlockLayoutTest, PlacesBlocksContiguously) {
  const BlockLayout layout = MixedLayout();
  EXPECT_EQ(layout.num_blocks(), 6u);
  EXPECT_EQ(layout.total_size(), 7u + 10u + 1u + 50u + 3u + 3u);
  EXPECT_EQ(layout.block(1).name, "cov");
  EXPECT_EQ(layout.block(1).offset, 7u);
  EXPECT_EQ(layout.block(1).size, 10u);
  EXPECT_EQ(layout.block(2).offset, 17u);
  EXPECT_EQ(layout.block(3).offset, 18u);
  auto found = layout.FindBlock("wide");
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(*found, 3u);
  EXPECT_EQ(layout.FindBlock("missing").status().code(), StatusCode::kNotFound);
}

TEST(BlockLayoutTest, RejectsInvalidSpecs) {
  struct Case {
    std::vector<BlockSpec> specs;
    std::string message;
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<Case> cases = {
      {{}, "at least one block"},
      {{{"", BlockKind::kVector, 2, 1.0}}, "name must not be empty"},
      {{{"a", BlockKind::kVector, 2, 1.0}, {"a", BlockKind::kVector, 2, 1.0}},
       "duplicate block name 'a'"},
      {{{"a", BlockKind::kVector, 0, 1.0}}, "'a': dim must be >= 1"},
      {{{"a", BlockKind::kVector, 2, 0.0}}, "'a': clip_bound"},
      {{{"a", BlockKind::kVector, 2, -1.0}}, "'a': clip_bound"},
      {{{"a", BlockKind::kVector, 2, nan}}, "'a': clip_bound"},
      {{{"a", BlockKind::kVector, 2, inf}}, "'a': clip_bound"},
      {{{"a", BlockKind::kVector, 2, DBL_TRUE_MIN}}, "'a': clip_bound"},
      {{{"a", BlockKind::kSymmetricMatrix, size_t{1} << 40, 1.0}}, "'a': dim too large"},
  };
  for (const Case& test_case : cases) {
    auto layout = BlockLayout::Create(test_case.specs);
    ASSERT_FALSE(layout.ok()) << test_case.message;
    EXPECT_EQ(layout.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(layout.status().message(), HasSubstr(test_case.message));
  }
}

TEST(PackingTest, PackedOrderIsLapackUpperColumnMajor) {
  Eigen::MatrixXd matrix(3, 3);
  matrix << 1, 2, 4,  //
      -9, 3, 5,       // strict lower triangle is ignored
      -9, -9, 6;
  std::vector<double> packed(PackedSymmetricSize(3));
  ASSERT_TRUE(PackUpperTriangle(matrix, packed).ok());
  EXPECT_EQ(packed, (std::vector<double>{1, 2, 3, 4, 5, 6}));
  auto unpacked = UnpackSymmetric(packed, 3);
  ASSERT_TRUE(unpacked.ok());
  Eigen::MatrixXd expected(3, 3);
  expected << 1, 2, 4, 2, 3, 5, 4, 5, 6;
  EXPECT_EQ(*unpacked, expected);
}

TEST(PackingTest, RoundTripIsExact) {
  std::mt19937_64 rng(5);
  std::normal_distribution<double> normal;
  for (size_t dim : {1, 2, 5, 17}) {
    Eigen::MatrixXd random(dim, dim);
    for (Eigen::Index i = 0; i < random.size(); ++i) random.data()[i] = normal(rng);
    const Eigen::MatrixXd symmetric = random + random.transpose();
    std::vector<double> packed(PackedSymmetricSize(dim));
    ASSERT_TRUE(PackUpperTriangle(symmetric, packed).ok());
    auto unpacked = UnpackSymmetric(packed, dim);
    ASSERT_TRUE(unpacked.ok());
    EXPECT_EQ(*unpacked, symmetric) << "dim " << dim;
  }
}

TEST(PackingTest, RejectsWrongShapes) {
  std::vector<double> packed(6);
  EXPECT_EQ(PackUpperTriangle(Eigen::MatrixXd::Zero(3, 2), packed).code(),
            StatusCode::kInvalidArgument);
  std::vector<double> short_packed(5);
  EXPECT_THAT(PackUpperTriangle(Eigen::MatrixXd::Zero(3, 3), short_packed).message(),
              HasSubstr("expected 6"));
  EXPECT_EQ(UnpackSymmetric(short_packed, 3).status().code(), StatusCode::kInvalidArgument);
}

TEST(ClipTest, RandomRecordsWithNormsFrom1e_300To1e300NeverExceedTheirBounds) {
  const BlockLayout layout = MixedLayout();
  std::mt19937_64 rng(2024);
  std::normal_distribution<double> normal;
  std::uniform_real_distribution<double> log10_scale(-300.0, 300.0);
  std::uniform_real_distribution<double> log10_jitter(-20.0, 20.0);
  std::uniform_int_distribution<int> style(0, 3);
  size_t clipped_blocks = 0, unclipped_blocks = 0;
  for (int trial = 0; trial < 100'000; ++trial) {
    std::vector<double> record(layout.total_size());
    for (const Block& block : layout.blocks()) {
      const double scale = std::pow(10.0, log10_scale(rng));
      const int kind = style(rng);
      for (size_t i = block.offset; i < block.offset + block.size; ++i) {
        double value = normal(rng) * scale;
        if (kind == 1) value *= std::pow(10.0, log10_jitter(rng));  // uneven magnitudes
        if (kind == 2 && i != block.offset) value = 0.0;            // one non-zero
        if (!std::isfinite(value)) value = std::copysign(DBL_MAX, value);
        record[i] = value;
      }
    }
    const std::vector<double> original = record;
    ClipReport report;
    ASSERT_TRUE(ClipRecordStatistic(layout, record, &report).ok());
    ExpectClippedCorrectly(layout, original, record, report);
    for (const bool clipped : report.block_clipped) (clipped ? clipped_blocks : unclipped_blocks)++;
  }
  // Both branches must be well exercised for the test to mean anything.
  EXPECT_GT(clipped_blocks, 100'000u);
  EXPECT_GT(unclipped_blocks, 100'000u);
}

TEST(ClipTest, AdversarialRecordsNeverExceedTheirBounds) {
  const BlockLayout layout = MixedLayout();
  const size_t n = layout.total_size();
  std::vector<std::vector<double>> records;
  records.push_back(std::vector<double>(n, 1e308));
  records.push_back(std::vector<double>(n, DBL_MAX));
  std::vector<double> alternating(n);
  for (size_t i = 0; i < n; ++i) alternating[i] = (i % 2 == 0) ? DBL_MAX : -DBL_MAX;
  records.push_back(alternating);
  records.push_back(std::vector<double>(n, 1e-320));
  records.push_back(std::vector<double>(n, DBL_TRUE_MIN));
  records.push_back(std::vector<double>(n, DBL_MIN));
  std::vector<double> single_huge(n, 1e-320);
  for (const Block& block : layout.blocks()) single_huge[block.offset + block.size - 1] = -1e308;
  records.push_back(single_huge);
  std::vector<double> mixed(n);
  for (size_t i = 0; i < n; ++i) mixed[i] = (i % 3 == 0) ? 1e308 : (i % 3 == 1) ? 1e-308 : 1e-320;
  records.push_back(mixed);
  std::vector<double> at_bound(n, 0.0);  // exactly C_b along one axis
  for (const Block& block : layout.blocks()) at_bound[block.offset] = block.clip_bound;
  records.push_back(at_bound);
  std::vector<double> just_above(n, 0.0);
  for (const Block& block : layout.blocks()) {
    just_above[block.offset] = std::nextafter(block.clip_bound, DBL_MAX);
  }
  records.push_back(just_above);

  for (size_t r = 0; r < records.size(); ++r) {
    SCOPED_TRACE("adversarial record " + std::to_string(r));
    std::vector<double> record = records[r];
    ClipReport report;
    ASSERT_TRUE(ClipRecordStatistic(layout, record, &report).ok());
    ExpectClippedCorrectly(layout, records[r], record, report);
  }
}

TEST(ClipTest, SingleHugeCoordinateKeepsItsSignAndLandsOnTheBound) {
  const BlockLayout layout = MakeLayout({{"v", BlockKind::kVector, 4, 2.0}});
  std::vector<double> record = {1e-320, -1e308, 0.0, 1e-320};
  ASSERT_TRUE(ClipRecordStatistic(layout, record).ok());
  EXPECT_NEAR(record[1], -2.0, 2.0 * 8 * Delta(4));
  EXPECT_EQ(record[0], 0.0);  // 1e-320 · 2e-308 underflows to zero
  EXPECT_EQ(record[2], 0.0);
}

TEST(ClipTest, SubnormalRecordsAgainstTheSmallestNormalBound) {
  // Both the input and the clipped output are subnormal or near it.
  const BlockLayout layout = MakeLayout({{"v", BlockKind::kVector, 50, DBL_MIN}});
  std::vector<double> record(50, 1e-308);  // norm ≈ 7.1e-308 > DBL_MIN
  const std::vector<double> original = record;
  ClipReport report;
  ASSERT_TRUE(ClipRecordStatistic(layout, record, &report).ok());
  ASSERT_TRUE(report.block_clipped[0]);
  EXPECT_LE(ReferenceNorm(record), static_cast<long double>(DBL_MIN));
  EXPECT_GT(ReferenceNorm(record), 0.99L * DBL_MIN);
}

TEST(ClipTest, LargeBlockJustAboveItsBound) {
  constexpr size_t kSize = 100'000;
  const BlockLayout layout = MakeLayout({{"big", BlockKind::kVector, kSize, 1.0}});
  std::mt19937_64 rng(17);
  std::normal_distribution<double> normal;
  std::vector<double> record(kSize);
  for (double& value : record) value = normal(rng);
  const long double norm = ReferenceNorm(record);
  for (double& value : record) value = static_cast<double>(value / norm * (1 + 1e-13L));
  const std::vector<double> original = record;
  ClipReport report;
  ASSERT_TRUE(ClipRecordStatistic(layout, record, &report).ok());
  ExpectClippedCorrectly(layout, original, record, report);
  EXPECT_TRUE(report.block_clipped[0]);
}

TEST(ClipTest, RecordsUnderTheBoundAreUntouchedBitForBit) {
  const BlockLayout layout = MixedLayout();
  std::mt19937_64 rng(8);
  std::normal_distribution<double> normal;
  std::uniform_real_distribution<double> fraction(0.0, 0.999);
  for (int trial = 0; trial < 10'000; ++trial) {
    std::vector<double> record(layout.total_size());
    for (const Block& block : layout.blocks()) {
      for (size_t i = block.offset; i < block.offset + block.size; ++i) record[i] = normal(rng);
      const long double norm = ReferenceNorm(BlockOf(record, block));
      const long double target = fraction(rng) * static_cast<long double>(block.clip_bound);
      for (size_t i = block.offset; i < block.offset + block.size; ++i) {
        record[i] = static_cast<double>(record[i] / norm * target);
      }
    }
    const std::vector<double> original = record;
    ClipReport report;
    ASSERT_TRUE(ClipRecordStatistic(layout, record, &report).ok());
    ASSERT_TRUE(BitwiseEqual(record, original)) << "trial " << trial;
    for (const bool clipped : report.block_clipped) ASSERT_FALSE(clipped);
  }
}

TEST(ClipTest, SymmetricBlocksAreBoundedInPackedNorm) {
  // Packed (0,0), (0,1), (1,1). The off-diagonal counts once: the packed
  // norm 0.9 is within the bound although the Frobenius norm 0.9·√2 is not.
  const BlockLayout layout = MakeLayout({{"s", BlockKind::kSymmetricMatrix, 2, 1.0}});
  std::vector<double> record = {0.0, 0.9, 0.0};
  ClipReport report;
  ASSERT_TRUE(ClipRecordStatistic(layout, record, &report).ok());
  EXPECT_FALSE(report.block_clipped[0]);
  EXPECT_EQ(record, (std::vector<double>{0.0, 0.9, 0.0}));
  record = {3.0, 0.0, 4.0};  // packed norm 5
  ASSERT_TRUE(ClipRecordStatistic(layout, record, &report).ok());
  EXPECT_TRUE(report.block_clipped[0]);
  EXPECT_NEAR(record[0], 0.6, 8 * Delta(3));
  EXPECT_NEAR(record[2], 0.8, 8 * Delta(3));
}

TEST(ClipTest, NonFiniteRecordsAreRejectedAndLeftUntouched) {
  const BlockLayout layout = MixedLayout();
  const double specials[] = {std::numeric_limits<double>::quiet_NaN(),
                             std::numeric_limits<double>::infinity(),
                             -std::numeric_limits<double>::infinity()};
  for (const double special : specials) {
    for (size_t position = 0; position < layout.total_size(); ++position) {
      // Every other coordinate is huge, so a partial clip would show.
      std::vector<double> record(layout.total_size(), 1e300);
      record[position] = special;
      const std::vector<double> original = record;
      const Status status = ClipRecordStatistic(layout, record);
      ASSERT_EQ(status.code(), StatusCode::kOutOfRange) << position;
      EXPECT_THAT(status.message(), HasSubstr("NaN or infinite"));
      ASSERT_TRUE(BitwiseEqual(record, original)) << "modified at position " << position;
    }
  }
}

TEST(ClipTest, WrongSizeIsRejectedAndLeftUntouched) {
  const BlockLayout layout = MixedLayout();
  for (const size_t size : {size_t{0}, layout.total_size() - 1, layout.total_size() + 1}) {
    std::vector<double> record(size, 1e300);
    const std::vector<double> original = record;
    const Status status = ClipRecordStatistic(layout, record);
    ASSERT_EQ(status.code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(), HasSubstr("block layout expects 74"));
    EXPECT_TRUE(BitwiseEqual(record, original));
  }
}

TEST(ClipTest, ClipToL2BoundReportsWhetherItChangedTheValues) {
  std::vector<double> small = {0.3, 0.4};
  EXPECT_FALSE(ClipToL2Bound(small, 1.0));
  EXPECT_EQ(small, (std::vector<double>{0.3, 0.4}));
  std::vector<double> large = {3.0, -4.0};
  EXPECT_TRUE(ClipToL2Bound(large, 1.0));
  EXPECT_NEAR(large[0], 0.6, 8 * Delta(2));
  EXPECT_NEAR(large[1], -0.8, 8 * Delta(2));
  EXPECT_LE(std::hypot(large[0], large[1]), 1.0);
  std::vector<double> zeros(5, 0.0);
  EXPECT_FALSE(ClipToL2Bound(zeros, 1e-300));
}

}  // namespace
}  // namespace vipsd::privacy
