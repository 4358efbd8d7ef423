// `vipsd status --state DIR [--delta D] [--json]`: the operator's first
// question — where is this state directory, how much budget is spent — read
// from the files alone, without the lock and without writing.
//
// What it reads: `DIR/ledger` (the budget of record: verified by its
// checksum and every section's checks, as a start would), `DIR/checkpoint`
// if present (verified; its step and whether it belongs to the ledger's
// run), and `DIR/status.json` (written by the running daemon at each slot:
// δ, ceiling, the last release, the daemon's pid). ε is computed from the
// ledger by daemon/state/budget.h — the daemon's own function — at the δ the
// ledger records (the state directory's, privacy.delta); `--delta`, else the
// δ in status.json, only for a ledger written before δ was recorded (a
// --delta that differs from the recorded one is reported as ignored).
//
// `daemon_running` means a process with status.json's pid exists (a reused
// pid can mislead; the lock on DIR/lock is the authority, and status does
// not touch it). `private` means no step of the directory ever ran without
// secure noise; `first_non_private_step` and `first_fixed_seed_step` name
// the first step that ran with σ = 0 and with fixed-seed noise (null in
// JSON, "none" in text, when no such step ran).
//
// Exit status of the command: 0 when the ledger (and the checkpoint, if
// any) verifies, 1 when either does not, 2 for usage errors or a directory
// without a ledger.
//
// Privacy: every value shown is public (counters, (q, σ), offsets, times).
#pragma once

#include <optional>
#include <string>

#include "core/base/status.h"

namespace vipsd::daemon {

struct StateStatusOptions {
  std::string directory;
  std::optional<double> delta;  // for a ledger that records none; overrides status.json's
  bool json = false;
};

struct StateStatusOutput {
  std::string text;       // the report (JSON object or aligned lines), newline-terminated
  bool verified = false;  // ledger (and checkpoint, if present) verify
};

// NOT_FOUND when DIR has no ledger; INVALID_ARGUMENT for a bad δ.
StatusOr<StateStatusOutput> StateStatus(const StateStatusOptions& options);

}  // namespace vipsd::daemon
