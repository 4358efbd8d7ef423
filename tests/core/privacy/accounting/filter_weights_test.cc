// The adaptive filter's split of δ over the Rényi orders: a valid split
// (Σ ≤ 1, every order usable), concentrated where the configured schedule
// ends, never cheaper than converting one order at the full δ, cheaper than
// the uniform split where it matters, and stored exactly.
#include "core/privacy/accounting/filter_weights.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/privacy/accounting/planner.h"
#include "core/privacy/accounting/rdp.h"
#include "core/privacy/accounting/rdp_accountant.h"

namespace vipsd::privacy {
namespace {

struct Setting {
  double q, sigma, delta, ceiling;
};

// The demo, the paper's BLR (σ = 1, 6) and LDA settings, a residency-like one.
const std::vector<Setting> kSettings = {{0.1, 2.0, 1e-5, 4.0},
                                        {0.004, 1.0, 1e-3, 0.5},
                                        {0.004, 6.0, 1e-3, 0.1},
                                        {0.05, 1.24, 1e-4, 2.0},
                                        {0.01, 1.1, 1e-6, 2.0}};

TEST(FilterWeightsTest, TheDesignedSplitIsValidAndPutsHalfOnTheOrderWhereTheScheduleEnds) {
  const auto& orders = DefaultRdpOrders();
  for (const Setting& c : kSettings) {
    auto horizon = FilterHorizonForCeiling(c.q, c.sigma, c.delta, c.ceiling);
    ASSERT_TRUE(horizon.ok());
    auto weights = DesignFilterWeights(c.q, c.sigma, c.delta, c.ceiling, 0);
    ASSERT_TRUE(weights.ok()) << weights.status().ToString();
    ASSERT_EQ(weights->size(), orders.size());
    // Σ w ≤ 1 (computed in long double, independent of the validator's sum).
    long double sum = 0;
    for (double w : *weights) {
      EXPECT_GT(w, 0);
      // Every order keeps at least a quarter of its uniform share.
      EXPECT_GE(w, 0.25 / static_cast<double>(orders.size()) * (1 - 1e-9));
      sum += w;
    }
    EXPECT_LE(sum, 1.0L);
    EXPECT_GT(sum, 1.0L - 1e-9L);
    // The peak is the optimal order of the horizon's curve at δ/2.
    auto curve = SampledGaussianRdpCurve(c.q, c.sigma, orders);
    ASSERT_TRUE(curve.ok());
    for (double& v : *curve) v *= static_cast<double>(*horizon);
    auto best = EpsilonFromRdp(orders, *curve, c.delta / 2, RdpConversion::kImproved);
    ASSERT_TRUE(best.ok());
    EXPECT_EQ(PeakFilterOrder(orders, *weights), best->order);
    EXPECT_GE(*std::max_element(weights->begin(), weights->end()), 0.5);
    // The horizon is the last step count within the ceiling at δ/2.
    EXPECT_LE(best->epsilon, c.ceiling);
    for (double& v : *curve) v *= static_cast<double>(*horizon + 1) / static_cast<double>(*horizon);
    auto beyond = EpsilonFromRdp(orders, *curve, c.delta / 2, RdpConversion::kImproved);
    EXPECT_GT(beyond->epsilon, c.ceiling);
  }
}

TEST(FilterWeightsTest, TheFilterIsNeverCheaperThanPlainRdpAndBeatsTheUniformSplit) {
  for (const Setting& c : kSettings) {
    auto weights = DesignFilterWeights(c.q, c.sigma, c.delta, c.ceiling, 0);
    ASSERT_TRUE(weights.ok());
    for (int64_t steps : {int64_t{1}, int64_t{10}, int64_t{100}, int64_t{1000}}) {
      RdpAccountant weighted;
      ASSERT_TRUE(weighted.SetFilterWeights(*weights).ok());
      ASSERT_TRUE(weighted.Compose({c.q, c.sigma}, steps).ok());
      RdpAccountant uniform = weighted;
      ASSERT_TRUE(uniform.SetFilterWeights({}).ok());
      const double filter =
          weighted.GetEpsilon(c.delta, RdpConversion::kImproved, Adaptivity::kAdaptiveFilter)
              ->epsilon;
      const double plain = weighted.GetEpsilon(c.delta)->epsilon;  // one order at the full δ
      const auto spread =
          *uniform.GetEpsilon(c.delta, RdpConversion::kImproved, Adaptivity::kAdaptiveFilter);
      // Every order is converted at δ·w ≤ δ: never below plain RDP.
      EXPECT_GE(filter, plain) << c.q << " " << c.sigma << " T=" << steps;
      // Far from the design horizon an order may cost up to ln 4/(α−1) more
      // than under the uniform split (its weight is ≥ 1/(4n)).
      EXPECT_LE(filter, spread.epsilon + std::log(4.0) / (spread.order - 1) + 1e-12);
    }
    // At the ceiling, the split buys steps: more than the uniform filter,
    // at most what plain RDP of a fixed schedule allows.
    auto designed = FilterMaxSteps(c.ceiling, c.q, c.sigma, c.delta, *weights);
    auto spread = FilterMaxSteps(c.ceiling, c.q, c.sigma, c.delta, {});
    auto plain = MaxStepsForEpsilon(AccountantKind::kRdp, c.ceiling, c.q, c.sigma, c.delta);
    ASSERT_TRUE(designed.ok() && spread.ok() && plain.ok());
    EXPECT_GT(*designed, *spread) << c.q << " " << c.sigma;
    EXPECT_LE(*designed, *plain);
  }
}

TEST(FilterWeightsTest, TheDemoAtCeilingFourGetsMostOfThePlainRdpSteps) {
  // q = 0.1, σ = 2, δ = 1e-5, ceiling 4: uniform over the 323 orders
  // allows fewer than 150 steps (142), plain RDP 234, the designed split 218.
  auto weights = DesignFilterWeights(0.1, 2, 1e-5, 4, 0);
  ASSERT_TRUE(weights.ok());
  EXPECT_EQ(*FilterMaxSteps(4, 0.1, 2, 1e-5, *weights), 218);
  EXPECT_LT(*FilterMaxSteps(4, 0.1, 2, 1e-5, {}), 150);
  EXPECT_EQ(*MaxStepsForEpsilon(AccountantKind::kRdp, 4, 0.1, 2, 1e-5), 234);
  EXPECT_EQ(*MaxStepsForEpsilon(AccountantKind::kFilter, 4, 0.1, 2, 1e-5), 218);
}

TEST(FilterWeightsTest, ResidencyDesignsForTheWindow) {
  auto by_window = DesignFilterWeights(0.01, 1.1, 1e-6, 2.0, 500);
  auto direct = ConcentratedFilterWeights(DefaultRdpOrders(), 0.01, 1.1, 1e-6, 500);
  ASSERT_TRUE(by_window.ok() && direct.ok());
  EXPECT_EQ(*by_window, *direct);
  // The longest window the planner finds starts, one more does not.
  auto longest = MaxResidencyWindow(AccountantKind::kFilter, 2.0, 0.01, 1.1, 1e-6);
  ASSERT_TRUE(longest.ok());
  EXPECT_LE(EstimateEpsilon(AccountantKind::kFilter, {0.01, 1.1}, *longest, 1e-6)->epsilon, 2.0);
  EXPECT_GT(EstimateEpsilon(AccountantKind::kFilter, {0.01, 1.1}, *longest + 1, 1e-6)->epsilon,
            2.0);
}

TEST(FilterWeightsTest, ValidationRefusesSplitsThatOverspendDelta) {
  const auto& orders = DefaultRdpOrders();
  const size_t n = orders.size();
  EXPECT_TRUE(ValidateFilterWeights({}, n).ok());  // uniform
  EXPECT_FALSE(ValidateFilterWeights(std::vector<double>(n - 1, 1.0 / n), n).ok());
  EXPECT_FALSE(ValidateFilterWeights(std::vector<double>(n, 1.0 / n), n).ok());  // Σ = 1, no margin
  std::vector<double> ok(n, 0.999 / n);
  EXPECT_TRUE(ValidateFilterWeights(ok, n).ok());
  for (double bad : {0.0, -1e-3, std::nan(""), 1.5}) {
    std::vector<double> w = ok;
    w[7] = bad;
    EXPECT_FALSE(ValidateFilterWeights(w, n).ok()) << bad;
  }
  std::vector<double> over = ok;
  over[3] += 0.002;
  EXPECT_FALSE(ValidateFilterWeights(over, n).ok());
  RdpAccountant accountant;
  EXPECT_FALSE(accountant.SetFilterWeights(over).ok());
  EXPECT_TRUE(accountant.filter_weights().empty());  // unchanged
}

TEST(FilterWeightsTest, TextFormRoundTripsExactlyAndIsBoundToTheOrders) {
  const auto& orders = DefaultRdpOrders();
  auto weights = DesignFilterWeights(0.1, 2, 1e-5, 4, 0);
  ASSERT_TRUE(weights.ok());
  const std::string text = SerializeFilterWeights(orders, *weights);
  auto back = DeserializeFilterWeights(text, orders);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, *weights);
  std::vector<double> other = orders;
  other[5] += 0.125;
  EXPECT_FALSE(DeserializeFilterWeights(text, other).ok());
  EXPECT_FALSE(DeserializeFilterWeights(text, std::vector<double>(orders.begin() + 1,
                                                                  orders.end()))
                   .ok());
  EXPECT_FALSE(DeserializeFilterWeights(text.substr(0, text.size() / 2), orders).ok());
  EXPECT_FALSE(DeserializeFilterWeights(text + "extra\n", orders).ok());
  EXPECT_FALSE(DeserializeFilterWeights("", orders).ok());
}

// The filter's grid is fixed when the state directory is created, so its
// ε can only be as close to the optimum as the grid's orders are: at the
// design horizon H, the designed split (weight > 1/2 on the peak) charges
// no more than plain RDP at δ/2 minimised over all real orders, +0.1 %, also
// at σ = 0.6 (issue 29). The real-order minimum uses the series, which
// rdp_order_grid_test checks against the quadrature oracle.
TEST(FilterWeightsTest, AtTheHorizonTheFilterIsWithinATenthOfAPercentOfTheRealOrderOptimum) {
  auto half_delta_optimum = [](double q, double sigma, double steps, double delta) {
    auto at = [&](double u) {
      const double alpha = 1 + std::exp(u);
      const std::vector<double> order = {alpha};
      const std::vector<double> rdp = {*SampledGaussianRdp(q, sigma, alpha) * steps};
      return EpsilonFromRdp(order, rdp, delta / 2, RdpConversion::kImproved)->epsilon;
    };
    // Every optimum here lies between α = 1.003 and 61.
    double best_u = std::log(0.003), best = at(best_u);
    for (double u = best_u; u < std::log(60.0); u += 0.05) {
      if (const double e = at(u); e < best) best = e, best_u = u;
    }
    double lo = best_u - 0.05, hi = best_u + 0.05;
    for (int i = 0; i < 40; ++i) {  // ternary search on a unimodal bracket
      const double m1 = lo + (hi - lo) / 3, m2 = hi - (hi - lo) / 3;
      if (at(m1) < at(m2)) {
        hi = m2;
      } else {
        lo = m1;
      }
    }
    return std::min(best, at((lo + hi) / 2));
  };
  // σ = 0.6 and 0.8 down to q = 0.001; at σ ≥ 0.9 with q near 0.001 the
  // grid is up to 0.5 % off (docs/privacy_accounting.md §3), so σ = 1.1
  // only with the paper's and the examples' rates.
  struct Case {
    double sigma, q;
  };
  const Case cases[] = {{0.6, 0.001}, {0.6, 0.05}, {0.6, 0.3}, {0.8, 0.001},
                        {0.8, 0.05},  {0.8, 0.3},  {1.1, 0.01}, {1.1, 0.05}};
  int checked = 0;
  for (const auto& [sigma, q] : cases) {
    for (int64_t horizon : {int64_t{10}, int64_t{1000}}) {
      const double delta = 1e-5;
      auto weights = ConcentratedFilterWeights(DefaultRdpOrders(), q, sigma, delta, horizon);
      ASSERT_TRUE(weights.ok());
      RdpAccountant filter;
      ASSERT_TRUE(filter.SetFilterWeights(*weights).ok());
      ASSERT_TRUE(filter.Compose({q, sigma}, horizon).ok());
      const double charged =
          filter.GetEpsilon(delta, RdpConversion::kImproved, Adaptivity::kAdaptiveFilter)->epsilon;
      const double optimum = half_delta_optimum(q, sigma, static_cast<double>(horizon), delta);
      EXPECT_LE(charged, optimum * 1.001) << "q=" << q << " sigma=" << sigma << " H=" << horizon;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 16);
}

}  // namespace
}  // namespace vipsd::privacy
