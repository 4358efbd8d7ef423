// The vipsd daemon (DESIGN.md 3-6; issue 11): records in from an
// InputSource, private steps on a public clock, ledger before release,
// releases out through an OutputSink. The streaming service (Kafka) and the
// offline run (a JSON Lines file, daemon/offline_run.h) are this one class
// with different connectors: one start-up check, one step loop, one ledger
// discipline.
//
// Which records a step sees (core/svi/slot_windows.h). Slots are due at
// public times t_k. Paced runs (Kafka): at t_k the CLOCK thread reads the end
// offset of every input partition; those offsets are slot k's cuts, and the
// step of slot k samples exactly the records with offsets in
// [cut(k − M), cut(k)) per partition — the records appended in the M slot
// intervals before t_k. The step waits until the ingest thread has read every
// partition up to its cut, however long that takes, so membership never
// depends on how fast anything ran; a step that starts late still uses its
// own slot's cuts. Unpaced runs (the offline file run): every step samples
// the whole file, and steps follow each other at once.
//
// Threads:
//   * the caller of Run() is the STEP thread: it owns the model, the driver,
//     the pool, the accountants, the ledger and the checkpoint store. For
//     each slot k it
//       1. takes slot k's cuts and waits until every partition was read up
//          to its cut (or finds that the window holds more records than
//          pool.capacity: stepping stops, with an alert, until a reload
//          raises pool.capacity — no candidate is ever dropped);
//       2. makes the pool exactly the window: records below cut(k) enter,
//          records below cut(k − M) leave;
//       3. checks the budget on public parameters only (global: the driver
//          refuses a step that would cross the ceiling; residency: the window
//          of the last M steps);
//       4. runs the private step (svi::StepDriver: Poisson sample, E-step,
//          clip, one Gaussian mechanism, charge, M-step);
//       5. records the cuts, the noise history and the charge, then COMMITS
//          THE LEDGER (fsync) — before anything about this step leaves the
//          process; then the checkpoint (every checkpoint_every steps);
//       6. waits until the slot's public release deadline t_k +
//          release_delay_seconds, and only then publishes the release (every
//          publish_every steps), alerts, metrics and the step's log line,
//          and moves the window on. A step that finishes after its deadline
//          is published at once, and the overrun is logged and counted.
//     At the ceiling the configured action runs: halt (final release of the
//     current model, no more steps, slots keep being observed; a reload that
//     raises the ceiling resumes) or exit (the same, then Run() returns OK).
//   * the INGEST thread polls the source, drops re-delivered duplicates,
//     decodes records (the model's RecordDecoder), sends malformed ones to
//     the dead-letter topic (retrying until delivered: nothing is lost),
//     stages good ones, and only then marks their offsets done. It pauses a
//     partition once it has read past the cut the step thread waits for,
//     and stops polling once it holds pool.capacity + 1 of the window's records.
//   * the CLOCK thread (paced runs) sleeps until each slot's time, reads the
//     partitions' end offsets and hands them to the step thread. It does no
//     private work, so nothing private can delay an observation.
// Shared work (state.work_topic, daemon/work_exchange.h). A COORDINATOR
// (Create with a work exchange) does not wait for every partition at step
// 4: SharedStep charges, appends the plan, sums the partitions the consumer
// group gave it that it has read up to their cuts, merges the others'
// partials as they arrive (repeating the plan every second, checking that
// it still owns the job), and finishes the step once every partition with
// a non-empty window has exactly one partial. A WORKER (CreateWorker) runs
// only the ingest thread and, on its step thread, the plans: it adopts each
// plan's model, q and windows, and appends the partials of the partitions
// it holds; no clock, ledger, checkpoint or release.
// RequestStop() and RequestReload() may be called from any thread (main's
// signal thread). On stop the step in progress finishes (ledger and
// checkpoint included); its release is withheld unless its deadline has
// passed (the next release includes the step); offsets are committed and
// the sink is flushed.
//
// Start-up check (one for both runs; the run refuses to start, naming the
// file, rather than reset or mix a budget): a ledger of another model, run
// or source kind; a checkpoint without a ledger, of another run or model, or
// of a step the ledger does not cover; versions 1 and 2 of the ledger;
// counters beyond 2^53; a private run (σ > 0, secure noise) on a state
// directory that ever ran a non-private or fixed-seed step, and a
// non-private or fixed-seed run on one that ran private steps; fixed-seed
// noise without DaemonOptions::allow_fixed_seed_noise (the command-line
// flag); a residency M whose ε exceeds the ceiling; an accounting mode other
// than the ledger's.
//
// Failure: a ledger commit that fails (disk full, I/O error) stops stepping
// and releasing until a retry succeeds — with backoff from 1 s to 60 s, the
// error logged once and then every 5 minutes — and then the daemon resumes
// by itself; the budget on disk stays an upper bound of what was released.
// A stop while the ledger is failing returns an error (exit status 1). A
// broken window invariant or a cut below an earlier one is sticky until an
// operator restarts. A failed release or checkpoint is counted, logged and
// retried.
//
// Privacy: logs, metrics, alerts and releases carry public values only —
// configuration, t, slot numbers and times, ρ_t, (ε, δ), stream volume
// (records consumed, rejected by reason, window sizes, lag). The realised
// batch size, clip counts and record contents stay on the step thread and in
// the pool. Everything the step thread makes observable about a step
// happens at the step's public deadline; step durations are exported only
// with metrics.expose_step_timing (off by default in private mode: it
// reveals how long each step took, hence something about the batch).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "config/config.h"
#include "core/base/status.h"
#include "core/privacy/fixed_schedule.h"
#include "core/privacy/noise_source.h"
#include "core/svi/record_pool.h"
#include "core/svi/slot_windows.h"
#include "core/svi/step_driver.h"
#include "daemon/checkpoint.h"
#include "daemon/io.h"
#include "daemon/ledger.h"
#include "daemon/ledger_replica.h"
#include "daemon/metrics.h"
#include "daemon/model_setup.h"
#include "daemon/work_exchange.h"

