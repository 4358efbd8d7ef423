// SlotWindows: the public slot clock and the per-record candidate windows.
// The central property (issue 11): whether a record is a candidate in a slot
// depends only on when that record was appended and on public times — never
// on any other record — and no record is a candidate in more than M slots.
#include "core/svi/slot_windows.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <vector>

namespace vipsd::svi {
namespace {

// A partition's log with append times; Cuts() observes its end at each slot
// time, as the daemon's clock thread does.
struct Log {
  std::vector<double> append_times;  // by offset, non-decreasing
  int64_t EndAt(double time) const {
    return std::upper_bound(append_times.begin(), append_times.end(), time) -
           append_times.begin();
  }
};

// Which slots (1..slots) contain each record, by record identity (its
// append time, unique here), for one partition observed through SlotWindows.
std::map<double, std::set<int64_t>> Membership(const Log& log, int64_t window, int64_t slots,
                                               const std::set<int64_t>& missed = {}) {
  auto windows = SlotWindows::Create(/*anchor_time=*/100.0, /*interval=*/1.0, window);
  EXPECT_TRUE(windows.ok());
  EXPECT_TRUE(windows->AddStream("t:0", 0).ok());
  std::map<double, std::set<int64_t>> member;
  for (int64_t k = 1; k <= slots; ++k) {
    if (missed.count(k) > 0) continue;  // nobody observed slot k
    EXPECT_TRUE(windows->RecordCuts(k, {{"t:0", log.EndAt(windows->SlotTime(k))}}).ok());
    const OffsetRange range = windows->Window("t:0", k);
    for (int64_t offset = range.low; offset < range.high; ++offset) {
      member[log.append_times[static_cast<size_t>(offset)]].insert(k);
    }
  }
  return member;
}

TEST(SlotWindowsTest, SlotTimesFollowTheAnchorAndTheInterval) {
  auto windows = SlotWindows::Create(1000.0, 2.5, 4);
  ASSERT_TRUE(windows.ok());
  EXPECT_DOUBLE_EQ(windows->SlotTime(0), 1000.0);
  EXPECT_DOUBLE_EQ(windows->SlotTime(3), 1007.5);
  EXPECT_EQ(windows->FirstSlotAtOrAfter(1007.5), 3);
  EXPECT_EQ(windows->FirstSlotAtOrAfter(1007.6), 4);
  EXPECT_EQ(windows->FirstSlotAtOrAfter(10.0), 1);  // never before the next slot
  ASSERT_TRUE(windows->RecordCuts(3, {}).ok());
  // A new interval applies after the given slot; earlier slot times stay.
  ASSERT_TRUE(windows->SetInterval(10.0, 5).ok());
  EXPECT_DOUBLE_EQ(windows->SlotTime(5), 1012.5);
  EXPECT_DOUBLE_EQ(windows->SlotTime(6), 1022.5);
  EXPECT_FALSE(windows->SetInterval(1.0, 2).ok());  // before the last slot
}

TEST(SlotWindowsTest, EveryRecordIsACandidateInExactlyTheMSlotsAfterItsAppend) {
  Log log;
  for (int i = 0; i < 40; ++i) log.append_times.push_back(100.3 + 0.37 * i);
  const int64_t kM = 3;
  const auto member = Membership(log, kM, 30);
  for (double t : log.append_times) {
    // Appended in (time(k-1), time(k)]: candidate in slots k .. k+M-1.
    const auto first = static_cast<int64_t>(std::ceil(t - 100.0));
    std::set<int64_t> expected;
    for (int64_t k = first; k < first + kM && k <= 30; ++k) expected.insert(k);
    EXPECT_EQ(member.at(t), expected) << "record appended at " << t;
  }
}

TEST(SlotWindowsTest, AddingOneRecordChangesNoOtherRecordsMembership) {
  // The neighbour-structure property on random logs, windows and insertion
  // points, including slots nobody observed (downtime).
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    Log base;
    std::uniform_real_distribution<double> gap(0.0, 0.9);
    double t = 100.0;
    const int n = 5 + static_cast<int>(rng() % 60);
    for (int i = 0; i < n; ++i) base.append_times.push_back(t += gap(rng));
    const int64_t window = static_cast<int64_t>(rng() % 6);  // 0 = all
    std::set<int64_t> missed;
    for (int k = 1; k <= 40; ++k) {
      if (rng() % 7 == 0) {
        missed.insert(k);
      }
    }
    Log with = base;
    const double extra = 100.0 + std::uniform_real_distribution<double>(0, t - 99.0)(rng) + 1e-6;
    with.append_times.insert(
        std::upper_bound(with.append_times.begin(), with.append_times.end(), extra), extra);
    const auto without_r = Membership(base, window, 40, missed);
    const auto with_r = Membership(with, window, 40, missed);
    for (double record : base.append_times) {
      const auto a = without_r.find(record);
      const auto b = with_r.find(record);
      EXPECT_EQ(a == without_r.end(), b == with_r.end());
      if (a != without_r.end() && b != with_r.end()) {
        EXPECT_EQ(a->second, b->second);
      }
    }
    if (window > 0 && with_r.count(extra) > 0) {
      EXPECT_LE(static_cast<int64_t>(with_r.at(extra).size()), window);
    }
  }
}

TEST(SlotWindowsTest, MissedSlotsCarryTheLastCutSoDowntimeRecordsJoinTheNextSlot) {
  auto windows = SlotWindows::Create(0.0, 1.0, 2);
  ASSERT_TRUE(windows.ok());
  ASSERT_TRUE(windows->AddStream("t:0", 10).ok());
  ASSERT_TRUE(windows->RecordCuts(1, {{"t:0", 15}}).ok());
  EXPECT_EQ(windows->Window("t:0", 1).low, 10);
  EXPECT_EQ(windows->Window("t:0", 1).high, 15);
  // Slots 2-4 were missed; slot 5 observes the end at 30.
  ASSERT_TRUE(windows->RecordCuts(5, {{"t:0", 30}}).ok());
  EXPECT_EQ(windows->Cut("t:0", 3), 15);
  EXPECT_EQ(windows->Window("t:0", 5).low, 15);  // cut(3) = cut(1)
  EXPECT_EQ(windows->Window("t:0", 5).high, 30);
  EXPECT_EQ(windows->ResumeOffset("t:0"), 15);   // slot 6 needs cut(4) = 15
  ASSERT_TRUE(windows->RecordCuts(6, {{"t:0", 31}}).ok());
  EXPECT_EQ(windows->ResumeOffset("t:0"), 30);   // slot 7 needs cut(5)
}

TEST(SlotWindowsTest, CutsNeverDecreaseAndUnknownStreamsAreRefused) {
  auto windows = SlotWindows::Create(0.0, 1.0, kWindowAll);
  ASSERT_TRUE(windows.ok());
  ASSERT_TRUE(windows->AddStream("t:0", 0).ok());
  ASSERT_TRUE(windows->RecordCuts(1, {{"t:0", 9}}).ok());
  EXPECT_FALSE(windows->RecordCuts(2, {{"t:0", 8}}).ok());
  EXPECT_FALSE(windows->RecordCuts(2, {{"t:1", 8}}).ok());
  EXPECT_FALSE(windows->RecordCuts(1, {{"t:0", 9}}).ok());  // not after the last slot
  EXPECT_FALSE(windows->AddStream("has space:0", 0).ok());
  EXPECT_EQ(windows->Window("t:0", 1).low, 0);  // window "all": from the origin
}

TEST(SlotWindowsTest, TheWindowCanOnlyShrinkOnARunningDirectory) {
  auto windows = SlotWindows::Create(0.0, 1.0, 5);
  ASSERT_TRUE(windows.ok());
  EXPECT_TRUE(windows->SetWindowSlots(3).ok());
  EXPECT_FALSE(windows->SetWindowSlots(4).ok());
  EXPECT_FALSE(windows->SetWindowSlots(kWindowAll).ok());
}

TEST(SlotWindowsTest, SerializeRoundTripsExactlyAndCorruptionIsRefused) {
  auto windows = SlotWindows::Create(1764000000.125, 0.15, 3);
  ASSERT_TRUE(windows.ok());
  ASSERT_TRUE(windows->AddStream("docs:0", 4).ok());
  ASSERT_TRUE(windows->AddStream("docs:1", 0).ok());
  for (int64_t k = 1; k <= 9; ++k) {
    ASSERT_TRUE(windows->RecordCuts(k, {{"docs:0", 4 + 3 * k}, {"docs:1", k * k}}).ok());
  }
  const std::string text = windows->Serialize();
  auto back = SlotWindows::Deserialize(text);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(*back == *windows);
  EXPECT_EQ(back->Serialize(), text);
  EXPECT_EQ(back->ResumeOffset("docs:1"), windows->ResumeOffset("docs:1"));
  for (const std::string& bad :
       {std::string("slot-windows 2\n") + text.substr(text.find('\n') + 1),
        text.substr(0, text.size() - 4), text + "extra\n",
        [&] {
          std::string t = text;
          t.replace(t.find("last_slot 9"), 11, "last_slot 3");  // cuts after last_slot
          return t;
        }(),
        [&] {
          std::string t = text;
          t.replace(t.find("window 3"), 8, "window -1");
          return t;
        }(),
        std::string("slot-windows 1\nclock 0 0x1p+0 0x1p+0\nwindow 1\nlast_slot "
                    "99999999999999999999\nend\n")}) {
    auto parsed = SlotWindows::Deserialize(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_EQ(parsed.status().code(), StatusCode::kDataLoss);
  }
}

// An interval change anchors at the last slot the clock observed, which can
// lie ahead of the last recorded one; a state committed then (a reload that
// also lowers the ceiling, a stop) must load again. Before 2026-12-05 it
// did not: Deserialize refused an anchor after last_slot as data loss.
TEST(SlotWindowsTest, AnAnchorAheadOfTheLastRecordedSlotRoundTrips) {
  auto windows = SlotWindows::Create(1764000000.125, 0.02, 100);
  ASSERT_TRUE(windows.ok());
  ASSERT_TRUE(windows->AddStream("docs:0", 0).ok());
  ASSERT_TRUE(windows->RecordCuts(10, {{"docs:0", 7}}).ok());
  ASSERT_TRUE(windows->SetInterval(0.03, 26).ok());
  EXPECT_EQ(windows->anchor_slot(), 26);
  EXPECT_EQ(windows->last_slot(), 10);
  auto back = SlotWindows::Deserialize(windows->Serialize());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(*back == *windows);
  // Slots up to the anchor keep their times; later ones follow the new interval.
  EXPECT_DOUBLE_EQ(back->SlotTime(26), 1764000000.125 + 26 * 0.02);
  EXPECT_DOUBLE_EQ(back->SlotTime(27), back->SlotTime(26) + 0.03);
  EXPECT_TRUE(back->RecordCuts(11, {{"docs:0", 8}}).ok());
}

}  // namespace
}  // namespace vipsd::svi
