// RecordPool: records enter and leave only by window (no capacity eviction),
// and the candidate-count check catches a broken window rule.
#include "core/svi/record_pool.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

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
  pool.ForEach([&](const model::Record& record, const RecordOrigin&, int64_t) {
    words.insert(record.word_ids[0]);
  });
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
  int64_t visited = 0;
  pool.ForEach([&](const model::Record& record, const RecordOrigin& origin, int64_t) {
    ++visited;
    EXPECT_GE(origin.offset, origin.stream == 0 ? 4 : 7);
    EXPECT_EQ(record.word_ids[0],
              static_cast<int32_t>((origin.stream == 0 ? 0 : 100) + origin.offset));
  });
  EXPECT_EQ(visited, 6 + 3);
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
  pool.ForEach([](const model::Record&, const RecordOrigin& origin, int64_t steps) {
    EXPECT_EQ(steps, origin.offset == 1 ? 1 : 2);
  });
  // Offset 0 should have left after 2 steps; a third step is refused.
  const Status third = pool.CompleteStep();
  ASSERT_FALSE(third.ok());
  EXPECT_EQ(third.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(third.message().find("offset 0"), std::string::npos);
  RecordPool unlimited;
  unlimited.Add(Doc(1), {0, 0});
  for (int i = 0; i < 50; ++i) ASSERT_TRUE(unlimited.CompleteStep().ok());
}

// The step's candidates: streams sorted by name whatever their indices,
// each stream's records in the order they were added (offset order), the
// records the pool holds (pointers, not copies).
TEST(RecordPoolTest, CandidatesAreGroupedByStreamAndSortedByName) {
  RecordPool pool;
  const std::vector<RecordOrigin> origins = {{1, 5}, {0, 2}, {1, 9}, {0, 3}, {2, 0}, {1, 12}};
  for (size_t i = 0; i < origins.size(); ++i) pool.Add(Doc(static_cast<int32_t>(i)), origins[i]);
  const std::vector<std::string> names = {"b", "a", "c"};
  auto grouped = pool.Candidates(names);
  ASSERT_TRUE(grouped.ok());
  ASSERT_EQ(grouped->size(), 3u);
  EXPECT_EQ((*grouped)[0].stream, "a");
  EXPECT_EQ((*grouped)[0].offsets, (std::vector<int64_t>{5, 9, 12}));
  ASSERT_EQ((*grouped)[0].records.size(), 3u);
  EXPECT_EQ((*grouped)[0].records[1]->word_ids[0], 2);
  EXPECT_EQ((*grouped)[1].stream, "b");
  EXPECT_EQ((*grouped)[1].offsets, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ((*grouped)[1].records[0]->word_ids[0], 1);
  EXPECT_EQ((*grouped)[2].stream, "c");
  // Pointers into the pool, not copies.
  const model::Record* held = nullptr;
  pool.ForEach([&](const model::Record& record, const RecordOrigin& origin, int64_t) {
    if (origin.stream == 2) held = &record;
  });
  EXPECT_EQ((*grouped)[2].records[0], held);
  // A stream emptied by eviction is not a candidate stream.
  EXPECT_EQ(pool.EvictBelow({{2, 1}}), 1);
  auto after = pool.Candidates(names);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->size(), 2u);
  // A stream index without a name is refused.
  RecordPool unnamed;
  unnamed.Add(Doc(0), {7, 0});
  EXPECT_EQ(unnamed.Candidates(names).status().code(), StatusCode::kInvalidArgument);
}

// A partition's window for a plan (a shared-work or federated process's
// own sum): exactly the records of that stream in [low, high), pointers
// into the pool; none when the pool holds no part of it. Dropping a stream
// (read again from an earlier offset) removes it whole; out-of-order adds
// are refused, not sampled.
TEST(RecordPoolTest, CandidatesInAreOneStreamsRecordsInTheRange) {
  RecordPool pool;
  for (int64_t offset = 10; offset < 20; ++offset) {
    pool.Add(Doc(static_cast<int32_t>(offset)), {0, offset});
    pool.Add(Doc(static_cast<int32_t>(100 + offset)), {1, offset});
  }
  auto window = pool.CandidatesIn(1, "docs:1", 12, 15);
  ASSERT_TRUE(window.ok()) << window.status().ToString();
  EXPECT_EQ(window->stream, "docs:1");
  EXPECT_EQ(window->offsets, (std::vector<int64_t>{12, 13, 14}));
  ASSERT_EQ(window->records.size(), 3u);
  EXPECT_EQ(window->records[0]->word_ids[0], 112);
  const model::Record* held = nullptr;
  pool.ForEach([&](const model::Record& record, const RecordOrigin& origin, int64_t) {
    if (origin.stream == 1 && origin.offset == 12) held = &record;
  });
  EXPECT_EQ(window->records[0], held);
  auto outside = pool.CandidatesIn(0, "docs:0", 20, 30);
  ASSERT_TRUE(outside.ok());
  EXPECT_TRUE(outside->records.empty());
  auto unknown = pool.CandidatesIn(5, "docs:5", 0, 100);
  ASSERT_TRUE(unknown.ok());
  EXPECT_TRUE(unknown->offsets.empty());
  EXPECT_EQ(pool.DropStream(1), 10);
  EXPECT_EQ(pool.DropStream(1), 0);
  EXPECT_EQ(pool.size(), 10);
  auto dropped = pool.CandidatesIn(1, "docs:1", 0, 100);
  ASSERT_TRUE(dropped.ok());
  EXPECT_TRUE(dropped->records.empty());
  pool.Add(Doc(0), {0, 15});  // below the stream's last offset
  EXPECT_EQ(pool.CandidatesIn(0, "docs:0", 0, 100).status().code(), StatusCode::kInternal);
}

}  // namespace
}  // namespace vipsd::svi
