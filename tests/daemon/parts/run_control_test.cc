// RunControl: the event count the step thread waits on (daemon/parts/run_control.h).
#include "daemon/parts/run_control.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace vipsd::daemon {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

TEST(RunControlTest, ARingAfterTheGenerationWasReadIsNeverMissed) {
  RunControl control;
  const uint64_t seen = control.Generation();
  control.Ring();  // between the waiter's check and its wait
  const auto start = Clock::now();
  control.WaitAfter(seen, 10s);
  EXPECT_LT(Clock::now() - start, 1s);
  EXPECT_GT(control.Generation(), seen);
}

TEST(RunControlTest, AWaitEndsAtARingFromAnotherThreadOrAtItsTimeout) {
  RunControl control;
  const uint64_t seen = control.Generation();
  std::thread ringer([&] {
    std::this_thread::sleep_for(50ms);
    control.Ring();
  });
  const auto start = Clock::now();
  control.WaitAfter(seen, 10s);
  EXPECT_LT(Clock::now() - start, 5s);
  ringer.join();
  const auto quiet = Clock::now();
  control.WaitAfter(control.Generation(), 100ms);  // nobody rings
  EXPECT_GE(Clock::now() - quiet, 90ms);
}

TEST(RunControlTest, AStopEndsEveryWaitAndIsSticky) {
  RunControl control;
  std::thread stopper([&] {
    std::this_thread::sleep_for(50ms);
    control.RequestStop();
  });
  const auto start = Clock::now();
  EXPECT_FALSE(control.SleepUntil(WallNow() + 30));
  EXPECT_LT(Clock::now() - start, 5s);
  stopper.join();
  EXPECT_TRUE(control.stopping());
  EXPECT_FALSE(control.PauseFor(10s));
  const auto after = Clock::now();
  control.WaitAfter(control.Generation(), 10s);
  EXPECT_LT(Clock::now() - after, 1s);
}

TEST(RunControlTest, AReloadIsTakenOncePerRequest) {
  RunControl control;
  EXPECT_FALSE(control.TakeReload());
  const uint64_t seen = control.Generation();
  control.RequestReload();
  EXPECT_GT(control.Generation(), seen);  // a waiting step thread wakes
  EXPECT_TRUE(control.TakeReload());
  EXPECT_FALSE(control.TakeReload());
}

TEST(RunControlTest, SleepUntilAPastTimeReturnsAtOnce) {
  RunControl control;
  const auto start = Clock::now();
  EXPECT_TRUE(control.SleepUntil(WallNow() - 1));
  EXPECT_TRUE(control.PauseFor(0ms));
  EXPECT_LT(Clock::now() - start, 1s);
}

}  // namespace
}  // namespace vipsd::daemon
