// Tests of the strong-composition baseline accountant
// (core/privacy/accounting/strong_composition.h).
//
// The reference values are recomputed here from the public GaussianEpsilon
// (tested against numerical integration in analytic_gaussian_test.cc) and the
// textbook formulas, written out independently of the implementation.
#include "core/privacy/accounting/strong_composition.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/privacy/accounting/analytic_gaussian.h"

namespace vipsd::privacy {
namespace {

using ::testing::HasSubstr;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

StrongCompositionResult Compose(double q, double sigma, int64_t steps, double delta) {
  StatusOr<StrongCompositionResult> result = StrongCompositionEpsilon(q, sigma, steps, delta);
  EXPECT_TRUE(result.ok()) << result.status().ToString();
  return result.ok() ? *result : StrongCompositionResult{.epsilon = kNaN};
}

double AmplifiedEpsilon(double q, double epsilon0) {
  return std::log(1 + q * (std::exp(epsilon0) - 1));
}

// ε_total when a fraction `slack_fraction` of δ is the DRV slack δ'' and the
// rest is split evenly over the steps (δ0 = (1 − f)δ/(Tq)); f = 0 is basic
// composition.
double ReferenceEpsilon(double q, double sigma, int64_t steps, double delta,
                        double slack_fraction) {
  const double t = static_cast<double>(steps);
  const double delta0 = std::min((1 - slack_fraction) * delta / (t * q), 0.999999);
  StatusOr<double> epsilon0 = GaussianEpsilon(sigma, delta0);
  EXPECT_TRUE(epsilon0.ok()) << epsilon0.status().ToString();
  const double amplified = AmplifiedEpsilon(q, *epsilon0);
  if (slack_fraction == 0.0) return t * amplified;
  return std::sqrt(2 * t * std::log(1 / (slack_fraction * delta))) * amplified +
         t * amplified * (std::exp(amplified) - 1);
}

struct Config {
  double q;
  double sigma;
  int64_t steps;
  double delta;
};

const std::vector<Config> kConfigs = {
    {1.0, 1.0, 1, 1e-5},       {0.01, 1.0, 1000, 1e-5},  {0.001, 0.7, 100000, 1e-6},
    {0.1, 4.0, 50, 1e-8},      {1e-4, 2.0, 10000000, 1e-9}, {0.5, 10.0, 20, 1e-5},
    {0.02, 100.0, 1000000, 1e-12},
};

TEST(StrongCompositionTest, OneFullBatchStepIsTheAnalyticGaussian) {
  for (double sigma : {0.5, 1.0, 3.0, 30.0}) {
    for (double delta : {1e-12, 1e-5, 1e-2}) {
      SCOPED_TRACE(testing::Message() << "sigma=" << sigma << " delta=" << delta);
      const StrongCompositionResult result = Compose(1.0, sigma, 1, delta);
      const double analytic = *GaussianEpsilon(sigma, delta);
      EXPECT_TRUE(result.used_basic_composition);
      EXPECT_EQ(result.slack_delta, 0.0);
      EXPECT_GE(result.epsilon, analytic);
      EXPECT_LE(result.epsilon, analytic * (1 + 1e-9));
      EXPECT_LE(result.delta, delta);
      EXPECT_GE(result.delta, delta * (1 - 1e-12));
    }
  }
}

TEST(StrongCompositionTest, ReportedComponentsReproduceTheBound) {
  for (const Config& config : kConfigs) {
    SCOPED_TRACE(testing::Message() << "q=" << config.q << " sigma=" << config.sigma
                                    << " T=" << config.steps << " delta=" << config.delta);
    const StrongCompositionResult result =
        Compose(config.q, config.sigma, config.steps, config.delta);
    const double t = static_cast<double>(config.steps);
    ASSERT_TRUE(std::isfinite(result.epsilon));
    // Per step: ε0 is exactly the analytic Gaussian's at the reported δ0.
    EXPECT_EQ(result.step_epsilon0, *GaussianEpsilon(config.sigma, result.step_delta0));
    EXPECT_NEAR(result.amplified_epsilon, AmplifiedEpsilon(config.q, result.step_epsilon0),
                1e-12 * result.amplified_epsilon);
    EXPECT_DOUBLE_EQ(result.amplified_delta, config.q * result.step_delta0);
    // Composition: the formula applied to the components gives ε (rounded up).
    const double recomputed =
        result.used_basic_composition
            ? t * result.amplified_epsilon
            : std::sqrt(2 * t * std::log(1 / result.slack_delta)) * result.amplified_epsilon +
                  t * result.amplified_epsilon * std::expm1(result.amplified_epsilon);
    EXPECT_GE(result.epsilon, recomputed);
    EXPECT_NEAR(result.epsilon, recomputed, 1e-12 * recomputed);
    // The δ split uses the budget and never exceeds it.
    EXPECT_EQ(result.slack_delta == 0.0, result.used_basic_composition);
    EXPECT_LE(t * result.amplified_delta + result.slack_delta, config.delta);
    EXPECT_LE(result.delta, config.delta);
    EXPECT_NEAR(result.delta, t * result.amplified_delta + result.slack_delta,
                1e-15 * config.delta);
    EXPECT_GE(result.delta, config.delta * (1 - 1e-12));
  }
}

TEST(StrongCompositionTest, OptimisedSplitIsNoWorseThanAnyGridSplit) {
  for (const Config& config : kConfigs) {
    SCOPED_TRACE(testing::Message() << "q=" << config.q << " sigma=" << config.sigma
                                    << " T=" << config.steps << " delta=" << config.delta);
    const double epsilon = Compose(config.q, config.sigma, config.steps, config.delta).epsilon;
    // The fixed splits a careless baseline would use.
    for (double fraction : {0.5, 0.01, 0.99}) {
      EXPECT_LE(epsilon, ReferenceEpsilon(config.q, config.sigma, config.steps, config.delta,
                                          fraction) * (1 + 1e-9))
          << "f=" << fraction;
    }
    // Brute force: a fine grid in f (denser than the implementation's and
    // offset from it), plus basic composition.
    double best = ReferenceEpsilon(config.q, config.sigma, config.steps, config.delta, 0.0);
    for (int i = 0; i < 1500; ++i) {
      const double logit = -16.0 + 32.0 * (i + 0.37) / 1500;
      const double fraction = 1 / (1 + std::exp(-logit));
      best = std::min(best, ReferenceEpsilon(config.q, config.sigma, config.steps,
                                             config.delta, fraction));
    }
    EXPECT_LE(epsilon, best * (1 + 1e-6));
    // …and not suspiciously better than the best split can be.
    EXPECT_GE(epsilon, best * (1 - 1e-6));
  }
}

TEST(StrongCompositionTest, AdvancedCompositionWinsForManySteps) {
  // Small per-step ε' (≈ 0.003) over 1e5 steps: √T beats T.
  const StrongCompositionResult many = Compose(0.001, 4.0, 100000, 1e-5);
  EXPECT_FALSE(many.used_basic_composition);
  EXPECT_GT(many.slack_delta, 0.0);
  EXPECT_LT(many.epsilon, 0.1 * 100000 * many.amplified_epsilon);
  // With σ = 1 the per-step ε' is ≈ 1 and e^{ε'} − 1 makes DRV worse than basic.
  const StrongCompositionResult few = Compose(0.01, 1.0, 10000, 1e-5);
  EXPECT_TRUE(few.used_basic_composition);
  EXPECT_EQ(few.slack_delta, 0.0);
}

TEST(StrongCompositionTest, MonotoneInStepsSamplingRateAndNoise) {
  double previous = 0.0;
  for (int64_t steps : {1, 10, 100, 1000, 10000, 100000, 1000000, 10000000}) {
    const double epsilon = Compose(0.001, 1.0, steps, 1e-6).epsilon;
    EXPECT_GT(epsilon, previous) << "T=" << steps;
    previous = epsilon;
  }
  previous = 0.0;
  for (double q : {1e-6, 1e-4, 1e-3, 0.01, 0.1, 0.5, 1.0}) {
    const double epsilon = Compose(q, 1.5, 1000, 1e-6).epsilon;
    EXPECT_GT(epsilon, previous) << "q=" << q;
    previous = epsilon;
  }
  previous = kInf;
  for (double sigma : {0.5, 0.8, 1.0, 2.0, 4.0, 10.0, 100.0}) {
    const double epsilon = Compose(0.01, sigma, 1000, 1e-6).epsilon;
    EXPECT_LT(epsilon, previous) << "sigma=" << sigma;
    previous = epsilon;
  }
}

TEST(StrongCompositionTest, SanityValue) {
  const StrongCompositionResult result = Compose(0.01, 1.0, 1000, 1e-5);
  EXPECT_TRUE(std::isfinite(result.epsilon));
  EXPECT_GT(result.epsilon, 0.0);
  // Between one step's amplified ε and basic composition with f = 0.
  EXPECT_GT(result.epsilon, result.amplified_epsilon);
  EXPECT_LE(result.epsilon, ReferenceEpsilon(0.01, 1.0, 1000, 1e-5, 0.0) * (1 + 1e-12));
}

TEST(StrongCompositionTest, ExtremeParametersGiveFiniteResults) {
  for (const Config& config : std::vector<Config>{{1e-6, 100.0, 10000000, 1e-12},
                                                  {1.0, 0.5, 10000000, 1e-12},
                                                  {1e-6, 0.5, 1, 0.5},
                                                  {1.0, 100.0, 1, 0.999}}) {
    SCOPED_TRACE(testing::Message() << "q=" << config.q << " sigma=" << config.sigma
                                    << " T=" << config.steps << " delta=" << config.delta);
    const StrongCompositionResult result =
        Compose(config.q, config.sigma, config.steps, config.delta);
    EXPECT_TRUE(std::isfinite(result.epsilon));
    EXPECT_GE(result.epsilon, 0.0);
    EXPECT_LE(result.delta, config.delta);
    EXPECT_LT(result.step_delta0, 1.0);
  }
}

TEST(StrongCompositionTest, RejectsInvalidInputsNamingTheParameter) {
  struct Invalid {
    double q;
    double sigma;
    int64_t steps;
    double delta;
    const char* parameter;
  };
  const Invalid kInvalid[] = {
      {0.0, 1.0, 10, 1e-5, "sampling_rate"},  {1.5, 1.0, 10, 1e-5, "sampling_rate"},
      {kNaN, 1.0, 10, 1e-5, "sampling_rate"}, {-0.1, 1.0, 10, 1e-5, "sampling_rate"},
      {0.1, 0.0, 10, 1e-5, "noise_multiplier"}, {0.1, kInf, 10, 1e-5, "noise_multiplier"},
      {0.1, kNaN, 10, 1e-5, "noise_multiplier"}, {0.1, 1.0, 0, 1e-5, "steps"},
      {0.1, 1.0, -5, 1e-5, "steps"},          {0.1, 1.0, 10, 0.0, "delta"},
      {0.1, 1.0, 10, 1.0, "delta"},           {0.1, 1.0, 10, kNaN, "delta"},
  };
  for (const Invalid& invalid : kInvalid) {
    StatusOr<StrongCompositionResult> result =
        StrongCompositionEpsilon(invalid.q, invalid.sigma, invalid.steps, invalid.delta);
    ASSERT_FALSE(result.ok()) << invalid.parameter;
    EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(result.status().message(), HasSubstr(invalid.parameter));
  }
}

}  // namespace
}  // namespace vipsd::privacy
