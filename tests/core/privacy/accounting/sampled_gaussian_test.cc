// The values at the accountant's edges (core/privacy/accounting/sampled_gaussian.h):
// what a step is charged for is checked in one place, naming the field, and
// the accountants take it whole — two charges of equal values compose to
// the same curve, and a ceiling check reads ε and δ from one guarantee.
#include "core/privacy/accounting/sampled_gaussian.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "core/privacy/accounting/fixed_schedule.h"
#include "core/privacy/accounting/rdp_accountant.h"
#include "core/privacy/accounting/residency_accountant.h"

namespace vipsd::privacy {
namespace {

TEST(SampledGaussianTest, ValidationNamesTheFieldAndTheValue) {
  EXPECT_TRUE(ValidateSampledGaussian({0.01, 1.1}, true).ok());
  EXPECT_TRUE(ValidateSampledGaussian({1.0, 0.0}, false).ok());  // non-private: no noise
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for (const double q : {0.0, -0.1, 1.5, nan}) {
    const Status bad = ValidateSampledGaussian({q, 1.0}, false);
    EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument) << q;
    EXPECT_NE(bad.message().find("sampling_rate must be in (0, 1]"), std::string::npos)
        << bad.message();
  }
  for (const double sigma : {-1.0, inf, nan}) {
    const Status bad = ValidateSampledGaussian({0.5, sigma}, false);
    EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument) << sigma;
    EXPECT_NE(bad.message().find("noise_multiplier must be finite and >= 0"), std::string::npos)
        << bad.message();
  }
  const Status silent = ValidateSampledGaussian({0.5, 0.0}, /*require_noise=*/true);
  EXPECT_NE(silent.message().find("noise_multiplier must be finite and > 0, got 0"),
            std::string::npos)
      << silent.message();
  EXPECT_NE(ValidateSampledGaussian({1.5, 1.0}, false).message().find("got 1.5"),
            std::string::npos);
}

TEST(SampledGaussianTest, EqualityIsBitForBit) {
  const SampledGaussian a{0.1, 2.0};
  EXPECT_EQ(a, (SampledGaussian{0.1, 2.0}));
  EXPECT_NE(a, (SampledGaussian{0.1, std::nextafter(2.0, 3.0)}));
  EXPECT_NE(a, (SampledGaussian{0.2, 2.0}));
  EXPECT_TRUE(a.is_private());
  EXPECT_FALSE((SampledGaussian{1.0, 0.0}).is_private());
  EXPECT_EQ((EpsilonDelta{2.0, 1e-6}), (EpsilonDelta{2.0, 1e-6}));
  EXPECT_NE((EpsilonDelta{2.0, 1e-6}), (EpsilonDelta{2.0, 1e-5}));
}

// The accountants' edges take the values whole: a ceiling check at
// (ε, δ) agrees with ε at that δ, and a step that would pass the ceiling's
// ε is refused; the residency accountant and the fixed schedule refuse an
// invalid step with the field named.
TEST(SampledGaussianTest, TheAccountantsEdgesTakeTheValues) {
  const SampledGaussian step{0.05, 1.1};
  RdpAccountant accountant;
  ASSERT_TRUE(accountant.Compose(step, 20).ok());
  auto spent = accountant.EpsilonIfComposed(step, 1, 1e-6);
  ASSERT_TRUE(spent.ok());
  auto below = accountant.CheckCeiling(step, 1, {spent->epsilon * 1.001, 1e-6});
  auto above = accountant.CheckCeiling(step, 1, {spent->epsilon * 0.999, 1e-6});
  ASSERT_TRUE(below.ok() && above.ok());
  EXPECT_FALSE(below->would_exceed);
  EXPECT_TRUE(above->would_exceed);
  EXPECT_DOUBLE_EQ(below->epsilon_after, spent->epsilon);
  // The ceiling's δ is the one used: a smaller δ gives a larger ε.
  auto tighter = accountant.CheckCeiling(step, 1, {spent->epsilon * 1.001, 1e-9});
  ASSERT_TRUE(tighter.ok());
  EXPECT_GT(tighter->epsilon_after, spent->epsilon);
  EXPECT_FALSE(accountant.Compose({0.0, 1.0}).ok());

  auto residency = ResidencyAccountant::Create(10);
  ASSERT_TRUE(residency.ok());
  const Status refused = residency->RecordStep({0.05, 0.0}, 0.1);
  EXPECT_NE(refused.message().find("noise_multiplier must be finite and > 0"), std::string::npos)
      << refused.message();
  auto fixed = FixedScheduleAccountant::Create({2.0, 1.0});
  ASSERT_FALSE(fixed.ok());
  EXPECT_NE(fixed.status().message().find("fixed schedule: sampling_rate must be in (0, 1]"),
            std::string::npos)
      << fixed.status().message();
  auto made = FixedScheduleAccountant::Create(step);
  ASSERT_TRUE(made.ok());
  EXPECT_EQ(made->step(), step);
}

}  // namespace
}  // namespace vipsd::privacy
