#include "core/base/format.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace vipsd {
namespace {

bool SameBits(double a, double b) { return std::memcmp(&a, &b, sizeof(double)) == 0; }

TEST(HexDoubleTest, EveryFiniteDoubleReadsBackBitForBit) {
  const double special[] = {0.0,
                            -0.0,
                            1.0,
                            0.1,
                            1.5,
                            std::numeric_limits<double>::min(),
                            std::numeric_limits<double>::denorm_min(),
                            std::numeric_limits<double>::max(),
                            -std::numeric_limits<double>::max(),
                            std::nextafter(1.0, 2.0)};
  for (double value : special) {
    double back = 7;
    ASSERT_TRUE(ParseHexDouble(HexDouble(value), &back)) << HexDouble(value);
    EXPECT_TRUE(SameBits(back, value)) << HexDouble(value);
  }
  std::mt19937_64 bits(20261127);
  for (int i = 0; i < 100000; ++i) {
    uint64_t word = bits();
    double value;
    std::memcpy(&value, &word, sizeof(value));
    if (!std::isfinite(value)) continue;
    double back = 0;
    ASSERT_TRUE(ParseHexDouble(HexDouble(value), &back)) << HexDouble(value);
    ASSERT_TRUE(SameBits(back, value)) << HexDouble(value);
  }
}

TEST(HexDoubleTest, WritesTheFormStateFilesAlreadyHold) {
  // Ledgers and accountant states written before these helpers moved here
  // hold exactly this text; a change would make old files read differently.
  EXPECT_EQ(HexDouble(1.5), "0x1.8p+0");
  EXPECT_EQ(HexDouble(0.0), "0x0p+0");
  EXPECT_EQ(HexDouble(0.05), "0x1.999999999999ap-5");
  EXPECT_EQ(HexDouble(std::numeric_limits<double>::infinity()), "inf");
}

TEST(HexDoubleTest, RejectsPartialEmptyAndNonFiniteTokens) {
  double out = 0;
  EXPECT_FALSE(ParseHexDouble("", &out));
  EXPECT_FALSE(ParseHexDouble("0x1.8p+0x", &out));
  EXPECT_FALSE(ParseHexDouble(" 0x1p+0", &out));  // strtod alone would skip the space
  EXPECT_FALSE(ParseHexDouble("0x1p+0 ", &out));
  EXPECT_FALSE(ParseHexDouble("nan", &out));
  EXPECT_FALSE(ParseHexDouble("nan", &out, NonFinite::kAllowInfinity));
  EXPECT_FALSE(ParseHexDouble("inf", &out));
  EXPECT_FALSE(ParseHexDouble("1e999", &out));  // overflows to infinity
  ASSERT_TRUE(ParseHexDouble("inf", &out, NonFinite::kAllowInfinity));
  EXPECT_TRUE(std::isinf(out) && out > 0);
  ASSERT_TRUE(ParseHexDouble("0.25", &out));  // decimal text reads too
  EXPECT_EQ(out, 0.25);
}

// One hex codec for every id, key and digest: two lowercase digits per
// byte, and a reader that takes exactly that form.
TEST(LowerHexTest, WritesTwoLowercaseDigitsPerByteAndTheCheckAcceptsOnlyThatForm) {
  const uint8_t bytes[] = {0x00, 0x0f, 0xa5, 0xff, 0x10};
  EXPECT_EQ(LowerHex(bytes), "000fa5ff10");
  EXPECT_EQ(LowerHex(std::span<const uint8_t>()), "");
  std::mt19937_64 rng(3);
  for (int i = 0; i < 100; ++i) {
    std::vector<uint8_t> random(static_cast<size_t>(rng() % 40));
    for (uint8_t& b : random) b = static_cast<uint8_t>(rng());
    const std::string hex = LowerHex(random);
    EXPECT_TRUE(IsLowerHex(hex, 2 * random.size())) << hex;
  }
  EXPECT_TRUE(IsLowerHex("0123456789abcdef", 16));
  EXPECT_FALSE(IsLowerHex("0123456789abcdef", 15));   // length is exact
  EXPECT_FALSE(IsLowerHex("0123456789ABCDEF", 16));   // no uppercase
  EXPECT_FALSE(IsLowerHex("0123456789abcdeg", 16));
  EXPECT_FALSE(IsLowerHex(std::string("0123456789abcde\0", 16), 16));
  EXPECT_TRUE(IsLowerHex("", 0));
}

TEST(SignificantDigitsTest, RoundsToTheDigitsAndDropsTrailingZeros) {
  // What ShortestNumber would spell out in full (2.7600000000000004e-07).
  EXPECT_EQ(SignificantDigits(276 * 1e-9, 6), "2.76e-07");
  EXPECT_EQ(SignificantDigits(1e-5 + 276 * 1e-9, 6), "1.0276e-05");
  EXPECT_EQ(SignificantDigits(3.997291234, 6), "3.99729");
  EXPECT_EQ(SignificantDigits(0.5, 3), "0.5");
  EXPECT_EQ(SignificantDigits(123456789.0, 4), "1.235e+08");
}

}  // namespace
}  // namespace vipsd
