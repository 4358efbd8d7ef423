// Tests of the exact discrete Gaussian sampler, its sub-samplers, its pmf and
// the 1-D privacy loss (core/privacy/mechanisms/discrete_gaussian.h).
//
// Statistical tests draw from the reproducible (fixed-seed) ChaCha20 source,
// so they are deterministic; each is a chi-square goodness-of-fit test at
// significance level 1e-6 (p-value from Boost.Math's chi_squared), with the
// tails pooled so that every expected count is ≥ 5. Power checks run the
// same test against a slightly wrong distribution and require rejection, so a
// test that passes is not merely insensitive. Printed lines starting with
// "[stat]" give the figures (chi-square, degrees of freedom, p, draws).
#include "core/privacy/mechanisms/discrete_gaussian.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <boost/math/distributions/chi_squared.hpp>
#include <boost/math/distributions/normal.hpp>
#include <boost/multiprecision/cpp_int.hpp>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/privacy/mechanisms/secure_noise.h"

namespace vipsd::privacy {
namespace {

using u128 = Uint128;
constexpr double kSignificance = 1e-6;

std::unique_ptr<NoiseSource> MakeReproducible(uint64_t seed) {
  auto source = SecureNoiseSource::CreateReproducible(seed);
  EXPECT_TRUE(source.ok()) << source.status().ToString();
  return std::move(source).value();
}

struct ChiSquare {
  double statistic = 0;
  int degrees_of_freedom = 0;
  double p_value = 0;
  int pooled_bins = 0;
};

// Goodness of fit of integer draws against pmf(x) (probabilities), over the
// integers. Bins: every integer with expected count ≥ 5 in the contiguous
// range around `mode`; everything left of it is one bin, everything right of
// it another (merged into the neighbouring bin if its expectation is < 5).
ChiSquare GoodnessOfFit(const std::map<int64_t, uint64_t>& counts, uint64_t draws,
                        const std::function<long double(int64_t)>& pmf, int64_t mode) {
  const long double n = static_cast<long double>(draws);
  int64_t low = mode, high = mode;
  while (n * pmf(low - 1) >= 5) --low;
  while (n * pmf(high + 1) >= 5) ++high;
  std::vector<long double> expected;
  std::vector<long double> observed;
  auto tail_mass = [&](int64_t start, int64_t step) {
    long double mass = 0;
    for (int64_t x = start;; x += step) {
      const long double p = pmf(x);
      mass += p;
      if (p < 1e-40L * (mass + 1e-300L) || p == 0) break;
    }
    return mass;
  };
  uint64_t left_count = 0, right_count = 0;
  for (const auto& [x, c] : counts) {
    if (x < low) left_count += c;
    if (x > high) right_count += c;
  }
  expected.push_back(n * tail_mass(low - 1, -1));
  observed.push_back(static_cast<long double>(left_count));
  for (int64_t x = low; x <= high; ++x) {
    expected.push_back(n * pmf(x));
    const auto it = counts.find(x);
    observed.push_back(it == counts.end() ? 0.0L : static_cast<long double>(it->second));
  }
  expected.push_back(n * tail_mass(high + 1, 1));
  observed.push_back(static_cast<long double>(right_count));
  // Merge under-filled tail bins inward.
  if (expected.front() < 5 && expected.size() > 2) {
    expected[1] += expected[0];
    observed[1] += observed[0];
    expected.erase(expected.begin());
    observed.erase(observed.begin());
  }
  if (expected.back() < 5 && expected.size() > 2) {
    expected[expected.size() - 2] += expected.back();
    observed[observed.size() - 2] += observed.back();
    expected.pop_back();
    observed.pop_back();
  }
  ChiSquare result;
  long double statistic = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_GE(expected[i], 5.0L) << "bin " << i;
    const long double diff = observed[i] - expected[i];
    statistic += diff * diff / expected[i];
  }
  result.statistic = static_cast<double>(statistic);
  result.degrees_of_freedom = static_cast<int>(expected.size()) - 1;
  result.pooled_bins = static_cast<int>(expected.size());
  boost::math::chi_squared_distribution<double> distribution(result.degrees_of_freedom);
  result.p_value = boost::math::cdf(boost::math::complement(distribution, result.statistic));
  return result;
}

ChiSquare ChiSquareOfBins(const std::vector<long double>& expected,
                          const std::vector<uint64_t>& observed) {
  ChiSquare result;
  long double statistic = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_GE(expected[i], 5.0L);
    const long double diff = static_cast<long double>(observed[i]) - expected[i];
    statistic += diff * diff / expected[i];
  }
  result.statistic = static_cast<double>(statistic);
  result.degrees_of_freedom = static_cast<int>(expected.size()) - 1;
  result.pooled_bins = static_cast<int>(expected.size());
  boost::math::chi_squared_distribution<double> distribution(result.degrees_of_freedom);
  result.p_value = boost::math::cdf(boost::math::complement(distribution, result.statistic));
  return result;
}

void Report(const std::string& what, const ChiSquare& chi, uint64_t draws) {
  std::printf("[stat] %s: chi2 = %.2f, df = %d, p = %.4g, draws = %llu\n", what.c_str(),
              chi.statistic, chi.degrees_of_freedom, chi.p_value,
              static_cast<unsigned long long>(draws));
}

DiscreteGaussianSampler MakeSampler(Rational sigma2) {
  auto sampler = DiscreteGaussianSampler::Create(sigma2);
  EXPECT_TRUE(sampler.ok()) << sampler.status().ToString();
  return std::move(sampler).value();
}

std::vector<int64_t> Draw(const DiscreteGaussianSampler& sampler, NoiseSource& source,
                          size_t count) {
  std::vector<int64_t> draws(count);
  const Status status = sampler.Fill(source, draws);
  EXPECT_TRUE(status.ok()) << status.ToString();
  return draws;
}

