#include "core/privacy/accounting/residency_accountant.h"

#include <gtest/gtest.h>

#include <vector>

namespace vipsd::privacy {
namespace {

constexpr double kDelta = 1e-5;

struct StepParams {
  double q;
  double sigma;
};

// A short order grid keeps the many curve evaluations of the oracle cheap.
const std::vector<double> kOrders = {1.5, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64};

// Oracle: compose exactly the steps of one window with an independent
// RdpAccountant and convert.
double WindowEpsilon(const std::vector<StepParams>& steps, size_t first, size_t last,
                     Adaptivity adaptivity) {
  auto created = RdpAccountant::Create(kOrders);
  EXPECT_TRUE(created.ok());
  RdpAccountant& accountant = *created;
  for (size_t i = first; i <= last; ++i) {
    EXPECT_TRUE(accountant.Compose({steps[i].q, steps[i].sigma}, 1).ok());
  }
  auto epsilon = accountant.GetEpsilon(kDelta, RdpConversion::kImproved, adaptivity);
  EXPECT_TRUE(epsilon.ok());
  return epsilon->epsilon;
}

TEST(ResidencyAccountantTest, EachCheckEqualsTheWindowItClosesWithMixedParameters) {
  constexpr int64_t kM = 4;
  const std::vector<StepParams> params = {{0.05, 1.0}, {0.05, 1.0}, {0.2, 2.0}, {0.05, 1.0},
                                          {0.2, 2.0},  {0.2, 2.0},  {0.2, 2.0}, {0.05, 1.0},
                                          {0.05, 1.0}, {0.05, 1.0}};
  for (Adaptivity adaptivity : {Adaptivity::kFixedSchedule, Adaptivity::kAdaptiveFilter}) {
    auto accountant = ResidencyAccountant::Create(kM, kOrders);
    ASSERT_TRUE(accountant.ok());
    for (size_t t = 0; t < params.size(); ++t) {
      auto check = accountant->CheckCeiling({params[t].q, params[t].sigma}, {100, kDelta},
                                            adaptivity);
      ASSERT_TRUE(check.ok());
      const size_t first = t + 1 >= kM ? t + 1 - kM : 0;
      EXPECT_NEAR(check->epsilon_after, WindowEpsilon(params, first, t, adaptivity),
                  1e-9 * check->epsilon_after)
          << "step " << t;
      ASSERT_TRUE(accountant->RecordStep({params[t].q, params[t].sigma},
                                         check->epsilon_after).ok());
    }
    EXPECT_EQ(accountant->steps(), static_cast<int64_t>(params.size()));
  }
}

TEST(ResidencyAccountantTest, ConstantScheduleNeverExceedsTheConfigurationCheck) {
  constexpr int64_t kM = 20;
  constexpr double kQ = 0.05, kSigma = 1.1, kCeiling = 2.0;
  auto configuration = ResidencyAccountant::CheckConfiguration(
      kM, {kQ, kSigma}, {kCeiling, kDelta}, Adaptivity::kFixedSchedule);
  ASSERT_TRUE(configuration.ok());
  EXPECT_FALSE(configuration->would_exceed);
  auto accountant = ResidencyAccountant::Create(kM);
  ASSERT_TRUE(accountant.ok());
  double last = 0;
  for (int t = 0; t < 20 * kM; ++t) {
    auto check =
        accountant->CheckCeiling({kQ, kSigma}, {kCeiling, kDelta}, Adaptivity::kFixedSchedule);
    ASSERT_TRUE(check.ok());
    ASSERT_FALSE(check->would_exceed);
    ASSERT_LE(check->epsilon_after, configuration->epsilon_after * (1 + 1e-12));
    EXPECT_GE(check->epsilon_after, last * (1 - 1e-12));  // grows, then plateaus
    last = check->epsilon_after;
    ASSERT_TRUE(accountant->RecordStep({kQ, kSigma}, check->epsilon_after).ok());
  }
  EXPECT_NEAR(last, configuration->epsilon_after, 1e-9);
  EXPECT_NEAR(accountant->worst_epsilon(), configuration->epsilon_after, 1e-9);
  // Unlike the global budget, running on does not spend more per record.
  RdpAccountant global;
  ASSERT_TRUE(global.Compose({kQ, kSigma}, 20 * kM).ok());
  EXPECT_GT(global.GetEpsilon(kDelta)->epsilon, 1.5 * accountant->worst_epsilon());
}

TEST(ResidencyAccountantTest, ConfigurationCheckRefusesAnUnaffordableM) {
  auto check = ResidencyAccountant::CheckConfiguration(1000, {0.1, 0.8}, {1.0, kDelta},
                                                       Adaptivity::kFixedSchedule);
  ASSERT_TRUE(check.ok());
  EXPECT_TRUE(check->would_exceed);
  EXPECT_GT(check->epsilon_after, 1.0);
  EXPECT_FALSE(ResidencyAccountant::CheckConfiguration(0, {0.1, 0.8}, {1.0, kDelta},
                                                       Adaptivity::kFixedSchedule)
                   .ok());
}

TEST(ResidencyAccountantTest, ARaiseOfQMidRunIsCaughtByTheWindowCheck) {
  constexpr int64_t kM = 10;
  auto accountant = ResidencyAccountant::Create(kM);
  ASSERT_TRUE(accountant.ok());
  for (int t = 0; t < kM; ++t) {
    auto check = accountant->CheckCeiling({0.01, 1.0}, {3.0, kDelta}, Adaptivity::kAdaptiveFilter);
    ASSERT_TRUE(check.ok() && !check->would_exceed);
    ASSERT_TRUE(accountant->RecordStep({0.01, 1.0}, check->epsilon_after).ok());
  }
  // A reload to q = 0.9 makes the next window exceed the ceiling.
  auto check = accountant->CheckCeiling({0.9, 1.0}, {3.0, kDelta}, Adaptivity::kAdaptiveFilter);
  ASSERT_TRUE(check.ok());
  EXPECT_TRUE(check->would_exceed);
}

TEST(ResidencyAccountantTest, MCanBeLoweredButNotRaised) {
  auto accountant = ResidencyAccountant::Create(5);
  ASSERT_TRUE(accountant.ok());
  for (int t = 0; t < 6; ++t) ASSERT_TRUE(accountant->RecordStep({0.1, 2.0}, 0.1).ok());
  EXPECT_FALSE(accountant->SetMaxResidencySteps(6).ok());
  ASSERT_TRUE(accountant->SetMaxResidencySteps(2).ok());
  auto shortened = accountant->CheckCeiling({0.1, 2.0}, {100, kDelta}, Adaptivity::kFixedSchedule);
  ASSERT_TRUE(shortened.ok());
  RdpAccountant two;
  ASSERT_TRUE(two.Compose({0.1, 2.0}, 2).ok());
  EXPECT_NEAR(shortened->epsilon_after, two.GetEpsilon(kDelta)->epsilon, 1e-9);
}

TEST(ResidencyAccountantTest, SerializeIsExactAndCorruptionIsRefused) {
  auto accountant = ResidencyAccountant::Create(7);
  ASSERT_TRUE(accountant.ok());
  ASSERT_TRUE(accountant->RecordStep({0.1, 2.0}, 0.25).ok());
  ASSERT_TRUE(accountant->RecordStep({0.3, 3.0}, 0.5).ok());
  const std::string text = accountant->Serialize();
  auto restored = ResidencyAccountant::Deserialize(text);
  ASSERT_TRUE(restored.ok()) << restored.status().ToString();
  EXPECT_EQ(*restored, *accountant);
  for (const std::string& bad :
       {text.substr(0, text.size() - 4), std::string("residency-accountant 2\n"),
        text + "junk\n"}) {
    auto result = ResidencyAccountant::Deserialize(bad);
    ASSERT_FALSE(result.ok());
    EXPECT_EQ(result.status().code(), StatusCode::kDataLoss);
  }
}

}  // namespace
}  // namespace vipsd::privacy