namespace vipsd::daemon {

// Builds the input source once the daemon knows where each partition must
// resume (from its ledger). The function may be called on any thread.
using SourceFactory =
    std::function<StatusOr<std::unique_ptr<InputSource>>(ResumeOffsetFn resume)>;

struct DaemonOptions {
  // The command-line flag --insecure-fixed-seed-noise: required, together
  // with privacy.noise: fixed_seed, before reproducible (NOT private) noise
  // is used. A config key alone must never turn the privacy off.
  bool allow_fixed_seed_noise = false;
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
};

// Test-only observation points; empty in production.
struct DaemonHooks {
  // Called on the step thread right before each step runs, with the pool
  // that step samples from and the stream names by pool stream index.
  std::function<void(int64_t step, int64_t slot, const svi::RecordPool& pool,
                     const std::vector<std::string>& stream_names)>
      before_step;
  // Called after each release was confirmed by the sink.
  std::function<void(const release::Release&)> after_release;
  // Fault injection: called before each ledger commit; a non-OK status is
  // returned as the commit's result and the ledger file is not written.
  std::function<Status()> ledger_fault;
};

struct DaemonStatus {
  int64_t next_step = 1;
  int64_t steps_run = 0;        // in this process
  int64_t last_slot = 0;        // last slot processed (stepped or skipped)
  int64_t slots_skipped = 0;    // in this process: overflow, ceiling, missed
  double epsilon_spent = 0;     // active accounting mode
  bool halted = false;
  bool window_overflow = false; // stepping stopped: a window did not fit pool.capacity
  int64_t pool_records = 0;
  int64_t last_published_step = 0;
  int64_t records_pooled = 0;   // in this process (stream volume)
  int64_t records_rejected = 0; // in this process (stream volume)
  // Shared work (state.work_topic), in this process: partial sums this
  // process computed and appended (worker) or merged (coordinator: its own
  // and other processes'), counted at the plan's public time.
  int64_t partials_published = 0;
  int64_t partials_merged_local = 0;
  int64_t partials_merged_remote = 0;
  int64_t plans_followed = 0;   // worker: steps it computed partials for
};

// What `vipsd --check-config` runs: every check a start performs that does
// not need the network or to write — the fixed-seed flag, the model and
// vocabulary, the metrics address, the state directory (writable; its
// ledger and checkpoint read without taking the lock and checked against
// the configuration as a start would: schedule, model, run id, window,
// contamination), and the privacy checks (the first step fits the
// ceiling, the residency window is affordable). The librdkafka client
// configurations are checked separately (kafka_io.h CheckKafkaClients).
// Errors name file:line: key where a key is at fault.
Status CheckStartUp(const config::VipsdConfig& config, const DaemonOptions& options);

class Daemon {
 public:
  // Loads the ledger and the checkpoint and runs the start-up check (see the
  // file comment); creates the source with resume offsets. Nothing is
  // consumed or stepped until Run().
  static StatusOr<std::unique_ptr<Daemon>> Create(const config::VipsdConfig& config,
                                                  SourceFactory make_source,
                                                  std::unique_ptr<OutputSink> sink,
                                                  Metrics* metrics, DaemonHooks hooks = {},
                                                  DaemonOptions options = {},
                                                  std::unique_ptr<LedgerReplica> replica = nullptr,
                                                  std::unique_ptr<WorkExchange> exchange = nullptr);
  // Shared work (daemon/work_exchange.h): a process that does not own the
  // job. It follows the coordinator's plans: reads the partitions the
  // consumer group gives it, computes their partial sums for each step and
  // appends them to the work topic. It charges nothing, writes no ledger and
  // releases nothing. It joins the consumer group when the first plan
  // arrives; every partition resumes at the latest plan's window start.
  // Run() returns OK on RequestStop().
  static StatusOr<std::unique_ptr<Daemon>> CreateWorker(const config::VipsdConfig& config,
                                                        SourceFactory make_source,
                                                        std::unique_ptr<OutputSink> sink,
                                                        Metrics* metrics,
                                                        std::unique_ptr<WorkExchange> exchange,
                                                        DaemonOptions options = {});
  ~Daemon();

