// Ingest: the consumer side and the staging area (daemon/parts/ingest.h) — what
// it reads, stages, dead-letters and acknowledges, and how the step thread
// takes a window from it.
#include "daemon/parts/ingest.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <limits>
#include <memory>
#include <thread>

#include "core/text/vocabulary.h"
#include "tests/testing/fake_io.h"
#include "tests/testing/test_metrics.h"

namespace vipsd::daemon {
namespace {

using namespace std::chrono_literals;

std::string Document(int i) {
  return "{\"id\": " + std::to_string(i) + ", \"text\": \"apple banana\"}";
}

struct Fixture {
  std::shared_ptr<FakeTopic> topic = std::make_shared<FakeTopic>();
  std::shared_ptr<SinkLog> log = std::make_shared<SinkLog>();
  FakeSink sink{log};
  std::unique_ptr<Metrics> metrics;
  text::Vocabulary vocabulary = *text::Vocabulary::Parse("apple\nbanana\n");
  std::unique_ptr<connectors::RecordDecoder> decoder = connectors::NewLdaRecordDecoder(vocabulary);
  RunControl control;
  std::unique_ptr<Ingest> ingest;

  explicit Fixture(bool cover_every_stream = false) {
    metrics = NewTestMetrics();
    ingest = std::make_unique<Ingest>(decoder.get(), &sink, metrics.get(), &control,
                                      cover_every_stream);
  }
  void Start() {
    Ingest* self = ingest.get();
    ingest->Start(std::make_unique<FakeSource>(
        topic, [self](const std::string& t, int32_t p) { return self->ResumeOffset(t, p); }));
  }
  // Waits until every stream in `cuts` was read up to its cut.
  bool ReadUpTo(const std::map<std::string, int64_t>& cuts) {
    const auto until = std::chrono::steady_clock::now() + 10s;
    while (std::chrono::steady_clock::now() < until) {
      if (ingest->Progress(cuts, [](const std::string&) { return int64_t{0}; }).behind.empty()) {
        return true;
      }
      std::this_thread::sleep_for(2ms);
    }
    return false;
  }
  int64_t Committed(int32_t partition) {
    std::lock_guard<std::mutex> lock(topic->mutex);
    return topic->committed[partition];
  }
  ~Fixture() {
    ingest->Stop();
    ingest->Join();
  }
};

TEST(IngestTest, AWindowIsExactlyTheRecordsBelowItsCutsInOffsetOrder) {
  Fixture f;
  for (int i = 0; i < 6; ++i) f.topic->Append(i % 2, Document(i));
  f.ingest->SetResumeOffsets({{"docs:0", 0}, {"docs:1", 0}}, /*covered=*/true);
  f.Start();
  const std::map<std::string, int64_t> cuts{{"docs:0", 2}, {"docs:1", 3}};
  f.ingest->SetTargets(SlotTargets::AtEnds(cuts));
  ASSERT_TRUE(f.ReadUpTo(cuts));
  auto admitted = f.ingest->Admit(cuts);
  std::map<std::string, std::vector<int64_t>> offsets;
  const std::vector<std::string> names = f.ingest->StreamNames();
  for (auto& [id, staged] : admitted) {
    for (const Staged& record : staged) offsets[names[id]].push_back(record.offset);
  }
  EXPECT_EQ(offsets["docs:0"], (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(offsets["docs:1"], (std::vector<int64_t>{0, 1, 2}));
  // What was read beyond the cut stays staged for the next window.
  const std::map<std::string, int64_t> next{{"docs:0", 3}, {"docs:1", 3}};
  ASSERT_TRUE(f.ReadUpTo(next));
  auto later = f.ingest->Admit(next);
  ASSERT_EQ(later.size(), 1u);
  EXPECT_EQ(later[0].second.front().offset, 2);
  EXPECT_EQ(f.ingest->records_pooled(), 6);
}

TEST(IngestTest, MalformedRecordsAreDeadLetteredBeforeTheirOffsetsAreAcknowledged) {
  Fixture f;
  f.topic->Append(0, Document(0));
  f.topic->Append(0, "not json");
  f.topic->Append(0, Document(2));
  f.ingest->SetResumeOffsets({{"docs:0", 0}}, true);
  f.log->fail_next_dead_letters = 2;  // the broker refuses twice first
  f.Start();
  const auto until = std::chrono::steady_clock::now() + 20s;
  while (f.Committed(0) < 3 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(5ms);
  }
  EXPECT_EQ(f.Committed(0), 3);
  std::lock_guard<std::mutex> lock(f.log->mutex);
  ASSERT_EQ(f.log->dead_letters.size(), 1u);
  EXPECT_EQ(f.log->dead_letters[0].first.offset, 1);
  EXPECT_EQ(f.log->dead_letters[0].first.payload, "not json");
  EXPECT_EQ(f.ingest->records_rejected(), 1);
  EXPECT_EQ(f.ingest->records_pooled(), 2);
}

TEST(IngestTest, ANewStreamIsAcknowledgedOnlyOnceTheStepThreadCoveredIt) {
  Fixture f;
  f.topic->Append(0, Document(0));
  f.Start();
  // Read, staged, but not acknowledged: a crash now must re-read it.
  const std::map<std::string, int64_t> cuts{{"docs:0", 1}};
  ASSERT_TRUE(f.ReadUpTo(cuts));
  const auto until = std::chrono::steady_clock::now() + 10s;
  bool asked = false;
  while (!asked && std::chrono::steady_clock::now() < until) {
    asked = f.ingest->TakeCoverRequest();
    std::this_thread::sleep_for(2ms);
  }
  ASSERT_TRUE(asked);
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(f.Committed(0), 0);
  f.ingest->Cover({"docs:0"});
  const auto acked = std::chrono::steady_clock::now() + 10s;
  while (f.Committed(0) < 1 && std::chrono::steady_clock::now() < acked) {
    std::this_thread::sleep_for(2ms);
  }
  EXPECT_EQ(f.Committed(0), 1);
}

TEST(IngestTest, OnceTheWindowsRecordsExceedTheCapacityNothingMoreIsRead) {
  Fixture f;
  for (int i = 0; i < 30; ++i) f.topic->Append(0, Document(i));
  f.ingest->SetResumeOffsets({{"docs:0", 0}}, true);
  f.ingest->SetCapacity(10);
  const std::map<std::string, int64_t> cuts{{"docs:0", 50}};
  f.ingest->SetTargets(SlotTargets::AtEnds(cuts));
  f.Start();
  auto held = [&] {
    return f.ingest->Progress(cuts, [](const std::string&) { return int64_t{0}; }).held;
  };
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (held() < 30 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(2ms);
  }
  ASSERT_EQ(held(), 30);
  // More records arrive; the window's held records exceed pool.capacity, so
  // they stay in the log (an overflow is a count, never a guess).
  for (int i = 30; i < 50; ++i) f.topic->Append(0, Document(i));
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(held(), 30);
  EXPECT_TRUE(f.ingest->Overflowing("docs:0"));
  EXPECT_FALSE(f.ingest->Complete("docs:0"));
  // Raising the capacity lets reading go on.
  f.ingest->SetCapacity(100);
  const auto resumed = std::chrono::steady_clock::now() + 10s;
  while (held() < 50 && std::chrono::steady_clock::now() < resumed) {
    std::this_thread::sleep_for(2ms);
  }
  EXPECT_EQ(held(), 50);
  EXPECT_TRUE(f.ingest->Complete("docs:0"));
}

TEST(IngestTest, AdvancingTheWindowDropsStagedRecordsBelowItsStart) {
  Fixture f;
  for (int i = 0; i < 5; ++i) f.topic->Append(0, Document(i));
  f.ingest->SetResumeOffsets({{"docs:0", 0}}, true);
  f.Start();
  ASSERT_TRUE(f.ReadUpTo({{"docs:0", 5}}));
  f.ingest->AdvanceTo({{"docs:0", 3}});
  // Admitting takes what is below the cut, in offset order, once.
  auto first = f.ingest->Admit({{"docs:0", 4}});
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].first, f.ingest->StreamId("docs:0"));
  ASSERT_EQ(first[0].second.size(), 1u);
  EXPECT_EQ(first[0].second[0].offset, 3);
  auto rest = f.ingest->Admit({{"docs:0", 5}});
  ASSERT_EQ(rest.size(), 1u);
  ASSERT_EQ(rest[0].second.size(), 1u);
  EXPECT_EQ(rest[0].second[0].offset, 4);
  EXPECT_TRUE(f.ingest->Admit({{"docs:0", 5}}).empty());
}

TEST(IngestTest, AFatalSourceErrorStopsTheRunWithTheError) {
  Fixture f;
  f.ingest->Fail(InternalError("partial sum failed"));
  ASSERT_TRUE(f.ingest->error().has_value());
  EXPECT_EQ(f.ingest->error()->code(), StatusCode::kInternal);
  EXPECT_TRUE(f.control.stopping());
}

TEST(IngestTest, ResumeOffsetsAreWhereAPartitionIsReadFromAfterARestart) {
  Fixture f(/*cover_every_stream=*/true);
  for (int i = 0; i < 5; ++i) f.topic->Append(0, Document(i));
  f.ingest->SetResumeOffset("docs:0", 3);
  EXPECT_EQ(f.ingest->ResumeOffset("docs", 0), 3);
  EXPECT_FALSE(f.ingest->ResumeOffset("docs", 1).has_value());
  f.Start();
  ASSERT_TRUE(f.ReadUpTo({{"docs:0", 5}}));
  EXPECT_EQ(f.ingest->records_pooled(), 2);  // 3 and 4 only
  EXPECT_TRUE(f.ingest->Assigned("docs:0"));  // a file-like source reads every stream
}

// The cut rule (core/svi/slot_windows.h): slot k's cut of a stream is its
// first record at or above the floor stamped after T_k, or the observed end
// when none is below it — the same cut whatever end the clock observed, as
// long as the end holds every record stamped up to T_k.
SlotTargets CutAt(int64_t cut_time_ms, int64_t end, int64_t floor = 0) {
  SlotTargets targets;
  targets.cut_time_ms = cut_time_ms;
  targets.streams["docs:0"] = {end, floor};
  return targets;
}

TEST(IngestTest, TheCutIsTheFirstRecordStampedAfterTheSlotTimeWhateverEndWasObserved) {
  // Records stamped 1.0, 2.0, ..., 10.0 s (offsets 0..9); T = 5.0 s: the
  // slot's records are offsets 0..4 (stamped up to 5000 ms, 5.0 included).
  for (const int64_t end : {5, 6, 8, 10}) {
    SCOPED_TRACE("end " + std::to_string(end));
    Fixture f;
    for (int i = 0; i < 10; ++i) f.topic->Append(0, Document(i), 1.0 + i);
    f.ingest->SetTimestampPolicy(TimestampPolicy::kLogAppendTime);
    f.ingest->SetResumeOffsets({{"docs:0", 0}}, /*covered=*/true);
    f.ingest->SetTargets(CutAt(5000, end));
    f.Start();
    ASSERT_TRUE(f.ReadUpTo({{"docs:0", end}}));
    EXPECT_EQ(f.ingest->Cuts({{"docs:0", end}}).at("docs:0"), 5);
    EXPECT_TRUE(f.ingest->Complete("docs:0"));
    EXPECT_EQ(f.ingest->Target("docs:0"), 5);
    auto admitted = f.ingest->Admit(f.ingest->Cuts({{"docs:0", end}}));
    ASSERT_EQ(admitted.size(), 1u);
    EXPECT_EQ(admitted[0].second.size(), 5u);
    EXPECT_EQ(admitted[0].second.back().offset, 4);
  }
}

TEST(IngestTest, AnEndBelowTheFirstLaterRecordIsTheCutAndTheFloorBoundsTheSearch) {
  Fixture f;
  for (int i = 0; i < 10; ++i) f.topic->Append(0, Document(i), 1.0 + i);
  f.ingest->SetTimestampPolicy(TimestampPolicy::kLogAppendTime);
  f.ingest->SetResumeOffsets({{"docs:0", 0}}, true);
  // An end observed before any record after T was readable: the end.
  f.ingest->SetTargets(CutAt(5000, 3));
  f.Start();
  ASSERT_TRUE(f.ReadUpTo({{"docs:0", 3}}));
  EXPECT_EQ(f.ingest->Cuts({{"docs:0", 3}}).at("docs:0"), 3);
  // A floor (the previous slot's end) above records stamped after T: the
  // cut is not below it. Records already staged decide it at once.
  f.ingest->SetTargets(CutAt(5000, 10, /*floor=*/7));
  ASSERT_TRUE(f.ReadUpTo({{"docs:0", 10}}));
  EXPECT_EQ(f.ingest->Cuts({{"docs:0", 10}}).at("docs:0"), 7);
  // No slot time (an unpaced run): the end itself.
  f.ingest->SetTargets(SlotTargets::AtEnds({{"docs:0", 10}}));
  ASSERT_TRUE(f.ReadUpTo({{"docs:0", 10}}));
  EXPECT_EQ(f.ingest->Cuts({{"docs:0", 10}}).at("docs:0"), 10);
}

// A stream the slot's targets do not name (a partition that appeared after
// the observation) gets no cut from a later-stamped record: it stays
// without a target and is read on, not paused.
TEST(IngestTest, AStreamWithoutATargetGetsNoCut) {
  Fixture f;
  for (int i = 0; i < 4; ++i) f.topic->Append(i % 2, Document(i), 10.0 + i);
  f.ingest->SetTimestampPolicy(TimestampPolicy::kLogAppendTime);
  f.ingest->SetResumeOffsets({{"docs:0", 0}, {"docs:1", 0}}, true);
  f.ingest->SetTargets(CutAt(5000, 2));  // docs:0 only; every record is stamped after T
  f.Start();
  ASSERT_TRUE(f.ReadUpTo({{"docs:0", 2}, {"docs:1", 2}}));
  EXPECT_EQ(f.ingest->Target("docs:0"), 0);
  EXPECT_EQ(f.ingest->Target("docs:1"), std::numeric_limits<int64_t>::max());
  EXPECT_FALSE(f.ingest->Complete("docs:1"));
}

TEST(IngestTest, AProducersTimestampIsDeadLetteredUnlessCreateTimeIsTrusted) {
  for (const bool trust : {false, true}) {
    SCOPED_TRACE(trust ? "create_time" : "log_append_time");
    Fixture f;
    f.topic->Append(0, Document(0), 1.0);
    // A producer stamps 100 s into the future: under log_append_time it
    // must not decide a cut; under create_time it does.
    f.topic->AppendStamped(0, Document(1), 2.0, 100.0);
    f.topic->Append(0, Document(2), 3.0);
    f.ingest->SetTimestampPolicy(trust ? TimestampPolicy::kAny : TimestampPolicy::kLogAppendTime);
    f.ingest->SetResumeOffsets({{"docs:0", 0}}, true);
    f.ingest->SetTargets(CutAt(5000, 3));
    f.Start();
    ASSERT_TRUE(f.ReadUpTo({{"docs:0", 3}}));
    const auto until = std::chrono::steady_clock::now() + 10s;
    while (f.Committed(0) < 3 && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(2ms);
    }
    std::lock_guard<std::mutex> lock(f.log->mutex);
    if (trust) {
      EXPECT_TRUE(f.log->dead_letters.empty());
      EXPECT_EQ(f.ingest->Cuts({{"docs:0", 3}}).at("docs:0"), 1);
    } else {
      ASSERT_EQ(f.log->dead_letters.size(), 1u);
      EXPECT_EQ(f.log->dead_letters[0].first.offset, 1);
      EXPECT_EQ(f.log->dead_letters[0].second, connectors::RejectReason::kUntrustedTimestamp);
      EXPECT_EQ(f.ingest->Cuts({{"docs:0", 3}}).at("docs:0"), 3);
      EXPECT_EQ(f.ingest->records_pooled(), 2);
    }
  }
}

}  // namespace
}  // namespace vipsd::daemon
