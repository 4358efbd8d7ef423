// The streaming daemon (DESIGN.md 3-6): records in from an InputSource,
// private steps on a schedule, ledger before release, releases out through
// an OutputSink, until stopped.
//
// Threads:
//   * the caller of Run() is the STEP thread: it owns the model, the driver,
//     the pool, the accountants, the ledger and the checkpoint store. It
//     waits for the schedule (every T seconds and/or after R new records),
//     reloads the configuration when asked, and runs steps:
//       1. move staged records into the pool (in residency mode a re-read
//          record keeps the candidate count it already had; records that
//          used up their M steps are dropped);
//       2. budget check on public parameters only: global mode — the driver
//          refuses a step that would cross the ceiling; residency mode — the
//          window of the last M steps (privacy/residency_accountant.h);
//       3. the private step (svi::StepDriver): Poisson sample, E-step, clip,
//          one Gaussian mechanism, charge, M-step;
//       4. residency bookkeeping, then the LEDGER COMMIT (fsync) — before
//          anything about this step leaves the process;
//       5. checkpoint (every checkpoint_every steps);
//       6. metrics, budget warnings (log + metric + alert message), and the
//          release (every publish_every steps), confirmed by the sink.
//     At the ceiling the configured action runs: halt (final release of the
//     current model, stop stepping, keep consuming and serving metrics; a
//     reload that raises the ceiling resumes) or exit (the same, then Run()
//     returns OK).
//   * the INGEST thread polls the source, decodes records (the model's
//     RecordDecoder), sends malformed or oversize ones to the dead-letter
//     topic (retrying until delivered: nothing is lost), stages good ones
//     for the pool, and only then marks their offsets done.
// RequestStop() and RequestReload() may be called from any thread (main's
// signal thread). On stop the step in progress finishes (ledger, checkpoint
// and release included), the ingest thread stops, offsets are committed and
// the sink is flushed; nothing half-written is published.
//
// Restart: the ledger gives t, both accountants, the arrival history and the
// offsets from which each partition is re-read to rebuild the pool; the
// checkpoint gives the model. The budget is never reset: a ledger from a
// different accounting mode, or a checkpoint of a different model, stops
// start-up with an error.
//
// Failure: a ledger commit that fails is sticky — no further step runs and
// no release leaves until an operator restarts the daemon (the budget on
// disk stays an upper bound of what was released). A failed release or
// checkpoint is counted, logged and retried at the next step.
//
// Privacy: logs, metrics, alerts and releases carry public values only —
// configuration, t, ρ_t, (ε, δ), stream volume (records consumed, rejected
// by reason, pool size, evictions, lag), timings. The realised batch size,
// clip counts and record contents stay on the step thread and in the pool.
// Timing (step duration) is a side channel the DP guarantee does not cover
// (README "Caveats").
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "config/config.h"
#include "core/base/status.h"
#include "core/privacy/noise_source.h"
#include "core/privacy/residency_accountant.h"
#include "core/svi/record_pool.h"
#include "core/svi/step_driver.h"
#include "daemon/checkpoint.h"
#include "daemon/io.h"
#include "daemon/ledger.h"
#include "daemon/metrics.h"
#include "daemon/model_setup.h"

namespace vipsd::daemon {

// Builds the input source once the daemon knows where each partition must
// resume (from its ledger).
using SourceFactory =
    std::function<StatusOr<std::unique_ptr<InputSource>>(ResumeOffsetFn resume)>;

// Test-only observation points; empty in production.
struct DaemonHooks {
  // Called on the step thread right before each step runs, with the pool
  // that step samples from.
  std::function<void(int64_t step, const svi::RecordPool& pool)> before_step;
  // Called after each release was confirmed by the sink.
  std::function<void(const release::Release&)> after_release;
};

struct DaemonStatus {
  int64_t next_step = 1;
  int64_t steps_run = 0;        // in this process
  double epsilon_spent = 0;     // active accounting mode
  bool halted = false;
  int64_t pool_records = 0;
  int64_t last_published_step = 0;
};

class Daemon {
 public:
  // Loads the ledger and the checkpoint, checks the configuration against
  // them (accounting mode, model fingerprint, residency M affordable), and
  // creates the source with resume offsets. Nothing is consumed or stepped
  // until Run().
  static StatusOr<std::unique_ptr<Daemon>> Create(const config::VipsdConfig& config,
                                                  SourceFactory make_source,
                                                  std::unique_ptr<OutputSink> sink,
                                                  Metrics* metrics, DaemonHooks hooks = {});
  ~Daemon();

