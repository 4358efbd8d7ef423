#include "daemon/io/sd_notify.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <string>

namespace vipsd::daemon {
namespace {

// Parses a whole decimal unsigned number; nullopt otherwise.
std::optional<unsigned long long> ParseUnsigned(const char* text) {
  if (text == nullptr || *text < '0' || *text > '9') return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text, &end, 10);
  if (errno != 0 || *end != '\0') return std::nullopt;
  return value;
}

}  // namespace

Status Notify(std::string_view state) {
  const char* socket_name = std::getenv("NOTIFY_SOCKET");
  if (socket_name == nullptr || *socket_name == '\0') return Status::Ok();
  if (state.empty()) return InvalidArgumentError("sd_notify: empty state");

  const std::string name = socket_name;
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  // The abstract namespace is spelt with a leading '@' and addressed with a
  // leading NUL byte; the address length then excludes any trailing NUL.
  if (name.front() != '/' && name.front() != '@') {
    return InvalidArgumentError("sd_notify: NOTIFY_SOCKET \"" + name +
                                "\" is neither an absolute path nor an '@' abstract name");
  }
  if (name.size() >= sizeof(address.sun_path)) {
    return InvalidArgumentError("sd_notify: NOTIFY_SOCKET \"" + name + "\" is too long");
  }
  std::memcpy(address.sun_path, name.data(), name.size());
  if (name.front() == '@') address.sun_path[0] = '\0';
  const auto address_length =
      static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size() +
                             (name.front() == '/' ? 1 : 0));

  const int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return UnavailableError("sd_notify: socket(AF_UNIX) failed: " +
                            std::string(std::strerror(errno)));
  }
  const ssize_t sent = sendto(fd, state.data(), state.size(), MSG_NOSIGNAL,
                              reinterpret_cast<const sockaddr*>(&address), address_length);
  const int send_errno = errno;
  close(fd);
  if (sent < 0) {
    return UnavailableError("sd_notify: sending to NOTIFY_SOCKET \"" + name +
                            "\" failed: " + std::strerror(send_errno));
  }
  if (static_cast<size_t>(sent) != state.size()) {
    return UnavailableError("sd_notify: short send to NOTIFY_SOCKET \"" + name + "\"");
  }
  return Status::Ok();
}

std::optional<std::chrono::microseconds> WatchdogInterval() {
  const auto usec = ParseUnsigned(std::getenv("WATCHDOG_USEC"));
  if (!usec.has_value() || *usec == 0) return std::nullopt;
  if (const char* pid_text = std::getenv("WATCHDOG_PID"); pid_text != nullptr) {
    const auto pid = ParseUnsigned(pid_text);
    if (!pid.has_value() || *pid != static_cast<unsigned long long>(getpid())) {
      return std::nullopt;
    }
  }
  return std::chrono::microseconds(static_cast<std::chrono::microseconds::rep>(*usec));
}

}  // namespace vipsd::daemon