std::map<int64_t, uint64_t> Histogram(const std::vector<int64_t>& draws) {
  std::map<int64_t, uint64_t> counts;
  for (int64_t x : draws) ++counts[x];
  return counts;
}

long double Pmf(Rational sigma2, int64_t x) {
  auto log_pmf = DiscreteGaussianLogPmf(sigma2, x);
  EXPECT_TRUE(log_pmf.ok());
  return std::exp(*log_pmf);
}

// --- Parameters ------------------------------------------------------------

TEST(DiscreteGaussianParameters, RoundUpSigma2IsExactOrLargerAndTight) {
  for (double sigma2 : {0.25, 1.0, 13.69, 0.1, 1e-3, 2.0 / 3.0, 1e6, 1234567.891, 1e18, 1e-5, 3e-19,
                        std::ldexp(1.0, 61) + std::ldexp(1.0, 20)}) {
    auto rational = RoundUpSigma2(sigma2);
    ASSERT_TRUE(rational.ok()) << sigma2 << ": " << rational.status().ToString();
    // Exact comparison: n ≥ σ²·d, evaluated with boost's big integers on the
    // double's exact dyadic value.
    int exponent = 0;
    const double mantissa = std::frexp(sigma2, &exponent);
    const auto m = static_cast<uint64_t>(std::ldexp(mantissa, 53));  // σ² = m·2^(exponent−53)
    using boost::multiprecision::cpp_int;
    cpp_int lhs = cpp_int(rational->numerator);  // n·2^(53−exponent) vs m·d
    cpp_int rhs = cpp_int(m) * rational->denominator;
    if (53 - exponent >= 0) {
      lhs <<= (53 - exponent);
    } else {
      rhs <<= (exponent - 53);
    }
    EXPECT_GE(lhs, rhs) << sigma2;
    const long double value =
        static_cast<long double>(rational->numerator) / rational->denominator;
    const long double relative = (value - sigma2) / sigma2;
    std::printf("[stat] RoundUpSigma2(%.17g) = %llu/%llu, relative increase %.3Lg\n", sigma2,
                static_cast<unsigned long long>(rational->numerator),
                static_cast<unsigned long long>(rational->denominator), relative);
    if (sigma2 >= 0.25) {
      EXPECT_LE(relative, std::ldexp(1.0L, -59)) << sigma2;
    }
    EXPECT_TRUE(DiscreteGaussianSampler::Create(*rational).ok());
  }
  EXPECT_EQ(RoundUpSigma2(0.25)->numerator, 1u);
  EXPECT_EQ(RoundUpSigma2(0.25)->denominator, 4u);
  EXPECT_EQ(RoundUpSigma2(1e6)->denominator, 1u);
}