  // Worker: steady-clock time (ns since its epoch) of the last plan or
  // reminder of the coordinator it saw; 0 before any. A standby that works
  // takes over only after the ledger AND the plans were silent.
  int64_t last_plan_seen_ns() const { return last_plan_seen_ns_.load(); }
  // Worker, after Run() returned: the model of the last plan it followed
  // (DaemonOptions::takeover_model); empty if none.
  const std::string& latest_plan_model() const { return latest_plan_model_; }

  // Runs until RequestStop(), the exit ceiling action, max_steps, or (the
  // offline run) max_epochs. Returns OK on a clean stop; an error if the
  // ingest path failed fatally, or if an offline run could not run a single
  // step (the ceiling admits none).
  Status Run();

  void RequestStop();
  void RequestReload();

  // Thread-safe snapshot of public state.
  DaemonStatus status() const;

 private:
  Daemon(const config::VipsdConfig& config, DaemonOptions options, ModelBundle bundle,
         std::unique_ptr<OutputSink> sink, Metrics* metrics, DaemonHooks hooks, Ledger ledger,
         LedgerState state, std::unique_ptr<privacy::NoiseSource> noise);

  struct Staged {
    model::Record record;
    int64_t offset = 0;
  };
  // What a step leaves to be made observable at its deadline.
  struct PendingOutput {
    int64_t slot = 0;
    double deadline = 0;        // unix seconds; 0 = at once (unpaced)
    bool stepped = false;
    int64_t step = 0;
    double rho = 0;
    bool publish = false;
    bool ledger_committed = false;
    double ledger_commit_seconds = 0;
    bool checkpoint_written = false;
    double checkpoint_write_seconds = 0;
    bool checkpoint_failed = false;
    double step_seconds = 0;
    // Shared work: partial sums merged, by who computed them; the window's
    // offsets across all partitions (the pool is spread over processes).
    int64_t partials_local = 0;
    int64_t partials_remote = 0;
    int64_t window_offsets = -1;  // -1: solo (the pool's size)
    std::vector<std::string> alerts;  // JSON
    std::vector<std::pair<LogLevel, std::string>> log_lines;
  };

