// Tests of the ChaCha20 noise source and its ziggurat Gaussian sampler.
//
// Statistical checks use 5-sigma tolerances of the estimator (or p = 1e-6
// critical values), so a correct sampler fails one of them with probability
// of order 1e-6 per run; the reproducible source makes most of them fully
// deterministic. The reference CDF is Φ(x) = erfc(−x/√2)/2 from the standard
// library, independent of the sampler's tables.
#include "core/privacy/mechanisms/secure_noise.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <boost/math/distributions/chi_squared.hpp>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/base/log.h"

namespace vipsd::privacy {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<NoiseSource> MakeSecure() {
  auto source = SecureNoiseSource::Create();
  EXPECT_TRUE(source.ok()) << source.status().ToString();
  return std::move(source).value();
}

std::unique_ptr<NoiseSource> MakeReproducible(uint64_t seed) {
  auto source = SecureNoiseSource::CreateReproducible(seed);
  EXPECT_TRUE(source.ok()) << source.status().ToString();
  return std::move(source).value();
}

std::vector<double> Normals(NoiseSource& source, size_t count) {
  std::vector<double> draws(count);
  source.FillStandardNormal(draws);
  return draws;
}

std::vector<uint64_t> Words(NoiseSource& source, size_t count) {
  std::vector<uint64_t> words(count);
  source.FillUniformBits(words);
  return words;
}

double NormalCdf(double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }

// Both kinds of source share the sampler; run the statistical tests on each.
class GaussianSamplerTest : public ::testing::TestWithParam<bool> {
 protected:
  std::unique_ptr<NoiseSource> Source() const {
    return GetParam() ? MakeSecure() : MakeReproducible(20240611);
  }
};

INSTANTIATE_TEST_SUITE_P(SecureAndReproducible, GaussianSamplerTest, ::testing::Bool(),
                         [](const auto& param_info) {
                           return param_info.param ? std::string("Secure")
                                             : std::string("Reproducible");
                         });

TEST(ZigguratGeometryTest, MatchesPublishedConstantsAndClosesTheTopLayer) {
  const internal::ZigguratGeometry geometry = internal::GetZigguratGeometry();
  // Marsaglia & Tsang (2000), 256 layers: r = 3.6541528853610088. Their
  // v = 0.00492867323399 is rounded; v = r f(r) + √(π/2) erfc(r/√2) at the
  // published r, evaluated with 40-digit arithmetic, is
  // 0.0049286732339746548702.
  EXPECT_NEAR(geometry.tail_start, 3.6541528853610088, 4e-16);
  EXPECT_NEAR(geometry.layer_area, 0.0049286732339746548702, 1e-18);
  EXPECT_NEAR(geometry.layer_area, 0.00492867323399, 2e-14);
  EXPECT_LT(geometry.top_layer_mismatch, 1e-15);
  std::printf("r = %.17g, v = %.17g, top-layer mismatch = %.3g\n", geometry.tail_start,
              geometry.layer_area, geometry.top_layer_mismatch);
}

TEST_P(GaussianSamplerTest, MomentsOfAMillionDrawsMatchStandardNormal) {
  constexpr size_t kCount = 1'000'000;
  const std::vector<double> draws = Normals(*Source(), kCount);
  double sum = 0, sum2 = 0, sum3 = 0, sum4 = 0;
  for (const double z : draws) {
    ASSERT_TRUE(std::isfinite(z));
    sum += z;
    sum2 += z * z;
    sum3 += z * z * z;
    sum4 += z * z * z * z;
  }
  const double n = kCount;
  const double mean = sum / n;
  const double variance = sum2 / n - mean * mean;
  // Standard errors: mean 1/√n; variance √(2/n); E z³ √(15/n); E z⁴ √(96/n).
  EXPECT_NEAR(mean, 0.0, 5.0 / std::sqrt(n));
  EXPECT_NEAR(variance, 1.0, 5.0 * std::sqrt(2.0 / n));
  EXPECT_NEAR(sum3 / n, 0.0, 5.0 * std::sqrt(15.0 / n));
  EXPECT_NEAR(sum4 / n, 3.0, 5.0 * std::sqrt(96.0 / n));
}

TEST_P(GaussianSamplerTest, KolmogorovSmirnovAgainstNormalCdf) {
  constexpr size_t kCount = 1'000'000;
  std::vector<double> draws = Normals(*Source(), kCount);
  std::sort(draws.begin(), draws.end());
  double max_distance = 0;
  for (size_t i = 0; i < kCount; ++i) {
    const double cdf = NormalCdf(draws[i]);
    max_distance = std::max({max_distance, cdf - static_cast<double>(i) / kCount,
                             static_cast<double>(i + 1) / kCount - cdf});
  }
  // Asymptotic critical value at p = 1e-6: sqrt(ln(2/p) / (2n)).
  const double critical = std::sqrt(std::log(2.0 / 1e-6) / (2.0 * kCount));
  EXPECT_LT(max_distance, critical);
}

TEST_P(GaussianSamplerTest, EquiprobableBinsPassChiSquared) {
  // Finer than KS at detecting a local density error (e.g. in one wedge).
  constexpr size_t kCount = 4'000'000;
  constexpr size_t kBins = 256;
  const std::vector<double> draws = Normals(*Source(), kCount);
  std::vector<double> observed(kBins, 0.0);
  for (const double z : draws) {
    const auto bin = static_cast<size_t>(NormalCdf(z) * kBins);
    observed[std::min(bin, kBins - 1)] += 1;
  }
  const double expected = static_cast<double>(kCount) / kBins;
  double chi2 = 0;
  for (const double count : observed) chi2 += (count - expected) * (count - expected) / expected;
  const boost::math::chi_squared distribution(kBins - 1);
  EXPECT_LT(chi2, boost::math::quantile(boost::math::complement(distribution, 1e-6)));
}

TEST_P(GaussianSamplerTest, TailFrequenciesMatchNormal) {
  constexpr size_t kCount = 4'000'000;
  const std::vector<double> draws = Normals(*Source(), kCount);
  const double tail_start = internal::GetZigguratGeometry().tail_start;
  for (const double threshold : {3.0, tail_start, 4.0}) {
    const auto beyond = static_cast<double>(std::count_if(
        draws.begin(), draws.end(), [&](double z) { return std::fabs(z) > threshold; }));
    const double p = std::erfc(threshold / std::sqrt(2.0));  // P(|Z| > threshold)
    const double expected = p * kCount;
    EXPECT_NEAR(beyond, expected, 5.0 * std::sqrt(expected * (1 - p)))
        << "threshold " << threshold;
  }
  const auto negative = static_cast<double>(
      std::count_if(draws.begin(), draws.end(), [](double z) { return z < 0; }));
  EXPECT_NEAR(negative, kCount / 2.0, 5.0 * std::sqrt(kCount / 4.0));
}

TEST(SecureNoiseSourceTest, TwoSecureSourcesDiffer) {
  auto first = MakeSecure();
  auto second = MakeSecure();
  EXPECT_NE(Words(*first, 64), Words(*second, 64));
  EXPECT_NE(Normals(*first, 64), Normals(*second, 64));
}

TEST(SecureNoiseSourceTest, ReproducibleSourceWithSameSeedReproduces) {
  auto first = MakeReproducible(7);
  auto second = MakeReproducible(7);
  EXPECT_EQ(Normals(*first, 100'000), Normals(*second, 100'000));
  EXPECT_EQ(Words(*first, 10'000), Words(*second, 10'000));
}

TEST(SecureNoiseSourceTest, DifferentSeedsDiffer) {
  auto first = MakeReproducible(7);
  auto second = MakeReproducible(8);
  EXPECT_NE(Words(*first, 64), Words(*second, 64));
  auto third = MakeReproducible(7);
  auto fourth = MakeReproducible(uint64_t{7} << 56);  // seed bytes all enter the key
  EXPECT_NE(Normals(*third, 64), Normals(*fourth, 64));
}

TEST(SecureNoiseSourceTest, StreamDoesNotDependOnHowFillsAreSplit) {
  // Words are consumed strictly in order across chunk boundaries.
  constexpr size_t kTotal = 3 * SecureNoiseSource::kKeystreamChunkWords + 123;
  auto whole = MakeReproducible(99);
  const std::vector<uint64_t> expected = Words(*whole, kTotal);
  auto pieces = MakeReproducible(99);
  std::vector<uint64_t> actual;
  size_t piece = 1;
  while (actual.size() < kTotal) {
    const size_t count = std::min(piece, kTotal - actual.size());
    const std::vector<uint64_t> part = Words(*pieces, count);
    actual.insert(actual.end(), part.begin(), part.end());
    piece = piece * 3 + 1;
  }
  EXPECT_EQ(actual, expected);
}

TEST(SecureNoiseSourceTest, NoKeystreamBlockIsEverRepeated) {
  // 64-byte ChaCha20 blocks = 8 words. A reused nonce or counter would
  // repeat whole blocks, within or across chunks and across fills.
  constexpr size_t kChunkWords = SecureNoiseSource::kKeystreamChunkWords;
  for (const bool secure : {true, false}) {
    auto source = secure ? MakeSecure() : MakeReproducible(3);
    std::vector<uint64_t> words;
    for (int fill = 0; fill < 8; ++fill) {  // successive fills, each one chunk
      const std::vector<uint64_t> chunk = Words(*source, kChunkWords);
      words.insert(words.end(), chunk.begin(), chunk.end());
    }
    for (int fill = 1; fill < 8; ++fill) {
      EXPECT_FALSE(std::equal(words.begin() + (fill - 1) * kChunkWords,
                              words.begin() + fill * kChunkWords,
                              words.begin() + fill * kChunkWords))
          << "chunk " << fill << " repeats the previous one";
    }
    std::set<std::vector<uint64_t>> blocks;
    for (size_t start = 0; start < words.size(); start += 8) {
      blocks.emplace(words.begin() + start, words.begin() + start + 8);
    }
    EXPECT_EQ(blocks.size(), words.size() / 8) << (secure ? "secure" : "reproducible");
  }
}

TEST(SecureNoiseSourceTest, UniformBitsAreBalancedAtEveryBitPosition) {
  constexpr size_t kCount = 200'000;
  for (const bool secure : {true, false}) {
    auto source = secure ? MakeSecure() : MakeReproducible(11);
    const std::vector<uint64_t> words = Words(*source, kCount);
    std::vector<double> ones(64, 0.0);
    double total_ones = 0;
    for (const uint64_t word : words) {
      for (int bit = 0; bit < 64; ++bit) ones[bit] += static_cast<double>((word >> bit) & 1);
      total_ones += std::popcount(word);
    }
    for (int bit = 0; bit < 64; ++bit) {
      EXPECT_NEAR(ones[bit], kCount / 2.0, 5.0 * std::sqrt(kCount / 4.0)) << "bit " << bit;
    }
    EXPECT_NEAR(total_ones, 32.0 * kCount, 5.0 * std::sqrt(16.0 * kCount));
  }
}

TEST(SecureNoiseSourceTest, PrivacyFlagsAndDescriptions) {
  auto secure = MakeSecure();
  EXPECT_TRUE(secure->is_private());
  EXPECT_EQ(secure->description(), "chacha20-os-seeded");
  auto reproducible = MakeReproducible(1);
  EXPECT_FALSE(reproducible->is_private());
  EXPECT_EQ(reproducible->description(), "chacha20-fixed-seed (NOT PRIVATE)");
}

TEST(SecureNoiseSourceTest, ReproducibleCreationLogsALoudWarning) {
  struct Entry {
    LogLevel level;
    std::string component;
    std::string message;
  };
  std::vector<Entry> entries;
  SetLogSink([&](LogLevel level, std::string_view component, std::string_view message) {
    entries.push_back({level, std::string(component), std::string(message)});
  });
  auto secure = MakeSecure();
  const size_t after_secure = entries.size();
  auto reproducible = MakeReproducible(5);
  SetLogSink(nullptr);
  EXPECT_EQ(after_secure, 0u) << "the secure source must not warn";
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].level, LogLevel::kWarning);
  EXPECT_THAT(entries[0].message, HasSubstr("NOT PRIVATE"));
  EXPECT_THAT(entries[0].message, HasSubstr("FIXED-SEED"));
}

TEST(SecureNoiseSourceTest, EmptyFillsDoNotAdvanceTheStream) {
  auto first = MakeReproducible(13);
  auto second = MakeReproducible(13);
  first->FillStandardNormal({});
  first->FillUniformBits({});
  EXPECT_EQ(Words(*first, 16), Words(*second, 16));
}

}  // namespace
}  // namespace vipsd::privacy