  // Runs until RequestStop() (or the exit ceiling action). Returns OK on a
  // clean stop; an error if start-up inside Run or the ingest path failed
  // fatally.
  Status Run();

  void RequestStop();
  void RequestReload();

  // Thread-safe snapshot of public state.
  DaemonStatus status() const;

 private:
  Daemon(const config::VipsdConfig& config, ModelBundle bundle, std::unique_ptr<OutputSink> sink,
         Metrics* metrics, DaemonHooks hooks, Ledger ledger, LedgerState state,
         std::unique_ptr<privacy::NoiseSource> noise, svi::RecordPool pool);

  struct Staged {
    model::Record record;
    uint32_t stream = 0;
    int64_t offset = 0;
  };

  void IngestLoop();
  Status IngestBatch(std::vector<InputRecord>& records);
  bool WaitForNextStep();
  void DrainStaging();
  void RunOneStep();
  void OnCeiling(double epsilon_refused);
  void Reload();
  Status CommitLedger();
  Status PublishModel(int64_t step, double rho);
  void RetryOwedRelease();
  void CoverNewStreams();
  void UpdateBudgetMetrics();
  void CheckWarnings();
  void PublishAlertJson(const std::string& json);
  std::map<std::string, int64_t> ResumeOffsets();
  double EpsilonSpent() const;
  svi::DriverConfig DriverConfigFor(const config::VipsdConfig& config) const;

  // Step thread only.
  config::VipsdConfig config_;
  ModelBundle bundle_;
  std::unique_ptr<OutputSink> sink_;
  Metrics* metrics_;
  DaemonHooks hooks_;
  Ledger ledger_;
  LedgerState state_;
  CheckpointStore checkpoints_;
  std::unique_ptr<privacy::NoiseSource> noise_;
  std::unique_ptr<svi::StepDriver> driver_;
  svi::RecordPool pool_;
  std::map<std::string, int64_t> high_offsets_;  // per stream, highest offset pooled
  int64_t model_step_ = 0;           // step whose M-step the model includes
  int64_t published_model_step_ = -1;
  double last_rho_ = 0;
  // (q, σ) of the step model_step_ ran with in this process (a later reload
  // must not relabel its release); negative until a step has run.
  double last_step_q_ = -1;
  double last_step_sigma_ = -1;
  // A due release that could not be delivered: the current model (post-
  // processing of released noisy sums, so re-publishing costs no budget) is
  // published again at release_retry_at_, backing off from 1 s to 60 s, until
  // a publication succeeds.
  bool release_owed_ = false;
  std::chrono::steady_clock::time_point release_retry_at_;
  std::chrono::milliseconds release_retry_backoff_{1000};
  int64_t release_attempts_failed_ = 0;
  bool halted_ = false;
  std::optional<Status> sticky_error_;
  int64_t steps_run_ = 0;

  std::unique_ptr<InputSource> source_;
  std::thread ingest_thread_;

  // Shared between the step thread, the ingest thread and RequestStop/Reload.
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<Staged> staging_;                 // guarded by mutex_
  std::map<std::string, uint32_t> stream_ids_;  // guarded by mutex_
  std::vector<std::string> stream_names_;       // guarded by mutex_ (by id)
  std::map<std::string, int64_t> next_unread_;  // guarded by mutex_: highest done + 1
  int64_t new_records_ = 0;                     // guarded by mutex_
  bool stop_ = false;                           // guarded by mutex_
  bool reload_ = false;                         // guarded by mutex_
  // A partition first read in this process: the ingest thread stores its
  // offsets only after the step thread has made sure the ledger holds a
  // resume offset for it (CoverNewStreams).
  bool new_stream_ = false;                     // guarded by mutex_
  uint64_t streams_seen_ = 0;                   // guarded by mutex_: generation
  uint64_t streams_covered_ = 0;                // guarded by mutex_: generation
  std::optional<Status> ingest_error_;          // guarded by mutex_
  int64_t pool_size_ = 0;                       // guarded by mutex_ (copy for ingest)
  std::atomic<bool> refuse_new_{false};         // pool.eviction == refuse_new
  std::atomic<int64_t> capacity_{0};            // pool.capacity
  DaemonStatus status_;                         // guarded by mutex_
};

}  // namespace vipsd::daemon
