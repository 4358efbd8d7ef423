// FixedScheduleAccountant: ε of a pinned (q, σ) schedule is the smaller of
// two valid upper bounds (PLD and RDP), never below the PLD lower bound, and
// the step count it allows is the planner's.
#include "core/privacy/accounting/fixed_schedule.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "core/privacy/accounting/pld_accountant.h"
#include "core/privacy/accounting/rdp_accountant.h"

namespace vipsd::privacy {
namespace {

struct Setting {
  double q, sigma;
  int64_t steps;
  double delta;
};

const std::vector<Setting> kSettings = {
    {0.1, 2.0, 150, 1e-5}, {0.004, 1.0, 100, 1e-3}, {0.2, 1.5, 30, 1e-5}, {1.0, 5.0, 10, 1e-5}};

TEST(FixedScheduleAccountantTest, IsTheSmallerOfPldAndRdpAndNeverBelowTheLowerBound) {
  for (const Setting& c : kSettings) {
    auto fixed = FixedScheduleAccountant::Create({c.q, c.sigma});
    ASSERT_TRUE(fixed.ok());
    auto at = fixed->Epsilon(c.steps, c.delta);
    ASSERT_TRUE(at.ok());
    // RDP: the plain (fixed-schedule) conversion of the composed curve.
    RdpAccountant rdp;
    ASSERT_TRUE(rdp.Compose({c.q, c.sigma}, c.steps).ok());
    const auto plain = rdp.GetEpsilon(c.delta);
    EXPECT_NEAR(at->rdp, plain->epsilon, 1e-12 * plain->epsilon);
    // PLD at the schedule's spacing.
    PldOptions options;
    options.discretization = kScheduleDiscretization;
    const double pld = *PldEpsilon(c.q, c.sigma, c.steps, c.delta, options);
    EXPECT_EQ(at->pld, pld);
    EXPECT_EQ(at->epsilon, std::min(pld, plain->epsilon));
    // Close to the finer default PLD (the coarser grid costs ≤ 1e-3).
    const double fine = *PldEpsilon(c.q, c.sigma, c.steps, c.delta);
    EXPECT_GE(at->pld, fine - 1e-9);
    EXPECT_LE(at->pld, fine + 1e-3);
    // And above the PLD lower bound: the true ε lies between the two.
    const PldStepGroup group{c.q, c.sigma, c.steps};
    auto lower = ComposedPld::ComposeLowerBound({&group, 1});
    ASSERT_TRUE(lower.ok());
    EXPECT_GE(at->epsilon, *lower->Epsilon(c.delta));
    // Memoised: the same answer again.
    EXPECT_EQ(fixed->Epsilon(c.steps, c.delta)->epsilon, at->epsilon);
  }
}

TEST(FixedScheduleAccountantTest, TheDemoSettingAllowsFarMoreStepsThanTheAdaptiveFilter) {
  // q = 0.1, σ = 2, δ = 1e-5, ceiling 4: the adaptive RDP filter allows 150
  // steps (with the old 162-order grid), plain RDP 234, PLD about 276.
  auto fixed = FixedScheduleAccountant::Create({0.1, 2.0});
  ASSERT_TRUE(fixed.ok());
  const int64_t steps = *fixed->MaxSteps(1e-5, 4.0, int64_t{1} << 30);
  EXPECT_GE(steps, 270);
  EXPECT_LE(fixed->Epsilon(steps, 1e-5)->epsilon, 4.0);
  EXPECT_GT(fixed->Epsilon(steps + 1, 1e-5)->epsilon, 4.0);
  EXPECT_STREQ(fixed->Epsilon(steps, 1e-5)->accountant(), "pld");
  RdpAccountant filter;
  ASSERT_TRUE(filter.Compose({0.1, 2.0}, steps).ok());
  EXPECT_GT(filter.GetEpsilon(1e-5, RdpConversion::kImproved, Adaptivity::kAdaptiveFilter)->epsilon,
            4.0);
}

TEST(FixedScheduleAccountantTest, EdgesAndInvalidArguments) {
  auto fixed = FixedScheduleAccountant::Create({0.5, 1.0});
  ASSERT_TRUE(fixed.ok());
  EXPECT_EQ(fixed->Epsilon(0, 1e-5)->epsilon, 0.0);
  EXPECT_FALSE(fixed->Epsilon(-1, 1e-5).ok());
  EXPECT_FALSE(fixed->Epsilon(1, 0.0).ok());
  EXPECT_FALSE(fixed->Epsilon(1, 1.0).ok());
  // One step is already over a tiny ceiling: zero steps.
  EXPECT_EQ(*fixed->MaxSteps(1e-5, 0.01, 1000), 0);
  // The search stops at its limit.
  auto generous = FixedScheduleAccountant::Create({0.001, 10.0});
  EXPECT_EQ(*generous->MaxSteps(1e-5, 10.0, 64), 64);
  EXPECT_FALSE(FixedScheduleAccountant::Create({0.0, 1.0}).ok());
  EXPECT_FALSE(FixedScheduleAccountant::Create({1.5, 1.0}).ok());
  EXPECT_FALSE(FixedScheduleAccountant::Create({0.5, 0.0}).ok());
}

// Prefetch (issue 30) computes in the background exactly what Epsilon
// computes, from any number of threads at once (TSan runs this test), and an
// accountant that goes away while a prefetch runs waits for it.
TEST(FixedScheduleAccountantTest, PrefetchGivesTheSameValuesFromAnyThread) {
  auto reference = FixedScheduleAccountant::Create({0.1, 2.0});
  auto accountant = FixedScheduleAccountant::Create({0.1, 2.0});
  ASSERT_TRUE(reference.ok() && accountant.ok());
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&accountant, t] {
      for (int64_t n = 1; n <= 12; ++n) {
        accountant->Prefetch(n + t, 1e-5);
        EXPECT_TRUE(accountant->Epsilon(n, 1e-5).ok());
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int64_t n = 1; n <= 14; ++n) {
    const auto want = reference->Epsilon(n, 1e-5);
    const auto got = accountant->Epsilon(n, 1e-5);
    ASSERT_TRUE(want.ok() && got.ok());
    EXPECT_EQ(got->epsilon, want->epsilon) << n;
    EXPECT_EQ(got->pld, want->pld) << n;
    EXPECT_EQ(got->rdp, want->rdp) << n;
  }
  // A copy shares the memo and the prefetch; the last one to go waits.
  {
    auto short_lived = FixedScheduleAccountant::Create({0.2, 1.5});
    ASSERT_TRUE(short_lived.ok());
    const FixedScheduleAccountant copy = *short_lived;
    copy.Prefetch(400, 1e-5);
  }
  // Arguments Epsilon would refuse start nothing.
  accountant->Prefetch(0, 1e-5);
  accountant->Prefetch(-3, 1e-5);
  accountant->Prefetch(5, 0.0);
  accountant->Prefetch(5, 1.0);
}

}  // namespace
}  // namespace vipsd::privacy
