// SlotClock: each slot's cuts observed at the slot's public time
// (daemon/parts/slot_clock.h).
#include "daemon/parts/slot_clock.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include "tests/testing/fake_io.h"

namespace vipsd::daemon {
namespace {

using namespace std::chrono_literals;

// Answers ObserveBounds with the FakeTopic's log as of the asked time, after
// failing the first `failures` calls; records every time it was asked for.
class CountingSource final : public InputSource {
 public:
  CountingSource(std::shared_ptr<FakeTopic> topic, int failures)
      : fake_(std::move(topic), [](const std::string&, int32_t) { return std::nullopt; }),
        failures_(failures) {}
  StatusOr<PollBatch> Poll(size_t, std::chrono::milliseconds) override { return PollBatch{}; }
  Status MarkDone(const InputRecord&) override { return Status::Ok(); }
  Status Pause(const std::set<std::string>&) override { return Status::Ok(); }
  Status Resume(const std::set<std::string>&) override { return Status::Ok(); }
  StatusOr<std::map<std::string, StreamBounds>> ObserveBounds(double as_of) override {
    ++calls;
    if (failures_-- > 0) return UnavailableError("broker down (fake)");
    {
      std::lock_guard<std::mutex> lock(mutex);
      asked.push_back(as_of);
    }
    return fake_.ObserveBounds(as_of);
  }
  Status Commit() override { return Status::Ok(); }
  int64_t Lag() const override { return 0; }
  Status Close() override { return Status::Ok(); }

  std::atomic<int> calls{0};
  std::mutex mutex;
  std::vector<double> asked;

 private:
  FakeSource fake_;
  std::atomic<int> failures_;
};

std::optional<SlotBounds> TakeWithin(SlotClock& clock, int64_t slot, std::chrono::seconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    if (auto taken = clock.Take(slot)) return taken;
    std::this_thread::sleep_for(5ms);
  }
  return std::nullopt;
}

TEST(SlotClockTest, EachSlotsCutsAreTheLogAtTheSlotsPublicTime) {
  auto topic = std::make_shared<FakeTopic>();
  const double anchor = std::floor(WallNow()) + 1;  // slot 0 at `anchor`
  const double interval = 0.1;
  // Records appended between slot times: slot k's cut holds those before t_k.
  topic->Append(0, "a", anchor + 0.05);   // before slot 1
  topic->Append(0, "b", anchor + 0.15);   // before slot 2
  topic->Append(0, "c", anchor + 0.151);  // before slot 2
  topic->Append(1, "d", anchor + 0.25);   // before slot 3
  RunControl control;
  SlotClock clock(&control);
  CountingSource source(topic, /*failures=*/0);
  clock.Schedule(1, 0, anchor, interval);
  clock.Start(&source);
  auto one = TakeWithin(clock, 1, 10s);
  auto two = TakeWithin(clock, 2, 10s);
  auto three = TakeWithin(clock, 3, 10s);
  clock.Stop();
  clock.Join();
  ASSERT_TRUE(one && two && three);
  EXPECT_EQ(one->at("docs:0").end, 1);
  EXPECT_EQ(two->at("docs:0").end, 3);
  EXPECT_EQ(two->at("docs:1").end, 0);
  EXPECT_EQ(three->at("docs:1").end, 1);
  // Observed for the public times, never for when the thread ran.
  std::lock_guard<std::mutex> lock(source.mutex);
  ASSERT_GE(source.asked.size(), 3u);
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(source.asked[k], anchor + static_cast<double>(k + 1) * interval);
  }
  EXPECT_EQ(clock.next_slot(), static_cast<int64_t>(source.asked.size()) + 1);
}

TEST(SlotClockTest, TakingASlotForgetsTheSlotsBeforeIt) {
  auto topic = std::make_shared<FakeTopic>();
  RunControl control;
  SlotClock clock(&control);
  CountingSource source(topic, 0);
  clock.Schedule(5, 5, WallNow() - 1, 0.01);  // several slots already due
  clock.Start(&source);
  ASSERT_TRUE(TakeWithin(clock, 8, 10s).has_value());
  EXPECT_FALSE(clock.Take(6).has_value());
  EXPECT_FALSE(clock.Take(7).has_value());
  clock.Stop();
  clock.Join();
}

TEST(SlotClockTest, ARetimeMovesTheSlotTimesFromTheSlotItChooses) {
  auto topic = std::make_shared<FakeTopic>();
  RunControl control;
  SlotClock clock(&control);
  CountingSource source(topic, 0);
  const double anchor = WallNow() + 100;  // nothing due for a while
  clock.Schedule(1, 0, anchor, 10);
  int64_t told = -1;
  ASSERT_TRUE(clock
                  .Retime([&](int64_t next_slot) -> StatusOr<SlotClock::Anchor> {
                    told = next_slot;
                    return SlotClock::Anchor{next_slot, WallNow() - 0.05, 0.05};
                  })
                  .ok());
  EXPECT_EQ(told, 1);
  clock.Start(&source);
  EXPECT_TRUE(TakeWithin(clock, 1, 10s).has_value());  // due now, not in 100 s
  // A refused retime changes nothing.
  const Status refused = clock.Retime(
      [](int64_t) -> StatusOr<SlotClock::Anchor> { return InvalidArgumentError("no"); });
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  clock.Stop();
  clock.Join();
}

TEST(SlotClockTest, AFailedObservationIsRetriedUntilItSucceedsOrTheRunStops) {
  auto topic = std::make_shared<FakeTopic>();
  topic->Append(0, "a");
  RunControl control;
  SlotClock clock(&control);
  CountingSource flaky(topic, /*failures=*/2);
  auto bounds = clock.ObserveWithRetry(flaky, 42.0);
  ASSERT_TRUE(bounds.ok()) << bounds.status().ToString();
  EXPECT_EQ(flaky.calls, 3);
  EXPECT_EQ(bounds->at("docs:0").end, 1);
  CountingSource down(topic, /*failures=*/1000000);
  std::thread stopper([&] {
    std::this_thread::sleep_for(100ms);
    clock.Stop();
  });
  auto cancelled = clock.ObserveWithRetry(down, 42.0);
  stopper.join();
  EXPECT_EQ(cancelled.status().code(), StatusCode::kCancelled);
}

}  // namespace
}  // namespace vipsd::daemon
