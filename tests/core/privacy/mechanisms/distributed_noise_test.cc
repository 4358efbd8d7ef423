#include "core/privacy/mechanisms/distributed_noise.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <vector>

#include "core/privacy/mechanisms/block_layout.h"
#include "core/privacy/mechanisms/discrete_gaussian.h"
#include "core/privacy/mechanisms/secure_noise.h"

namespace vipsd::privacy {
namespace {

BlockLayout OneBlock() {
  auto layout = BlockLayout::Create({{"b", BlockKind::kVector, 8, 1.0}});
  EXPECT_TRUE(layout.ok()) << layout.status().message();
  return *layout;
}

TEST(DistributedNoiseTest, RefusesHolderCountsOutsideTheRangeNamingThem) {
  const BlockLayout layout = OneBlock();
  auto none = DistributedNoiseFor(layout, 1.0, 0, 0);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("number of holders"), std::string::npos);
  EXPECT_FALSE(DistributedNoiseFor(layout, 1.0, kMaxHolders + 1, 0).ok());
  auto all = DistributedNoiseFor(layout, 1.0, 3, 3);
  ASSERT_FALSE(all.ok());
  EXPECT_NE(all.status().message().find("must be below the number of holders"),
            std::string::npos);
  EXPECT_FALSE(DistributedNoiseFor(layout, -1.0, 3, 1).ok());
}

// The shares of the honest holders cover σ_g² (so the charge at σ stands)
// and are the smallest integers that do.
TEST(DistributedNoiseTest, TheHonestSharesCoverTheCentralNoiseWithTheSmallestIntegerShare) {
  const BlockLayout layout = OneBlock();
  for (double sigma : {0.5, 1.0, 2.0, 7.3}) {
    for (uint32_t n : {1u, 2u, 3u, 5u, 16u}) {
      for (uint32_t t = 0; t < n; ++t) {
        auto noise = DistributedNoiseFor(layout, sigma, n, t);
        ASSERT_TRUE(noise.ok()) << noise.status().message();
        const uint64_t central = noise->central.sigma2.numerator;
        const uint64_t share = noise->share_sigma2.numerator;
        const uint64_t honest = n - t;
        EXPECT_GE(honest * share, central);
        EXPECT_LT(honest * (share - 1), central);
        EXPECT_EQ(noise->share_sigma2.denominator, 1u);
        auto charged = HonestNoiseMultiplier(*noise, honest);
        ASSERT_TRUE(charged.ok());
        EXPECT_GE(*charged, sigma);
        // What the formula promises, checked in long double.
        const long double usable = static_cast<long double>(honest * share) - kReductionTau2;
        EXPECT_LE(static_cast<long double>(*charged) * *charged,
                  usable / noise->central.bound_squared * (1 + 1e-15L));
      }
    }
  }
}

TEST(DistributedNoiseTest, MoreColludersThanToleratedLowerTheChargeableSigmaAsTheSquareRoot) {
  const BlockLayout layout = OneBlock();
  auto noise = DistributedNoiseFor(layout, 2.0, 5, 1);  // 4 honest shares cover σ
  ASSERT_TRUE(noise.ok());
  for (uint32_t honest = 1; honest < 4; ++honest) {
    auto sigma = HonestNoiseMultiplier(*noise, honest);
    ASSERT_TRUE(sigma.ok());
    EXPECT_LT(*sigma, 2.0);
    EXPECT_NEAR(*sigma, 2.0 * std::sqrt(honest / 4.0), 2e-3) << honest;
  }
  auto zero = HonestNoiseMultiplier(*noise, 0);
  ASSERT_TRUE(zero.ok());
  EXPECT_EQ(*zero, 0.0);
  EXPECT_FALSE(HonestNoiseMultiplier(*noise, 6).ok());
}

// Independent oracle for the closeness bound: the pmf of a sum of h discrete
// Gaussians by direct convolution, against exp(−x²/(2hs²))/sqrt(2πhs²).
std::vector<long double> DiscreteGaussianPmf(long double s2, int64_t half_width) {
  std::vector<long double> pmf(2 * half_width + 1);
  long double z = 0;
  for (int64_t x = -half_width; x <= half_width; ++x) {
    pmf[x + half_width] = std::exp(-static_cast<long double>(x * x) / (2 * s2));
    z += pmf[x + half_width];
  }
  for (long double& p : pmf) p /= z;
  return pmf;
}

TEST(DistributedNoiseTest, TheClosenessBoundHoldsAgainstConvolvedPmfsAndIsNotVacuous) {
  const long double pi = std::numbers::pi_v<long double>;
  for (long double s2 : {0.5L, 0.8L, 1.0L, 1.5L}) {
    const int64_t half = 60;  // > 40 σ of every sum below
    const std::vector<long double> one = DiscreteGaussianPmf(s2, half);
    std::vector<long double> sum = one;  // support [−h·half, h·half]
    for (uint32_t h = 2; h <= 4; ++h) {
      std::vector<long double> next(sum.size() + one.size() - 1, 0);
      for (size_t i = 0; i < sum.size(); ++i) {
        for (size_t j = 0; j < one.size(); ++j) next[i + j] += sum[i] * one[j];
      }
      sum = std::move(next);
      const int64_t offset = static_cast<int64_t>(sum.size() / 2);
      const long double variance = h * s2;
      long double worst = 0;
      // Where the pmf is far above long double's rounding.
      for (int64_t x = -static_cast<int64_t>(6 * std::sqrt(variance));
           x <= static_cast<int64_t>(6 * std::sqrt(variance)); ++x) {
        const long double gauss =
            std::exp(-static_cast<long double>(x * x) / (2 * variance)) /
            std::sqrt(2 * pi * variance);
        worst = std::max(worst, std::fabs(std::log(sum[x + offset] / gauss)));
      }
      const long double bound = ShareSumClosenessBound(s2, h);
      EXPECT_LE(worst, bound * (1 + 1e-9L) + 1e-16L) << "s2=" << static_cast<double>(s2)
                                                     << " h=" << h;
      // Not vacuous where it is one convolution (h = 2); with more it sums
      // per-convolution worst cases (measured up to 400x loose at h = 4,
      // s² = 1.5, where the bound is 7.5e-7 and the truth 1.8e-9).
      if (h == 2) {
        EXPECT_GE(worst, bound / 10) << "the bound is far from tight: s2=" << static_cast<double>(s2)
                                   << " h=" << h;
      }
      EXPECT_GE(Log10ShareSumClosenessBound(s2, h), std::log10(bound));
    }
  }
}

TEST(DistributedNoiseTest, TheSharesVipsdUsesAreIndistinguishableFromOneGaussian) {
  const BlockLayout layout = OneBlock();
  auto noise = DistributedNoiseFor(layout, 1.0, 3, 1);
  ASSERT_TRUE(noise.ok());
  const long double s2 = static_cast<long double>(noise->share_sigma2.numerator);
  EXPECT_EQ(ShareSumClosenessBound(s2, 3), 0.0L);  // below long double's range
  EXPECT_LT(Log10ShareSumClosenessBound(s2, 3), -1e10L);
}

// The shares a holder draws are N_Z(0, s²): summed over three holders the
// sample variance is 3s² (a statistical check of the wiring, not of the
// sampler, which discrete_gaussian_test covers).
TEST(DistributedNoiseTest, SummedSharesHaveTheVarianceOfTheirSum) {
  const Rational share{400, 1};
  auto sampler = DiscreteGaussianSampler::Create(share);
  ASSERT_TRUE(sampler.ok());
  std::vector<std::unique_ptr<NoiseSource>> holders;
  for (uint64_t seed : {11u, 12u, 13u}) {
    auto source = SecureNoiseSource::CreateReproducible(seed);
    ASSERT_TRUE(source.ok());
    holders.push_back(std::move(*source));
  }
  const size_t n = 60000;
  std::vector<int64_t> total(n, 0), draws(n);
  for (auto& holder : holders) {
    ASSERT_TRUE(sampler->Fill(*holder, draws).ok());
    for (size_t i = 0; i < n; ++i) total[i] += draws[i];
  }
  long double mean = 0, m2 = 0;
  for (int64_t v : total) mean += v;
  mean /= n;
  for (int64_t v : total) m2 += (v - mean) * (v - mean);
  const long double variance = m2 / (n - 1);
  // sd of the sample variance ≈ variance·sqrt(2/n) = 0.58 % ; 5 sd.
  EXPECT_NEAR(static_cast<double>(variance), 1200.0, 1200.0 * 0.029);
  EXPECT_NEAR(static_cast<double>(mean), 0.0, 5 * std::sqrt(1200.0 / n));
}

}  // namespace
}  // namespace vipsd::privacy
