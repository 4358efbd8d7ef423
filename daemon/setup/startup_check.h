// The start-up check: what a start (the streaming daemon and the offline
// run alike) and `vipsd --check-config` decide before anything is consumed,
// stepped or written — one check for every entry point, refusing to start
// (naming the file) rather than reset or mix a budget.
//
// Refused: fixed-seed noise without DaemonOptions::allow_fixed_seed_noise
// (the command-line flag; a configuration key alone must never turn the
// privacy off); paths whose inputs and outputs meet (daemon/setup/path_checks.h);
// a ledger of another model, run or source kind; an accounting mode or
// schedule other than the ledger's (and, schedule fixed, another (q, σ));
// a private run (σ > 0, secure noise) on a state directory that ever ran a
// non-private or fixed-seed step, and a non-private or fixed-seed run on
// one that ran private steps; a checkpoint without a ledger, of another run
// or model, or of a step the ledger does not cover; versions 1 and 2 of the
// ledger and counters beyond 2^53 (Ledger::Decode); a residency window M
// whose ε exceeds the ceiling, or that would grow; a slot window that
// would grow; a first step that alone would cross the ceiling.
//
// PrepareState also builds a fresh state directory's state (run id, public
// slot clock anchor, the RDP filter's δ split designed from public settings
// before any data) and restores the checkpoint into the model.
//
// Errors name file:line: key where a key is at fault, else the state file.
// Thread-safety: pure functions of their arguments and the file system.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "config/config.h"
#include "core/base/status.h"
#include "core/privacy/accounting/rdp_accountant.h"
#include "core/privacy/accounting/residency_accountant.h"
#include "core/privacy/mechanisms/noise_source.h"
#include "core/svi/slot_windows.h"
#include "daemon/setup/model_setup.h"
#include "daemon/state/ledger.h"
#include "daemon/state/ledger_replica.h"

namespace vipsd::daemon {

struct DaemonOptions {
  // The command-line flag --insecure-fixed-seed-noise: required, together
  // with privacy.noise: fixed_seed, before reproducible (NOT private) noise
  // is used. A config key alone must never turn the privacy off.
  bool allow_fixed_seed_noise = false;
  // A start that timed its worst-case step (main.cc, unless
  // --no-step-time-check) times every reload that changes a key in
  // StepCostKeys() too, and refuses it as the start would have
  // (daemon/setup/step_calibration.h). Off in-process unless a test sets it.
  bool time_reloads = false;
  // --instance-id: names this process in its partial sums and log lines
  // (shared work); default host:pid.
  std::string instance_id;
  // A working standby that takes over (state.work_topic): the model of the
  // last plan it worked on (CheckpointStore bytes; public: post-processing
  // of charged, noised sums). Create continues from it instead of the
  // prior when the state directory holds no newer model of the record's
  // lineage and it belongs to the ledger of record (run id, model, a step
  // the record charges).
  std::string takeover_model;
  // TESTS ONLY (no flag or key sets it): a pause added to every federated
  // holder round after its share is computed, as a slow E-step would take
  // (the share-timing tests; daemon/step/holder.h).
  std::chrono::milliseconds test_holder_round_delay{0};
};

// How every private run accounts: an RDP privacy filter from the first step
// ((q, σ) may change by reload after releases were seen).
privacy::Adaptivity AccountingAdaptivity();

// What `vipsd --check-config` runs: every check a start performs that does
// not need the network or to write — the fixed-seed flag, the model and
// vocabulary, the metrics address, the state directory (writable; its
// ledger and checkpoint read without taking the lock and checked against
// the configuration as a start would), and the privacy checks. The
// librdkafka client configurations are checked separately (kafka_io.h
// CheckKafkaClients).
Status CheckStartUp(const config::VipsdConfig& config, const DaemonOptions& options);

Status CheckFixedSeedFlag(const config::VipsdConfig& config, const DaemonOptions& options);

struct PreparedState {
  LedgerState state;
  int64_t model_step = 0;  // the step the restored checkpoint holds (0: none)
};

// Everything a start checks and prepares against the state directory's
// ledger `previous` (none: a new directory) and checkpoint, without writing
// anything but (checkpoint_usable false) moving a checkpoint the ledger of
// record does not charge aside. Restores the checkpoint into `bundle`'s
// model. `dry_run`: only whether this state may be continued under this
// configuration (no checkpoint is read).
StatusOr<PreparedState> PrepareState(const config::VipsdConfig& config, ModelBundle& bundle,
                                     std::optional<LedgerState> previous,
                                     const std::string& ledger_path,
                                     bool checkpoint_usable = true, bool dry_run = false);

// What Daemon::Create starts from. With `replica` (state.ledger_topic):
// first what this process would continue from is checked against its
// configuration without claiming anything (a misconfigured process must
// refuse before it fences a healthy owner), then the job is claimed
// (fencing any earlier owner) and the state of record is continued, its
// checkpoint used only if the local ledger is the record's; a working
// standby's takeover model is then considered (ContinueFromTakeoverModel).
StatusOr<PreparedState> PrepareStart(const config::VipsdConfig& config, ModelBundle& bundle,
                                     const Ledger& ledger, LedgerReplica* replica,
                                     const DaemonOptions& options);

// The schedule a run of `config` uses on a state directory whose ledger says
// `ledger` (null: a new directory), or why the combination is refused.
StatusOr<ScheduleKind> ResolveSchedule(const config::VipsdConfig& config,
                                       const LedgerState* ledger,
                                       const std::string& ledger_path);

// ε of one record that is a candidate in `window_steps` steps of the
// configured (q, σ), under the state directory's schedule: the start-up and
// reload check of residency mode.
StatusOr<privacy::CeilingCheck> ResidencyWindowCheck(const config::VipsdConfig& config,
                                                     const LedgerState& state);

// The run's noise: secure (OS-seeded ChaCha20) or, privacy.noise:
// fixed_seed (CheckFixedSeedFlag passed), reproducible — said loudly.
StatusOr<std::unique_ptr<privacy::NoiseSource>> NewNoiseSource(const config::VipsdConfig& config);

// A working standby that took over (DaemonOptions::takeover_model): the
// model of the last plan it followed is restored into `bundle` when it is
// of the record's run and model, of a step the record charges, and newer
// than `model_step` (the checkpoint's). Returns the step the model holds;
// says why when it is not used.
int64_t ContinueFromTakeoverModel(const std::string& takeover_model, const LedgerState& state,
                                  ModelBundle& bundle, int64_t model_step);

// What a reload refuses beyond the keys that cannot change
// (config::ChangedReloadableKeys): a fixed schedule's other (q, σ); a
// residency window whose ε would exceed the ceiling, or that would grow; a
// slot window that would grow (paced runs). On success, the state's
// residency accountant and slot windows as the new configuration sets them
// (not yet installed).
struct ReloadedState {
  std::optional<privacy::ResidencyAccountant> residency;
  svi::SlotWindows windows;
};
StatusOr<ReloadedState> CheckReload(const config::VipsdConfig& running,
                                    const config::VipsdConfig& next, const LedgerState& state,
                                    const std::string& ledger_path, bool paced);

}  // namespace vipsd::daemon
