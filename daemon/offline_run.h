// The offline run: the daemon's step loop fed by a JSON Lines file instead
// of Kafka, writing releases to a directory (DESIGN.md 5; issue "offline
// runs"). It is the same path the daemon takes — pool behind the privacy
// wall, StepDriver, ledger before release — with file connectors.
//
//   1. Read the PUBLIC vocabulary, build the model.
//   2. Open the ledger: a previous run's spent budget and step counter are
//      restored (never reset); a corrupt ledger stops the run. ε is always
//      accounted in the adaptive-filter mode, because a resumed run may use
//      (q, σ) chosen after seeing earlier releases. The model resumes from
//      its checkpoint (daemon/checkpoint.h) when one exists; a checkpoint
//      of a different model or a corrupt one stops the run.
//   3. Read the source into the in-memory pool, each line decoded by the
//      model's record decoder (the daemon's; for LDA a document without a
//      vocabulary word is rejected as empty_document). Malformed lines go to
//      the dead-letter file (line number and reason only — never content).
//      Records are never written to disk.
//   4. Step until max_steps / max_epochs (one epoch = 1/q steps) or until
//      the accountant refuses a step at the ε ceiling. After every step the
//      ledger is committed (fsync) BEFORE any release of that step is
//      written; a checkpoint every checkpoint_every steps and at the end;
//      releases every publish_every steps and at the end.
//
// Logs (stderr, logfmt) carry only public values: step, ρ, ε spent,
// records read/rejected from the stream (stream volume is public).
#pragma once

#include <cstdint>

#include "config/config.h"
#include "core/base/status.h"

namespace vipsd::daemon {

struct OfflineRunSummary {
  int64_t first_step = 0;         // t of the first step of this run
  int64_t steps_run = 0;
  int64_t releases_written = 0;
  bool stopped_at_ceiling = false;
  double epsilon_spent = 0;       // cumulative, including earlier runs
  int64_t records_pooled = 0;     // stream volume: public
  int64_t records_rejected = 0;   // malformed lines: public (stream-level)
  double estep_seconds = 0;       // wall time inside driver steps
};

StatusOr<OfflineRunSummary> RunOffline(const config::VipsdConfig& config);

}  // namespace vipsd::daemon
