#include "core/privacy/accounting/rdp_accountant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "core/privacy/accounting/rdp.h"

namespace vipsd::privacy {
namespace {

TEST(RdpAccountantTest, EmptyAccountantHasSpentNothing) {
  RdpAccountant accountant;
  auto epsilon = accountant.GetEpsilon(1e-5);
  ASSERT_TRUE(epsilon.ok());
  EXPECT_EQ(epsilon->epsilon, 0.0);
  EXPECT_EQ(accountant.GetEpsilon(1e-5, RdpConversion::kImproved, Adaptivity::kAdaptiveFilter)
                ->epsilon,
            0.0);
  EXPECT_EQ(accountant.steps(), 0);
}

TEST(RdpAccountantTest, ComposeAddsTheStepCurvePerOrder) {
  RdpAccountant accountant;
  ASSERT_TRUE(accountant.Compose({0.01, 1.1}, 250).ok());
  auto curve = SampledGaussianRdpCurve(0.01, 1.1, accountant.orders());
  ASSERT_TRUE(curve.ok());
  for (size_t i = 0; i < curve->size(); ++i) {
    EXPECT_DOUBLE_EQ(accountant.rdp()[i], 250 * (*curve)[i]);
  }
  EXPECT_EQ(accountant.steps(), 250);
}

TEST(RdpAccountantTest, StepByStepEqualsBatchedComposition) {
  RdpAccountant one_by_one, batched;
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(one_by_one.Compose({0.02, 0.9}).ok());
  ASSERT_TRUE(batched.Compose({0.02, 0.9}, 100).ok());
  auto a = one_by_one.GetEpsilon(1e-5);
  auto b = batched.GetEpsilon(1e-5);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NEAR(a->epsilon, b->epsilon, 1e-12 * b->epsilon);
  EXPECT_EQ(a->order, b->order);
}

TEST(RdpAccountantTest, HeterogeneousStepsComposePerOrder) {
  RdpAccountant accountant;
  ASSERT_TRUE(accountant.Compose({0.01, 1.0}, 300).ok());
  ASSERT_TRUE(accountant.Compose({0.05, 2.0}, 40).ok());
  ASSERT_TRUE(accountant.Compose({1.0, 30.0}, 2).ok());
  const auto& orders = accountant.orders();
  auto c1 = SampledGaussianRdpCurve(0.01, 1.0, orders);
  auto c2 = SampledGaussianRdpCurve(0.05, 2.0, orders);
  auto c3 = SampledGaussianRdpCurve(1.0, 30.0, orders);
  ASSERT_TRUE(c1.ok() && c2.ok() && c3.ok());
  std::vector<double> expected(orders.size());
  for (size_t i = 0; i < orders.size(); ++i) {
    expected[i] = 300 * (*c1)[i] + 40 * (*c2)[i] + 2 * (*c3)[i];
    EXPECT_NEAR(accountant.rdp()[i], expected[i], 1e-13 * expected[i]);
  }
  auto from_accountant = accountant.GetEpsilon(1e-6);
  auto from_sum = EpsilonFromRdp(orders, expected, 1e-6, RdpConversion::kImproved);
  ASSERT_TRUE(from_accountant.ok() && from_sum.ok());
  EXPECT_NEAR(from_accountant->epsilon, from_sum->epsilon, 1e-12);
  EXPECT_EQ(accountant.steps(), 342);
}

TEST(RdpAccountantTest, EpsilonGrowsWithStepsAndRateAndFallsWithNoise) {
  auto epsilon = [](double q, double sigma, int64_t steps) {
    RdpAccountant accountant;
    EXPECT_TRUE(accountant.Compose({q, sigma}, steps).ok());
    return accountant.GetEpsilon(1e-5)->epsilon;
  };
  double previous = 0;
  for (int64_t steps : {1, 10, 100, 1000, 10000}) {
    const double value = epsilon(0.01, 1.0, steps);
    EXPECT_GT(value, previous) << steps;
    previous = value;
  }
  previous = 0;
  for (double q : {1e-4, 1e-3, 1e-2, 0.1, 1.0}) {
    const double value = epsilon(q, 1.0, 100);
    EXPECT_GT(value, previous) << q;
    previous = value;
  }
  previous = INFINITY;
  for (double sigma : {0.5, 0.8, 1.0, 2.0, 10.0, 100.0}) {
    const double value = epsilon(0.01, sigma, 100);
    EXPECT_LT(value, previous) << sigma;
    previous = value;
  }
}

TEST(RdpAccountantTest, TenMillionStepsStayFiniteAndOrdered) {
  RdpAccountant small_rate, large_noise;
  ASSERT_TRUE(small_rate.Compose({1e-6, 0.5}, 10'000'000).ok());
  ASSERT_TRUE(large_noise.Compose({1e-5, 10.0}, 10'000).ok());
  for (const RdpAccountant* accountant : {&small_rate, &large_noise}) {
    auto epsilon = accountant->GetEpsilon(1e-6);
    ASSERT_TRUE(epsilon.ok());
    EXPECT_TRUE(std::isfinite(epsilon->epsilon));
    EXPECT_GT(epsilon->epsilon, 0.0);
  }
  // With q = 1e-5, σ = 10 the optimal order is far above 63, where
  // libraries with short order lists stop (docs/privacy_accounting.md).
  EXPECT_GT(large_noise.GetEpsilon(1e-6)->order, 256);
}

TEST(RdpAccountantTest, DeltaAndEpsilonAreConsistent) {
  RdpAccountant accountant;
  ASSERT_TRUE(accountant.Compose({0.004, 1.0}, 1000).ok());
  for (double delta : {1e-3, 1e-5, 1e-9}) {
    auto epsilon = accountant.GetEpsilon(delta);
    ASSERT_TRUE(epsilon.ok());
    auto back = accountant.GetDelta(epsilon->epsilon);
    ASSERT_TRUE(back.ok());
    EXPECT_LE(back->delta, delta * (1 + 1e-9));
  }
}

TEST(RdpAccountantTest, WhatIfQueriesDoNotChangeState) {
  RdpAccountant accountant;
  ASSERT_TRUE(accountant.Compose({0.01, 1.0}, 10).ok());
  const RdpAccountant before = accountant;
  auto if_composed = accountant.EpsilonIfComposed({0.01, 1.0}, 5, 1e-5);
  auto check = accountant.CheckCeiling({0.01, 1.0}, 5, {0.1, 1e-5});
  ASSERT_TRUE(if_composed.ok() && check.ok());
  EXPECT_EQ(accountant, before);
  RdpAccountant composed = accountant;
  ASSERT_TRUE(composed.Compose({0.01, 1.0}, 5).ok());
  EXPECT_NEAR(if_composed->epsilon, composed.GetEpsilon(1e-5)->epsilon, 1e-12);
  EXPECT_EQ(check->epsilon_after, if_composed->epsilon);
}

TEST(RdpAccountantTest, CeilingStopsMixedScheduleJustBeforeCrossing) {
  // Reconfiguration changes (q, σ) between steps; the ceiling check uses
  // only those public parameters and must stop the run at the last step
  // that keeps ε ≤ ceiling, whichever mix of steps came before.
  const double delta = 1e-5;
  struct Step { double q, sigma; };
  const Step schedule[] = {{0.01, 1.0}, {0.02, 1.5}, {0.005, 1.2}, {0.05, 3.0}};
  for (Adaptivity adaptivity : {Adaptivity::kFixedSchedule, Adaptivity::kAdaptiveFilter}) {
    // The filter pays ln|Λ|/(α−1) up front, so it gets a larger ceiling to
    // run a comparable number of steps.
    const double ceiling = adaptivity == Adaptivity::kFixedSchedule ? 1.6 : 2.5;
    RdpAccountant accountant;
    int ran = 0;
    for (int t = 0; t < 100000; ++t) {
      const Step& step = schedule[(t / 7) % 4];
      auto check = accountant.CheckCeiling({step.q, step.sigma}, 1, {ceiling, delta},
                                           RdpConversion::kImproved, adaptivity);
      ASSERT_TRUE(check.ok());
      if (check->would_exceed) {
        EXPECT_GT(check->epsilon_after, ceiling);
        break;
      }
      ASSERT_TRUE(accountant.Compose({step.q, step.sigma}).ok());
      ++ran;
    }
    ASSERT_GT(ran, 28) << "the run should cycle through every (q, σ)";
    RecordProperty(adaptivity == Adaptivity::kFixedSchedule ? "fixed_steps" : "adaptive_steps", ran);
    ASSERT_LT(ran, 100000);
    auto spent = accountant.GetEpsilon(delta, RdpConversion::kImproved, adaptivity);
    ASSERT_TRUE(spent.ok());
    EXPECT_LE(spent->epsilon, ceiling);
    // The refused step really would have crossed it.
    const Step& next = schedule[(ran / 7) % 4];
    RdpAccountant one_more = accountant;
    ASSERT_TRUE(one_more.Compose({next.q, next.sigma}).ok());
    EXPECT_GT(one_more.GetEpsilon(delta, RdpConversion::kImproved, adaptivity)->epsilon,
              ceiling);
  }
}

TEST(RdpAccountantTest, AdaptiveFilterPaysTheDocumentedUnionBound) {
  RdpAccountant accountant;
  ASSERT_TRUE(accountant.Compose({0.01, 1.0}, 500).ok());
  const double delta = 1e-5;
  auto fixed = accountant.GetEpsilon(delta);
  auto adaptive =
      accountant.GetEpsilon(delta, RdpConversion::kImproved, Adaptivity::kAdaptiveFilter);
  ASSERT_TRUE(fixed.ok() && adaptive.ok());
  EXPECT_GT(adaptive->epsilon, fixed->epsilon);
  auto by_hand =
      EpsilonFromRdp(accountant.orders(), accountant.rdp(),
                     delta / accountant.orders().size(), RdpConversion::kImproved);
  ASSERT_TRUE(by_hand.ok());
  EXPECT_EQ(adaptive->epsilon, by_hand->epsilon);
}

TEST(RdpAccountantTest, SerializeRestoreGivesIdenticalEpsilon) {
  RdpAccountant accountant;
  ASSERT_TRUE(accountant.Compose({0.013, 1.37}, 1234).ok());
  ASSERT_TRUE(accountant.Compose({0.0007, 4.1}, 99).ok());
  const std::string text = accountant.Serialize();
  auto restored = RdpAccountant::Deserialize(text);
  ASSERT_TRUE(restored.ok()) << restored.status().message();
  EXPECT_EQ(*restored, accountant);
  EXPECT_EQ(restored->steps(), 1333);
  for (double delta : {1e-3, 1e-5, 1e-8}) {
    // Bit-identical, not merely close.
    EXPECT_EQ(restored->GetEpsilon(delta)->epsilon, accountant.GetEpsilon(delta)->epsilon);
    EXPECT_EQ(restored->GetEpsilon(delta)->order, accountant.GetEpsilon(delta)->order);
  }
  EXPECT_EQ(restored->Serialize(), text);
  // A restored accountant keeps composing from where it was.
  ASSERT_TRUE(restored->Compose({0.013, 1.37}).ok());
  ASSERT_TRUE(accountant.Compose({0.013, 1.37}).ok());
  EXPECT_EQ(*restored, accountant);
}

TEST(RdpAccountantTest, SerializeKeepsInfiniteOrdersAndCustomGrids) {
  auto accountant = RdpAccountant::Create({1.5, 2, 32, 1e6});
  ASSERT_TRUE(accountant.ok());
  // Order 1e6 with σ = 0.5 and q = 0.9 overflows to +∞; that must survive.
  ASSERT_TRUE(accountant->Compose({0.9, 0.5}, 3).ok());
  auto restored = RdpAccountant::Deserialize(accountant->Serialize());
  ASSERT_TRUE(restored.ok()) << restored.status().message();
  EXPECT_EQ(*restored, *accountant);
}

TEST(RdpAccountantTest, CorruptStateIsRejectedNotReset) {
  RdpAccountant accountant;
  ASSERT_TRUE(accountant.Compose({0.01, 1.0}, 10).ok());
  const std::string good = accountant.Serialize();
  const std::string bad_inputs[] = {
      "",
      "garbage",
      good.substr(0, good.size() / 2),                          // truncated
      std::string(good).replace(good.find(" 1\n"), 3, " 9\n"),  // future version
      good + "extra\n",
      std::string(good).replace(good.find("steps 10"), 8, "steps -1"),
  };
  for (const std::string& text : bad_inputs) {
    auto restored = RdpAccountant::Deserialize(text);
    EXPECT_FALSE(restored.ok()) << text.substr(0, 60);
    if (!restored.ok()) {
      EXPECT_EQ(restored.status().code(), StatusCode::kDataLoss);
    }
  }
  // A NaN where a value belongs.
  std::string nan_state = good;
  const size_t line = nan_state.find('\n', nan_state.find("orders"));
  const size_t space = nan_state.find(' ', line + 1);
  nan_state.replace(space + 1, nan_state.find('\n', space) - space - 1, "nan");
  EXPECT_FALSE(RdpAccountant::Deserialize(nan_state).ok());
}

TEST(RdpAccountantTest, RejectsInvalidArgumentsWithoutChangingState) {
  RdpAccountant accountant;
  ASSERT_TRUE(accountant.Compose({0.01, 1.0}, 10).ok());
  const RdpAccountant before = accountant;
  EXPECT_FALSE(accountant.Compose({0.0, 1.0}).ok());
  EXPECT_FALSE(accountant.Compose({1.5, 1.0}).ok());
  EXPECT_FALSE(accountant.Compose({0.1, 0.0}).ok());
  EXPECT_FALSE(accountant.Compose({0.1, NAN}).ok());
  EXPECT_FALSE(accountant.Compose({0.1, 1.0}, 0).ok());
  EXPECT_EQ(accountant, before);
  EXPECT_FALSE(accountant.GetEpsilon(0.0).ok());
  EXPECT_FALSE(accountant.GetEpsilon(1.0).ok());
  EXPECT_FALSE(accountant.CheckCeiling({0.01, 1.0}, 1, {0.0, 1e-5}).ok());
  EXPECT_FALSE(RdpAccountant::Create({}).ok());
  EXPECT_FALSE(RdpAccountant::Create({1.0, 2.0}).ok());
  EXPECT_FALSE(RdpAccountant::Create({2.0, 2.0}).ok());
}

}  // namespace
}  // namespace vipsd::privacy
