// Publisher: what leaves the process at a slot's public deadline — the
// release, the step's log line and metrics, alerts and status.json — and
// when.
//
// A slot's outputs (SlotOutputs) are gathered while its step runs and held
// until its public deadline t_k + release_delay_seconds (WaitForDeadline):
// nothing the step thread makes observable about a step happens at a time
// that depends on how long the step took. A slot that finishes after its
// deadline is held by the daemon until a later slot's deadline (a public
// boundary) and leaves with it; the overrun is counted then
// (CountOverrun: vipsd_release_deadline_overruns_total) and logged at most
// every 10 s.
//
// Releases. A due release that cannot be delivered is owed: the current
// model (post-processing of released noisy sums, so re-publishing costs no
// budget) is published again at a later slot's deadline, backing off from
// 1 s to 60 s. A release whose publication failed is kept byte for byte and
// re-sent with the same bytes and timestamp, so that a release id never
// carries two contents even when the failed attempt was in fact delivered.
// Right before a release leaves, the caller confirms that this process still
// owns the job (daemon/state/ledger_replica.h).
//
// status.json (<state directory>/status.json): what `vipsd status` adds to
// the ledger — δ, ceiling, the last release — public values only, replaced
// by rename, not fsync'd (informational).
//
// Privacy: everything here is public: configuration, step and slot numbers,
// public times, ρ_t, (ε, δ) of committed state, stream volume. Step
// durations only with metrics.expose_step_timing.
//
// Thread-safety: step thread only (not thread-safe).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "config/config.h"
#include "core/base/log.h"
#include "core/base/status.h"
#include "core/release/release.h"
#include "daemon/io/io.h"
#include "daemon/io/metrics.h"
#include "daemon/parts/run_control.h"

namespace vipsd::daemon {

// What a slot leaves to be made observable at its deadline.
struct SlotOutputs {
  int64_t slot = 0;
  double deadline = 0;  // unix seconds; 0 = at once (unpaced)
  // The slot ran past its own deadline; `deadline` was moved to the next
  // public boundary (counted as an overrun when it is emitted).
  bool late = false;
  bool stepped = false;
  int64_t step = 0;
  double rho = 0;
  bool publish = false;
  bool ledger_committed = false;
  // A step charged that did not finish (a federated round abandoned, a
  // shared step whose partials never came): counted in private_steps like
  // any charged step; a federated one in vipsd_federation_rounds_total.
  bool charged_unfinished = false;
  double ledger_commit_seconds = 0;
  double step_seconds = 0;
  // Shared work: partial sums merged, by who computed them; the window's
  // offsets across all partitions (the pool is spread over processes).
  int64_t partials_local = 0;
  int64_t partials_remote = 0;
  int64_t window_offsets = -1;  // -1: solo (the pool's size)
  // Solo: the pool's size when the step ran (-1: none recorded). A late
  // slot is reported at a later deadline, when the pool already holds a
  // later slot's window.
  int64_t pool_records = -1;
  // Records this slot admitted that were stamped at or before the previous
  // slot's time: readable only after its cut was read (stream timing).
  int64_t records_late = 0;
  // Where the step thread spent the step, in order (seconds): charge,
  // sample, estep, noise, mstep for one process; charge, plan, own, wait,
  // merge, noise, mstep for a shared step's coordinator. Work-dependent:
  // reported only with metrics.expose_step_timing (phase_ms= on the step
  // line, with the ledger commit).
  std::vector<std::pair<const char*, double>> phases;
  std::vector<std::string> alerts;  // JSON
  std::vector<std::pair<LogLevel, std::string>> log_lines;
};

// The public facts status.json states.
struct StatusFacts {
  StatusFacts(const config::VipsdConfig* config_in, bool halted_in, bool ledger_failing_in,
              int64_t last_slot_in)
      : config(config_in),
        halted(halted_in),
        ledger_failing(ledger_failing_in),
        last_slot(last_slot_in) {}
  const config::VipsdConfig* config = nullptr;
  bool halted = false;
  bool ledger_failing = false;
  int64_t last_slot = 0;
  // A federated holder (its role and id come from the configuration): why it
  // stopped taking part for the run ("" while it takes part), and its rounds
  // by outcome in this process's lifetime (the ledger holds those charged).
  std::string holder_stopped;
  int64_t holder_shares = 0;
  int64_t holder_declined = 0;
  int64_t holder_withheld = 0;
};

// Writes DIR/status.json (`vipsd status` reads δ and the daemon's state
// from it): `published_step` and `published_time` are the last release's
// (0: none, e.g. a federated holder, which releases nothing). Informational
// (the ledger is the record): renamed into place, not fsync'd.
void WriteStatusFile(const StatusFacts& facts, int64_t published_step, double published_time);

class Publisher {
 public:
  // `paced`: releases and alerts follow a public clock (a Kafka source).
  Publisher(OutputSink* sink, Metrics* metrics, RunControl* control, bool paced,
            std::function<void(const release::Release&)> after_release);

