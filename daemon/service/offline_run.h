// The offline run: `source.type: file`. It is the daemon (daemon/service/daemon.h)
// over a JSON Lines file and a release directory (daemon/io/file_io.h) — the
// same start-up check, step loop and ledger discipline as the streaming
// service — with an unpaced clock: the file is the whole data set, every
// step samples all of it, and steps follow each other at once until
// max_steps / max_epochs (one epoch = 1/q steps) or the ε ceiling.
//
// Malformed lines go to the dead-letter file (line number and reason only —
// never content); a document with no vocabulary word is a record like any
// other (its statistic is zero). A restarted run continues t and ε from the
// ledger and the model from its checkpoint, after the same checks as the
// daemon (daemon.h "Start-up check").
//
// Exit: OK when the run stepped at least once and stopped by max_steps,
// max_epochs or the ceiling; FAILED_PRECONDITION when the ceiling admits no
// step at all (nothing was run).
//
// Timing: an offline run has no public clock; its files' modification times
// reveal how long each step took. Its releases carry the time the run
// started, not when a step finished: publish only the release contents.
#pragma once

#include <cstdint>

#include "config/config.h"
#include "core/base/status.h"
#include "daemon/service/daemon.h"

namespace vipsd::daemon {

struct OfflineRunSummary {
  int64_t first_step = 0;         // t of the first step of this run
  int64_t steps_run = 0;
  int64_t releases_written = 0;
  bool stopped_at_ceiling = false;
  double epsilon_spent = 0;       // cumulative, including earlier runs
  int64_t records_pooled = 0;     // stream volume
  int64_t records_rejected = 0;   // malformed lines (stream volume)
  double seconds = 0;             // wall time of Run()
};

StatusOr<OfflineRunSummary> RunOffline(const config::VipsdConfig& config,
                                       DaemonOptions options = {}, DaemonHooks hooks = {});

}  // namespace vipsd::daemon
