// The vipsd daemon (docs/architecture.md): records in from an InputSource, private
// steps on a public clock, ledger before release, releases out through an
// OutputSink. The streaming service (Kafka) and the offline run (a JSON
// Lines file, daemon/service/offline_run.h) are this one class with different
// connectors: one start-up check, one slot loop, one ledger discipline.
// docs/architecture.md draws the parts, the threads and the life of a slot.
//
// Daemon keeps the public-clock slot loop and reload; every other concern
// is a part with its own state (each header states its contract):
//   startup_check  what a start refuses; a fresh or continued state
//   ingest         the INGEST thread, the staging area and its mutex
//   slot_clock     the CLOCK thread: each slot's cuts at its public time
//   ledger_keeper  the ledger (and its topic replica), checkpoints, commit
//                  retry, the sticky error
//   publisher      deadlines, releases and their retry, alerts, status.json
//   step_          the mode's step (daemon/step/slot_step.h): SoloStep, a
//                  shared-work Coordinator (state.work_topic, when this
//                  process owns the job) or a federated Aggregator; a Worker
//                  (daemon/step/worker.h) is another class
//
// Which records a step sees (core/svi/slot_windows.h). Slots are due at
// public times t_k. Paced runs (Kafka): at t_k the clock thread reads the end
// offset of every input partition; those offsets are slot k's cuts, and the
// step of slot k samples exactly the records with offsets in
// [cut(k − M), cut(k)) per partition — the records appended in the M slot
// intervals before t_k. The step waits until the ingest thread has read every
// partition up to its cut, however long that takes, so membership never
// depends on how fast anything ran; a step that starts late still uses its
// own slot's cuts. Unpaced runs (the offline file run): every step samples
// the whole file, and steps follow each other at once.
//
// The caller of Run() is the STEP thread. For each slot k it
//   1. takes slot k's cuts and waits until every partition was read up to
//      its cut (or finds that the window holds more records than
//      pool.capacity: stepping stops, with an alert, until a reload raises
//      pool.capacity — no candidate is ever dropped);
//   2. makes the pool exactly the window: records below cut(k) enter,
//      records below cut(k − M) leave;
//   3. checks the budget on public parameters only (global: the driver
//      refuses a step that would cross the ceiling; residency: the window
//      of the last M steps);
//   4. runs the private step (svi::StepDriver: Poisson sample, E-step, clip,
//      one Gaussian mechanism, charge, M-step) — or, as a coordinator, the
//      shared step, and as an aggregator a federated round (step_);
//   5. waits until the slot's public release deadline t_k +
//      release_delay_seconds, COMMITS THE LEDGER (fsync) — before anything
//      about this step leaves the process, and at a time that says nothing
//      about how long the step took — then publishes the release (every
//      publish_every steps), alerts, metrics and the step's log line, then
//      the checkpoint (every checkpoint_every steps). A slot that finishes
//      after its deadline is held, ledger commit included: the next slot
//      starts at once, and at ITS deadline (a public boundary t_k +
//      release_delay + j·Δ) one commit covers both and both slots' outputs
//      leave, with one release of the latest model; the overrun is counted
//      and logged then. If that slot is late too, it waits for the next
//      boundary after it finished instead, so nothing waits for ever. A step whose commit fails reports nothing until a
//      later commit covers it. The final release of a run that ends by
//      itself leaves at the next slot's deadline (or a later boundary).
// At the ceiling the configured action runs: halt (final release of the
// current model, no more steps, slots keep being observed; a reload after
// which a step fits again resumes) or exit (the same, then Run() returns
// OK).
// RequestStop() and RequestReload() may be called from any thread (main's
// signal thread). On stop the step in progress finishes (ledger and
// checkpoint included); its release is withheld unless its deadline has
// passed (the next release includes the step); offsets are committed and
// the sink is flushed.
//
// Failure: a ledger commit that fails (disk full, I/O error) stops stepping
// and releasing until a retry succeeds (ledger_keeper.h), and then the
// daemon resumes by itself. A stop while the ledger is failing returns an
// error (exit status 1). A broken window invariant or a cut below an earlier
// one is sticky until an operator restarts. A failed release or checkpoint
// is counted, logged and retried.
//
// Privacy: logs, metrics, alerts and releases carry public values only —
// configuration, t, slot numbers and times, ρ_t, (ε, δ) of committed state,
// stream volume (records consumed, rejected by reason, window sizes, lag).
// The realised batch size, clip counts and record contents stay on the step
// thread and in the pool. Step durations are exported only with
// metrics.expose_step_timing (off by default in private mode: it reveals
// how long each step took, hence something about the batch).
//
// Thread-safety: Create and Run on one thread; RequestStop, RequestReload
// and status() from any thread.
#pragma once

