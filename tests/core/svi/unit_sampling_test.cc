// Unit-level privacy in the step driver (DriverConfig::max_records_per_unit;
// docs/privacy_accounting.md "The privacy unit"): units are sampled, a kept
// unit contributes at most the cap's worth of its records, chosen by a rule
// that looks at its own records only, and their statistics are clipped as
// one vector. The probe model's statistic of record r is a spike at
// coordinate r, so the released (here: exact, σ = 0) sum shows which
// records each step used and how each unit's contribution was scaled.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/privacy/mechanisms/block_layout.h"
#include "core/privacy/accounting/rdp_accountant.h"
#include "core/svi/step_driver.h"
#include "core/svi/step_randomness.h"
#include "tests/testing/testing_noise.h"

namespace vipsd::svi {
namespace {

constexpr int kDim = 512;
constexpr double kBound = 1.0;

// Record r (features[0] = r) has the statistic 0.8 · e_r: one record is
// within the bound, two or more of one unit are not (they must be clipped
// together).
class SpikeModel final : public model::Model {
 public:
  SpikeModel()
      : layout_(*privacy::BlockLayout::Create({{"x", privacy::BlockKind::kVector, kDim, kBound}})) {}
  std::string type() const override { return "spike"; }
  const privacy::BlockLayout& statistic_layout() const override { return layout_; }
  bool has_proven_bounds() const override { return true; }
  std::vector<std::pair<std::string, int64_t>> dimensions() const override { return {}; }
  std::unique_ptr<model::EStepScratch> NewScratch() const override {
    return std::make_unique<model::EStepScratch>();
  }
  Status EStep(const model::Record& record, model::RecordRng&, model::EStepScratch&,
               model::SparseStatistic& out) const override {
    out.indices = {static_cast<uint32_t>(record.features.at(0))};
    out.values = {0.8};
    return Status::Ok();
  }
  Status MStep(const Eigen::VectorXd& sum, const privacy::SampledGaussian&, double) override {
    last_sum = sum;
    return Status::Ok();
  }
  std::vector<model::NamedArray> ReleaseArrays() const override { return {}; }
  std::vector<model::NamedArray> CheckpointArrays() const override { return {}; }
  Status RestoreCheckpoint(std::span<const model::NamedArray>) override { return Status::Ok(); }
  Eigen::VectorXd last_sum;

