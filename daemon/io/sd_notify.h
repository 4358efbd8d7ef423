// sd_notify: tells the service manager about state changes (systemd's
// sd_notify(3) protocol) without linking libsystemd.
//
// The protocol: one datagram, newline-separated "KEY=VALUE" assignments, sent
// to the AF_UNIX datagram socket named by $NOTIFY_SOCKET — a filesystem path
// ("/run/systemd/notify") or, with a leading '@', a name in the abstract
// namespace. vipsd sends READY=1 once it serves, RELOADING=1 / READY=1
// around a SIGHUP reload, STOPPING=1 on shutdown, STATUS=… for
// `systemctl status`, and WATCHDOG=1 if the unit sets WatchdogSec=.
//
// When $NOTIFY_SOCKET is unset (not run by systemd, or Type= is not notify)
// Notify does nothing and returns OK. A send failure is returned as
// UNAVAILABLE naming the socket; callers log it and carry on (systemd then
// times the start or reload out, which an operator sees).
//
// Privacy: STATUS text is shown to operators and logged by systemd; it must
// carry only public values (step, ε spent), never anything from records.
//
// Thread-safety: Notify opens its own socket per call and may be called from
// any thread, provided nothing modifies the environment concurrently.
#pragma once

#include <chrono>
#include <optional>
#include <string_view>

#include "core/base/status.h"

namespace vipsd::daemon {

// Sends `state` (e.g. "READY=1", "STATUS=step 42\nREADY=1") to $NOTIFY_SOCKET.
// INVALID_ARGUMENT for an empty state or a malformed $NOTIFY_SOCKET.
Status Notify(std::string_view state);

// The watchdog period systemd expects WATCHDOG=1 within, from $WATCHDOG_USEC,
// when $WATCHDOG_PID is unset or names this process; nullopt when the unit
// has no watchdog (or the variables are malformed). Ping at half of it.
std::optional<std::chrono::microseconds> WatchdogInterval();

}  // namespace vipsd::daemon
