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

#include "config/config.h"
#include "core/base/status.h"
#include "daemon/setup/startup_check.h"

namespace vipsd::daemon {

int RunService(const config::VipsdConfig& config, const DaemonOptions& options);

// 2 for INVALID_ARGUMENT (a configuration the operator must fix), else 1.
int ExitCodeFor(const Status& status);

}  // namespace vipsd::daemon