#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/base/status.h"
#include "core/base/thread_annotations.h"
#include "core/privacy/mechanisms/noise_source.h"
#include "core/svi/record_pool.h"
#include "core/svi/slot_windows.h"
#include "core/svi/step_driver.h"
#include "daemon/io/io.h"
#include "daemon/io/metrics.h"
#include "daemon/io/work_exchange.h"
#include "daemon/parts/ingest.h"
#include "daemon/parts/run_control.h"
#include "daemon/setup/model_setup.h"
#include "daemon/setup/startup_check.h"
#include "daemon/state/ledger.h"
#include "daemon/state/ledger_edit.h"
#include "daemon/state/ledger_replica.h"

namespace vipsd::daemon {

class SlotStep;
class Ingest;
class LedgerKeeper;
class Publisher;
class SlotClock;
struct SlotOutputs;

// Test-only observation points; empty in production.
struct DaemonHooks {
  // Called on the step thread right before each step runs, with the pool
  // that step samples from and the stream names by pool stream index.
  std::function<void(int64_t step, int64_t slot, const svi::RecordPool& pool,
                     const std::vector<std::string>& stream_names)>
      before_step;
  // Called on the step thread after each step's sampling (step 2) with the
  // step's contributions (svi::SampleObserver): PRIVATE, for in-process
  // tests of who was sampled; never set by main.cc.
  svi::SampleObserver after_sample;
  // Called after each release was confirmed by the sink.
  std::function<void(const release::Release&)> after_release;
  // Fault injection: called before each ledger commit; a non-OK status is
  // returned as the commit's result and the ledger file is not written.
  std::function<Status()> ledger_fault;
  // Called on the step thread with every edit of the ledger's live state
  // (daemon/state/ledger_edit.h) and the state after it; once first, at Create,
  // with no edit (nullptr) and the state the keeper starts from. Tests
  // replay the edits; never set by main.cc (the ledger's values are public,
  // but nothing outside the process needs them as they change).
  std::function<void(const LedgerEdit* edit, const LedgerState& after)> ledger_edit;
};

struct DaemonStatus {
  int64_t next_step = 1;        // as committed
  int64_t steps_run = 0;        // in this process, committed
  int64_t last_slot = 0;        // last slot processed (stepped or skipped)
  int64_t slots_skipped = 0;    // in this process: overflow, ceiling, missed
  double epsilon_spent = 0;     // active accounting mode, as committed
  bool halted = false;
  bool window_overflow = false; // stepping stopped: a window did not fit pool.capacity
  int64_t pool_records = 0;
  int64_t last_published_step = 0;
  int64_t records_pooled = 0;   // in this process (stream volume)
  int64_t records_rejected = 0; // in this process (stream volume)
  // Shared work (state.work_topic), coordinator: partial sums merged into
  // its steps, computed by this process or by others, counted at the
  // steps' public deadlines.
  int64_t partials_merged_local = 0;
  int64_t partials_merged_remote = 0;
};

class Daemon {
 public:
  // Loads the ledger and the checkpoint and runs the start-up check
  // (startup_check.h); creates the source with resume offsets. Nothing is
  // consumed or stepped until Run(). With `replica` the job's ledger of
  // record is claimed on the ledger topic; with `exchange` (and a replica)
  // this process coordinates the job's shared steps.
  static StatusOr<std::unique_ptr<Daemon>> Create(const config::VipsdConfig& config,
                                                  SourceFactory make_source,
                                                  std::unique_ptr<OutputSink> sink,
                                                  Metrics* metrics, DaemonHooks hooks = {},
                                                  DaemonOptions options = {},
                                                  std::unique_ptr<LedgerReplica> replica = nullptr,
                                                  std::unique_ptr<WorkExchange> exchange = nullptr);
  ~Daemon();

  // Runs until RequestStop(), the exit ceiling action, max_steps, or (the
  // offline run) max_epochs. Returns OK on a clean stop; an error if the
  // ingest path failed fatally, or if an offline run could not run a single
  // step (the ceiling admits none).
  Status Run();

  void RequestStop();
  void RequestReload();

  // Thread-safe snapshot of public state.
  DaemonStatus status() const EXCLUDES(status_mutex_);

 private:
  Daemon(const config::VipsdConfig& config, DaemonOptions options, ModelBundle bundle,
         std::unique_ptr<OutputSink> sink, Metrics* metrics, DaemonHooks hooks,
         std::unique_ptr<LedgerKeeper> keeper, std::unique_ptr<privacy::NoiseSource> noise);

