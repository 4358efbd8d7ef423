// RecordPool: records enter and leave only by window (no capacity eviction),
// and the candidate-count check catches a broken window rule.
#include "core/svi/record_pool.h"

#include <gtest/gtest.h>

#include <set>

namespace vipsd::svi {
namespace {

model::Record Doc(int32_t word) {
  model::Record record;
  record.word_ids = {word};
  return record;
}

TEST(RecordPoolTest, HoldsEveryRecordAddedWhateverTheCount) {
  RecordPool pool;
  for (int i = 0; i < 1000; ++i) pool.Add(Doc(i), {static_cast<uint32_t>(i % 3), i});
  EXPECT_EQ(pool.size(), 1000);  // no capacity rule inside the pool
  std::set<int32_t> words;
  for (const auto& record : pool.records()) words.insert(record.word_ids[0]);
  EXPECT_EQ(words.size(), 1000u);
}

TEST(RecordPoolTest, EvictBelowRemovesExactlyTheRecordsUnderEachStreamsLowEdge) {
  RecordPool pool;
  for (int64_t offset = 0; offset < 10; ++offset) {
    pool.Add(Doc(static_cast<int32_t>(offset)), {0, offset});
    pool.Add(Doc(static_cast<int32_t>(100 + offset)), {1, offset});
  }
  EXPECT_EQ(pool.EvictBelow({{0, 4}, {1, 7}}), 4 + 7);
  ASSERT_EQ(pool.size(), 6 + 3);
  for (size_t i = 0; i < static_cast<size_t>(pool.size()); ++i) {
    const RecordOrigin& origin = pool.origin(i);
    EXPECT_GE(origin.offset, origin.stream == 0 ? 4 : 7);
    EXPECT_EQ(pool.records()[i].word_ids[0],
              static_cast<int32_t>((origin.stream == 0 ? 0 : 100) + origin.offset));
  }
  // A stream without an entry keeps all its records.
  EXPECT_EQ(pool.EvictBelow({{0, 100}}), 6);
  EXPECT_EQ(pool.size(), 3);
}

TEST(RecordPoolTest, CandidateCountsAreCheckedAgainstTheWindow) {
  RecordPool pool(/*max_candidate_steps=*/2);
  pool.Add(Doc(1), {0, 0});
  ASSERT_TRUE(pool.CompleteStep().ok());
  pool.Add(Doc(2), {0, 1});
  ASSERT_TRUE(pool.CompleteStep().ok());
  EXPECT_EQ(pool.MaxStepsPresent(), 2);
  EXPECT_EQ(pool.steps_present(1), 1);
  // Offset 0 should have left after 2 steps; a third step is refused.
  const Status third = pool.CompleteStep();
  ASSERT_FALSE(third.ok());
  EXPECT_EQ(third.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(third.message().find("offset 0"), std::string::npos);
  RecordPool unlimited;
  unlimited.Add(Doc(1), {0, 0});
  for (int i = 0; i < 50; ++i) ASSERT_TRUE(unlimited.CompleteStep().ok());
}

}  // namespace
}  // namespace vipsd::svi