  // Waits for `out`'s deadline (false: stopping first).
  bool WaitForDeadline(const SlotOutputs& out);
  // Slot `late_slot` finished after its deadline and its outputs leave at
  // slot `at_slot`'s: counted and logged (at most every 10 s).
  void CountOverrun(int64_t late_slot, int64_t at_slot);

  // How a step is reported: `epsilon` is the committed ε text, "spent/
  // ceiling" ("" when not private), `pool_size` the solo pool's size,
  // `coordinator` adds the partials, `expose_step_timing` the step's
  // duration metrics (metrics.expose_step_timing).
  struct ReportContext {
    std::string epsilon;
    int64_t pool_size = 0;
    bool coordinator = false;
    bool expose_step_timing = false;
  };
  // The step's log lines and metrics, and its "step=…" line (empty if no
  // step ran).
  std::string ReportStep(const SlotOutputs& out, const ReportContext& context);

  // Publishes the model of `step` at `publish_time`: the bytes of an earlier
  // failed attempt of the same step, else `build()`'s; `owner` is whether
  // this process still owns the job, confirmed right before (a failure is
  // handled like a failed publish). A failure makes the release owed
  // (retried at later deadlines with backoff).
  Status PublishModel(int64_t step, double publish_time,
                      const std::function<StatusOr<release::Release>()>& build,
                      const Status& owner);
  // A release is owed now (the ledger recovered after a step's commit had
  // failed); retried at the next deadline.
  void Owe();
  // Stopping before the deadline of `out`: its release is withheld (the
  // next run's release includes it); its log lines are said.
  void WithholdOnStop(const SlotOutputs& out);
  bool owed() const { return owed_; }
  bool retry_due(double now) const { return owed_ && now >= retry_at_; }
  int64_t published_step() const { return published_step_; }

  // The operator alert `json` (budget warning, halt, overflow) on the alert
  // topic, if one is configured (an offline run's sink takes every alert).
  void PublishAlert(const std::string& json, bool alert_topic_configured);

  void WriteStatus(const StatusFacts& facts) const;

 private:
  struct UnconfirmedRelease {
    int64_t step = 0;
    double publish_time = 0;
    release::Release release;
    release::EncodedRelease encoded;
  };

  OutputSink* const sink_;
  Metrics* const metrics_;
  RunControl* const control_;
  const bool paced_;
  const std::function<void(const release::Release&)> after_release_;

  std::optional<UnconfirmedRelease> unconfirmed_;
  bool owed_ = false;
  double retry_at_ = 0;
  double retry_backoff_ = 1;
  int64_t published_step_ = -1;
  double published_time_ = 0;  // public time of the last release (unix s)
  int64_t overruns_unreported_ = 0;
  double last_overrun_log_ = 0;
};

}  // namespace vipsd::daemon
