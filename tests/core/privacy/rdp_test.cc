// Tests of the per-step RDP of the Poisson-subsampled Gaussian mechanism and
// of the (ε, δ) conversions.
//
// The independent oracle is numerical integration (Boost's adaptive
// Gauss–Kronrod) of the Rényi divergence between μ0 = N(0, σ²) and
// μ = (1 − q)N(0, σ²) + qN(1, σ²), in both directions. It shares no code with
// the series in core/privacy/rdp.cc.
#include "core/privacy/rdp.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <boost/math/quadrature/gauss_kronrod.hpp>
#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace vipsd::privacy {
namespace {

using ::testing::HasSubstr;

// Result of integrating A_α − 1 = ∫ (integrand) dz, with the integral of the
// absolute integrand for judging conditioning. Both scaled by exp(log_scale).
struct Integral {
  double log_a = 0;      // ln A_α
  double condition = 0;  // ∫|h| / |∫h|
};

// Direction kForward: A = E_{μ0}[(μ/μ0)^α]  (the series' direction).
// Direction kBackward: A = E_{μ}[(μ0/μ)^α].
enum class Direction { kForward, kBackward };

// h(z) such that A − 1 = ∫ h. With x = (2z − 1)/(2σ²) and r = μ/μ0 = 1 + q·expm1(x):
//   forward:  h = μ0(z) · expm1(α ln r)
//   backward: h = μ0(z) · r · expm1(−α ln r)
// Returns ln|h| and the sign.
void LogIntegrand(double z, double q, double sigma, double alpha, Direction direction,
                  double* log_abs, int* sign) {
  const double log_mu0 = -z * z / (2 * sigma * sigma) - std::log(sigma * std::sqrt(2 * M_PI));
  const double x = (2 * z - 1) / (2 * sigma * sigma);
  // ln r, stable for large x (r ≈ q e^x).
  const double log_r = x > 30 ? std::log(q) + x + std::log1p((1 - q) * std::exp(-x) / q)
                              : std::log1p(q * std::expm1(x));
  double y = direction == Direction::kForward ? alpha * log_r : -alpha * log_r;
  double log_abs_expm1;
  if (y > 0) {
    log_abs_expm1 = y > 30 ? y + std::log1p(-std::exp(-y)) : std::log(std::expm1(y));
    *sign = 1;
  } else if (y < 0) {
    log_abs_expm1 = std::log(-std::expm1(y));
    *sign = -1;
  } else {
    *log_abs = -std::numeric_limits<double>::infinity();
    *sign = 0;
    return;
  }
  *log_abs = log_mu0 + log_abs_expm1 + (direction == Direction::kBackward ? log_r : 0.0);
}

Integral IntegrateRenyi(double q, double sigma, double alpha, Direction direction) {
  // The mass sits between the two Gaussian centres and, for large α, near
  // z ≈ α (forward) — integrate over a generous window and find the scale.
  const double lo = -40 * sigma - 2;
  const double hi = std::max(alpha, 1.0) + 40 * sigma + 2;
  double log_scale = -std::numeric_limits<double>::infinity();
  for (int i = 0; i <= 20000; ++i) {
    const double z = lo + (hi - lo) * i / 20000.0;
    double la;
    int s;
    LogIntegrand(z, q, sigma, alpha, direction, &la, &s);
    log_scale = std::max(log_scale, la);
  }
  auto signed_part = [&](double z) {
    double la;
    int s;
    LogIntegrand(z, q, sigma, alpha, direction, &la, &s);
    return s * std::exp(la - log_scale);
  };
  auto abs_part = [&](double z) { return std::abs(signed_part(z)); };
  using Quad = boost::math::quadrature::gauss_kronrod<double, 61>;
  // Split at 1/2 (sign change of h) and at a few points to help adaptivity.
  std::vector<double> cuts = {lo, 0.5 - 10 * sigma, 0.5, 0.5 + 10 * sigma, hi};
  if (alpha > 1) cuts.insert(cuts.end() - 1, std::min(hi - 1, alpha));
  std::sort(cuts.begin(), cuts.end());
  double total = 0, total_abs = 0;
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    if (cuts[i + 1] <= cuts[i]) continue;
    total += Quad::integrate(signed_part, cuts[i], cuts[i + 1], 20, 1e-14);
    total_abs += Quad::integrate(abs_part, cuts[i], cuts[i + 1], 20, 1e-14);
  }
  Integral result;
  result.condition = total_abs / std::abs(total);
  // ln A = ln(1 + total·e^scale)
  const double log_excess = std::log(std::abs(total)) + log_scale;
  if (total > 0) {
    result.log_a = log_excess > 30 ? log_excess + std::log1p(std::exp(-log_excess))
                                   : std::log1p(std::exp(log_excess));
  } else {
    result.log_a = std::log1p(-std::exp(log_excess));
  }
  return result;
}