  enum class Role { kSolo, kCoordinator, kWorker };

  // Threads.
  void IngestLoop();
  Status IngestBatch(PollBatch& batch);
  void ClockLoop();

  // Step thread.
  Status Initialize();
  StatusOr<std::map<std::string, StreamBounds>> ObserveWithRetry(double as_of);
  bool WaitForCuts(int64_t slot, std::map<std::string, StreamBounds>* bounds);
  bool WaitForWindow(const std::map<std::string, StreamBounds>& bounds, bool* overflow);
  void ServiceRequests(std::unique_lock<std::mutex>& lock);
  void CoverNewStreams();
  void ProcessSlot(int64_t slot, const std::map<std::string, StreamBounds>& bounds);
  void AdmitWindow(const std::map<std::string, StreamBounds>& bounds);
  void SaveCheckpoint(PendingOutput* out);
  void AdvanceWindow();
  bool RunStep(int64_t slot, PendingOutput* out);
  // Shared work. Coordinator: Begin, plan, partials (own and others'),
  // Finish. OUT_OF_RANGE: a process could not hold a partition's window;
  // CANCELLED: stopping.
  StatusOr<svi::StepResult> SharedStep(int64_t slot, PendingOutput* out);
  StatusOr<svi::StepResult> SharedStepCharged(const svi::StepTicket& ticket, int64_t slot,
                                              PendingOutput* out);
  // The ingest thread pauses each stream at the slot's cut.
  void SetTargets(const std::map<std::string, int64_t>& cuts);
  // Every record of [low, high) of `stream` has been read here.
  bool LocallyComplete(const WorkStream& stream);  // mutex_ held
  // The source has `stream` assigned now (or reads every stream).
  bool LocallyAssigned(const std::string& stream);  // mutex_ held
  // A stream this process reads cannot be completed: the records held fill
  // pool.capacity.
  bool LocallyOverflowing(const WorkStream& stream);  // mutex_ held
  // The clipped partial sum of `stream`'s window from the staged records,
  // encoded for the work topic (PRIVATE).
  StatusOr<std::string> LocalPartial(const svi::StepKey& key, const WorkStream& stream);
  StatusOr<int64_t> AppendWork(const std::string& bytes);
  // The work topic's new messages; nullopt after a failed read (logged
  // every 20th time, then a short back-off).
  std::optional<std::vector<std::pair<int64_t, std::string>>> PollWork(
      std::chrono::milliseconds wait, int* failures);
  Status RunWorker();
  // At the end of Run: commits the source's offsets, closes it and flushes
  // the sink (errors logged).
  void CloseIo();
  // Worker: makes `plan` the one it works on (model, q, windows, resume
  // offsets). INVALID_ARGUMENT when this process's configuration is not the
  // coordinator's (another model, privacy on one side only): the worker
  // stops; other failures are logged and the plan is skipped.
  Status AdoptPlan(WorkPlan plan);
  void WorkOnPlan();
  bool BudgetAdmitsStep(double* epsilon_after, double* window_epsilon);
  // A slot's outputs: wait for its public deadline (false: stopping first;
  // counts and logs an overrun), then emit them — or, when stopping before
  // the deadline, withhold the release and keep only the log lines.
  bool WaitForDeadline(const PendingOutput& out);
  void Emit(PendingOutput& out);
  // A step's log lines, metrics and its "step=…" line (empty if none ran).
  std::string ReportStep(const PendingOutput& out);
  // A stepped slot whose ledger commit failed: its report waits in
  // uncommitted_step_ for the commit that covers it; `out` keeps one line.
  void HoldUntilCommitted(PendingOutput& out);
  void WithholdOnStop(PendingOutput& out);
  // A checkpoint now, with its metrics and log lines (after a slot's outputs).
  void SaveCheckpointNow();
  // The first window over pool.capacity stops stepping until a reload raises
  // pool.capacity (or a restart): skipping only the slots that overflow would
  // let the record counts switch releases on and off slot after slot.
  void StopSteppingOnOverflow(int64_t slot, const std::string& why, PendingOutput* out);
  void OnCeiling(double epsilon_refused, PendingOutput* out);
  void Reload();
  Status CommitLedger(PendingOutput* out);
  bool CommitOrRetryLedger(PendingOutput* out);
  void OnLedgerFailure(const Status& error);
  // The ledger replica found another owner of the job (sticky; stops).
  void OnFenced(const Status& error);
  Status PublishModel(int64_t step, double rho, double publish_time);
  void UpdateBudgetMetrics();
  // <state directory>/status.json: what `vipsd status` adds to the ledger
  // (δ, ceiling, the last release); public values only, written at the
  // slot's public time, replaced by rename (not fsync'd: informational).
  void WriteStatusFile();
  void CheckWarnings(PendingOutput* out);
  std::string AlertJson(const std::string& event, double spent) const;
  void PublishAlertJson(const std::string& json);
  // The release metadata's `accountant`: schedule, mode and bound behind
  // EpsilonSpent().
  std::string AccountantName() const;
  // ε of the live state (step decisions), of the last durable commit
  // (everything reported: metrics, log lines, status), of `state`.
  double EpsilonSpent() const;
  double CommittedEpsilon() const;
  double EpsilonOf(const LedgerState& state) const;
  svi::DriverConfig DriverConfigFor(const config::VipsdConfig& config) const;
  double Now() const;
  bool SleepUntil(double unix_time);  // false when stopping
  void PublishResumeOffsets();
  uint32_t StreamId(const std::string& stream);  // mutex_ held
  bool IsFinished() const;

