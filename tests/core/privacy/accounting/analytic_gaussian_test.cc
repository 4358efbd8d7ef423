// Tests of the exact privacy profile of the Gaussian mechanism
// (core/privacy/accounting/analytic_gaussian.h).
//
// The independent oracle is numerical integration (Boost's adaptive
// Gauss–Kronrod) of the hockey-stick divergence ∫ max(0, p(x) − e^ε q(x)) dx
// with p = N(1, σ²) and q = N(0, σ²), straight from the definition of
// (ε, δ)-DP; it shares no code or formula with the Mills-ratio evaluation in
// core/privacy/accounting/analytic_gaussian.cc. Golden values were computed separately
// with 60-digit arithmetic (mpmath) from Balle & Wang's Theorem 8.
#include "core/privacy/accounting/analytic_gaussian.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <boost/math/quadrature/gauss_kronrod.hpp>
#include <cmath>
#include <limits>
#include <vector>

namespace vipsd::privacy {
namespace {

using ::testing::HasSubstr;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// ln δ_σ(ε) by quadrature. p(x) > e^ε q(x) exactly for x > x* = σ²ε + 1/2.
// With x = x* + y and c = x* − 1:
//   p(x) − e^ε q(x) = p(x*) · exp(−(y² + 2cy)/(2σ²)) · (1 − exp(−y/σ²)),
// a positive integrand (no cancellation). y is rescaled by its natural width
// and [0, ∞) is covered by the segments [0, 1], [1, 2], [2, 4], … until the
// integrand is negligible past the peak; each segment is integrated by
// adaptive Gauss–Kronrod.
double OracleLogDelta(double sigma, double epsilon) {
  const double variance = sigma * sigma;
  const double c = variance * epsilon - 0.5;
  const double width = variance / (std::max(c, 0.0) + sigma);
  auto integrand = [&](double z) {
    const double y = width * z;
    return std::exp(-(y * y + 2 * c * y) / (2 * variance)) * -std::expm1(-y / variance);
  };
  const double peak = std::max(-c, 0.0) / width;  // of the Gaussian factor
  double integral = 0;
  double error_sum = 0;
  double lo = 0;
  double hi = 1;
  for (int segment = 0; segment < 1100; ++segment) {
    double error = 0;
    integral += boost::math::quadrature::gauss_kronrod<double, 61>::integrate(
        integrand, lo, hi, 15, 1e-13, &error);
    error_sum += error;
    if (hi > peak + 1 && integrand(hi) * hi < 1e-20 * integral) break;
    lo = hi;
    hi *= 2;
  }
  EXPECT_LT(error_sum, 1e-11 * integral) << "quadrature did not converge for sigma=" << sigma
                                         << " epsilon=" << epsilon;
  const double log_p_at_threshold =
      -c * c / (2 * variance) - std::log(sigma * std::sqrt(2 * M_PI));
  return log_p_at_threshold + std::log(width * integral);
}

double Delta(double sigma, double epsilon) {
  StatusOr<double> delta = GaussianDelta(sigma, epsilon);
  EXPECT_TRUE(delta.ok()) << delta.status().ToString();
  return delta.ok() ? *delta : kNaN;
}

double Epsilon(double sigma, double delta) {
  StatusOr<double> epsilon = GaussianEpsilon(sigma, delta);
  EXPECT_TRUE(epsilon.ok()) << epsilon.status().ToString();
  return epsilon.ok() ? *epsilon : kNaN;
}

double Sigma(double epsilon, double delta) {
  StatusOr<double> sigma = GaussianSigmaForEpsilon(epsilon, delta);
  EXPECT_TRUE(sigma.ok()) << sigma.status().ToString();
  return sigma.ok() ? *sigma : kNaN;
}

struct ProfilePoint {
  double sigma;
  double epsilon;
};

// From δ ≈ 0.6 down to δ ≈ 1e-200, both formula branches (ε below and above
// 1/(2σ²)), σ from 0.5 to 100.
const std::vector<ProfilePoint> kProfilePoints = {
    {0.5, 0.0},  {0.5, 0.1},  {0.5, 1.9},   {0.5, 2.1},   {0.5, 10.0},  {0.5, 40.0},
    {1.0, 0.0},  {1.0, 0.3},  {1.0, 0.5},   {1.0, 3.0},   {1.0, 7.0},   {1.0, 25.0},
    {2.0, 0.05}, {2.0, 1.0},  {2.0, 5.0},   {5.0, 0.01},  {5.0, 0.3},   {5.0, 2.0},
    {10.0, 0.0}, {10.0, 0.004}, {10.0, 0.05}, {10.0, 0.6}, {30.0, 0.2}, {100.0, 0.0},
    {100.0, 1e-5}, {100.0, 0.01}, {100.0, 0.06}, {100.0, 0.15},
    // σ = 0.02: e^ε overflows a double, on both sides of ε = 1/(2σ²) = 1250.
    {0.02, 1249.0}, {0.02, 1300.0}, {0.02, 2000.0},
};

TEST(GaussianDeltaTest, MatchesNumericalIntegrationOfHockeyStickDivergence) {
  for (const ProfilePoint& point : kProfilePoints) {
    SCOPED_TRACE(testing::Message() << "sigma=" << point.sigma << " epsilon=" << point.epsilon);
    const double log_oracle = OracleLogDelta(point.sigma, point.epsilon);
    const double delta = Delta(point.sigma, point.epsilon);
    ASSERT_GT(delta, 0.0);
    // Same value to 1e-10 relative at every magnitude down to 1e-200 (the
    // pessimistic rounding adds up to ~7e-11 at σ = 100).
    EXPECT_NEAR(std::log(delta), log_oracle, 1e-10);
    // Rounded up: never below the exact value. (The oracle agrees with
    // 60-digit arithmetic to ~1e-14; Boost's error estimate is looser.)
    EXPECT_GE(std::log(delta), log_oracle - 1e-13);
  }
}

TEST(GaussianDeltaTest, AtZeroEpsilonIsTotalVariationDistance) {
  // δ_σ(0) = Φ(1/(2σ)) − Φ(−1/(2σ)) = erf(1/(2√2 σ)).
  for (double sigma : {0.5, 1.0, 3.0, 100.0, 1e4, 1e8}) {
    const double expected = std::erf(1.0 / (2.0 * std::sqrt(2.0) * sigma));
    const double delta = Delta(sigma, 0.0);
    EXPECT_NEAR(delta, expected, 1e-13 * expected) << "sigma=" << sigma;
    EXPECT_GE(delta, expected * (1 - 4e-16)) << "sigma=" << sigma;
  }
}

TEST(GaussianDeltaTest, MonotoneInEpsilonAndSigma) {
  // Down to δ ≈ 1e-250; below DBL_MIN the result is the constant floor.
  for (double sigma : {0.5, 1.0, 4.0, 100.0}) {
    double previous = 1.0;
    for (double epsilon = 0.0; previous > 1e-250; epsilon += 0.01 / sigma) {
      const double delta = Delta(sigma, epsilon);
      ASSERT_LT(delta, previous) << "sigma=" << sigma << " epsilon=" << epsilon;
      previous = delta;
    }
  }
  for (double epsilon : {0.0, 0.1, 1.0, 5.0}) {
    double previous = 1.0;
    for (double sigma = 0.3; sigma < 200.0 && previous > 1e-250; sigma *= 1.05) {
      const double delta = Delta(sigma, epsilon);
      ASSERT_LT(delta, previous) << "sigma=" << sigma << " epsilon=" << epsilon;
      previous = delta;
    }
  }
}

TEST(GaussianDeltaTest, ExtremeInputsGiveValidProbabilities) {
  // Large ε: e^ε overflows a double at ε ≈ 710, the formula must not.
  for (double sigma : {0.01, 0.5, 1.0, 100.0}) {
    for (double epsilon : {50.0, 700.0, 800.0, 1e6}) {
      const double delta = Delta(sigma, epsilon);
      EXPECT_TRUE(std::isfinite(delta));
      EXPECT_GT(delta, 0.0);  // never rounded down to an exact zero
      EXPECT_LE(delta, 1.0);
    }
  }
  // Absurd magnitudes still give a bound in [0, 1], with the right limits.
  for (double sigma : {1e-300, 1e-20, 1e20, 1e300}) {
    for (double epsilon : {0.0, 1e-300, 1.0, 1e20, 1e300}) {
      const double delta = Delta(sigma, epsilon);
      EXPECT_GE(delta, 0.0) << "sigma=" << sigma << " epsilon=" << epsilon;
      EXPECT_LE(delta, 1.0) << "sigma=" << sigma << " epsilon=" << epsilon;
    }
  }
  EXPECT_EQ(Delta(1e-20, 1.0), 1.0);               // no noise: no privacy
  EXPECT_LT(Delta(1e300, 0.0), 1e-299);            // overwhelming noise
  EXPECT_LE(Delta(1.0, 1e20), 1e-300);             // astronomically small δ
}

TEST(GaussianEpsilonTest, MatchesGoldenValues) {
  struct Golden {
    double sigma;
    double delta;
    double epsilon;  // mpmath, 60 digits
  };
  const Golden kGolden[] = {
      {0.5, 1e-5, 9.9972561464343004},   {1.0, 1e-5, 4.3771780956812246},
      {1.0, 1e-12, 7.2384944201788584},  {2.0, 1e-8, 2.7076063342228486},
      {5.0, 1e-6, 0.83411754862405235},  {20.0, 1e-10, 0.28032683360095045},
      {100.0, 1e-12, 0.060752210629786216},
  };
  for (const Golden& golden : kGolden) {
    const double epsilon = Epsilon(golden.sigma, golden.delta);
    EXPECT_NEAR(epsilon, golden.epsilon, 1e-10 * golden.epsilon)
        << "sigma=" << golden.sigma << " delta=" << golden.delta;
    EXPECT_GE(epsilon, golden.epsilon) << "sigma=" << golden.sigma << " delta=" << golden.delta;
  }
}

TEST(GaussianEpsilonTest, InvertsDeltaAndIsTheSmallestValidEpsilon) {
  for (double sigma : {0.5, 1.0, 3.0, 10.0, 100.0}) {
    for (double delta : {1e-12, 1e-8, 1e-5, 1e-3}) {
      SCOPED_TRACE(testing::Message() << "sigma=" << sigma << " delta=" << delta);
      const double epsilon = Epsilon(sigma, delta);
      ASSERT_GT(epsilon, 0.0);
      EXPECT_LE(Delta(sigma, epsilon), delta);
      // The exact δ at the returned ε also meets the target.
      EXPECT_LE(OracleLogDelta(sigma, epsilon), std::log(delta));
      // Anything noticeably smaller does not.
      EXPECT_GT(Delta(sigma, epsilon * (1 - 1e-9)), delta);
      EXPECT_GT(OracleLogDelta(sigma, epsilon * (1 - 1e-9)), std::log(delta));
    }
  }
}

TEST(GaussianEpsilonTest, IsZeroWhenDeltaCoversTotalVariation) {
  // δ_1(0) = erf(1/(2√2)) ≈ 0.383.
  EXPECT_EQ(Epsilon(1.0, 0.5), 0.0);
  EXPECT_GT(Epsilon(1.0, 0.3), 0.0);
  EXPECT_EQ(Epsilon(100.0, 0.5), 0.0);
}

TEST(GaussianEpsilonTest, ClassicalCalibrationIsLooserThanAnalytic) {
  // Dwork & Roth, Theorem A.1: σ = sqrt(2 ln(1.25/δ))/ε gives (ε, δ)-DP for
  // ε < 1. The exact profile must certify at least that, and strictly more.
  for (double epsilon : {0.05, 0.2, 0.5, 0.9}) {
    for (double delta : {1e-3, 1e-5, 1e-10}) {
      SCOPED_TRACE(testing::Message() << "epsilon=" << epsilon << " delta=" << delta);
      const double classical_sigma = std::sqrt(2 * std::log(1.25 / delta)) / epsilon;
      const double analytic_epsilon = Epsilon(classical_sigma, delta);
      EXPECT_LT(analytic_epsilon, epsilon);
      EXPECT_GT(analytic_epsilon, 0.0);
      EXPECT_LT(Sigma(epsilon, delta), classical_sigma);
    }
  }
}

TEST(GaussianEpsilonTest, DecreasesWithNoiseAndDelta) {
  for (double delta : {1e-12, 1e-6, 1e-2}) {
    double previous = kInf;
    for (double sigma = 0.5; sigma <= 100.0; sigma *= 1.1) {
      const double epsilon = Epsilon(sigma, delta);
      if (epsilon == 0.0) {  // from here on δ_σ(0) ≤ δ already
        EXPECT_LE(Delta(sigma, 0.0), delta) << "sigma=" << sigma << " delta=" << delta;
        continue;
      }
      EXPECT_LT(epsilon, previous) << "sigma=" << sigma << " delta=" << delta;
      previous = epsilon;
    }
  }
  for (double sigma : {0.5, 2.0, 50.0}) {
    double previous = kInf;
    for (double delta = 1e-14; delta < 1e-2; delta *= 3.0) {
      const double epsilon = Epsilon(sigma, delta);
      EXPECT_LT(epsilon, previous) << "sigma=" << sigma << " delta=" << delta;
      previous = epsilon;
    }
  }
}

TEST(GaussianEpsilonTest, ExtremeInputsGiveFiniteResults) {
  for (double sigma : {0.5, 100.0}) {
    for (double delta : {1e-12, 0.5}) {
      const double epsilon = Epsilon(sigma, delta);
      EXPECT_TRUE(std::isfinite(epsilon));
      EXPECT_GE(epsilon, 0.0);
      EXPECT_LE(Delta(sigma, epsilon), delta);
    }
  }
  // Tiny δ and tiny σ: large but finite ε, still a valid guarantee.
  EXPECT_LE(Delta(1.0, Epsilon(1.0, 1e-300)), 1e-300);
  const double small_sigma_epsilon = Epsilon(1e-3, 1e-12);
  EXPECT_GT(small_sigma_epsilon, 5e5);  // ≈ 1/(2σ²) + ...
  EXPECT_LE(Delta(1e-3, small_sigma_epsilon), 1e-12);
}

TEST(GaussianSigmaForEpsilonTest, MatchesGoldenValues) {
  struct Golden {
    double epsilon;
    double delta;
    double sigma;  // mpmath, 60 digits
  };
  const Golden kGolden[] = {
      {0.1, 1e-5, 30.749566131977448}, {0.5, 1e-6, 8.0576184807250443},
      {1.0, 1e-5, 3.7306316348159418}, {2.0, 1e-10, 3.0257935440946646},
      {8.0, 1e-12, 0.91225199883995782},
  };
  for (const Golden& golden : kGolden) {
    const double sigma = Sigma(golden.epsilon, golden.delta);
    EXPECT_NEAR(sigma, golden.sigma, 1e-10 * golden.sigma)
        << "epsilon=" << golden.epsilon << " delta=" << golden.delta;
    EXPECT_GE(sigma, golden.sigma) << "epsilon=" << golden.epsilon << " delta=" << golden.delta;
  }
}

TEST(GaussianSigmaForEpsilonTest, IsTheSmallestSufficientSigma) {
  for (double epsilon : {0.0, 0.01, 0.3, 1.0, 4.0, 20.0}) {
    for (double delta : {1e-12, 1e-6, 1e-2}) {
      SCOPED_TRACE(testing::Message() << "epsilon=" << epsilon << " delta=" << delta);
      const double sigma = Sigma(epsilon, delta);
      EXPECT_LE(Delta(sigma, epsilon), delta);
      EXPECT_GT(Delta(sigma * (1 - 1e-9), epsilon), delta);
      // Round trip through the ε direction.
      EXPECT_LE(Epsilon(sigma, delta), epsilon * (1 + 1e-11) + 1e-300);
    }
  }
  // ε = 0 has a closed form: erf(1/(2√2σ)) = δ.
  const double sigma = Sigma(0.0, 1e-3);
  EXPECT_NEAR(std::erf(1.0 / (2 * std::sqrt(2.0) * sigma)), 1e-3, 1e-14);
}

TEST(GaussianSigmaForEpsilonTest, DecreasesWithEpsilonAndDelta) {
  double previous = kInf;
  for (double epsilon = 0.01; epsilon < 50.0; epsilon *= 1.3) {
    const double sigma = Sigma(epsilon, 1e-6);
    EXPECT_LT(sigma, previous) << "epsilon=" << epsilon;
    previous = sigma;
  }
  previous = kInf;
  for (double delta = 1e-15; delta < 0.5; delta *= 4.0) {
    const double sigma = Sigma(1.0, delta);
    EXPECT_LT(sigma, previous) << "delta=" << delta;
    previous = sigma;
  }
}

TEST(AnalyticGaussianValidationTest, RejectsInvalidInputsNamingTheParameter) {
  for (double sigma : {0.0, -1.0, kNaN, kInf}) {
    StatusOr<double> delta = GaussianDelta(sigma, 1.0);
    ASSERT_FALSE(delta.ok());
    EXPECT_EQ(delta.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(delta.status().message(), HasSubstr("noise_multiplier"));
    StatusOr<double> epsilon = GaussianEpsilon(sigma, 1e-5);
    ASSERT_FALSE(epsilon.ok());
    EXPECT_EQ(epsilon.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(epsilon.status().message(), HasSubstr("noise_multiplier"));
  }
  for (double epsilon : {-1e-300, -1.0, kNaN, kInf}) {
    StatusOr<double> delta = GaussianDelta(1.0, epsilon);
    ASSERT_FALSE(delta.ok());
    EXPECT_EQ(delta.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(delta.status().message(), HasSubstr("epsilon"));
    StatusOr<double> sigma = GaussianSigmaForEpsilon(epsilon, 1e-5);
    ASSERT_FALSE(sigma.ok());
    EXPECT_EQ(sigma.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(sigma.status().message(), HasSubstr("epsilon"));
  }
  for (double delta : {0.0, 1.0, -0.1, 1.5, kNaN}) {
    StatusOr<double> epsilon = GaussianEpsilon(1.0, delta);
    ASSERT_FALSE(epsilon.ok());
    EXPECT_EQ(epsilon.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(epsilon.status().message(), HasSubstr("delta"));
    StatusOr<double> sigma = GaussianSigmaForEpsilon(1.0, delta);
    ASSERT_FALSE(sigma.ok());
    EXPECT_EQ(sigma.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(sigma.status().message(), HasSubstr("delta"));
  }
}

TEST(AnalyticGaussianValidationTest, UnreachableDeltaIsOutOfRange) {
  // Below DBL_MIN the pessimistic δ cannot go.
  StatusOr<double> epsilon = GaussianEpsilon(1.0, 1e-320);
  ASSERT_FALSE(epsilon.ok());
  EXPECT_EQ(epsilon.status().code(), StatusCode::kOutOfRange);
  EXPECT_THAT(epsilon.status().message(), HasSubstr("delta"));
}

}  // namespace
}  // namespace vipsd::privacy