TEST(SampledGaussianRdpTest, FullBatchMatchesClosedForm) {
  for (double sigma : {0.5, 1.0, 3.7, 100.0}) {
    for (double alpha : {1.5, 2.0, 7.25, 32.0, 256.0, 4096.0}) {
      auto rdp = SampledGaussianRdp(1.0, sigma, alpha);
      ASSERT_TRUE(rdp.ok());
      EXPECT_DOUBLE_EQ(*rdp, alpha / (2 * sigma * sigma)) << sigma << " " << alpha;
    }
  }
}

TEST(SampledGaussianRdpTest, NearFullBatchApproachesClosedForm) {
  // q → 1 from below must approach α/(2σ²) continuously, for integer and
  // fractional orders alike.
  for (double alpha : {2.0, 3.5, 16.0}) {
    auto full = SampledGaussianRdp(1.0, 2.0, alpha);
    auto near = SampledGaussianRdp(1.0 - 1e-9, 2.0, alpha);
    ASSERT_TRUE(full.ok() && near.ok());
    EXPECT_NEAR(*near, *full, 1e-6 * *full) << alpha;
  }
}

TEST(SampledGaussianRdpTest, AgreesWithNumericalIntegrationBothDirections) {
  std::mt19937_64 rng(20261122);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  const std::vector<double> orders = {1.5, 2, 2.5, 3, 3.7, 5, 8, 10.3, 16, 20.5, 32, 64};
  int compared = 0;
  for (int trial = 0; trial < 12; ++trial) {
    const double q = std::pow(10.0, -3.0 + 3.0 * unit(rng));       // [1e-3, 1]
    const double sigma = 0.5 * std::pow(20.0, unit(rng));           // [0.5, 10]
    for (double alpha : orders) {
      auto series = SampledGaussianRdp(q, sigma, alpha);
      ASSERT_TRUE(series.ok());
      const Integral forward = IntegrateRenyi(q, sigma, alpha, Direction::kForward);
      const Integral backward = IntegrateRenyi(q, sigma, alpha, Direction::kBackward);
      const double forward_rdp = forward.log_a / (alpha - 1);
      const double backward_rdp = backward.log_a / (alpha - 1);
      // The series must dominate the other direction (add vs remove).
      EXPECT_GE(*series * (1 + 1e-9), backward_rdp)
          << "q=" << q << " sigma=" << sigma << " alpha=" << alpha;
      // Well-conditioned integrals and values not dominated by overflow.
      if (forward.condition < 1e4 && forward_rdp > 1e-12 && forward_rdp < 1e6 &&
          std::isfinite(forward_rdp)) {
        EXPECT_NEAR(*series, forward_rdp, 1e-6 * forward_rdp)
            << "q=" << q << " sigma=" << sigma << " alpha=" << alpha;
        // And never below the integral (pessimistic rounding).
        EXPECT_GE(*series, forward_rdp * (1 - 1e-9));
        ++compared;
      }
    }
  }
  EXPECT_GT(compared, 80);  // the oracle really checked most cases
}

TEST(SampledGaussianRdpTest, SmallRateLargeNoiseKeepsPrecision) {
  // For small q, A_α − 1 ≈ C(α,2)·q²·(e^{1/σ²} − 1), so ε(α) ≈ αq²/(2σ²);
  // summing the plain series would round A_α to 1 and return 0.
  for (double alpha : {1.5, 2.0, 2.5, 64.0, 1024.0}) {
    auto rdp = SampledGaussianRdp(1e-6, 100.0, alpha);
    ASSERT_TRUE(rdp.ok());
    const double approx = 1e-12 * alpha / (2 * 100.0 * 100.0);
    // Fractional orders fall back to the ⌈α⌉ bound here (documented), so
    // they may be looser by ⌈α⌉/α, never tighter.
    const double slack = std::ceil(alpha) / alpha;
    EXPECT_GT(*rdp, 0.999 * approx) << alpha;
    EXPECT_LT(*rdp, 1.01 * slack * approx) << alpha;
  }
  // Order 2 has the exact closed form A_2 = 1 + q²(e^{1/σ²} − 1).
  const double q = 1e-6, sigma = 100.0;
  auto rdp2 = SampledGaussianRdp(q, sigma, 2.0);
  ASSERT_TRUE(rdp2.ok());
  EXPECT_NEAR(*rdp2, std::log1p(q * q * std::expm1(1 / (sigma * sigma))), 1e-9 * *rdp2);
  EXPECT_GE(*rdp2, std::log1p(q * q * std::expm1(1 / (sigma * sigma))));
}