  // Fixed for the life of the object.
  const DaemonOptions options_;
  const bool paced_;
  Role role_ = Role::kSolo;

  // Step thread only.
  config::VipsdConfig config_;
  ModelBundle bundle_;
  std::unique_ptr<OutputSink> sink_;
  Metrics* metrics_;
  DaemonHooks hooks_;
  Ledger ledger_;
  LedgerState state_;
  LedgerState committed_;  // state_ as of the last durable commit (or as loaded)
  std::optional<PendingOutput> uncommitted_step_;
  // privacy.schedule: fixed (private runs): ε of n steps of the pinned (q, σ).
  std::optional<privacy::FixedScheduleAccountant> fixed_schedule_;
  CheckpointStore checkpoints_;
  std::unique_ptr<privacy::NoiseSource> noise_;
  std::unique_ptr<svi::StepDriver> driver_;
  svi::RecordPool pool_;
  int64_t model_step_ = 0;           // step whose M-step the model includes
  int64_t published_model_step_ = -1;
  double published_time_ = 0;  // public time of the last release (unix s)
  double last_rho_ = 0;
  // (q, σ) of the step model_step_ ran with in this process (a later reload
  // must not relabel its release); negative until a step has run.
  double last_step_q_ = -1;
  double last_step_sigma_ = -1;
  // A due release that could not be delivered: the current model (post-
  // processing of released noisy sums, so re-publishing costs no budget) is
  // published again at a later slot's deadline, backing off from 1 s to 60 s.
  bool release_owed_ = false;
  // A release whose publication failed, kept byte for byte: a retry of the
  // same step re-sends exactly these bytes (and timestamp), so that a
  // release id never carries two contents even when the failed attempt's
  // messages were in fact delivered.
  struct UnconfirmedRelease {
    int64_t step = 0;
    double publish_time = 0;
    release::Release release;
    release::EncodedRelease encoded;
  };
  std::optional<UnconfirmedRelease> unconfirmed_release_;
  double release_retry_at_ = 0;
  double release_retry_backoff_ = 1;
  int64_t release_attempts_failed_ = 0;
  bool halted_ = false;
  bool overflow_ = false;             // stepping stopped by a window over capacity
  int64_t overflow_capacity_ = 0;     // the pool.capacity it overflowed
  double run_started_at_ = 0;         // whole seconds: an unpaced run's release time
  std::optional<Status> sticky_error_;
  double sticky_logged_at_ = 0;  // when the last "not stepping" line was said
  // A failed ledger commit (disk full, I/O error): no step and no release
  // until a retry (backoff 1 s to 60 s, one per slot at most) succeeds; then
  // the daemon resumes by itself.
  bool ledger_failing_ = false;
  Status ledger_error_ = Status::Ok();
  int64_t ledger_failures_ = 0;
  double ledger_retry_at_ = 0;
  double ledger_backoff_ = 1;
  double ledger_failing_since_ = 0;
  double ledger_failure_logged_at_ = 0;
  int64_t steps_run_ = 0;
  int64_t slots_skipped_ = 0;
  int64_t step_limit_ = 0;          // offline run: steps from max_steps / max_epochs; 0 = none
  std::optional<Status> run_error_;  // returned by Run()
  // state.ledger_topic: the ledger of record beyond this disk (null: the
  // local file only). Every commit goes to the file, then to the topic.
  std::unique_ptr<LedgerReplica> replica_;
  int64_t checkpoint_step_ = -1;     // step of the last checkpoint written in this process
  int64_t overruns_unreported_ = 0;  // deadline overruns since the last log line
  double last_overrun_log_ = 0;