 private:
  privacy::BlockLayout layout_;
};

// A record of unit `unit` whose statistic is a spike at `id`.
model::Record Rec(int id, const std::string& unit) {
  model::Record record;
  record.features = {static_cast<double>(id)};
  record.unit = UnitDigest(unit);
  return record;
}

// Records spread over two streams: record i goes to stream i % 2, offsets
// increasing in each.
struct Data {
  std::vector<model::Record> a, b;
  std::map<int, std::string> unit_of;
  void Add(int id, const std::string& unit) {
    (id % 2 == 0 ? a : b).push_back(Rec(id, unit));
    unit_of[id] = unit;
  }
  std::vector<StreamCandidates> Candidates() const {
    std::vector<StreamCandidates> out(2);
    out[0].stream = "in/0";
    out[1].stream = "in/1";
    for (size_t s = 0; s < 2; ++s) {
      const auto& records = s == 0 ? a : b;
      for (const model::Record& r : records) {
        out[s].records.push_back(&r);
        out[s].offsets.push_back(static_cast<int64_t>(r.features[0]));  // the id: increasing
      }
    }
    return out;
  }
};

DriverConfig UnitConfig(double q, int64_t cap, int threads = 1) {
  DriverConfig config;
  config.mechanism.sampling_rate = q;
  config.mechanism.noise_multiplier = 0;  // the exact sum: each step's choices are visible
  config.threads = threads;
  config.max_records_per_unit = cap;
  return config;
}

// The step sums of `steps` steps on `data` with step keys from `seed`.
std::vector<Eigen::VectorXd> RunSteps(const Data& data, const DriverConfig& config, uint64_t seed,
                                 int steps) {
  SpikeModel model;
  testing::ZeroNoiseSource noise(seed);
  privacy::RdpAccountant accountant;  // a private driver charges its steps
  auto driver = StepDriver::Create(&model, &noise,
                                   config.mechanism.is_private() ? &accountant : nullptr,
                                   config);
  EXPECT_TRUE(driver.ok()) << driver.status().message();
  std::vector<Eigen::VectorXd> sums;
  if (!driver.ok()) return sums;
  const auto candidates = data.Candidates();
  for (int t = 0; t < steps; ++t) {
    const auto result = (*driver)->Step(candidates);
    EXPECT_TRUE(result.ok()) << result.status().message();
    sums.push_back(model.last_sum);
  }
  return sums;
}

// Units u0 … u19 with 1 … 20 records, ids 0 … 209.
Data ManyUnits() {
  Data data;
  int id = 0;
  std::vector<std::pair<int, std::string>> all;
  for (int u = 0; u < 20; ++u) {
    for (int k = 0; k <= u; ++k) all.emplace_back(id++, "u" + std::to_string(u));
  }
  // Interleave units in id order so that each stream mixes every unit.
  for (const auto& [i, unit] : all) data.Add(i, unit);
  return data;
}

TEST(UnitSamplingTest, AUnitContributesAtMostTheCapChosenByItsOwnRecordsOnly) {
  constexpr int64_t kCap = 3;
  // Unit "big" has 30 records (10× the cap) in both streams; others have 2.
  Data alone, crowded;
  for (int i = 0; i < 30; ++i) {
    alone.Add(i, "big");
    crowded.Add(i, "big");
  }
  for (int i = 30; i < 90; ++i) crowded.Add(i, "other" + std::to_string(i / 2));
  for (uint64_t seed : {1u, 2u, 3u, 4u, 5u}) {
    const auto with_others = RunSteps(crowded, UnitConfig(1.0, kCap), seed, 1)[0];
    const auto without = RunSteps(alone, UnitConfig(1.0, kCap), seed, 1)[0];
    std::set<int> chosen;
    double norm2 = 0;
    for (int i = 0; i < 30; ++i) {
      if (with_others[i] != 0) chosen.insert(i);
      norm2 += with_others[i] * with_others[i];
      // The same records, with the same values, whatever else is present.
      EXPECT_EQ(with_others[i], without[i]) << "record " << i << " seed " << seed;
    }
    EXPECT_EQ(chosen.size(), static_cast<size_t>(kCap)) << "seed " << seed;
    // Three spikes of 0.8 (norm 1.386) clipped as one vector to the bound.
    EXPECT_LE(std::sqrt(norm2), kBound * (1 + 1e-12));
    EXPECT_NEAR(std::sqrt(norm2), kBound, 1e-9);
    // The two-record units: 2 · 0.8 spikes, norm 1.13 > 1, clipped together.
    for (int i = 30; i < 90; i += 2) {
      EXPECT_NEAR(std::hypot(with_others[i], with_others[i + 1]), kBound, 1e-9);
      EXPECT_DOUBLE_EQ(with_others[i], with_others[i + 1]);
    }
  }
  // The choice follows the step key: not always the same three records.
  std::set<std::set<int>> choices;
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    const auto sum = RunSteps(alone, UnitConfig(1.0, kCap), seed, 1)[0];
    std::set<int> chosen;
    for (int i = 0; i < 30; ++i) {
      if (sum[i] != 0) chosen.insert(i);
    }
    choices.insert(chosen);
  }
  EXPECT_GT(choices.size(), 1u);
}

TEST(UnitSamplingTest, RemovingOneUnitChangesOnlyThatUnitsDecisionsInEveryStep) {
  const Data d = ManyUnits();
  for (const std::string removed : {"u7", "u19", "u0"}) {
    Data d_minus;
    for (const auto& [id, unit] : d.unit_of) {
      if (unit != removed) d_minus.Add(id, unit);
    }
    const auto with = RunSteps(d, UnitConfig(0.4, 4), 11, 25);
    const auto without = RunSteps(d_minus, UnitConfig(0.4, 4), 11, 25);
    ASSERT_EQ(with.size(), without.size());
    int removed_kept = 0;
    for (size_t t = 0; t < with.size(); ++t) {
      bool removed_here = false;
      for (const auto& [id, unit] : d.unit_of) {
        if (unit == removed) {
          removed_here = removed_here || with[t][id] != 0;
          EXPECT_EQ(without[t][id], 0.0);
        } else {
          // Every other unit: same inclusion, same records, same bits.
          EXPECT_EQ(with[t][id], without[t][id]) << "step " << t << " record " << id;
        }
      }
      removed_kept += removed_here ? 1 : 0;
    }
    // The removed unit took part in some steps, not all (q = 0.4, 25 steps).
    EXPECT_GT(removed_kept, 0) << removed;
    EXPECT_LT(removed_kept, 25) << removed;
  }
}

TEST(UnitSamplingTest, UnitsAreKeptWithProbabilityQAndAllOrNothingUnderTheCap) {
  const Data d = ManyUnits();
  constexpr int kSteps = 300;
  constexpr double kQ = 0.3;
  const auto sums = RunSteps(d, UnitConfig(kQ, 25), 21, kSteps);
  int64_t kept = 0;
  for (const auto& sum : sums) {
    std::map<std::string, std::pair<int, int>> seen;  // unit -> (used, total)
    for (const auto& [id, unit] : d.unit_of) {
      ++seen[unit].second;
      if (sum[id] != 0) ++seen[unit].first;
    }
    for (const auto& [unit, counts] : seen) {
      // Every unit has at most 20 records, under the cap of 25: all or none.
      EXPECT_TRUE(counts.first == 0 || counts.first == counts.second) << unit;
      kept += counts.first > 0 ? 1 : 0;
    }
  }
  // Binomial(300 · 20, 0.3): mean 1800, sd 35.5.
  EXPECT_NEAR(static_cast<double>(kept), kQ * kSteps * 20, 6 * 35.5);
}

TEST(UnitSamplingTest, TheSumDoesNotDependOnTheThreadCount) {
  Data d;
  // Enough units for several 64-contribution chunks.
  for (int i = 0; i < kDim; ++i) d.Add(i, "u" + std::to_string(i / 3));
  // σ = 0: float sums; σ > 0 (zero noise drawn): grid sums, whose units are
  // clipped and rounded before they are summed.
  for (const double sigma : {0.0, 1.0}) {
    DriverConfig one_thread = UnitConfig(0.5, 2, 1), four_threads = UnitConfig(0.5, 2, 4);
    one_thread.mechanism.noise_multiplier = four_threads.mechanism.noise_multiplier = sigma;
    one_thread.epsilon_ceiling = four_threads.epsilon_ceiling = 1000;  // every step runs
    const auto one = RunSteps(d, one_thread, 5, 4);
    const auto four = RunSteps(d, four_threads, 5, 4);
    ASSERT_EQ(one.size(), four.size());
    for (size_t t = 0; t < one.size(); ++t) {
      EXPECT_GT(one[t].norm(), 0) << "sigma " << sigma << " step " << t;  // the step ran
      EXPECT_EQ(one[t], four[t]) << "sigma " << sigma << " step " << t;
    }
  }
}

TEST(UnitSamplingTest, TheCapIsValidated) {
  SpikeModel model;
  testing::ZeroNoiseSource noise(1);
  EXPECT_FALSE(StepDriver::Create(&model, &noise, nullptr, UnitConfig(0.5, -1)).ok());
  EXPECT_FALSE(StepDriver::Create(&model, &noise, nullptr, UnitConfig(0.5, 1000001)).ok());
  EXPECT_TRUE(StepDriver::Create(&model, &noise, nullptr, UnitConfig(0.5, 1000000)).ok());
}

TEST(UnitSamplingTest, UnitDigestsAreDistinctAndStable) {
  EXPECT_EQ(UnitDigest("patient-1"), UnitDigest("patient-1"));
  EXPECT_NE(UnitDigest("patient-1"), UnitDigest("patient-2"));
  EXPECT_NE(UnitDigest(""), UnitDigest(std::string(1, '\0')));
  StepKey k1, k2;
  k2.bytes[0] = 1;
  EXPECT_NE(UnitWord(k1, UnitDigest("a")), UnitWord(k2, UnitDigest("a")));
  EXPECT_EQ(UnitWord(k1, UnitDigest("a")), UnitWord(k1, UnitDigest("a")));
}

}  // namespace
}  // namespace vipsd::svi