TEST(SampledGaussianRdpTest, StableAcrossTheSupportedRange) {
  // σ ∈ [0.5, 100], q ∈ [1e-6, 1], every order of the default grid: finite
  // or +∞, never NaN, non-negative, non-decreasing in α (RDP is monotone in
  // the order).
  for (double q : {1e-6, 1e-4, 0.01, 0.3, 0.999999, 1.0}) {
    for (double sigma : {0.5, 1.0, 5.0, 100.0}) {
      auto curve = SampledGaussianRdpCurve(q, sigma, DefaultRdpOrders());
      ASSERT_TRUE(curve.ok());
      double previous = 0;
      for (size_t i = 0; i < curve->size(); ++i) {
        const double value = (*curve)[i];
        ASSERT_FALSE(std::isnan(value)) << q << " " << sigma;
        ASSERT_GE(value, 0.0);
        // Fractional orders carry an absolute margin of a few 1e-15 on A_α
        // (the two-series form cancels to 1), i.e. up to ~1e-13 in ε at α = 1.05.
        EXPECT_GE(value, previous * (1 - 1e-6) - 1e-12)
            << "q=" << q << " sigma=" << sigma << " order=" << DefaultRdpOrders()[i];
        previous = value;
      }
    }
  }
}

TEST(SampledGaussianRdpTest, MonotoneInRateAndNoise) {
  for (double alpha : {1.5, 4.0, 20.0}) {
    double previous = 0;
    for (double q : {1e-5, 1e-3, 0.01, 0.1, 0.5, 1.0}) {
      const double value = *SampledGaussianRdp(q, 1.5, alpha);
      EXPECT_GT(value, previous);
      previous = value;
    }
    previous = std::numeric_limits<double>::infinity();
    for (double sigma : {0.5, 0.8, 1.0, 2.0, 10.0}) {
      const double value = *SampledGaussianRdp(0.05, sigma, alpha);
      EXPECT_LT(value, previous);
      previous = value;
    }
  }
}

TEST(SampledGaussianRdpTest, RejectsInvalidParameters) {
  EXPECT_THAT(SampledGaussianRdp(0.0, 1, 2).status().message(), HasSubstr("sampling_rate"));
  EXPECT_THAT(SampledGaussianRdp(1.5, 1, 2).status().message(), HasSubstr("(0, 1]"));
  EXPECT_THAT(SampledGaussianRdp(NAN, 1, 2).status().message(), HasSubstr("sampling_rate"));
  EXPECT_THAT(SampledGaussianRdp(0.1, 0, 2).status().message(), HasSubstr("noise_multiplier"));
  EXPECT_THAT(SampledGaussianRdp(0.1, INFINITY, 2).status().message(),
              HasSubstr("noise_multiplier"));
  EXPECT_THAT(SampledGaussianRdp(0.1, 1, 1.0).status().message(), HasSubstr("order"));
  EXPECT_THAT(SampledGaussianRdp(0.1, 1, NAN).status().message(), HasSubstr("order"));
}

TEST(DefaultRdpOrdersTest, CoversSmallAndVeryLargeOrders) {
  const auto& orders = DefaultRdpOrders();
  EXPECT_TRUE(std::is_sorted(orders.begin(), orders.end()));
  EXPECT_LE(orders.front(), 1.1);
  EXPECT_GE(orders.back(), 256.0);
  EXPECT_GE(orders.back(), 100000.0);
  for (double order : orders) {
    EXPECT_GT(order, 1.0);
    if (order > 64) {
      EXPECT_EQ(order, std::floor(order));
    } else if (order >= 2) {
      EXPECT_EQ(order * 4, std::floor(order * 4)) << order;  // quarter steps
    }
  }
}

