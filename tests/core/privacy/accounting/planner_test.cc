#include "core/privacy/accounting/planner.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/privacy/accounting/filter_weights.h"
#include "core/privacy/accounting/rdp_accountant.h"

namespace vipsd::privacy {
namespace {

// True if x has at most three significant decimal digits.
bool HasThreeDigits(double x) {
  const double scale = std::pow(10.0, 2 - std::floor(std::log10(x)));
  const double scaled = x * scale;
  return std::abs(scaled - std::round(scaled)) < 1e-9 * scaled;
}

double RdpEpsilon(double q, double sigma, int64_t steps, double delta) {
  RdpAccountant accountant;
  EXPECT_TRUE(accountant.Compose({q, sigma}, steps).ok());
  return accountant.GetEpsilon(delta)->epsilon;
}

TEST(PlannerTest, RdpEstimateMatchesTheAccountant) {
  auto estimate = EstimateEpsilon(AccountantKind::kRdp, {0.004, 1.0}, 100, 1e-3);
  ASSERT_TRUE(estimate.ok());
  EXPECT_EQ(estimate->epsilon, RdpEpsilon(0.004, 1.0, 100, 1e-3));
  ASSERT_TRUE(estimate->order.has_value());
  ASSERT_TRUE(estimate->epsilon_classic.has_value());
  EXPECT_GE(*estimate->epsilon_classic, estimate->epsilon);
}

TEST(PlannerTest, SigmaIsTheSmallestThreeDigitValueMeetingTheTarget) {
  struct Case { double target, q; int64_t steps; double delta; };
  for (const Case& c : {Case{1.0, 0.02, 50, 1e-5}, Case{0.5, 0.004, 1000, 1e-6},
                        Case{8.0, 0.1, 10000, 1e-5}, Case{0.05, 1e-4, 100, 1e-5}}) {
    auto sigma = NoiseMultiplierForEpsilon(AccountantKind::kRdp, c.target, c.q, c.steps,
                                           c.delta);
    ASSERT_TRUE(sigma.ok()) << sigma.status().message();
    EXPECT_TRUE(HasThreeDigits(*sigma)) << *sigma;
    EXPECT_LE(RdpEpsilon(c.q, *sigma, c.steps, c.delta), c.target);
    // The next smaller three-digit value no longer meets the target.
    const double unit = std::pow(10.0, std::floor(std::log10(*sigma)) - 2);
    const double mantissa = std::round(*sigma / unit);
    const double smaller = mantissa > 100 ? (mantissa - 1) * unit : 999 * unit / 10;
    EXPECT_GT(RdpEpsilon(c.q, smaller, c.steps, c.delta), c.target) << *sigma;
  }
}

TEST(PlannerTest, StepsIsTheLargestCountWithinBudget) {
  auto steps = MaxStepsForEpsilon(AccountantKind::kRdp, 1.0, 0.01, 1.1, 1e-5);
  ASSERT_TRUE(steps.ok());
  ASSERT_GT(*steps, 1);
  EXPECT_LE(RdpEpsilon(0.01, 1.1, *steps, 1e-5), 1.0);
  EXPECT_GT(RdpEpsilon(0.01, 1.1, *steps + 1, 1e-5), 1.0);
}

TEST(PlannerTest, StepsIsZeroWhenOneStepIsTooMuch) {
  auto steps = MaxStepsForEpsilon(AccountantKind::kRdp, 0.01, 1.0, 0.5, 1e-5);
  ASSERT_TRUE(steps.ok());
  EXPECT_EQ(*steps, 0);
}

TEST(PlannerTest, HugeBudgetIsReportedNotLooped) {
  auto steps = MaxStepsForEpsilon(AccountantKind::kRdp, 1000.0, 1e-6, 100.0, 0.5);
  EXPECT_FALSE(steps.ok());
  EXPECT_EQ(steps.status().code(), StatusCode::kOutOfRange);
}

TEST(PlannerTest, OtherAccountantsPlanConsistently) {
  double planned[2] = {0, 0};
  for (AccountantKind kind : {AccountantKind::kPld, AccountantKind::kStrong}) {
    auto sigma = NoiseMultiplierForEpsilon(kind, 1.0, 0.02, 50, 1e-5);
    ASSERT_TRUE(sigma.ok()) << AccountantName(kind) << ": " << sigma.status().message();
    EXPECT_TRUE(HasThreeDigits(*sigma));
    auto at = EstimateEpsilon(kind, {0.02, *sigma}, 50, 1e-5);
    ASSERT_TRUE(at.ok());
    EXPECT_LE(at->epsilon, 1.0);
    EXPECT_FALSE(at->order.has_value());
    auto below = EstimateEpsilon(kind, {0.02, *sigma * 0.99}, 50, 1e-5);
    ASSERT_TRUE(below.ok());
    EXPECT_GT(below->epsilon, 1.0) << AccountantName(kind);
    planned[kind == AccountantKind::kPld ? 0 : 1] = *sigma;
  }
  // PLD is tighter than RDP, so it needs less noise; strong composition more.
  const double rdp = *NoiseMultiplierForEpsilon(AccountantKind::kRdp, 1.0, 0.02, 50, 1e-5);
  EXPECT_LT(planned[0], rdp);
  EXPECT_GT(planned[1], rdp);
  // Step planning with the cheap baseline accountant: largest T within budget.
  auto steps = MaxStepsForEpsilon(AccountantKind::kStrong, 20.0, 0.02, 2.0, 1e-5);
  ASSERT_TRUE(steps.ok()) << steps.status().message();
  ASSERT_GT(*steps, 0);
  EXPECT_LE(EstimateEpsilon(AccountantKind::kStrong, {0.02, 2.0}, *steps, 1e-5)->epsilon, 20.0);
  EXPECT_GT(EstimateEpsilon(AccountantKind::kStrong, {0.02, 2.0}, *steps + 1, 1e-5)->epsilon,
            20.0);
}

TEST(PlannerTest, AccountantNamesRoundTrip) {
  for (AccountantKind kind : {AccountantKind::kRdp, AccountantKind::kPld, AccountantKind::kStrong}) {
    EXPECT_EQ(ParseAccountantName(AccountantName(kind)), kind);
  }
  EXPECT_FALSE(ParseAccountantName("moments").has_value());
}

TEST(PlannerTest, RejectsInvalidParameters) {
  EXPECT_FALSE(EstimateEpsilon(AccountantKind::kRdp, {0.0, 1.0}, 10, 1e-5).ok());
  EXPECT_FALSE(EstimateEpsilon(AccountantKind::kRdp, {0.1, -1.0}, 10, 1e-5).ok());
  EXPECT_FALSE(EstimateEpsilon(AccountantKind::kRdp, {0.1, 1.0}, 0, 1e-5).ok());
  EXPECT_FALSE(EstimateEpsilon(AccountantKind::kRdp, {0.1, 1.0}, 10, 1.0).ok());
  EXPECT_FALSE(NoiseMultiplierForEpsilon(AccountantKind::kRdp, 0.0, 0.1, 10, 1e-5).ok());
  EXPECT_FALSE(MaxStepsForEpsilon(AccountantKind::kRdp, -1.0, 0.1, 1.0, 1e-5).ok());
}

// PlanRun is what `vipsd-privacy plan` and `vipsd --check-config` both
// state: the steps, the filter's split and β, each the planner's own answer.
TEST(PlannerTest, PlanRunAnswersWithThePlannersFunctions) {
  // Global, fixed schedule: the steps to the ceiling; β counts all of them.
  auto global = PlanRun(/*fixed=*/true, /*residency=*/false, 4.0, 0.1, 2.0, 1e-5, 0);
  ASSERT_TRUE(global.ok()) << global.status().ToString();
  EXPECT_EQ(global->steps, *MaxStepsForEpsilon(AccountantKind::kFixed, 4.0, 0.1, 2.0, 1e-5));
  EXPECT_GT(global->steps, 0);
  EXPECT_EQ(global->timed_steps, global->steps);
  EXPECT_DOUBLE_EQ(global->overrun_beta, global->steps * kBatchTailProbability);
  EXPECT_TRUE(global->filter_weights.empty());
  // Global, adaptive: the split a new directory gets, and the filter's steps.
  auto adaptive = PlanRun(false, false, 4.0, 0.1, 2.0, 1e-5, 0);
  ASSERT_TRUE(adaptive.ok()) << adaptive.status().ToString();
  EXPECT_EQ(adaptive->filter_weights, *DesignFilterWeights(0.1, 2.0, 1e-5, 4.0, 0));
  EXPECT_EQ(adaptive->steps, *FilterMaxSteps(4.0, 0.1, 2.0, 1e-5, adaptive->filter_weights));
  // Residency: the longest affordable window; β counts the configured one.
  auto residency = PlanRun(true, true, 2.0, 0.01, 1.1, 1e-6, 500);
  ASSERT_TRUE(residency.ok()) << residency.status().ToString();
  EXPECT_EQ(residency->steps, *MaxResidencyWindow(AccountantKind::kFixed, 2.0, 0.01, 1.1, 1e-6));
  EXPECT_EQ(residency->timed_steps, 500);
  EXPECT_DOUBLE_EQ(residency->overrun_beta, 500 * kBatchTailProbability);
  // Bad settings are the planner's errors.
  EXPECT_FALSE(PlanRun(true, false, 4.0, 0.1, -1.0, 1e-5, 0).ok());
}

}  // namespace
}  // namespace vipsd::privacy
