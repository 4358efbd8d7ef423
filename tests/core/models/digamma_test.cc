#include "core/models/digamma.h"

#include <gtest/gtest.h>

#include <boost/math/special_functions/digamma.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

namespace vipsd::models {
namespace {

// Root of ψ on (0, ∞); close to it ψ is small and only an absolute error
// makes sense.
constexpr double kRoot = 1.4616321449683623;

// Relative error against Boost, or absolute where |ψ| < 1 (around the root).
double DigammaError(double x) {
  const double oracle = boost::math::digamma(x);
  return std::abs(Digamma(x) - oracle) / std::max(1.0, std::abs(oracle));
}

std::vector<double> LogUniform(double low, double high, int count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> log_x(std::log(low), std::log(high));
  std::vector<double> xs(static_cast<size_t>(count));
  for (double& x : xs) x = std::exp(log_x(rng));
  return xs;
}

TEST(DigammaTest, MatchesBoostTo1e12OverTheRangeLdaUses) {
  double worst = 0;
  for (double x : LogUniform(1e-3, 1e7, 200000, 1)) {
    const double error = DigammaError(x);
    worst = std::max(worst, error);
    ASSERT_LE(error, 1e-12) << "x = " << x;
  }
  // Far below the tolerance: the method is accurate to a few ulps.
  EXPECT_LT(worst, 1e-14);
}

TEST(DigammaTest, MatchesBoostFromTinyToHugeArguments) {
  for (double x : LogUniform(1e-300, 1e300, 20000, 2)) {
    ASSERT_LE(DigammaError(x), 1e-12) << "x = " << x;
  }
  // Around the clamp of the recurrence quotient (1e20) and exact integers,
  // where ψ(n) = H_{n−1} − γ and the recurrence is exact.
  for (double x : {1e19, 9.99e19, 1e20, 1.01e20, 1e21, 1.0, 2.0, 3.0, 9.0, 10.0, 11.0, 100.0}) {
    EXPECT_LE(DigammaError(x), 1e-14) << "x = " << x;
  }
  EXPECT_NEAR(Digamma(1.0), -0.57721566490153286, 1e-15);
}

TEST(DigammaTest, AbsoluteErrorNearTheRoot) {
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> around(kRoot - 0.1, kRoot + 0.1);
  for (int i = 0; i < 20000; ++i) {
    const double x = around(rng);
    EXPECT_NEAR(Digamma(x), boost::math::digamma(x), 1e-14) << x;
  }
  EXPECT_NEAR(Digamma(kRoot), 0.0, 1e-15);
}

// exp(ψ(x) − c) against std::exp of Boost's ψ. The exponential turns an
// absolute error δ of the argument into a relative error δ; ψ itself is
// accurate to a few ulps of max(1, |ψ(x)|), hence the tolerance.
void ExpectExpDigammaMatches(double x, double offset, double got) {
  const double argument = boost::math::digamma(x) - offset;
  const double oracle = std::exp(argument);
  const double tolerance = 1e-13 * (1.0 + std::abs(argument) + std::abs(offset)) * oracle;
  if (argument < -708.0) {
    EXPECT_EQ(got, 0.0) << "x = " << x << ", offset = " << offset;  // flushed, documented
  } else if (got == 0.0) {
    EXPECT_LT(oracle, 4e-306) << "x = " << x << ", offset = " << offset;  // flushed near the edge
  } else {
    EXPECT_NEAR(got, oracle, tolerance) << "x = " << x << ", offset = " << offset;
  }
}

TEST(ExpDigammaMinusTest, MatchesStdExpOfBoostDigamma) {
  const std::vector<double> xs = LogUniform(1e-3, 1e7, 100001, 4);  // odd: exercises the tail
  for (double offset : {-3.0, 0.0, 0.7, 5.0, 16.0}) {
    std::vector<double> out(xs.size(), -1.0);
    ExpDigammaMinus(xs, offset, out);
    for (size_t i = 0; i < xs.size(); ++i) ExpectExpDigammaMatches(xs[i], offset, out[i]);
  }
}

TEST(ExpDigammaMinusTest, PerElementOffsetsAndEveryTailLength) {
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> offset_dist(-2.0, 12.0);
  for (size_t n = 0; n <= 19; ++n) {
    const std::vector<double> xs = LogUniform(1e-2, 1e5, static_cast<int>(n), 10 + n);
    std::vector<double> offsets(n);
    for (double& offset : offsets) offset = offset_dist(rng);
    std::vector<double> out(n + 1, -1.0);  // one guard entry past the end
    ExpDigammaMinus(xs, offsets, std::span<double>(out.data(), n));
    for (size_t i = 0; i < n; ++i) ExpectExpDigammaMatches(xs[i], offsets[i], out[i]);
    EXPECT_EQ(out[n], -1.0) << "wrote past the end, n = " << n;
    // The scalar-offset form agrees with the per-element form entry by entry.
    std::vector<double> same_offset(n, 1.25), a(n), b(n);
    ExpDigammaMinus(xs, 1.25, a);
    ExpDigammaMinus(xs, same_offset, b);
    EXPECT_EQ(a, b);
  }
}

TEST(ExpDigammaMinusTest, InPlaceAndUnderflow) {
  std::vector<double> xs = {1e-4, 1e-3, 2e-3, 0.02, 1.0, 7.5, 3e6};
  const std::vector<double> copy = xs;
  ExpDigammaMinus(xs, 2.0, xs);  // out aliases x
  for (size_t i = 0; i < xs.size(); ++i) ExpectExpDigammaMatches(copy[i], 2.0, xs[i]);
  // ψ(1e-4) ≈ −1e4: the true value underflows; it is returned as exactly 0.
  EXPECT_EQ(xs[0], 0.0);
  EXPECT_EQ(xs[1], 0.0);  // ψ(1e-3) − 2 ≈ −1002.6
  EXPECT_GT(xs[4], 0.0);
}

}  // namespace
}  // namespace vipsd::models