// ε of T steps at order α (improved conversion), with the per-step RDP from
// the series or from the quadrature oracle above.
double EpsilonAtOrderFrom(double per_step_rdp, int64_t steps, double delta, double alpha) {
  const std::vector<double> order = {alpha};
  const std::vector<double> rdp = {per_step_rdp * static_cast<double>(steps)};
  return EpsilonFromRdp(order, rdp, delta, RdpConversion::kImproved)->epsilon;
}

TEST(DefaultRdpOrdersTest, GridIsWithinATenthOfAPercentOfTheOptimumOverRealOrders) {
  struct Setting {
    double q, sigma;
    int64_t steps;
    double delta;
  };
  // The paper's BLR setting, the demo, the service example, the Wikipedia
  // LDA setting, a full-batch run, and a long run at small q.
  const std::vector<Setting> settings = {{0.004, 1.0, 100, 1e-3}, {0.1, 2.0, 150, 1e-5},
                                         {0.01, 1.1, 1000, 1e-6}, {0.058, 1.24, 18, 1e-5},
                                         {1.0, 5.0, 10, 1e-5},    {0.001, 0.8, 20000, 1e-5}};
  for (const Setting& c : settings) {
    const auto& orders = DefaultRdpOrders();
    std::vector<double> rdp;
    for (double alpha : orders) rdp.push_back(*SampledGaussianRdp(c.q, c.sigma, alpha) * c.steps);
    const double grid = EpsilonFromRdp(orders, rdp, c.delta, RdpConversion::kImproved)->epsilon;
    // The optimum over real orders: a scan at 0.05, refined at 0.001.
    auto at = [&](double alpha) {
      return EpsilonAtOrderFrom(*SampledGaussianRdp(c.q, c.sigma, alpha), c.steps, c.delta,
                                alpha);
    };
    double best_alpha = 1.05, best = at(1.05);
    for (double alpha = 1.1; alpha <= 200; alpha += 0.05) {
      if (const double e = at(alpha); e < best) best = e, best_alpha = alpha;
    }
    for (double alpha = std::max(1.001, best_alpha - 0.05); alpha <= best_alpha + 0.05;
         alpha += 0.001) {
      if (const double e = at(alpha); e < best) best = e, best_alpha = alpha;
    }
    EXPECT_LE(grid, best * 1.001) << "q=" << c.q << " sigma=" << c.sigma << " T=" << c.steps
                                  << " optimum at alpha=" << best_alpha;
    EXPECT_GE(grid, best * (1 - 1e-12));
    // The series at the (fractional) optimum agrees with the quadrature
    // oracle, so the optimum above is the true one, not a series artefact.
    const Integral forward = IntegrateRenyi(c.q, c.sigma, best_alpha, Direction::kForward);
    if (forward.condition < 1e4) {
      const double oracle = EpsilonAtOrderFrom(forward.log_a / (best_alpha - 1), c.steps, c.delta,
                                               best_alpha);
      EXPECT_NEAR(best, oracle, 1e-5 * oracle) << "alpha=" << best_alpha;
    }
  }
  // The paper's BLR setting: 0.3956 at α ≈ 10.7 (the old integer grid gave
  // 0.4097).
  std::vector<double> rdp;
  for (double alpha : DefaultRdpOrders()) rdp.push_back(*SampledGaussianRdp(0.004, 1, alpha) * 100);
  EXPECT_LT(EpsilonFromRdp(DefaultRdpOrders(), rdp, 1e-3, RdpConversion::kImproved)->epsilon,
            0.3960);
}

TEST(ConversionTest, ClassicMatchesDefinition) {
  const std::vector<double> orders = {2, 4, 8};
  const std::vector<double> rdp = {0.1, 0.3, 0.9};
  auto eps = EpsilonFromRdp(orders, rdp, 1e-5, RdpConversion::kClassic);
  ASSERT_TRUE(eps.ok());
  double expected = 1e300;
  double expected_order = 0;
  for (size_t i = 0; i < 3; ++i) {
    const double value = rdp[i] + std::log(1e5) / (orders[i] - 1);
    if (value < expected) expected = value, expected_order = orders[i];
  }
  EXPECT_DOUBLE_EQ(eps->epsilon, expected);
  EXPECT_EQ(eps->order, expected_order);
}