  // Shared work (state.work_topic): null in a solo process.
  std::unique_ptr<WorkExchange> exchange_;
  SourceFactory make_source_;  // worker: the source is made at the first plan
  std::string instance_;
  std::unique_ptr<privacy::GaussianSumMechanism> shared_total_;  // coordinator
  // Worker (step thread): the plan followed, where its model came from, and
  // the partials already appended for it.
  std::optional<WorkPlan> plan_;
  std::pair<uint64_t, int64_t> plan_model_of_{0, -1};  // (epoch, step) of the model held
  std::set<std::string> plan_sent_;
  std::string latest_plan_model_;
  uint64_t highest_epoch_ = 0;
  int64_t pending_published_ = 0;  // counted at the next plan (public time)
  std::atomic<int64_t> last_plan_seen_ns_{0};

  std::unique_ptr<InputSource> source_;
  bool undeliverable_dead_letter_logged_ = false;  // ingest thread only
  std::thread ingest_thread_;
  std::thread clock_thread_;

  // Shared between the step, ingest and clock threads and RequestStop/Reload.
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;                                     // guarded by mutex_
  bool reload_ = false;                                   // guarded by mutex_
  std::optional<Status> ingest_error_;                    // guarded by mutex_
  std::map<std::string, uint32_t> stream_ids_;            // guarded by mutex_
  std::vector<std::string> stream_names_;                 // guarded by mutex_ (by id)
  std::vector<std::deque<Staged>> staging_;               // guarded by mutex_ (by id; by offset)
  // Per stream id: every offset below has been read (returned or passed).
  std::vector<int64_t> next_unread_;                      // guarded by mutex_
  // Per stream id: the cut the step thread is gathering for (INT64_MAX until
  // the slot's cut is known). Staged records below it are window records.
  std::vector<int64_t> target_;                           // guarded by mutex_
  int64_t staged_in_window_ = 0;                          // guarded by mutex_
  int64_t pool_size_ = 0;                                 // guarded by mutex_ (copy)
  int64_t capacity_ = 0;                                  // guarded by mutex_ (copy)
  // Streams the ledger knows (their records may be acknowledged).
  std::set<std::string> covered_streams_;                 // guarded by mutex_
  bool cover_requested_ = false;                          // guarded by mutex_
  std::map<std::string, int64_t> resume_offsets_;         // guarded by mutex_
  // Slot cuts observed by the clock thread, not yet processed.
  std::map<int64_t, std::map<std::string, StreamBounds>> observed_;  // guarded by mutex_
  int64_t clock_next_slot_ = 0;                           // guarded by mutex_
  double clock_anchor_time_ = 0;                          // guarded by mutex_
  int64_t clock_anchor_slot_ = 0;                         // guarded by mutex_
  double clock_interval_ = 0;                             // guarded by mutex_
  int64_t records_pooled_ = 0;                            // guarded by mutex_
  int64_t records_rejected_ = 0;                          // guarded by mutex_
  // The streams the source has assigned (nullopt: all of them).
  std::optional<std::set<std::string>> assigned_;         // guarded by mutex_
  DaemonStatus status_;                                   // guarded by mutex_
};

}  // namespace vipsd::daemon