  // Start-up: each stream's origin, missed slots, the first commit.
  Status Initialize();
  // The slot loop.
  bool WaitForCuts(int64_t slot, std::map<std::string, StreamBounds>* bounds);
  // Gathers slot `slot`'s window; `cuts` are its cuts, or empty when an
  // overflow came before they were decided (false: stopping).
  bool WaitForWindow(int64_t slot, const std::map<std::string, StreamBounds>& bounds,
                     bool* overflow, std::map<std::string, int64_t>* cuts);
  // Slot `slot`'s cut rule for the ends observed (`bounds`).
  SlotTargets TargetsFor(int64_t slot, const std::map<std::string, StreamBounds>& bounds) const;
  // A reload or a new partition to cover, asked while the step thread waits.
  void ServiceRequests();
  void CoverNewStreams();
  // One slot: its cut (CutSlot), its step or the reason it has none
  // (StepOrSkip), a shared step's cuts (RecordSharedCuts), the late-slot
  // policy (HoldIfLate), then its deadline, commit, release and checkpoint
  // (FinishSlot).
  void ProcessSlot(int64_t slot, const std::map<std::string, StreamBounds>& bounds);
  // The slot's windows: new streams, the cut (one process; a shared step's
  // targets), the log ends for the next slot, an overflow, the admitted
  // records. False when stopping.
  bool CutSlot(int64_t slot, const std::map<std::string, StreamBounds>& bounds,
               SlotOutputs& out);
  // Runs the slot's step, or counts why none runs (a failing or stuck
  // ledger, an overflow, an overrun, a slot begun after its deadline).
  bool StepOrSkip(int64_t slot, SlotOutputs& out);
  // Shared work: the cuts the step's partials named (none: the slot passed).
  void RecordSharedCuts(int64_t slot, SlotOutputs& out);
  // The late-slot policy (SECURITY.md "Overruns"): a slot done after its
  // deadline is held for a later slot's deadline, or stops stepping for the
  // run. True when `out` was held (moved from: the slot is done).
  bool HoldIfLate(int64_t slot, SlotOutputs& out);
  // The slot's public deadline, then the ledger commit, the release (or its
  // withholding) and a due checkpoint.
  void FinishSlot(SlotOutputs& out, bool stepped);
  // Returns how many admitted records were late (SlotOutputs::records_late).
  int64_t AdmitWindow(const std::map<std::string, int64_t>& cuts);
  void AdvanceWindow();
  // The step.
  bool RunStep(int64_t slot, SlotOutputs* out);
  void RecordStep(const svi::StepResult& result, double window_epsilon, SlotOutputs* out);
  // The first window over pool.capacity stops stepping until a reload
  // raises pool.capacity (or a restart): skipping only the slots that
  // overflow would let the record counts switch releases on and off slot
  // after slot.
  void StopSteppingOnOverflow(int64_t slot, const std::string& why, SlotOutputs* out);
  void OnCeiling(double epsilon_refused, SlotOutputs* out);
  void CheckWarnings(SlotOutputs* out);
  // The ledger and what follows it.
  bool CommitOrRetryLedger(SlotOutputs* out);
  // A slot whose ledger commit failed: its report, and the late slots' the
  // commit was to cover, wait in uncommitted_ for the commit that covers
  // them; `out` keeps one line per step.
  void HoldUntilCommitted(SlotOutputs& out);
  // Steps run in this process whose charge is not durable yet.
  int64_t UncommittedSteps() const;
  // The ledger replica found another owner of the job (sticky; stops).
  void OnFenced(const Status& error);
  void SaveCheckpointNow();
  // A slot's outputs, at its deadline (with the late slots its commit
  // covers, first).
  void Emit(SlotOutputs& out);
  // Stopping with late slots held: their log lines are said, their
  // release withheld (the next run's includes them).
  void WithholdLateOnStop();
  // schedule.on_overrun: stop applies: one vipsd's steps and a shared-work
  // coordinator's (whose length is its workers' too); not a federated
  // aggregator's rounds, whose length does not depend on the data (holders
  // send at public times) and which are caught up (SECURITY.md "Overruns").
  bool StopsAtOverruns() const {
    return config_.on_overrun == config::OverrunAction::kStop &&
           config_.federation.role != config::FederationRole::kAggregator;
  }
  Status PublishModel(double publish_time);
  StatusOr<release::Release> BuildRelease(double publish_time) const;
  void Reload();
  // The new configuration applied (true), nothing to change (false), or why
  // it is refused (nothing changed then). A lowered ceiling is committed
  // before the reload counts as applied; `durable` is that commit's failure
  // (the lower ceiling holds in this process and is committed with the next
  // step: a tightening is never undone).
  StatusOr<bool> ApplyReload(config::VipsdConfig next, std::vector<std::string>* described,
                             Status* durable);
  void UpdateBudgetMetrics() EXCLUDES(status_mutex_);
  std::string AlertJson(const std::string& event, double spent) const;
  svi::DriverConfig DriverConfigFor(const config::VipsdConfig& config) const;
  // ε of the live state (step decisions) and as committed (everything
  // reported: metrics, log lines, status).
  double EpsilonSpent() const;
  double CommittedEpsilon() const;
  // The source resumes each partition where the ledger's windows begin.
  void PublishResumeOffsets();
  // Sleeps until the public time the final release of a paced run leaves
  // at (the deadline of the slot after the last one processed, or a later
  // boundary of the public clock) and returns it.
  double WaitForFinalReleaseTime();
  // The first public boundary deadline + j × interval (j ≥ 0) at or after
  // `now`.
  double NextBoundary(double deadline, double now) const;
  bool IsFinished() const;
  InputSource* source() const;

