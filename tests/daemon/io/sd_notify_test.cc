#include "daemon/io/sd_notify.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>

namespace vipsd::daemon {
namespace {

using ::testing::HasSubstr;

// Saves and restores the environment variables a test changes.
class SdNotifyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name : kVariables) {
      const char* value = std::getenv(name);
      saved_[Index(name)] = value ? std::optional<std::string>(value) : std::nullopt;
      unsetenv(name);
    }
  }
  void TearDown() override {
    for (const char* name : kVariables) {
      const auto& value = saved_[Index(name)];
      if (value) {
        setenv(name, value->c_str(), 1);
      } else {
        unsetenv(name);
      }
    }
  }

 private:
  static constexpr const char* kVariables[] = {"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"};
  static size_t Index(const char* name) {
    for (size_t i = 0; i < std::size(kVariables); ++i) {
      if (std::strcmp(kVariables[i], name) == 0) return i;
    }
    return 0;
  }
  std::optional<std::string> saved_[std::size(kVariables)];
};

// A datagram socket playing systemd's side: bound to a path or, when `name`
// starts with '@', to an abstract name.
class Receiver {
 public:
  explicit Receiver(const std::string& name) {
    fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::memcpy(address.sun_path, name.data(), name.size());
    if (name[0] == '@') address.sun_path[0] = '\0';
    const auto length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size() +
                                               (name[0] == '@' ? 0 : 1));
    bound_ = fd_ >= 0 && bind(fd_, reinterpret_cast<sockaddr*>(&address), length) == 0;
    timeval timeout{2, 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  }
  ~Receiver() {
    if (fd_ >= 0) close(fd_);
  }
  bool bound() const { return bound_; }
  std::string Receive() {
    char buffer[4096];
    const ssize_t n = recv(fd_, buffer, sizeof(buffer), 0);
    return n < 0 ? std::string("<nothing received>") : std::string(buffer, n);
  }

 private:
  int fd_ = -1;
  bool bound_ = false;
};

std::string UniqueName(const std::string& stem) {
  static std::atomic<int> counter{0};
  return stem + "-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
}

TEST_F(SdNotifyTest, WithoutNotifySocketItIsANoOp) {
  EXPECT_TRUE(Notify("READY=1").ok());
  setenv("NOTIFY_SOCKET", "", 1);
  EXPECT_TRUE(Notify("READY=1").ok());
}

TEST_F(SdNotifyTest, SendsToAFilesystemSocket) {
  const std::string dir = ::testing::TempDir() + UniqueName("sd_notify_test");
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/notify";
  Receiver receiver(path);
  ASSERT_TRUE(receiver.bound()) << path;
  setenv("NOTIFY_SOCKET", path.c_str(), 1);

  ASSERT_TRUE(Notify("READY=1").ok());
  EXPECT_EQ(receiver.Receive(), "READY=1");
  ASSERT_TRUE(Notify("RELOADING=1").ok());
  EXPECT_EQ(receiver.Receive(), "RELOADING=1");
  ASSERT_TRUE(Notify("STATUS=step 42, epsilon 0.5 of 1\nREADY=1").ok());
  EXPECT_EQ(receiver.Receive(), "STATUS=step 42, epsilon 0.5 of 1\nREADY=1");
  ASSERT_TRUE(Notify("WATCHDOG=1").ok());
  EXPECT_EQ(receiver.Receive(), "WATCHDOG=1");
  ASSERT_TRUE(Notify("STOPPING=1").ok());
  EXPECT_EQ(receiver.Receive(), "STOPPING=1");
  std::filesystem::remove_all(dir);
}

TEST_F(SdNotifyTest, SendsToAnAbstractSocket) {
  const std::string name = "@" + UniqueName("vipsd-sd-notify-test");
  Receiver receiver(name);
  ASSERT_TRUE(receiver.bound()) << name;
  setenv("NOTIFY_SOCKET", name.c_str(), 1);
  ASSERT_TRUE(Notify("READY=1").ok());
  EXPECT_EQ(receiver.Receive(), "READY=1");
}

TEST_F(SdNotifyTest, MissingSocketIsUnavailableAndNamesIt) {
  const std::string path = ::testing::TempDir() + UniqueName("no-such-notify-socket");
  setenv("NOTIFY_SOCKET", path.c_str(), 1);
  const Status status = Notify("READY=1");
  EXPECT_EQ(status.code(), StatusCode::kUnavailable);
  EXPECT_THAT(status.message(), HasSubstr(path));

  const std::string abstract_name = "@" + UniqueName("vipsd-nobody-listens");
  setenv("NOTIFY_SOCKET", abstract_name.c_str(), 1);
  EXPECT_EQ(Notify("READY=1").code(), StatusCode::kUnavailable);
}

TEST_F(SdNotifyTest, MalformedSocketOrStateIsInvalid) {
  setenv("NOTIFY_SOCKET", "relative/notify", 1);
  Status status = Notify("READY=1");
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("relative/notify"));

  const std::string too_long = "/" + std::string(sizeof(sockaddr_un::sun_path), 'x');
  setenv("NOTIFY_SOCKET", too_long.c_str(), 1);
  EXPECT_EQ(Notify("READY=1").code(), StatusCode::kInvalidArgument);

  setenv("NOTIFY_SOCKET", "/run/systemd/notify", 1);
  EXPECT_EQ(Notify("").code(), StatusCode::kInvalidArgument);
}

TEST_F(SdNotifyTest, WatchdogIntervalFollowsTheEnvironment) {
  EXPECT_FALSE(WatchdogInterval().has_value());
  setenv("WATCHDOG_USEC", "30000000", 1);
  ASSERT_TRUE(WatchdogInterval().has_value());
  EXPECT_EQ(*WatchdogInterval(), std::chrono::seconds(30));
  setenv("WATCHDOG_PID", std::to_string(getpid()).c_str(), 1);
  EXPECT_EQ(*WatchdogInterval(), std::chrono::seconds(30));
  // Meant for another process (e.g. inherited by a child): not ours.
  setenv("WATCHDOG_PID", std::to_string(getpid() + 1).c_str(), 1);
  EXPECT_FALSE(WatchdogInterval().has_value());
  unsetenv("WATCHDOG_PID");
  for (const char* bad : {"0", "", "-5", "12abc", "abc", "99999999999999999999999"}) {
    setenv("WATCHDOG_USEC", bad, 1);
    EXPECT_FALSE(WatchdogInterval().has_value()) << bad;
  }
}

}  // namespace
}  // namespace vipsd::daemon
