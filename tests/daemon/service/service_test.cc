#include "daemon/service/service.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "core/base/log.h"

namespace vipsd::daemon {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

// What the service does while the brokers cannot answer (a broker
// restarting: _UNKNOWN_PARTITION, connection refused): its Kafka clients
// are made again until they can be, instead of the process exiting with 1
// (found by harness.failover_shared_cooperative, whose restarted standby
// exited during a broker restart).
class RetryWhileUnavailableTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetLogSink([this](LogLevel level, std::string_view, std::string_view message) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (level == LogLevel::kWarning) warnings_.emplace_back(message);
    });
  }
  void TearDown() override { SetLogSink(nullptr); }
  std::vector<std::string> warnings() {
    std::lock_guard<std::mutex> lock(mutex_);
    return warnings_;
  }

 private:
  std::mutex mutex_;
  std::vector<std::string> warnings_;
};

TEST_F(RetryWhileUnavailableTest, UnavailableIsWaitedOutAndSaidOnceUntilItWorks) {
  int calls = 0;
  auto made = RetryWhileUnavailable<int>(
      "work topic",
      [&]() -> StatusOr<int> {
        if (++calls < 4) return UnavailableError("watermarks of work[0]: _UNKNOWN_PARTITION");
        return 42;
      },
      [] { return false; }, 1ms);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  EXPECT_EQ(*made, 42);
  EXPECT_EQ(calls, 4);
  ASSERT_EQ(warnings().size(), 1u);  // the first failure; then every 30th
  EXPECT_THAT(warnings()[0], HasSubstr("work topic: UNAVAILABLE"));
  EXPECT_THAT(warnings()[0], HasSubstr("until the brokers answer"));
}

TEST_F(RetryWhileUnavailableTest, AnyOtherErrorReturnsAtOnce) {
  int calls = 0;
  auto made = RetryWhileUnavailable<int>(
      "ledger topic",
      [&]() -> StatusOr<int> {
        ++calls;
        return InvalidArgumentError("state.ledger_topic: not a topic name");
      },
      [] { return false; }, 1ms);
  EXPECT_EQ(made.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(warnings().empty());
  EXPECT_EQ(ExitCodeFor(made.status()), 2);
}

TEST_F(RetryWhileUnavailableTest, AStopEndsTheWaitAsCancelled) {
  int calls = 0;
  auto made = RetryWhileUnavailable<int>(
      "output",
      [&]() -> StatusOr<int> {
        ++calls;
        return UnavailableError("all brokers down");
      },
      [&] { return calls >= 3; }, 1ms);
  EXPECT_EQ(made.status().code(), StatusCode::kCancelled);
  EXPECT_EQ(calls, 3);
}

TEST_F(RetryWhileUnavailableTest, ALongOutageIsSaidEveryThirtiethTry) {
  int calls = 0;
  auto made = RetryWhileUnavailable<int>(
      "output",
      [&]() -> StatusOr<int> {
        if (++calls <= 61) return UnavailableError("all brokers down");
        return 1;
      },
      [] { return false; }, 0ms);
  ASSERT_TRUE(made.ok());
  EXPECT_EQ(warnings().size(), 3u);  // tries 1, 31 and 61
}

}  // namespace
}  // namespace vipsd::daemon