TEST(DiscreteGaussianParameters, InvalidArgumentsAreRefused) {
  EXPECT_EQ(DiscreteGaussianSampler::Create({0, 1}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(DiscreteGaussianSampler::Create({1, 0}).status().code(),
            StatusCode::kInvalidArgument);
  // 2·n·d·t² ≥ 2^127: refused, never wrapped.
  EXPECT_EQ(DiscreteGaussianSampler::Create({uint64_t{1} << 63, uint64_t{1} << 63})
                .status()
                .code(),
            StatusCode::kOutOfRange);
  EXPECT_EQ(DiscreteGaussianSampler::Create({~uint64_t{0}, 1}).status().code(),
            StatusCode::kOutOfRange);
  EXPECT_TRUE(DiscreteGaussianSampler::Create({uint64_t{1} << 61, 1}).ok());
  // ⌊sqrt(2^61)⌋ + 1 = ⌊1518500249.988⌋ + 1.
  EXPECT_EQ(DiscreteGaussianSampler::Create({uint64_t{1} << 61, 1})->laplace_scale(),
            1518500250u);
  EXPECT_EQ(DiscreteGaussianSampler::Create({1369, 100})->laplace_scale(), 4u);
  EXPECT_EQ(DiscreteGaussianSampler::Create({16, 1})->laplace_scale(), 5u);
  EXPECT_EQ(DiscreteGaussianSampler::Create({1, 4})->laplace_scale(), 1u);
  for (double bad : {0.0, -1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    EXPECT_EQ(RoundUpSigma2(bad).status().code(), StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(RoundUpSigma2(std::ldexp(1.0, 62)).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(DiscreteGaussianLogPmf({0, 1}, 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(DiscreteGaussianMechanismDelta({1, 1}, 0, 1.0).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(DiscreteGaussianMechanismDelta({1, 1}, 1, -0.5).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(DiscreteGaussianMechanismDelta({1, 1}, 1, std::nan("")).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(DiscreteGaussianMechanismDelta({uint64_t{1} << 60, 1}, 1, 0.5).status().code(),
            StatusCode::kOutOfRange);
  EXPECT_EQ(DiscreteGaussianRenyiDivergence({1, 1}, 1, 1.0).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(DiscreteGaussianRenyiDivergence({1, 1}, 0, 2.0).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(DiscreteGaussianRenyiDivergence({1, 1}, 1, 2000.0).status().code(),
            StatusCode::kInvalidArgument);
}

// --- Exact integer helpers -------------------------------------------------

TEST(DiscreteGaussianInternals, DivideSquareMatchesBigIntegers) {
  using boost::multiprecision::cpp_int;
  auto source = MakeReproducible(7);
  internal::RandomWords words(*source);
  auto to_big = [](u128 v) {
    return (cpp_int(static_cast<uint64_t>(v >> 64)) << 64) + cpp_int(static_cast<uint64_t>(v));
  };
  const u128 max = ~static_cast<u128>(0);
  std::vector<std::pair<u128, u128>> cases = {
      {0, 1}, {1, 1}, {max, 1}, {max, (static_cast<u128>(1) << 127) - 1},
      {static_cast<u128>(1) << 64, 3}, {(static_cast<u128>(1) << 64) - 1, 7},
      {static_cast<u128>(1) << 100, (static_cast<u128>(1) << 110) + 12345}};
  for (int i = 0; i < 20000; ++i) {
    const int a_bits = 1 + static_cast<int>(words.Next() % 128);
    const int b_bits = 1 + static_cast<int>(words.Next() % 127);
    u128 a = (static_cast<u128>(words.Next()) << 64) | words.Next();
    u128 b = (static_cast<u128>(words.Next()) << 64) | words.Next();
    a = a_bits == 128 ? a : a & ((static_cast<u128>(1) << a_bits) - 1);
    b &= (static_cast<u128>(1) << b_bits) - 1;
    if (b == 0) b = 1;
    cases.emplace_back(a, b);
  }
  int overflows = 0, long_divisions = 0;
  for (const auto& [a, b] : cases) {
    const internal::SquareDivision got = internal::DivideSquare(a, b);
    const cpp_int square = to_big(a) * to_big(a);
    const cpp_int quotient = square / to_big(b);
    const cpp_int remainder = square % to_big(b);
    if (quotient > to_big(max)) {
      EXPECT_TRUE(got.overflow);
      ++overflows;
      continue;
    }
    ASSERT_FALSE(got.overflow);
    EXPECT_EQ(to_big(got.quotient), quotient);
    EXPECT_EQ(to_big(got.remainder), remainder);
    if ((a >> 64) != 0) ++long_divisions;
  }
  EXPECT_GT(overflows, 100);
  EXPECT_GT(long_divisions, 100);
}

// RandomWords::Bits hands out the stream's bits in order, each once: the bits
// of Bits(n) calls of every width 1..64, concatenated, are the words' bits
// (lowest first) with nothing skipped or repeated; Next after Bits starts a
// fresh word.
TEST(DiscreteGaussianInternals, BitsAreTheWordsBitsInOrderEachOnce) {
  auto plain = MakeReproducible(31);
  auto pooled = MakeReproducible(31);
  std::vector<uint64_t> words;
  {
    internal::RandomWords source(*plain);
    for (int i = 0; i < 200; ++i) words.push_back(source.Next());
  }
  auto bit = [&](size_t index) { return (words[index / 64] >> (index % 64)) & 1; };
  internal::RandomWords source(*pooled);
  size_t position = 0;
  int width = 1;
  while (position + 64 <= 190 * 64) {
    const uint64_t value = source.Bits(width);
    for (int b = 0; b < width; ++b) {
      ASSERT_EQ((value >> b) & 1, bit(position + static_cast<size_t>(b)))
          << "width " << width << " at bit " << position;
    }
    if (width < 64) {
      EXPECT_EQ(value >> width, 0u) << "width " << width;
    }
    position += static_cast<size_t>(width);
    width = width % 64 + 1;  // 1, 2, ..., 64, 1, ...
  }
  // The pool is partly used; Next takes the word after the one it came from.
  const size_t next_word = (position + 63) / 64;
  EXPECT_EQ(source.Next(), words[next_word]);
}

TEST(DiscreteGaussianInternals, UniformBelowHasNoModuloBias) {
  auto source = MakeReproducible(11);
  internal::RandomWords words(*source);
  constexpr uint64_t kDraws = 600000;
  std::vector<uint64_t> counts(6, 0);
  for (uint64_t i = 0; i < kDraws; ++i) ++counts[internal::UniformBelow(words, 6)];
  const ChiSquare chi = ChiSquareOfBins(std::vector<long double>(6, kDraws / 6.0L), counts);
  Report("UniformBelow(6)", chi, kDraws);
  EXPECT_GT(chi.p_value, kSignificance);
  // m = 2^63 + 2^62: a modulo reduction of a 64-bit word would put mass 1/2
  // (not 1/3) in the top third. Rejection gives thirds.
  const uint64_t m = (uint64_t{1} << 63) + (uint64_t{1} << 62);
  std::vector<uint64_t> thirds(3, 0);
  for (uint64_t i = 0; i < 300000; ++i) {
    const uint64_t u = internal::UniformBelow(words, m);
    ASSERT_LT(u, m);
    ++thirds[u / (uint64_t{1} << 62)];
  }
  const ChiSquare third_chi = ChiSquareOfBins(std::vector<long double>(3, 100000.0L), thirds);
  Report("UniformBelow(3*2^62) thirds", third_chi, 300000);
  EXPECT_GT(third_chi.p_value, kSignificance);
  // 128-bit: m = 3·2^100.
  const u128 m128 = static_cast<u128>(3) << 100;
  std::vector<uint64_t> thirds128(3, 0);
  for (int i = 0; i < 300000; ++i) {
    const u128 u = internal::UniformBelow128(words, m128);
    ASSERT_LT(u, m128);
    ++thirds128[static_cast<size_t>(u >> 100)];
  }
  const ChiSquare chi128 = ChiSquareOfBins(std::vector<long double>(3, 100000.0L), thirds128);
  Report("UniformBelow128(3*2^100) thirds", chi128, 300000);
  EXPECT_GT(chi128.p_value, kSignificance);
  EXPECT_EQ(internal::UniformBelow(words, 1), 0u);
}

// --- (c) Sub-samplers against their exact distributions --------------------

TEST(DiscreteGaussianSubSamplers, BernoulliExpMinusGamma) {
  auto source = MakeReproducible(21);
  internal::RandomWords words(*source);
  constexpr uint64_t kDraws = 1000000;
  struct Case {
    uint64_t numerator, denominator;
  };
  for (const Case c : {Case{0, 1}, Case{1, 3}, Case{1, 1}, Case{5, 2}, Case{7, 1}, Case{1000, 999},
                       Case{23, 7}, Case{(uint64_t{1} << 63) + 1, uint64_t{1} << 63}}) {
    uint64_t ones = 0;
    for (uint64_t i = 0; i < kDraws; ++i) {
      auto b = internal::BernoulliExpMinusRational(words, c.numerator, c.denominator);
      ASSERT_TRUE(b.ok());
      ones += *b ? 1 : 0;
    }
    const long double gamma = static_cast<long double>(c.numerator) / c.denominator;
    const long double p = std::exp(-gamma);
    if (c.numerator == 0) {
      EXPECT_EQ(ones, kDraws);
      continue;
    }
    const ChiSquare chi = ChiSquareOfBins({kDraws * p, kDraws * (1 - p)}, {ones, kDraws - ones});
    Report("Bernoulli(exp(-" + std::to_string(c.numerator) + "/" +
               std::to_string(c.denominator) + "))",
           chi, kDraws);
    EXPECT_GT(chi.p_value, kSignificance);
    if (c.numerator == 1 && c.denominator == 1) {
      // Power: the same counts are rejected against exp(−1.01).
      const long double q = std::exp(-1.01L);
      const ChiSquare wrong =
          ChiSquareOfBins({kDraws * q, kDraws * (1 - q)}, {ones, kDraws - ones});
      Report("power: Bernoulli(exp(-1)) draws vs exp(-1.01)", wrong, kDraws);
      EXPECT_LT(wrong.p_value, kSignificance);
    }
  }
  // γ only known as a lower bound: exact unless every trial passes.
  EXPECT_EQ(internal::BernoulliExpMinus(words, 0, 0, 1, true).status().code(),
            StatusCode::kOutOfRange);
  int passes = 0;
  for (int i = 0; i < 1000; ++i) {
    auto b = internal::BernoulliExpMinus(words, 40, 0, 1, true);
    if (b.ok()) {
      EXPECT_FALSE(*b);
    } else {
      ++passes;  // probability e^-40 per try
    }
  }
  EXPECT_EQ(passes, 0);
  EXPECT_EQ(internal::BernoulliExpMinus(words, 0, 3, 3).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(DiscreteGaussianSubSamplers, DiscreteLaplace) {
  auto source = MakeReproducible(31);
  internal::RandomWords words(*source);
  constexpr uint64_t kDraws = 500000;
  struct Case {
    uint64_t s, t;
  };
  for (const Case c : {Case{1, 1}, Case{2, 3}, Case{1, 7}, Case{5, 2}}) {
    std::map<int64_t, uint64_t> counts;
    for (uint64_t i = 0; i < kDraws; ++i) {
      auto x = internal::DiscreteLaplace(words, c.s, c.t);
      ASSERT_TRUE(x.ok());
      ++counts[*x];
    }
    const long double a = static_cast<long double>(c.s) / c.t;
    auto pmf = [a](int64_t x) {
      return std::tanh(a / 2) * std::exp(-a * std::fabs(static_cast<long double>(x)));
    };
    const ChiSquare chi = GoodnessOfFit(counts, kDraws, pmf, 0);
    Report("DiscreteLaplace(scale " + std::to_string(c.t) + "/" + std::to_string(c.s) + ")", chi,
           kDraws);
    EXPECT_GT(chi.p_value, kSignificance);
    EXPECT_GT(chi.degrees_of_freedom, 2);
  }
  EXPECT_EQ(internal::DiscreteLaplace(words, 0, 1).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(DiscreteGaussianSubSamplers, LaplaceOverflowFailsLoudlyInsteadOfWrapping) {
  // t = 2^62: the candidate U + t·V reaches 2^63 as soon as V ≥ 2
  // (probability e^-2 per accepted candidate).
  auto source = MakeReproducible(41);
  internal::RandomWords words(*source);
  int errors = 0, values = 0;
  for (int i = 0; i < 2000; ++i) {
    auto x = internal::DiscreteLaplace(words, 1, uint64_t{1} << 62);
    if (!x.ok()) {
      EXPECT_EQ(x.status().code(), StatusCode::kOutOfRange);
      ++errors;
      continue;
    }
    ++values;
    EXPECT_NE(*x, std::numeric_limits<int64_t>::min());
  }
  EXPECT_GT(errors, 100);
  EXPECT_GT(values, 1000);
}

// --- The pmf helper --------------------------------------------------------

TEST(DiscreteGaussianPmf, NormaliserSeriesAgreeAndPmfSumsToOne) {
  for (long double sigma2 : {4.0L, 25.0L, 64.0L, 100.0L, 13.69L}) {
    const long double sigma = std::sqrt(sigma2);
    const long double direct =
        internal::LogNormaliserDirect(sigma2, static_cast<int64_t>(40 * sigma) + 2);
    const long double dual = internal::LogNormaliserDual(sigma2, 3);
    EXPECT_NEAR(static_cast<double>(direct - dual), 0.0, 1e-16) << sigma2;
  }
  // Σ_x pmf(x) = 1 (summed independently of the normaliser's own loop).
  for (Rational sigma2 : {Rational{1, 4}, Rational{1, 1}, Rational{1369, 100},
                          Rational{1000003, 7919}, Rational{1000000, 1}}) {
    auto z = DiscreteGaussianLogNormaliser(sigma2);
    ASSERT_TRUE(z.ok());
    EXPECT_LT(z->absolute_error_bound, 1e-12L);
    const long double s2 = static_cast<long double>(sigma2.numerator) / sigma2.denominator;
    const auto limit = static_cast<int64_t>(std::ceil(45 * std::sqrt(s2)));
    long double total = 0;
    for (int64_t x = -limit; x <= limit; ++x) total += Pmf(sigma2, x);
    EXPECT_NEAR(static_cast<double>(total - 1), 0.0, 1e-14) << s2;
  }
  // N_Z(0, 1/4): Z = 1 + 2e^-2 + 2e^-8 + 2e^-18 + ... exactly by hand.
  const long double z_quarter = 1 + 2 * std::exp(-2.0L) + 2 * std::exp(-8.0L) +
                                2 * std::exp(-18.0L) + 2 * std::exp(-32.0L) +
                                2 * std::exp(-50.0L);
  EXPECT_NEAR(static_cast<double>(Pmf({1, 4}, 0) * z_quarter - 1), 0.0, 1e-17);
}

// --- (a) Goodness of fit of the sampler ------------------------------------

void ExpectGaussianFits(Rational sigma2, uint64_t seed, uint64_t draws, const std::string& name) {
  const DiscreteGaussianSampler sampler = MakeSampler(sigma2);
  auto source = MakeReproducible(seed);
  const std::vector<int64_t> values = Draw(sampler, *source, draws);
  const std::map<int64_t, uint64_t> counts = Histogram(values);
  const ChiSquare chi =
      GoodnessOfFit(counts, draws, [&](int64_t x) { return Pmf(sigma2, x); }, 0);
  Report("N_Z(0, " + name + ")", chi, draws);
  EXPECT_GT(chi.p_value, kSignificance) << name;
  EXPECT_GE(chi.degrees_of_freedom, 2) << name;
}

TEST(DiscreteGaussianSampler, GoodnessOfFitSigmaHalf) { ExpectGaussianFits({1, 4}, 101, 1000000, "1/4"); }
TEST(DiscreteGaussianSampler, GoodnessOfFitSigmaOne) { ExpectGaussianFits({1, 1}, 102, 1000000, "1"); }
TEST(DiscreteGaussianSampler, GoodnessOfFitSigma3p7) {
  ExpectGaussianFits({1369, 100}, 103, 1000000, "1369/100");
}
TEST(DiscreteGaussianSampler, GoodnessOfFitSigma1000) {
  ExpectGaussianFits({1000000, 1}, 104, 1000000, "10^6");
}
TEST(DiscreteGaussianSampler, GoodnessOfFitNonDyadicRational) {
  ExpectGaussianFits({1000003, 7919}, 105, 1000000, "1000003/7919");
}

TEST(DiscreteGaussianSampler, GoodnessOfFitHasPower) {
  // σ = 3.7 draws tested against σ² × 1.02: must be rejected.
  const Rational sigma2{1369, 100};
  const Rational wrong{13962, 1000};  // 13.962 = 1.02 × 13.69 (rounded down)
  auto source = MakeReproducible(103);
  const std::vector<int64_t> values = Draw(MakeSampler(sigma2), *source, 1000000);
  const ChiSquare chi = GoodnessOfFit(Histogram(values), values.size(),
                                      [&](int64_t x) { return Pmf(wrong, x); }, 0);
  Report("power: N_Z(0, 13.69) draws vs N_Z(0, 13.962)", chi, values.size());
  EXPECT_LT(chi.p_value, kSignificance);
  // ... and against the continuous Gaussian's density at the integers
  // (normalised): σ = 0.5 is far from it.
  auto half = MakeReproducible(101);
  const std::vector<int64_t> small = Draw(MakeSampler({1, 4}), *half, 1000000);
  const long double phi0 = 1 / std::sqrt(2 * 3.14159265358979323846L * 0.25L);
  long double mass = 0;
  for (int x = -10; x <= 10; ++x) mass += phi0 * std::exp(-2.0L * x * x);
  const ChiSquare chi_small = GoodnessOfFit(
      Histogram(small), small.size(),
      [&](int64_t x) {
        // Rounded continuous N(0, 1/4), a plausible wrong implementation.
        const long double lo = (static_cast<long double>(x) - 0.5L) / 0.5L / std::sqrt(2.0L);
        const long double hi = (static_cast<long double>(x) + 0.5L) / 0.5L / std::sqrt(2.0L);
        return 0.5L * (std::erfc(lo) - std::erfc(hi));
      },
      0);
  Report("power: N_Z(0, 1/4) draws vs rounded N(0, 1/4)", chi_small, small.size());
  EXPECT_LT(chi_small.p_value, kSignificance);
  EXPECT_GT(mass, 0);
}

TEST(DiscreteGaussianSampler, GoodnessOfFitHugeSigmaUsesTheWideArithmetic) {
  // σ² = 2^62 + 2^40 + 12345 (σ ≈ 2.15·10^9 grid units, near the largest
  // Create accepts): ||Y|·t − n| ≥ 2^64 for candidates beyond (2^64/n + 1)σ ≈ 5σ
  // (~0.7% of them, some thousands here), so the 256-bit acceptance path is
  // exercised. Bins:
  // 40 quantile bins of the continuous N(0, σ²) with half-integer edges; the
  // discrete mass of a bin of integers differs from that integral by
  // O(1/σ²) relative (midpoint rule), below 1e-18 here.
  const Rational sigma2{(uint64_t{1} << 62) + (uint64_t{1} << 40) + 12345, 1};
  const DiscreteGaussianSampler sampler = MakeSampler(sigma2);
  auto source = MakeReproducible(106);
  constexpr uint64_t kDraws = 200000;
  const std::vector<int64_t> values = Draw(sampler, *source, kDraws);
  const long double sigma = std::sqrt(static_cast<long double>(sigma2.numerator));
  constexpr int kBins = 40;
  std::vector<long double> edges;  // integer edges; bin j = [edge_j, edge_{j+1})
  const boost::math::normal_distribution<long double> normal(0.0L, 1.0L);
  for (int j = 1; j < kBins; ++j) {
    edges.push_back(std::round(sigma * boost::math::quantile(normal, j / static_cast<long double>(kBins))));
  }
  auto cdf = [&](long double edge) {  // P(X < edge) ≈ Φ((edge − 1/2)/σ)
    return 0.5L * std::erfc(-(edge - 0.5L) / sigma / std::sqrt(2.0L));
  };
  std::vector<long double> expected;
  long double previous = 0;
  for (long double e : edges) {
    expected.push_back(kDraws * (cdf(e) - previous));
    previous = cdf(e);
  }
  expected.push_back(kDraws * (1 - previous));
  std::vector<uint64_t> observed(kBins, 0);
  for (int64_t v : values) {
    const auto it = std::upper_bound(edges.begin(), edges.end(), static_cast<long double>(v));
    ++observed[static_cast<size_t>(it - edges.begin())];
  }
  const ChiSquare chi = ChiSquareOfBins(expected, observed);
  Report("N_Z(0, 2^62+2^40+12345), 40 quantile bins", chi, kDraws);
  EXPECT_GT(chi.p_value, kSignificance);
}

// --- (b) The low-order-bit / support test ----------------------------------

TEST(DiscreteGaussianSampler, NeighbouringSumsHaveTheSameOutputClasses) {
  // Two neighbouring integer sums s and s + 1 released as s + N_Z(0, σ²),
  // σ = 1000. Every release is an integer (on a grid g = 2^-20 it is exactly
  // representable: (s + Y)·g round-trips), the support of each side is all
  // of Z, and the low-order bits carry nothing: for k = 1..8 the residues
  // mod 2^k are uniform on each side, the two sides are homogeneous, and no
  // residue class is reached on one side only.
  const DiscreteGaussianSampler sampler = MakeSampler({1000000, 1});
  constexpr uint64_t kDraws = 1000000;
  const int64_t s = 123456789;
  std::vector<std::vector<int64_t>> releases(2);
  for (int side = 0; side < 2; ++side) {
    auto source = MakeReproducible(200 + side);
    releases[side] = Draw(sampler, *source, kDraws);
    for (int64_t& y : releases[side]) {
      y += s + side;
      const double on_grid = std::ldexp(static_cast<double>(y), -20);
      ASSERT_EQ(static_cast<int64_t>(std::ldexp(on_grid, 20)), y);
    }
  }
  double worst_uniform_p = 1, worst_homogeneity_p = 1;
  for (int k = 1; k <= 8; ++k) {
    const uint64_t classes = uint64_t{1} << k;
    std::vector<std::vector<uint64_t>> counts(2, std::vector<uint64_t>(classes, 0));
    for (int side = 0; side < 2; ++side) {
      for (int64_t y : releases[side]) ++counts[side][static_cast<uint64_t>(y) & (classes - 1)];
      const ChiSquare uniform = ChiSquareOfBins(
          std::vector<long double>(classes, static_cast<long double>(kDraws) / classes),
          counts[side]);
      worst_uniform_p = std::min(worst_uniform_p, uniform.p_value);
      EXPECT_GT(uniform.p_value, kSignificance) << "side " << side << " k " << k;
    }
    // Two-sample homogeneity (equal sample sizes): Σ (a − b)²/(a + b).
    long double statistic = 0;
    for (uint64_t c = 0; c < classes; ++c) {
      EXPECT_GT(counts[0][c], 0u) << "class " << c << " mod 2^" << k << " unreached for s";
      EXPECT_GT(counts[1][c], 0u) << "class " << c << " mod 2^" << k << " unreached for s+1";
      const long double a = counts[0][c], b = counts[1][c];
      statistic += (a - b) * (a - b) / (a + b);
    }
    boost::math::chi_squared_distribution<double> distribution(static_cast<double>(classes - 1));
    const double p = boost::math::cdf(
        boost::math::complement(distribution, static_cast<double>(statistic)));
    worst_homogeneity_p = std::min(worst_homogeneity_p, p);
    EXPECT_GT(p, kSignificance) << "k " << k;
  }
  std::printf("[stat] low-order bits, s vs s+1, k = 1..8, %llu draws a side: worst uniformity "
              "p = %.4g, worst homogeneity p = %.4g\n",
              static_cast<unsigned long long>(kDraws), worst_uniform_p, worst_homogeneity_p);
  // The support: every integer within 2σ of s is reached from both sides
  // (expected count at the edge ≈ 54, so a miss has probability ≈ e^-54).
  for (int side = 0; side < 2; ++side) {
    std::vector<bool> seen(4001, false);
    for (int64_t y : releases[side]) {
      const int64_t offset = y - s + 2000;
      if (offset >= 0 && offset <= 4000) seen[static_cast<size_t>(offset)] = true;
    }
    EXPECT_EQ(std::count(seen.begin(), seen.end(), false), 0) << "side " << side;
  }
}

TEST(DiscreteGaussianSampler, FloatingPointSamplerFailsTheSameTest) {
  // The same question asked of today's floating-point mechanism, release =
  // s + σ·z in double with σ = 1 and neighbouring s = 0, 1 (Mironov 2012):
  // a release in [1/4, 1/2) with its last mantissa bit set (an odd multiple
  // of 2^-54) can only come from s = 0, because for s = 1 it is 1 + σz with
  // σz a multiple of 2^-53. This documents the failure the discrete sampler
  // removes; it is not a property of the new code.
  auto source = MakeReproducible(300);
  std::vector<double> z(400000);
  source->FillStandardNormal(z);
  int one_sided[2] = {0, 0};
  for (int side = 0; side < 2; ++side) {
    for (size_t i = side; i < z.size(); i += 2) {
      const double release = static_cast<double>(side) + z[i];
      if (release >= 0.25 && release < 0.5) {
        const double units = std::ldexp(release, 54);  // exact
        if (std::fmod(units, 2.0) == 1.0) ++one_sided[side];
      }
    }
  }
  std::printf("[stat] floating-point releases in [1/4,1/2) with odd last bit: s=0: %d, s=1: %d\n",
              one_sided[0], one_sided[1]);
  EXPECT_GT(one_sided[0], 1000);
  EXPECT_EQ(one_sided[1], 0);
}

// --- (d) Reproducibility ---------------------------------------------------

TEST(DiscreteGaussianSampler, ReproducibleSourceGivesIdenticalDraws) {
  const DiscreteGaussianSampler sampler = MakeSampler({1369, 100});
  auto a = MakeReproducible(5);
  auto b = MakeReproducible(5);
  auto c = MakeReproducible(6);
  const std::vector<int64_t> first = Draw(sampler, *a, 10000);
  const std::vector<int64_t> second = Draw(sampler, *b, 10000);
  const std::vector<int64_t> other = Draw(sampler, *c, 10000);
  EXPECT_EQ(first, second);
  EXPECT_NE(first, other);
  // Same call sequence, same draws again.
  EXPECT_EQ(Draw(sampler, *a, 777), Draw(sampler, *b, 777));
  // The production source works through the same interface.
  auto secure = SecureNoiseSource::Create();
  ASSERT_TRUE(secure.ok());
  std::vector<int64_t> production(1000);
  EXPECT_TRUE(sampler.Fill(**secure, production).ok());
  EXPECT_GT(std::count_if(production.begin(), production.end(),
                          [](int64_t x) { return x != 0; }),
            500);
}

// The sampler's draws on fixed seeds, pinned: any change to which random
// bits a draw reads, or to what it makes of them, changes the digests; so
// does a change of distribution that the goodness-of-fit tests above might
// be too weak to see. A change of the digests must be deliberate and say why
// the draws are still exact (they changed once: uniforms and sign bits now
// take only the bits they need from RandomWords::Bits instead of a word
// each). The cases cover t = 1 (σ < 1), denominators d > 1 that are not
// powers of two, σ ≈ 2^21 (a release's grid-unit σ), and σ near 2^31 (the
// 256-bit acceptance path). Two Fill calls per case: the second starts where
// the first left the stream, so it also pins how much the first consumed.
uint64_t Fnv1a(uint64_t hash, int64_t value) {
  for (int byte = 0; byte < 8; ++byte) {
    hash ^= static_cast<uint64_t>(value) >> (8 * byte) & 0xff;
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

TEST(DiscreteGaussianSampler, FixedSeedDrawsAreThoseOfTheFirstSampler) {
  struct Case {
    Rational sigma2;
    uint64_t seed;
    uint64_t digest;
  };
  const Case cases[] = {
      {{1, 4}, 201, 0x1921ffc706da4314ULL},
      {{5, 7}, 202, 0x57281ba25e79de66ULL},
      {{1369, 100}, 203, 0x53cf43b28dd6002aULL},
      {{1000000000007ULL, 3}, 204, 0x59637df1b209c5efULL},
      {{(uint64_t{1} << 42) + 4097, 1}, 205, 0xcf71cddfd75196a3ULL},
      {{(uint64_t{1} << 62) + (uint64_t{1} << 40) + 12345, 1}, 206, 0x752aeba4fec470fbULL},
  };
  for (const Case& c : cases) {
    const DiscreteGaussianSampler sampler = MakeSampler(c.sigma2);
    auto source = MakeReproducible(c.seed);
    uint64_t digest = 0xcbf29ce484222325ULL;
    for (size_t count : {size_t{60000}, size_t{40001}}) {
      for (int64_t x : Draw(sampler, *source, count)) digest = Fnv1a(digest, x);
    }
    std::printf("[pin] sigma^2 = %llu/%llu seed %llu: digest 0x%016llxULL\n",
                static_cast<unsigned long long>(c.sigma2.numerator),
                static_cast<unsigned long long>(c.sigma2.denominator),
                static_cast<unsigned long long>(c.seed), static_cast<unsigned long long>(digest));
    EXPECT_EQ(digest, c.digest) << c.sigma2.numerator << "/" << c.sigma2.denominator;
  }
}

// The release noise in chunks, each from a stream of its own (issue 30: the
// noise of a step divides over threads): the draws are the same on any
// number of threads, chunks differ from each other and from the next call,
// and the whole still fits N_Z(0, sigma^2).
TEST(DiscreteGaussianSampler, ChunkedFillIsTheSameOnAnyNumberOfThreadsAndFits) {
  const Rational sigma2{1369, 100};
  const DiscreteGaussianSampler sampler = MakeSampler(sigma2);
  const size_t chunk = SecureNoiseSource::kDiscreteGaussianChunk;
  const size_t count = 6 * chunk + 123;  // a short last chunk
  std::vector<int64_t> one(count);
  {
    auto source = MakeReproducible(9);
    ASSERT_TRUE(source->FillDiscreteGaussianParallel(sampler, one, 1).ok());
  }
  for (int threads : {2, 3, 8, 64}) {
    auto source = MakeReproducible(9);
    std::vector<int64_t> many(count);
    ASSERT_TRUE(source->FillDiscreteGaussianParallel(sampler, many, threads).ok());
    EXPECT_EQ(many, one) << threads << " threads";
  }
  auto source = MakeReproducible(9);
  std::vector<int64_t> serial(count);
  ASSERT_TRUE(source->FillDiscreteGaussian(sampler, serial).ok());  // one thread
  EXPECT_EQ(serial, one);
  std::vector<int64_t> next(count);
  ASSERT_TRUE(source->FillDiscreteGaussianParallel(sampler, next, 4).ok());
  EXPECT_NE(next, one);  // a new base key for every call
  EXPECT_FALSE(std::equal(one.begin(), one.begin() + chunk, one.begin() + chunk));

  const uint64_t draws = 1000000;
  auto fit_source = MakeReproducible(110);
  std::vector<int64_t> values(draws);
  ASSERT_TRUE(fit_source->FillDiscreteGaussianParallel(sampler, values, 4).ok());
  const ChiSquare chi =
      GoodnessOfFit(Histogram(values), draws, [&](int64_t x) { return Pmf(sigma2, x); }, 0);
  Report("N_Z(0, 1369/100), 4 threads, chunked", chi, draws);
  EXPECT_GT(chi.p_value, kSignificance);
}

// --- (f) 1-D privacy loss ----------------------------------------------------

TEST(DiscreteGaussianAccounting, DeltaClosedFormsAndSymmetry) {
  // ε = 0: δ is the total variation distance. For Δ = 1 the loss is > 0 on
  // x ≤ 0, so δ(0) = P(X ≤ 0) − P(X ≤ −1) = P(X = 0) = 1/Z; for Δ = 2,
  // δ(0) = P(0) + P(−1).
  for (Rational sigma2 : {Rational{1, 4}, Rational{1, 1}, Rational{1369, 100},
                          Rational{1000003, 7919}}) {
    auto d1 = DiscreteGaussianMechanismDelta(sigma2, 1, 0.0);
    ASSERT_TRUE(d1.ok());
    EXPECT_NEAR(static_cast<double>(d1->delta / Pmf(sigma2, 0) - 1), 0.0, 1e-15);
    auto d2 = DiscreteGaussianMechanismDelta(sigma2, 2, 0.0);
    ASSERT_TRUE(d2.ok());
    EXPECT_NEAR(static_cast<double>(d2->delta / (Pmf(sigma2, 0) + Pmf(sigma2, -1)) - 1), 0.0,
                1e-15);
    long double previous = 2;
    for (double eps : {0.0, 0.1, 0.5, 1.0, 2.0, 4.0, 8.0}) {
      for (uint64_t sensitivity : {1u, 2u, 3u}) {
        auto d = DiscreteGaussianMechanismDelta(sigma2, sensitivity, eps);
        ASSERT_TRUE(d.ok());
        // Both directions, computed separately, agree (x ↦ Δ − x symmetry).
        EXPECT_LE(std::fabs(d->delta_remove - d->delta_add),
                  2 * d->error_bound + 1e-300L) << eps << " " << sensitivity;
        EXPECT_LT(d->error_bound, 1e-12L * d->delta + 1e-300L);
      }
      auto d = DiscreteGaussianMechanismDelta(sigma2, 1, eps);
      EXPECT_LT(d->delta, previous);  // strictly decreasing in ε
      previous = d->delta;
    }
  }
}

TEST(DiscreteGaussianAccounting, RenyiDivergenceIsAtMostTheCksBound) {
  int strict = 0, attained = 0;
  for (Rational sigma2 : {Rational{1, 4}, Rational{1, 1}, Rational{2, 1}, Rational{1369, 100},
                          Rational{1000003, 7919}, Rational{7, 3}}) {
    for (uint64_t sensitivity : {1u, 2u, 3u, 5u}) {
      for (double alpha : {1.25, 1.5, 2.0, 2.5, 3.0, 3.7, 8.0, 16.5, 32.0, 64.0}) {
        auto d = DiscreteGaussianRenyiDivergence(sigma2, sensitivity, alpha);
        ASSERT_TRUE(d.ok());
        const long double bound = DiscreteGaussianRdpBound(sigma2, sensitivity, alpha);
        EXPECT_LE(*d, bound * (1 + 1e-14L)) << sigma2.numerator << "/" << sigma2.denominator
                                           << " Δ=" << sensitivity << " α=" << alpha;
        const long double shift = (alpha - 1) * static_cast<long double>(sensitivity);
        if (shift == std::round(shift)) {
          // (α − 1)Δ integer: θ((α−1)Δ) = θ(0), the bound is attained.
          EXPECT_NEAR(static_cast<double>(*d / bound - 1), 0.0, 1e-13);
          ++attained;
        } else if (bound - *d > 1e-6L * bound) {
          ++strict;
        }
        // Independent closed form: bound + ln(θ(c)/θ(0))/(α − 1), θ summed here.
        const long double s2 = static_cast<long double>(sigma2.numerator) / sigma2.denominator;
        const long double c = shift;
        long double theta_c = 0, theta_0 = 0;
        const auto reach = static_cast<int64_t>(std::ceil(45 * std::sqrt(s2))) + 1;
        for (int64_t x = -reach; x <= reach; ++x) {
          const long double xx = static_cast<long double>(x);
          theta_c += std::exp(-(xx - (c - std::round(c))) * (xx - (c - std::round(c))) / (2 * s2));
          theta_0 += std::exp(-xx * xx / (2 * s2));
        }
        const long double closed = bound + std::log(theta_c / theta_0) / (alpha - 1);
        EXPECT_NEAR(static_cast<double>((*d - closed) / bound), 0.0, 1e-13);
      }
    }
  }
  std::printf("[stat] Renyi grid: %d points attain the bound ((alpha-1)*Delta integer), %d are "
              "below it by more than 1e-6 relative\n",
              attained, strict);
  EXPECT_GT(strict, 10);
  EXPECT_GT(attained, 20);
  // σ = 0.5, Δ = 1, α = 1.5: visibly below the bound 3 (≈ 2.9425).
  auto d = DiscreteGaussianRenyiDivergence({1, 4}, 1, 1.5);
  EXPECT_LT(*d, 2.95L);
  EXPECT_GT(*d, 2.93L);
}

TEST(DiscreteGaussianAccounting, DeltaIsBelowTheRdpConversion) {
  // δ(ε) ≤ exp((α − 1)(D_α − ε)) (Mironov 2017, Proposition 3) for every α:
  // ties the two exact computations together.
  for (Rational sigma2 : {Rational{1, 1}, Rational{1369, 100}, Rational{7, 3}}) {
    for (double eps : {0.5, 1.0, 3.0}) {
      auto delta = DiscreteGaussianMechanismDelta(sigma2, 1, eps);
      ASSERT_TRUE(delta.ok());
      for (double alpha : {1.5, 2.0, 4.0, 10.0}) {
        auto d = DiscreteGaussianRenyiDivergence(sigma2, 1, alpha);
        ASSERT_TRUE(d.ok());
        EXPECT_LE(delta->delta, std::exp((alpha - 1) * (*d - eps)));
      }
    }
  }
}

}  // namespace
}  // namespace vipsd::privacy
