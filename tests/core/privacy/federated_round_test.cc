// One federated step in process (issue 31): three data holders each sum
// their own records, add their noise share, mask; the aggregator sums the
// masked messages and releases. Against one trusted process on the union of
// the data: the same release bit for bit without noise, and the noise of the
// sum of shares has the variance the plan promises.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/privacy/mechanisms/block_layout.h"
#include "core/privacy/mechanisms/distributed_noise.h"
#include "core/privacy/mechanisms/gaussian_mechanism.h"
#include "core/privacy/mechanisms/secure_aggregation.h"
#include "core/privacy/mechanisms/secure_noise.h"
#include "tests/testing/testing_noise.h"

namespace vipsd::privacy {
namespace {

BlockLayout TwoBlocks(size_t first, size_t second) {
  auto layout = BlockLayout::Create(
      {{"a", BlockKind::kVector, first, 1.0}, {"b", BlockKind::kVector, second, 2.5}});
  EXPECT_TRUE(layout.ok()) << layout.status().message();
  return *layout;
}

std::vector<std::vector<double>> Records(size_t count, size_t size, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> value(0.0, 0.4);
  std::vector<std::vector<double>> out(count, std::vector<double>(size));
  for (auto& record : out) {
    for (double& v : record) v = value(rng);
  }
  return out;
}

// Each of `holders` holders' records (`count` each, seeds from `seed`).
using HolderData = std::vector<std::vector<std::vector<double>>>;
HolderData MakeData(size_t holders, size_t count, size_t size, uint64_t seed) {
  HolderData data;
  for (uint64_t i = 0; i < holders; ++i) data.push_back(Records(count, size, seed + i));
  return data;
}

struct Holders {
  std::vector<std::string> ids;
  std::vector<Masker> maskers;
};

Holders MakeHolders(size_t n) {
  Holders h;
  std::vector<HolderSecretKey> keys;
  std::vector<RosterEntry> roster;
  for (size_t i = 0; i < n; ++i) {
    auto key = HolderSecretKey::Generate();
    EXPECT_TRUE(key.ok());
    h.ids.push_back("site-" + std::to_string(i));
    roster.push_back({h.ids.back(), key->PublicKey()});
    keys.push_back(std::move(*key));
  }
  for (size_t i = 0; i < n; ++i) {
    auto masker = Masker::Create(keys[i], h.ids[i], roster);
    EXPECT_TRUE(masker.ok());
    EXPECT_TRUE(masker->Bind("round").ok());
    h.maskers.push_back(std::move(*masker));
  }
  return h;
}

// Runs one federated round: holder i sums records[i], draws its share from
// sources[i], masks for `round`; returns the aggregator's release.
StatusOr<GaussianRelease> FederatedRound(const BlockLayout& layout, const DistributedNoise& plan,
                                         Holders& holders,
                                         const HolderData& data,
                                         std::vector<NoiseSource*> sources, uint64_t round) {
  std::vector<std::vector<uint64_t>> messages;
  bool all_private = true;
  for (size_t i = 0; i < data.size(); ++i) {
    GaussianSumMechanism holder(layout);
    for (const auto& record : data[i]) VIPSD_RETURN_IF_ERROR(holder.Add(record));
    VIPSD_ASSIGN_OR_RETURN(std::vector<int64_t> share, holder.ReleaseShare(*sources[i], plan));
    messages.emplace_back(share.size());
    VIPSD_RETURN_IF_ERROR(holders.maskers[i].Mask(round, holders.ids, share, messages.back()));
    all_private = all_private && sources[i]->is_private();
  }
  std::vector<std::span<const uint64_t>> views(messages.begin(), messages.end());
  VIPSD_ASSIGN_OR_RETURN(std::vector<int64_t> total, SumMasked(views));
  return GaussianSumMechanism::ReleaseFederatedTotal(layout, total, plan, all_private);
}

TEST(FederatedRoundTest, WithoutNoiseTheReleaseIsTheTrustedProcesssBitForBit) {
  const BlockLayout layout = TwoBlocks(40, 25);
  std::vector<std::vector<std::vector<double>>> data;
  for (uint64_t i = 0; i < 3; ++i) data.push_back(Records(20 + 7 * i, layout.total_size(), 50 + i));
  auto plan = DistributedNoiseFor(layout, 1.5, 3, 1);
  ASSERT_TRUE(plan.ok());
  Holders holders = MakeHolders(3);
  testing::ZeroNoiseSource zero;
  auto federated = FederatedRound(layout, *plan, holders, data, {&zero, &zero, &zero}, 1);
  ASSERT_TRUE(federated.ok()) << federated.status().message();
  GaussianSumMechanism central(layout);
  for (const auto& holder : data) {
    for (const auto& record : holder) ASSERT_TRUE(central.Add(record).ok());
  }
  auto trusted = central.Release(zero, 1.5);
  ASSERT_TRUE(trusted.ok());
  ASSERT_EQ(federated->noisy_sum.size(), trusted->noisy_sum.size());
  for (Eigen::Index c = 0; c < trusted->noisy_sum.size(); ++c) {
    ASSERT_EQ(federated->noisy_sum[c], trusted->noisy_sum[c]) << c;
  }
  EXPECT_EQ(federated->noise.sigma2.numerator, trusted->noise.sigma2.numerator);
  EXPECT_EQ(federated->noise_multiplier, 1.5);
  EXPECT_FALSE(federated->is_private);  // the zero source is not private
  EXPECT_NE(federated->noise_description.find("3 holders, tolerating 1"), std::string::npos);
}

// With the holders' private-style (fixed-seed here) sources, the release
// minus the exact sum is the sum of three shares: per coordinate, variance
// 3·s² in grid units, i.e. 3/2 of σ_g² for t = 1 (two honest shares alone
// cover σ_g²).
TEST(FederatedRoundTest, TheNoiseInTheReleaseIsTheSumOfTheHoldersShares) {
  const BlockLayout layout = TwoBlocks(6000, 4000);
  const HolderData data = MakeData(3, 5, layout.total_size(), 70);
  auto plan = DistributedNoiseFor(layout, 1.0, 3, 1);
  ASSERT_TRUE(plan.ok());
  Holders holders = MakeHolders(3);
  std::vector<std::unique_ptr<NoiseSource>> sources;
  for (uint64_t seed : {1u, 2u, 3u}) {
    auto source = SecureNoiseSource::CreateReproducible(seed);
    ASSERT_TRUE(source.ok());
    sources.push_back(std::move(*source));
  }
  auto federated = FederatedRound(layout, *plan, holders, data,
                                  {sources[0].get(), sources[1].get(), sources[2].get()}, 1);
  ASSERT_TRUE(federated.ok()) << federated.status().message();
  GaussianSumMechanism central(layout);
  for (const auto& holder : data) {
    for (const auto& record : holder) ASSERT_TRUE(central.Add(record).ok());
  }
  auto exact = central.ReleaseNonPrivate();
  ASSERT_TRUE(exact.ok());
  const int g = plan->central.grid_exponent;
  double m2 = 0;
  for (const Block& block : layout.blocks()) {
    for (size_t c = block.offset; c < block.offset + block.size; ++c) {
      const double grid_units = std::ldexp(
          (federated->noisy_sum[static_cast<Eigen::Index>(c)] -
           exact->noisy_sum[static_cast<Eigen::Index>(c)]) / block.clip_bound, g);
      m2 += grid_units * grid_units;
    }
  }
  const double variance = m2 / static_cast<double>(layout.total_size());
  const double expected = 3.0 * static_cast<double>(plan->share_sigma2.numerator);
  // The sample variance of 10,000 draws: sd 1.4 %; 5 sd.
  EXPECT_NEAR(variance / expected, 1.0, 0.071);
  EXPECT_NEAR(expected / static_cast<double>(plan->central.sigma2.numerator), 1.5, 1e-6);
}

// A holder whose message never arrives: the others' messages sum to a pad,
// not to anything near the data; the round is abandoned and the next one,
// among the two that remain (noise re-planned for n = 2), releases normally.
TEST(FederatedRoundTest, ARoundMissingAHolderSumsToAPadAndTheNextRoundProceeds) {
  const BlockLayout layout = TwoBlocks(30, 10);
  const HolderData data = MakeData(3, 10, layout.total_size(), 90);
  auto plan = DistributedNoiseFor(layout, 1.0, 3, 1);
  ASSERT_TRUE(plan.ok());
  Holders holders = MakeHolders(3);
  testing::ZeroNoiseSource zero;
  std::vector<std::vector<uint64_t>> messages;
  for (size_t i = 0; i < 3; ++i) {
    GaussianSumMechanism holder(layout);
    for (const auto& record : data[i]) ASSERT_TRUE(holder.Add(record).ok());
    auto share = holder.ReleaseShare(zero, *plan);
    ASSERT_TRUE(share.ok());
    messages.emplace_back(share->size());
    ASSERT_TRUE(holders.maskers[i].Mask(1, holders.ids, *share, messages.back()).ok());
  }
  std::vector<std::span<const uint64_t>> two = {messages[0], messages[2]};
  auto pad = SumMasked(two);
  ASSERT_TRUE(pad.ok());
  size_t large = 0;  // |value| ≥ 2^50 grid units: 2^30 bounds, nothing data can reach
  for (int64_t v : *pad) large += (v > (int64_t{1} << 50) || v < -(int64_t{1} << 50));
  EXPECT_GE(large, pad->size() - 1);
  // Round 2 among the remaining holders, noise re-planned for two.
  auto replanned = DistributedNoiseFor(layout, 1.0, 2, 0);
  ASSERT_TRUE(replanned.ok());
  EXPECT_EQ(replanned->share_sigma2.numerator, (plan->central.sigma2.numerator + 1) / 2);
  std::vector<std::vector<uint64_t>> next;
  const std::vector<std::string> remaining = {holders.ids[0], holders.ids[2]};
  for (size_t i : {0u, 2u}) {
    GaussianSumMechanism holder(layout);
    for (const auto& record : data[i]) ASSERT_TRUE(holder.Add(record).ok());
    auto share = holder.ReleaseShare(zero, *replanned);
    ASSERT_TRUE(share.ok());
    next.emplace_back(share->size());
    ASSERT_TRUE(holders.maskers[i].Mask(2, remaining, *share, next.back()).ok());
  }
  std::vector<std::span<const uint64_t>> views(next.begin(), next.end());
  auto total = SumMasked(views);
  ASSERT_TRUE(total.ok());
  GaussianSumMechanism central(layout);
  for (size_t i : {0u, 2u}) {
    for (const auto& record : data[i]) ASSERT_TRUE(central.Add(record).ok());
  }
  auto exact = central.ReleaseNonPrivate();
  ASSERT_TRUE(exact.ok());
  auto release = GaussianSumMechanism::ReleaseFederatedTotal(layout, *total, *replanned, false);
  ASSERT_TRUE(release.ok());
  for (Eigen::Index c = 0; c < exact->noisy_sum.size(); ++c) {
    EXPECT_EQ(release->noisy_sum[c], exact->noisy_sum[c]);
  }
}

TEST(FederatedRoundTest, ASumYieldsOneShareAndMismatchedPlansAreRefused) {
  const BlockLayout layout = TwoBlocks(4, 4);
  auto plan = DistributedNoiseFor(layout, 1.0, 3, 1);
  ASSERT_TRUE(plan.ok());
  testing::ZeroNoiseSource zero;
  GaussianSumMechanism holder(layout);
  ASSERT_TRUE(holder.Add(std::vector<double>(8, 0.1)).ok());
  ASSERT_TRUE(holder.ReleaseShare(zero, *plan).ok());
  EXPECT_FALSE(holder.ReleaseShare(zero, *plan).ok());  // consumed
  EXPECT_FALSE(holder.Release(zero, 1.0).ok());
  // A plan for a layout with another number of blocks has another grid.
  auto many = BlockLayout::Create({{"a", BlockKind::kVector, 1, 1.0}, {"b", BlockKind::kVector, 1, 1.0},
                                   {"c", BlockKind::kVector, 1, 1.0}, {"d", BlockKind::kVector, 1, 1.0}});
  ASSERT_TRUE(many.ok());
  auto other = DistributedNoiseFor(*many, 1.0, 3, 1);
  ASSERT_TRUE(other.ok());
  GaussianSumMechanism fresh(layout);
  EXPECT_FALSE(fresh.ReleaseShare(zero, *other).ok());
  EXPECT_FALSE(
      GaussianSumMechanism::ReleaseFederatedTotal(layout, std::vector<int64_t>(7), *plan, false).ok());
  EXPECT_FALSE(
      GaussianSumMechanism::ReleaseFederatedTotal(layout, std::vector<int64_t>(8), *other, false).ok());
  GaussianSumMechanism floating(layout, SumKind::kFloat);
  EXPECT_FALSE(floating.ReleaseShare(zero, *plan).ok());
}

}  // namespace
}  // namespace vipsd::privacy
