// The vipsd service: what `vipsd --config FILE` runs for a Kafka source
// once the configuration is loaded — the embedded cluster (kafka.embedded),
// the metrics endpoint, the claim of the job's budget (a hot standby first
// waits, working for the owner with state.work_topic, until the owner's
// ledger entries and plans stop: state.standby_takeover_seconds), the
// signal thread (SIGHUP reloads, SIGTERM/SIGINT stop after the current
// step; systemd is told READY/RELOADING/STOPPING), the daemon's run, and the
// demo's closing summary. main.cc only parses flags and starts it.
//
// Exit codes: 0 done (stopped, or stopped at the ceiling with on_ceiling:
// exit, or stopped while standing by), 1 run-time failure, 2 invalid
// configuration (ExitCodeFor).
//
// Thread-safety: RunService blocks SIGINT, SIGTERM, SIGHUP and SIGUSR1 in
// the calling thread before any other thread starts; call it once, from
// main.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>

#include "config/config.h"
#include "core/base/log.h"
#include "core/base/status.h"
#include "daemon/setup/startup_check.h"

namespace vipsd::daemon {

int RunService(const config::VipsdConfig& config, const DaemonOptions& options);

// 2 for INVALID_ARGUMENT (a configuration the operator must fix), else 1.
int ExitCodeFor(const Status& status);

// A Kafka client the service makes (the work topic's, the ledger topic's,
// the output) while the brokers cannot answer — one restarting, a partition
// without a leader yet (_UNKNOWN_PARTITION): UNAVAILABLE is waited out, as
// a running daemon waits out a broker outage, instead of exiting. `make` is
// retried every `pause` until it returns anything but UNAVAILABLE, or
// `stop` says so (CANCELLED: a stop signal came meanwhile). The first
// failure and every 30th are logged, naming `what` (public: an address and
// a topic, never a record).
template <typename T>
StatusOr<T> RetryWhileUnavailable(const std::string& what,
                                  const std::function<StatusOr<T>()>& make,
                                  const std::function<bool()>& stop,
                                  std::chrono::milliseconds pause = std::chrono::seconds(1)) {
  for (int64_t failures = 0;; ++failures) {
    StatusOr<T> made = make();
    if (made.ok() || made.status().code() != StatusCode::kUnavailable) return made;
    if (failures % 30 == 0) {
      Log(LogLevel::kWarning, "main",
          what + ": " + made.status().ToString() + "; retrying every " +
              std::to_string(pause.count()) +
              " ms until the brokers answer (said again every 30 tries)");
    }
    if (stop()) return CancelledError("stopping");
    std::this_thread::sleep_for(pause);
  }
}

}  // namespace vipsd::daemon
