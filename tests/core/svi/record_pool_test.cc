#include "core/svi/record_pool.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <string>

namespace vipsd::svi {
namespace {

// Test records carry an id in features[0] so that the test can follow them.
model::Record Tagged(int64_t id) {
  model::Record record;
  record.features = {static_cast<double>(id)};
  return record;
}

int64_t IdOf(const model::Record& record) { return static_cast<int64_t>(record.features[0]); }

RecordPool MakePool(int64_t capacity, int64_t residency,
                    EvictionPolicy eviction = EvictionPolicy::kEvictOldest) {
  PoolOptions options;
  options.capacity = capacity;
  options.max_residency_steps = residency;
  options.eviction = eviction;
  auto pool = RecordPool::Create(options);
  EXPECT_TRUE(pool.ok());
  return std::move(*pool);
}

TEST(RecordPoolTest, ValidatesOptions) {
  PoolOptions options;
  options.capacity = 0;
  EXPECT_FALSE(RecordPool::Create(options).ok());
  options.capacity = 1;
  options.max_residency_steps = -1;
  EXPECT_FALSE(RecordPool::Create(options).ok());
}

TEST(RecordPoolTest, CapacityEvictsOldestFirst) {
  RecordPool pool = MakePool(3, 0);
  for (int64_t id = 0; id < 10; ++id) {
    auto added = pool.Add(Tagged(id), {0, id});
    ASSERT_TRUE(added.ok() && *added);
    ASSERT_LE(pool.size(), 3);
  }
  ASSERT_EQ(pool.size(), 3);
  EXPECT_EQ(IdOf(pool.records()[0]), 7);
  EXPECT_EQ(IdOf(pool.records()[2]), 9);
  EXPECT_EQ(pool.evicted_by_capacity(), 7);
  EXPECT_EQ(pool.LowestOffsets().at(0), 7);
}

TEST(RecordPoolTest, RefuseNewKeepsThePoolAndSaysSo) {
  RecordPool pool = MakePool(2, 0, EvictionPolicy::kRefuseNew);
  ASSERT_TRUE(*pool.Add(Tagged(1), {0, 1}));
  ASSERT_TRUE(*pool.Add(Tagged(2), {0, 2}));
  auto added = pool.Add(Tagged(3), {0, 3});
  ASSERT_TRUE(added.ok());
  EXPECT_FALSE(*added);
  EXPECT_EQ(pool.size(), 2);
  EXPECT_EQ(IdOf(pool.records()[1]), 2);
  EXPECT_EQ(pool.evicted_by_capacity(), 0);
}

TEST(RecordPoolTest, ResidencyMakesEveryRecordACandidateInExactlyMSteps) {
  constexpr int64_t kM = 4;
  RecordPool pool = MakePool(1000, kM);
  std::map<int64_t, int64_t> candidate_steps;  // id → steps it was a candidate
  std::mt19937 random(5);
  int64_t next_id = 0;
  for (int step = 0; step < 50; ++step) {
    const int arrivals = static_cast<int>(random() % 5);
    for (int i = 0; i < arrivals; ++i) {
      ASSERT_TRUE(pool.Add(Tagged(next_id), {0, next_id}).ok());
      ++next_id;
    }
    ASSERT_LT(pool.MaxStepsPresent(), kM);
    for (const auto& record : pool.records()) ++candidate_steps[IdOf(record)];
    pool.CompleteStep();
  }
  for (const auto& [id, steps] : candidate_steps) {
    ASSERT_LE(steps, kM) << "record " << id;
    // Records that arrived early enough were evicted after exactly M steps.
    if (id < next_id - 4 * kM) {
      EXPECT_EQ(steps, kM) << "record " << id;
    }
  }
}

TEST(RecordPoolTest, RebuiltRecordsKeepTheirCountAndLeaveOnTime) {
  RecordPool pool = MakePool(100, 3);
  ASSERT_TRUE(pool.Add(Tagged(1), {0, 1}, 2).ok());
  ASSERT_TRUE(pool.Add(Tagged(2), {0, 2}, 0).ok());
  EXPECT_FALSE(pool.Add(Tagged(3), {0, 3}, 3).ok());  // already used up
  EXPECT_EQ(pool.CompleteStep(), 1);                   // record 1 reaches 3
  ASSERT_EQ(pool.size(), 1);
  EXPECT_EQ(IdOf(pool.records()[0]), 2);
  EXPECT_EQ(pool.steps_present(0), 1);
  EXPECT_EQ(pool.evicted_by_residency(), 1);
}

TEST(RecordPoolTest, ReconfigureShrinksCapacityAndResidency) {
  RecordPool pool = MakePool(10, 5);
  for (int64_t id = 0; id < 6; ++id) ASSERT_TRUE(pool.Add(Tagged(id), {1, id}).ok());
  pool.CompleteStep();
  pool.CompleteStep();
  ASSERT_TRUE(pool.Add(Tagged(6), {1, 6}).ok());
  PoolOptions options = pool.options();
  options.capacity = 4;
  options.max_residency_steps = 2;
  ASSERT_TRUE(pool.Reconfigure(options).ok());
  // Capacity drops ids 0..2; residency 2 drops ids 3..5 (count 2); 6 stays.
  ASSERT_EQ(pool.size(), 1);
  EXPECT_EQ(IdOf(pool.records()[0]), 6);
  EXPECT_EQ(pool.MaxStepsPresent(), 0);
}

TEST(RecordPoolTest, LowestOffsetsPerStream) {
  RecordPool pool = MakePool(3, 0);
  ASSERT_TRUE(pool.Add(Tagged(0), {0, 10}).ok());
  ASSERT_TRUE(pool.Add(Tagged(1), {1, 4}).ok());
  ASSERT_TRUE(pool.Add(Tagged(2), {0, 11}).ok());
  ASSERT_TRUE(pool.Add(Tagged(3), {1, 5}).ok());  // evicts stream 0 offset 10
  const auto lowest = pool.LowestOffsets();
  EXPECT_EQ(lowest.at(0), 11);
  EXPECT_EQ(lowest.at(1), 4);
}

// Simulates a daemon: records arrive on two streams, the pool is capped
// (so some records leave early), steps run, and the history is recorded.
// Oracle: the exact number of steps each record was a candidate. The
// history's answer must never be lower (it may be higher after a capacity
// eviction), and must be exact when nothing was evicted by capacity.
TEST(ArrivalHistoryTest, NeverUndercountsPresenceAndIsExactWithoutCapacityEviction) {
  for (const int64_t capacity : {int64_t{1000}, int64_t{7}}) {
    constexpr int64_t kM = 5;
    RecordPool pool = MakePool(capacity, kM);
    ArrivalHistory history(kM);
    std::map<std::pair<int, int64_t>, int64_t> truth;  // (stream, offset) → steps
    std::map<std::string, int64_t> high;
    int64_t next_offset[2] = {0, 0};
    std::mt19937 random(11);
    for (int64_t step = 1; step <= 40; ++step) {
      for (int i = 0; i < static_cast<int>(random() % 4); ++i) {
        const int stream = static_cast<int>(random() % 2);
        const int64_t offset = next_offset[stream]++;
        ASSERT_TRUE(pool.Add(Tagged(stream * 1000 + offset),
                             {static_cast<uint32_t>(stream), offset}).ok());
        high["t:" + std::to_string(stream)] = offset;
      }
      for (size_t r = 0; r < static_cast<size_t>(pool.size()); ++r) {
        ++truth[{static_cast<int>(pool.origin(r).stream), pool.origin(r).offset}];
      }
      ASSERT_TRUE(history.RecordStep(step, high).ok());
      pool.CompleteStep();
    }
    // Records still in the pool or evicted within the window.
    for (int stream = 0; stream < 2; ++stream) {
      for (int64_t offset = 0; offset < next_offset[stream]; ++offset) {
        const int64_t counted = history.StepsPresent("t:" + std::to_string(stream), offset);
        const auto it = truth.find({stream, offset});
        const int64_t actual = it == truth.end() ? 0 : it->second;
        ASSERT_LE(counted, kM);
        if (pool.evicted_by_capacity() == 0) {
          // Exact for records whose whole residency is inside the window.
          EXPECT_EQ(counted, std::min(actual, kM)) << stream << ":" << offset;
        } else {
          EXPECT_GE(counted, std::min(actual, kM)) << stream << ":" << offset;
        }
      }
    }
    EXPECT_EQ(history.StepsPresent("unknown:0", 0), 0);
  }
}

TEST(ArrivalHistoryTest, RefusesNonMonotoneInput) {
  ArrivalHistory history(3);
  ASSERT_TRUE(history.RecordStep(1, {{"a:0", 5}}).ok());
  EXPECT_FALSE(history.RecordStep(1, {{"a:0", 6}}).ok());
  EXPECT_FALSE(history.RecordStep(2, {{"a:0", 4}}).ok());
}

TEST(ArrivalHistoryTest, SerializeRoundTripsAndCorruptionIsRefused) {
  ArrivalHistory history(4);
  ASSERT_TRUE(history.RecordStep(1, {{"in:0", 3}, {"in:1", 0}}).ok());
  ASSERT_TRUE(history.RecordStep(2, {{"in:0", 9}}).ok());
  ASSERT_TRUE(history.RecordStep(3, {{"in:1", 7}}).ok());
  const std::string text = history.Serialize();
  auto restored = ArrivalHistory::Deserialize(text);
  ASSERT_TRUE(restored.ok()) << restored.status().ToString();
  EXPECT_EQ(*restored, history);
  EXPECT_EQ(restored->StepsPresent("in:0", 5), 2);
  EXPECT_EQ(restored->StepsPresent("in:1", 7), 1);
  for (const std::string& bad :
       {std::string("arrival-history 2\n"), text.substr(0, text.size() - 4),
        text + "stream x 1 1 1\n",
        std::string("arrival-history 1\nwindow 4\nlast_step 3\nstream a 2 2 5 1 6\nend\n")}) {
    EXPECT_FALSE(ArrivalHistory::Deserialize(bad).ok()) << bad;
  }
}

}  // namespace
}  // namespace vipsd::svi