  // Fixed for the life of the object.
  const DaemonOptions options_;
  const bool paced_;

  // Step thread only.
  config::VipsdConfig config_;
  ModelBundle bundle_;
  std::unique_ptr<OutputSink> sink_;
  Metrics* metrics_;
  DaemonHooks hooks_;
  std::unique_ptr<privacy::NoiseSource> noise_;
  std::unique_ptr<svi::StepDriver> driver_;
  svi::RecordPool pool_;
  RunControl control_;
  std::unique_ptr<LedgerKeeper> keeper_;
  // The input until Run hands it to the ingest (then ingest_->source()).
  std::unique_ptr<InputSource> source_;
  std::unique_ptr<Ingest> ingest_;
  std::unique_ptr<SlotClock> clock_;
  std::unique_ptr<Publisher> publisher_;
  // The step of this process's mode (daemon/step/slot_step.h): solo, a
  // shared-work coordinator or a federated aggregator.
  std::unique_ptr<SlotStep> step_;
  int64_t model_step_ = 0;  // step whose M-step the model includes
  // The step model_step_ ran as in this process (its ρ, q and σ label the
  // release; a later reload must not relabel it); nullopt until one ran.
  std::optional<svi::StepResult> model_step_result_;
  std::vector<SlotOutputs> uncommitted_;  // oldest first
  // Slots that finished after their deadline, oldest first: held, commit
  // included, until the next slot's deadline (ProcessSlot).
  std::vector<SlotOutputs> late_;
  bool halted_ = false;
  bool overflow_ = false;            // stepping stopped by a window over capacity
  // Overruns (ProcessSlot): the slot whose step is skipped after a short
  // one (its deadline carries the late outputs), how many this run saw, and
  // why stepping stopped at one ("" while it goes on).
  int64_t overrun_skip_slot_ = -1;
  int64_t overruns_ = 0;
  std::string overrun_stopped_;
  int64_t overflow_capacity_ = 0;    // the pool.capacity it overflowed
  double run_started_at_ = 0;        // whole seconds: an unpaced run's release time
  double sticky_logged_at_ = 0;      // when the last "not stepping" line was said
  int64_t steps_run_ = 0;
  int64_t slots_skipped_ = 0;
  // The log ends observed for the last slot processed (the floor of the next
  // slot's cuts, TargetsFor); empty after a start.
  std::map<std::string, int64_t> previous_ends_;
  // When the read of the slot being processed completed (SlotClock::Take),
  // and how many slots' ends were read too late to be a floor.
  double cuts_read_at_ = 0;
  int64_t late_end_reads_ = 0;
  // T of the last slot whose window was admitted here (none after a start:
  // a restart's first window legitimately holds older records).
  int64_t previous_cut_time_ms_ = std::numeric_limits<int64_t>::min();
  bool late_records_logged_ = false;
  // Shared work: the slot's cut rule for the plan, and the cuts its step
  // found (empty when the slot was not stepped to the end).
  SlotTargets slot_targets_;
  std::map<std::string, int64_t> shared_cuts_;
  int64_t step_limit_ = 0;           // offline run: steps from max_steps / max_epochs; 0 = none
  std::optional<Status> run_error_;  // returned by Run()

  // Read by status() from any thread.
  mutable Mutex status_mutex_;
  DaemonStatus status_ GUARDED_BY(status_mutex_);
};

}  // namespace vipsd::daemon