TEST(ConversionTest, ImprovedNeverBelowClassicMinusDocumentedImprovement) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  const auto& orders = DefaultRdpOrders();
  for (int trial = 0; trial < 50; ++trial) {
    const double q = std::pow(10.0, -4.0 + 4.0 * unit(rng));
    const double sigma = 0.6 + 5 * unit(rng);
    const double delta = std::pow(10.0, -9.0 + 7.0 * unit(rng));
    auto curve = SampledGaussianRdpCurve(q, sigma, orders);
    ASSERT_TRUE(curve.ok());
    for (double& value : *curve) value *= 1000;  // 1000 steps
    auto improved = EpsilonFromRdp(orders, *curve, delta, RdpConversion::kImproved);
    auto classic = EpsilonFromRdp(orders, *curve, delta, RdpConversion::kClassic);
    ASSERT_TRUE(improved.ok() && classic.ok());
    EXPECT_LE(improved->epsilon, classic->epsilon);
    // classic ≤ classic(α*) = improved + improvement(α*) at the improved
    // optimum α*, so the improved bound is at most that much smaller.
    EXPECT_GE(improved->epsilon,
              classic->epsilon - ConversionImprovement(improved->order) - 1e-12);
    size_t i = std::find(orders.begin(), orders.end(), improved->order) - orders.begin();
    ASSERT_LT(i, orders.size());
    const double classic_at_order = (*curve)[i] - std::log(delta) / (improved->order - 1);
    EXPECT_NEAR(improved->epsilon,
                std::max(0.0, classic_at_order - ConversionImprovement(improved->order)),
                1e-12 * std::max(1.0, classic_at_order));
  }
}

TEST(ConversionTest, DeltaAndEpsilonAreInverse) {
  const auto& orders = DefaultRdpOrders();
  auto curve = SampledGaussianRdpCurve(0.01, 1.1, orders);
  ASSERT_TRUE(curve.ok());
  for (double& value : *curve) value *= 5000;
  for (auto conversion : {RdpConversion::kImproved, RdpConversion::kClassic}) {
    for (double delta : {1e-3, 1e-5, 1e-8}) {
      auto eps = EpsilonFromRdp(orders, *curve, delta, conversion);
      ASSERT_TRUE(eps.ok());
      auto back = DeltaFromRdp(orders, *curve, eps->epsilon, conversion);
      ASSERT_TRUE(back.ok());
      EXPECT_LE(back->delta, delta * (1 + 1e-9)) << RdpConversionName(conversion);
      EXPECT_GT(back->delta, delta * 0.5);
      // A slightly smaller ε cannot reach the same δ.
      auto tighter = DeltaFromRdp(orders, *curve, eps->epsilon * 0.99, conversion);
      EXPECT_GT(tighter->delta, delta);
    }
  }
}

TEST(ConversionTest, ZeroRdpGivesZeroEpsilonAndDelta) {
  const std::vector<double> orders = {2, 3};
  const std::vector<double> zero = {0, 0};
  auto eps = EpsilonFromRdp(orders, zero, 1e-5, RdpConversion::kImproved);
  // With no privacy loss, only the conversion term remains; it must be >= 0.
  ASSERT_TRUE(eps.ok());
  EXPECT_GE(eps->epsilon, 0.0);
  auto delta = DeltaFromRdp(orders, zero, 0.5, RdpConversion::kImproved);
  ASSERT_TRUE(delta.ok());
  EXPECT_EQ(delta->delta, 0.0);
}

TEST(ConversionTest, RejectsInvalidInputs) {
  const std::vector<double> orders = {2, 3};
  const std::vector<double> rdp = {0.1, 0.2};
  EXPECT_THAT(EpsilonFromRdp(orders, rdp, 0.0, RdpConversion::kImproved).status().message(),
              HasSubstr("delta must be in (0, 1)"));
  EXPECT_THAT(EpsilonFromRdp(orders, rdp, 1.0, RdpConversion::kImproved).status().message(),
              HasSubstr("delta"));
  EXPECT_THAT(DeltaFromRdp(orders, rdp, -1, RdpConversion::kImproved).status().message(),
              HasSubstr("epsilon"));
  const std::vector<double> short_rdp = {0.1};
  EXPECT_FALSE(EpsilonFromRdp(orders, short_rdp, 1e-5, RdpConversion::kClassic).ok());
  const std::vector<double> bad_orders = {1.0, 3};
  EXPECT_FALSE(EpsilonFromRdp(bad_orders, rdp, 1e-5, RdpConversion::kClassic).ok());
  const std::vector<double> nan_rdp = {NAN, 0.2};
  EXPECT_FALSE(EpsilonFromRdp(orders, nan_rdp, 1e-5, RdpConversion::kClassic).ok());
}

}  // namespace
}  // namespace vipsd::privacy
