// Tests of the privacy-loss-distribution accountant.
//
// Oracles, none of which shares code with core/privacy/accounting/pld_accountant.cc:
//  * q = 1: T Gaussian steps with noise σ are one Gaussian step with
//    s = σ/√T, whose exact δ(ε) = Φ(1/(2s) − εs) − e^ε Φ(−1/(2s) − εs)
//    (Balle & Wang, ICML 2018, Theorem 8).
//  * q < 1, one step: the hockey-stick divergence ∫ max(0, P − e^ε Q) dx of
//    the two densities, by adaptive Gauss–Kronrod quadrature split at the
//    crossing point, in both directions (add and remove).
//  * q < 1, a few steps: no closed form; the upper bound must shrink as the
//    grid is refined and must stay above an independent lower bound computed
//    by rounding the other way.
//  * The RDP accountant (rdp.h): PLD must be tighter but positive.
#include "core/privacy/accounting/pld_accountant.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <boost/math/quadrature/gauss_kronrod.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/privacy/accounting/rdp.h"

namespace vipsd::privacy {
namespace {

using ::testing::HasSubstr;

constexpr double kInf = std::numeric_limits<double>::infinity();

double NormalCdf(double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }

// Exact δ(ε) of one Gaussian mechanism with sensitivity 1 and noise s.
double GaussianDelta(double s, double epsilon) {
  return NormalCdf(1 / (2 * s) - epsilon * s) -
         std::exp(epsilon) * NormalCdf(-1 / (2 * s) - epsilon * s);
}

// Exact ε(δ) of the same, by bisection on the decreasing δ(ε).
double GaussianEpsilon(double s, double delta) {
  double lo = 0, hi = 1;
  while (GaussianDelta(s, hi) > delta) hi *= 2;
  if (GaussianDelta(s, 0) <= delta) return 0;
  for (int i = 0; i < 200; ++i) {
    const double mid = (lo + hi) / 2;
    (GaussianDelta(s, mid) > delta ? lo : hi) = mid;
  }
  return hi;
}

double NormalDensity(double x, double mean, double sigma) {
  const double z = (x - mean) / sigma;
  return std::exp(-0.5 * z * z) / (sigma * std::sqrt(2 * M_PI));
}

// ∫ max(0, P − e^ε Q) for one step of the subsampled Gaussian, by
// quadrature. remove: P = (1−q)N(0,σ²) + qN(1,σ²), Q = N(0,σ²); add: swapped.
double HockeyStickByQuadrature(double q, double sigma, double epsilon, bool remove) {
  const auto mixture = [&](double x) {
    return (1 - q) * NormalDensity(x, 0, sigma) + q * NormalDensity(x, 1, sigma);
  };
  const auto base = [&](double x) { return NormalDensity(x, 0, sigma); };
  const auto integrand = [&](double x) {
    const double p = remove ? mixture(x) : base(x);
    const double other = remove ? base(x) : mixture(x);
    return std::max(0.0, p - std::exp(epsilon) * other);
  };
  // The privacy loss is monotone, so the integrand is positive on one side
  // of the point where it equals ε: x* = 1/2 + σ² ln((e^{±ε} − 1 + q)/q).
  const double target_ratio = remove ? std::exp(epsilon) : std::exp(-epsilon);
  if (target_ratio - 1 + q <= 0) return 0;  // the loss never reaches ε
  const double crossing = 0.5 + sigma * sigma * std::log((target_ratio - 1 + q) / q);
  using Quad = boost::math::quadrature::gauss_kronrod<double, 61>;
  // Pieces of growing width away from the crossing, out to 40σ + 2.
  const double offsets[] = {0, 0.25, 0.5, 1, 2, 4, 8, 16, 40};
  double total = 0;
  for (size_t i = 0; i + 1 < std::size(offsets); ++i) {
    const double near = offsets[i] * sigma + (i == 0 ? 0.0 : 2.0 * offsets[i] / 40);
    const double far = offsets[i + 1] * sigma + 2.0 * offsets[i + 1] / 40;
    const double a = remove ? crossing + near : crossing - far;
    const double b = remove ? crossing + far : crossing - near;
    // Depth 10 suffices (values agree with depth 12 to 1e-15); deeper
    // recursion only chases rounding noise in the far tails.
    total += Quad::integrate(integrand, a, b, 10, 1e-14);
  }
  return total;
}

double RdpEpsilon(double q, double sigma, int64_t steps, double delta) {
  auto curve = SampledGaussianRdpCurve(q, sigma, DefaultRdpOrders());
  EXPECT_TRUE(curve.ok());
  std::vector<double> total(curve->begin(), curve->end());
  for (double& value : total) value *= static_cast<double>(steps);
  auto epsilon = EpsilonFromRdp(DefaultRdpOrders(), total, delta, RdpConversion::kImproved);
  EXPECT_TRUE(epsilon.ok());
  return epsilon->epsilon;
}

ComposedPld MustCompose(double q, double sigma, int64_t steps, const PldOptions& options = {}) {
  const PldStepGroup group{q, sigma, steps};
  auto pld = ComposedPld::Compose({&group, 1}, options);
  EXPECT_TRUE(pld.ok()) << pld.status().ToString();
  return std::move(pld).value();
}

ComposedPld MustComposeLower(double q, double sigma, int64_t steps,
                             const PldOptions& options = {}) {
  const PldStepGroup group{q, sigma, steps};
  auto pld = ComposedPld::ComposeLowerBound({&group, 1}, options);
  EXPECT_TRUE(pld.ok()) << pld.status().ToString();
  return std::move(pld).value();
}

TEST(PldAccountantTest, FullBatchCompositionNeverBelowClosedFormAndClose) {
  struct Case {
    double sigma;
    int64_t steps;
  };
  int compared = 0;
  for (const Case c : {Case{0.8, 1}, Case{0.8, 10}, Case{2.0, 1}, Case{2.0, 100},
                       Case{5.0, 10}, Case{5.0, 1000}}) {
    const double s = c.sigma / std::sqrt(static_cast<double>(c.steps));
    const ComposedPld pld = MustCompose(1.0, c.sigma, c.steps);
    for (double epsilon : {0.0, 0.25, 1.0, 3.0, 6.0}) {
      const double exact = GaussianDelta(s, epsilon);
      auto delta = pld.Delta(epsilon);
      ASSERT_TRUE(delta.ok());
      EXPECT_GE(*delta, exact) << "sigma=" << c.sigma << " T=" << c.steps << " eps=" << epsilon;
      if (exact < 1e-9) continue;  // closeness is limited by the additive error terms
      EXPECT_LE(*delta, exact * (1 + 1e-3)) << "sigma=" << c.sigma << " T=" << c.steps
                                            << " eps=" << epsilon;
      ++compared;
    }
    for (double delta : {1e-2, 1e-5, 1e-8}) {
      const double exact = GaussianEpsilon(s, delta);
      auto epsilon = pld.Epsilon(delta);
      ASSERT_TRUE(epsilon.ok());
      EXPECT_GE(*epsilon, exact) << "sigma=" << c.sigma << " T=" << c.steps << " delta=" << delta;
      EXPECT_LE(*epsilon, exact * (1 + 1e-3) + 1e-6)
          << "sigma=" << c.sigma << " T=" << c.steps << " delta=" << delta;
    }
  }
  EXPECT_GE(compared, 20);
}

TEST(PldAccountantTest, FullBatchHeterogeneousMatchesClosedForm) {
  // Gaussian steps with σ₁ and σ₂ compose to one with 1/s² = Σ T_i/σ_i².
  const std::vector<PldStepGroup> groups = {{1.0, 3.0, 20}, {1.0, 6.0, 50}};
  const double s = 1 / std::sqrt(20 / 9.0 + 50 / 36.0);
  auto pld = ComposedPld::Compose(groups);
  ASSERT_TRUE(pld.ok());
  for (double epsilon : {0.1, 0.5, 1.0, 2.0}) {
    const double exact = GaussianDelta(s, epsilon);
    auto delta = pld->Delta(epsilon);
    ASSERT_TRUE(delta.ok());
    EXPECT_GE(*delta, exact) << epsilon;
    EXPECT_LE(*delta, exact * (1 + 1e-3)) << epsilon;
  }
}

TEST(PldAccountantTest, SingleSubsampledStepMatchesQuadratureBothDirections) {
  struct Case {
    double q;
    double sigma;
  };
  int compared = 0;
  for (const Case c : {Case{0.004, 1.0}, Case{0.01, 0.7}, Case{0.1, 0.8}, Case{0.5, 2.0},
                       Case{0.9, 1.3}}) {
    const ComposedPld pld = MustCompose(c.q, c.sigma, 1);
    const double spacing = pld.remove_report().grid_spacing;
    for (double epsilon : {0.0, 0.01, 0.1, 0.5, 1.0, 2.0}) {
      // Connecting the dots interpolates the privacy profile between grid
      // points, so one step's δ(ε) lies between the exact δ(ε) and the exact
      // δ at the grid point just below ε (plus error terms far below 1e-12).
      const double below = std::floor(epsilon / spacing) * spacing;
      const std::string label = "q=" + std::to_string(c.q) + " sigma=" + std::to_string(c.sigma) +
                                " eps=" + std::to_string(epsilon);
      double exact_max = 0;
      double ceiling_max = 0;
      for (PldDirection direction : {PldDirection::kRemove, PldDirection::kAdd}) {
        const bool remove = direction == PldDirection::kRemove;
        const double exact = HockeyStickByQuadrature(c.q, c.sigma, epsilon, remove);
        const double ceiling =
            std::max(exact * (1 + 1e-4), HockeyStickByQuadrature(c.q, c.sigma, below, remove)) + 1e-12;
        auto delta = pld.DirectionDelta(direction, epsilon);
        ASSERT_TRUE(delta.ok());
        EXPECT_GE(*delta, exact) << label << " remove=" << remove;
        EXPECT_LE(*delta, ceiling) << label << " remove=" << remove;
        // Away from the end of the loss range the profile is smooth and the
        // interpolation error is second order.
        if (exact >= 1e-6) {
          EXPECT_LE(*delta, exact * (1 + 1e-4)) << label << " remove=" << remove;
          ++compared;
        }
        exact_max = std::max(exact_max, exact);
        ceiling_max = std::max(ceiling_max, ceiling);
      }
      auto delta = pld.Delta(epsilon);
      ASSERT_TRUE(delta.ok());
      EXPECT_GE(*delta, exact_max) << label;
      EXPECT_LE(*delta, ceiling_max) << label;
    }
  }
  EXPECT_GE(compared, 25);
}

TEST(PldAccountantTest, RefiningTheGridTightensTheUpperBoundAboveTheLowerBound) {
  struct Case {
    double q;
    double sigma;
    int64_t steps;
  };
  for (const Case c : {Case{0.05, 0.9, 2}, Case{0.2, 1.5, 3}, Case{0.01, 0.7, 3}}) {
    std::vector<double> upper_eps;
    std::vector<double> lower_eps;
    std::vector<double> upper_delta;
    std::vector<double> lower_delta;
    for (double spacing : {1e-2, 1e-3, 1e-4}) {
      PldOptions options;
      options.discretization = spacing;
      const ComposedPld upper = MustCompose(c.q, c.sigma, c.steps, options);
      const ComposedPld lower = MustComposeLower(c.q, c.sigma, c.steps, options);
      upper_eps.push_back(*upper.Epsilon(1e-5));
      lower_eps.push_back(*lower.Epsilon(1e-5));
      upper_delta.push_back(*upper.Delta(0.5));
      lower_delta.push_back(*lower.Delta(0.5));
      // Rounding every cell up dominates connecting the dots.
      options.method = PldDiscretization::kRoundUp;
      const ComposedPld round_up = MustCompose(c.q, c.sigma, c.steps, options);
      EXPECT_GE(*round_up.Epsilon(1e-5), upper_eps.back() - 1e-12) << spacing;
      EXPECT_GE(*round_up.Delta(0.5), upper_delta.back() - 1e-12) << spacing;
    }
    const std::string label = "q=" + std::to_string(c.q) + " sigma=" + std::to_string(c.sigma) +
                              " T=" + std::to_string(c.steps);
    for (size_t i = 0; i + 1 < upper_eps.size(); ++i) {
      EXPECT_LE(upper_eps[i + 1], upper_eps[i] + 1e-12) << label;
      EXPECT_LE(upper_delta[i + 1], upper_delta[i] + 1e-12) << label;
      EXPECT_GE(lower_eps[i + 1], lower_eps[i] - 1e-12) << label;
      EXPECT_GE(lower_delta[i + 1], lower_delta[i] - 1e-12) << label;
    }
    // Every lower bound is below every upper bound (the truth is between).
    EXPECT_LE(*std::max_element(lower_eps.begin(), lower_eps.end()),
              *std::min_element(upper_eps.begin(), upper_eps.end()))
        << label;
    EXPECT_LE(*std::max_element(lower_delta.begin(), lower_delta.end()),
              *std::min_element(upper_delta.begin(), upper_delta.end()))
        << label;
    // At the finest grid the sandwich is narrow.
    EXPECT_LT(upper_eps.back() - lower_eps.back(), 2e-3 * upper_eps.back() + 1e-3) << label;
    EXPECT_GT(lower_eps.back(), 0.0) << label;
  }
}

TEST(PldAccountantTest, TighterThanRdpButPositive) {
  struct Case {
    double q;
    double sigma;
    int64_t steps;
    double delta;
  };
  for (const Case c : {Case{0.01, 1.0, 1000, 1e-5}, Case{0.004, 1.0, 100, 1e-3},
                       Case{0.02, 1.24, 50, 1e-5}}) {
    auto pld = PldEpsilon(c.q, c.sigma, c.steps, c.delta);
    ASSERT_TRUE(pld.ok());
    const double rdp = RdpEpsilon(c.q, c.sigma, c.steps, c.delta);
    const ComposedPld lower = MustComposeLower(c.q, c.sigma, c.steps);
    const double lower_eps = *lower.Epsilon(c.delta);
    EXPECT_LT(*pld, rdp) << "q=" << c.q << " T=" << c.steps;
    EXPECT_GE(*pld, lower_eps) << "q=" << c.q << " T=" << c.steps;
    EXPECT_GT(lower_eps, 0.0);
  }
}

TEST(PldAccountantTest, MonotoneInStepsSamplingRateAndNoise) {
  double previous = 0;
  for (int64_t steps : {10, 100, 1000}) {
    const double epsilon = *PldEpsilon(0.01, 1.0, steps, 1e-5);
    EXPECT_GT(epsilon, previous) << steps;
    previous = epsilon;
  }
  previous = 0;
  for (double q : {0.001, 0.01, 0.1}) {
    const double epsilon = *PldEpsilon(q, 1.0, 100, 1e-5);
    EXPECT_GT(epsilon, previous) << q;
    previous = epsilon;
  }
  previous = kInf;
  for (double sigma : {0.7, 1.0, 2.0}) {
    const double epsilon = *PldEpsilon(0.01, sigma, 100, 1e-5);
    EXPECT_LT(epsilon, previous) << sigma;
    previous = epsilon;
  }
  // δ(ε) is non-increasing in ε.
  const ComposedPld pld = MustCompose(0.01, 1.0, 100);
  double previous_delta = 1;
  for (double epsilon : {0.0, 0.1, 0.3, 1.0, 3.0}) {
    const double delta = *pld.Delta(epsilon);
    EXPECT_LE(delta, previous_delta) << epsilon;
    previous_delta = delta;
  }
}

TEST(PldAccountantTest, DeltaAndEpsilonAreConsistent) {
  const ComposedPld pld = MustCompose(0.02, 1.24, 50);
  for (double delta : {1e-3, 1e-5, 1e-9}) {
    const double epsilon = *pld.Epsilon(delta);
    EXPECT_LE(*pld.Delta(epsilon), delta) << delta;
    // Not far above the smallest admissible ε: slightly less ε fails.
    EXPECT_GT(*pld.Delta(std::max(0.0, epsilon - 1e-3)), delta) << delta;
  }
}

TEST(PldAccountantTest, MillionStepsIsFiniteAndTighterThanRdp) {
  const PldStepGroup group{0.004, 1.0, 1'000'000};
  auto pld = ComposedPld::Compose({&group, 1});
  ASSERT_TRUE(pld.ok());
  const double epsilon = *pld->Epsilon(1e-5);
  EXPECT_TRUE(std::isfinite(epsilon));
  EXPECT_GT(epsilon, 0.0);
  EXPECT_LT(epsilon, RdpEpsilon(0.004, 1.0, 1'000'000, 1e-5));
  for (const PldDirectionReport* report : {&pld->remove_report(), &pld->add_report()}) {
    EXPECT_LE(report->grid_points, int64_t{1} << 21);
    // Every error term is far below the δ asked for.
    EXPECT_LT(report->infinity_mass + report->aliasing_bound + report->fft_error +
                  report->rounding_error,
              1e-8);
  }
}

TEST(PldAccountantTest, TailTruncationIsChargedToDelta) {
  PldOptions options;
  options.tail_mass_truncation = 1e-4;
  const ComposedPld loose = MustCompose(0.05, 1.0, 100, options);
  const ComposedPld tight = MustCompose(0.05, 1.0, 100);
  // The truncated mass goes to +∞, so δ can only grow with the truncation.
  EXPECT_GT(loose.remove_report().infinity_mass, tight.remove_report().infinity_mass);
  EXPECT_LE(loose.remove_report().infinity_mass, 1e-4);
  for (double epsilon : {0.5, 2.0, 10.0}) {
    EXPECT_GE(*loose.Delta(epsilon), *tight.Delta(epsilon)) << epsilon;
    EXPECT_GE(*loose.Delta(epsilon), loose.remove_report().infinity_mass) << epsilon;
  }
}

TEST(PldAccountantTest, LowerBoundIsMarkedAndBelow) {
  const ComposedPld upper = MustCompose(0.01, 1.0, 300);
  const ComposedPld lower = MustComposeLower(0.01, 1.0, 300);
  EXPECT_EQ(upper.bound(), ComposedPld::Bound::kUpper);
  EXPECT_EQ(lower.bound(), ComposedPld::Bound::kLower);
  for (double epsilon : {0.0, 0.3, 1.0}) {
    EXPECT_LE(*lower.Delta(epsilon), *upper.Delta(epsilon)) << epsilon;
  }
  EXPECT_LE(*lower.Epsilon(1e-6), *upper.Epsilon(1e-6));
}

TEST(PldAccountantTest, RejectsInvalidInputs) {
  const auto expect_invalid = [](const StatusOr<double>& result, const std::string& pattern) {
    ASSERT_FALSE(result.ok());
    EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(result.status().message(), HasSubstr(pattern));
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  expect_invalid(PldEpsilon(0.0, 1.0, 10, 1e-5), "sampling_rate");
  expect_invalid(PldEpsilon(1.5, 1.0, 10, 1e-5), "sampling_rate");
  expect_invalid(PldEpsilon(nan, 1.0, 10, 1e-5), "sampling_rate");
  expect_invalid(PldEpsilon(0.1, 0.0, 10, 1e-5), "noise_multiplier");
  expect_invalid(PldEpsilon(0.1, -1.0, 10, 1e-5), "noise_multiplier");
  expect_invalid(PldEpsilon(0.1, kInf, 10, 1e-5), "noise_multiplier");
  expect_invalid(PldEpsilon(0.1, 1.0, 0, 1e-5), "steps");
  expect_invalid(PldEpsilon(0.1, 1.0, -5, 1e-5), "steps");
  expect_invalid(PldEpsilon(0.1, 1.0, 10, 0.0), "delta");
  expect_invalid(PldEpsilon(0.1, 1.0, 10, 1.0), "delta");
  expect_invalid(PldEpsilon(0.1, 1.0, 10, nan), "delta");
  expect_invalid(PldDelta(0.1, 1.0, 10, -1.0), "epsilon");
  expect_invalid(PldDelta(0.1, 1.0, 10, kInf), "epsilon");
  expect_invalid(PldDelta(0.1, 1.0, 10, nan), "epsilon");
  PldOptions options;
  options.discretization = 0;
  expect_invalid(PldDelta(0.1, 1.0, 10, 1.0, options), "discretization");
  options.discretization = 2;
  expect_invalid(PldDelta(0.1, 1.0, 10, 1.0, options), "discretization");
  options = {};
  options.tail_mass_truncation = 0;
  expect_invalid(PldDelta(0.1, 1.0, 10, 1.0, options), "tail_mass_truncation");
  options.tail_mass_truncation = 0.5;
  expect_invalid(PldDelta(0.1, 1.0, 10, 1.0, options), "tail_mass_truncation");

  auto empty = ComposedPld::Compose({});
  ASSERT_FALSE(empty.ok());
  EXPECT_THAT(empty.status().message(), HasSubstr("step group"));
  const std::vector<PldStepGroup> too_many = {{0.1, 1.0, int64_t{1} << 40}, {0.1, 2.0, 1}};
  auto overflow = ComposedPld::Compose(too_many);
  ASSERT_FALSE(overflow.ok());
  EXPECT_THAT(overflow.status().message(), HasSubstr("2^40"));

  const ComposedPld pld = MustCompose(0.1, 1.0, 10);
  EXPECT_FALSE(pld.Delta(-0.5).ok());
  EXPECT_FALSE(pld.Epsilon(0.0).ok());
  EXPECT_FALSE(pld.Epsilon(1.5).ok());
}

TEST(PldAccountantTest, DeltaBelowErrorTermsGivesInfiniteEpsilon) {
  PldOptions options;
  options.tail_mass_truncation = 1e-6;
  const ComposedPld pld = MustCompose(0.1, 1.0, 10, options);
  // δ below the truncated mass cannot be certified: ε = +∞, a valid bound.
  EXPECT_EQ(*pld.Epsilon(1e-9), kInf);
  EXPECT_TRUE(std::isfinite(*pld.Epsilon(1e-5)));
}

}  // namespace
}  // namespace vipsd::privacy
