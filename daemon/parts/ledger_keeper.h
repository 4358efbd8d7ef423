// LedgerKeeper: the budget of record as the step thread keeps it — the
// ledger file (daemon/state/ledger.h), the ledger topic's replica
// (daemon/state/ledger_replica.h), the model checkpoints (daemon/state/checkpoint.h),
// the retry of a failing commit, and the sticky error that stops stepping
// when privacy would otherwise be uncertain.
//
// Two states. state() is the LIVE state the next step charges into (the
// accountants, the slot windows, the noise history), read-only outside the
// keeper: the keeper is its only writer, through named operations, each one
// edit (daemon/state/ledger_edit.h) validated and applied by ApplyLedgerEdit —
// streams added, cuts recorded, slots skipped, a step charged (the driver
// charges through the keeper: svi::ChargeBook), a reload's changes, a
// warning level, a holder's run, the step counter at a commit. An observer
// (tests) sees every edit and the state after it. committed() is the state
// as of the last durable commit (or as loaded at start): everything the daemon reports
// — metrics, log lines, status.json, the stopped: line — is computed from
// it, so that nothing about a step appears before its charge is durable
// (docs/ledger_format.md).
//
// Commit: the file (write, fsync, rename, directory fsync), then, with a
// replica, the append to the ledger topic and its confirmation. A failed
// commit (disk full, I/O error) starts a retry schedule — backoff 1 s to
// 60 s, the error logged once and then every 5 minutes — during which the
// daemon neither steps nor releases; the first commit that succeeds ends it
// (CommitResult::kRecovered). A replica that finds another owner of the job
// is fenced (fenced(): sticky; the daemon stops and releases nothing more).
//
// Sticky error: a failure that makes privacy uncertain (a broken window
// invariant, a cut below an earlier one, the step counter at its largest
// value, a fence) is recorded with Stick(); the daemon then neither steps
// nor releases until an operator restarts it.
//
// ε: EpsilonOf(state) is LedgerSpent (daemon/state/budget.h) with the fixed
// schedule's memoised accountant: one code path for the charge check, the
// metrics, the manifest and `vipsd status`.
//
// Thread-safety: step thread only (not thread-safe).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/base/status.h"
#include "core/privacy/accounting/fixed_schedule.h"
#include "core/svi/step_driver.h"
#include "daemon/io/metrics.h"
#include "daemon/state/budget.h"
#include "daemon/state/checkpoint.h"
#include "daemon/state/ledger.h"
#include "daemon/state/ledger_edit.h"
#include "daemon/state/ledger_replica.h"

namespace vipsd::daemon {

class LedgerKeeper final : public svi::ChargeBook {
 public:
  // `fault` (tests): called before each commit; a non-OK status is the
  // commit's result and nothing is written.
  LedgerKeeper(Ledger ledger, LedgerState state, std::unique_ptr<LedgerReplica> replica,
               const std::string& state_directory, Metrics* metrics,
               std::function<Status()> fault = nullptr);

  // The fixed schedule's accountant for a private run on a fixed-schedule
  // ledger (its (q, σ) pinned there).
  Status UseFixedSchedule(bool is_private);

  const LedgerState& state() const { return state_; }
  const LedgerState& committed() const { return committed_; }

  // The named edits of the live state. Each is validated and applied whole
  // or not at all (ApplyLedgerEdit); none is durable before Commit.
  Status AddStream(const std::string& stream, int64_t origin);
  Status RecordCuts(int64_t slot, const std::map<std::string, int64_t>& cuts);
  // Every slot up to `slot` passed without cuts (missed, or not stepped).
  Status SkipTo(int64_t slot);
  // A reload's changes (LedgerEdit::SetWindowSlots, SetInterval,
  // SetResidencySteps, LowerCeiling), tried together on a copy first: all
  // are applied or none.
  Status ApplyReload(const std::vector<LedgerEdit>& edits);
  // The budget-warning level announced (only rises).
  Status RaiseWarningLevel(double level);
  // A holder: the aggregator run its pads are bound to (recorded once).
  Status BindFederationRun(const std::string& run);
  // svi::ChargeBook: the driver's step 1 reads the live RDP accountant and
  // charges one step through the keeper.
  const privacy::RdpAccountant& accountant() const override { return state_.accountant; }
  Status Charge(const privacy::SampledGaussian& step) override;
  // Called after every edit applied, with the state after it (tests replay
  // the edits: DaemonHooks::ledger_edit).
  void set_edit_observer(std::function<void(const LedgerEdit&, const LedgerState&)> observer) {
    edit_observer_ = std::move(observer);
  }
  const Ledger& ledger() const { return ledger_; }
  LedgerReplica* replica() const { return replica_.get(); }
  const privacy::FixedScheduleAccountant* fixed_schedule() const {
    return fixed_schedule_.has_value() ? &*fixed_schedule_ : nullptr;
  }

  // The ceiling check before a step, on public parameters only: whether one
  // more step of `step` keeps ε within `ceiling` at its δ — the fixed
  // schedule's ε of the steps it would complete, the residency window's, or
  // (adaptive, global) the RDP filter's (the driver checks that one again
  // as it charges). `epsilon_after` is the ε the step would reach,
  // `window_epsilon` the residency window's (0 in global mode).
  bool AdmitsStep(const privacy::SampledGaussian& step, const privacy::EpsilonDelta& ceiling,
                  double* epsilon_after, double* window_epsilon);
  // Fixed schedule: starts the next step's check (a PLD composition that can
  // take a large share of a short slot) in the background, so that the first
  // step after a start does not compute it on its serial path. Public: a
  // function of (q, σ, δ) and the step count. No-op otherwise.
  void PrefetchNextCheck(double delta) const;
  // After a step ran: the residency window's record of it and the state
  // directory's noise history (private, non-private or fixed-seed steps).
  // A step charged that did not finish (abandoned): its noise kind in the
  // directory's history (private_steps counts every charged step), nothing
  // else.
  void RecordCharged(bool is_private, bool secure_noise, int64_t step);
  Status RecordStep(const svi::StepResult& result, bool is_private, bool secure_noise,
                    double window_epsilon);

  // ε (0 when not private) and the manifest's accountant name.
  double EpsilonOf(const LedgerState& state, double delta, bool is_private) const;
  std::string AccountantName(double delta) const;

  enum class CommitResult { kCommitted, kRecovered, kFailed };
  // Commits state() (with `next_step`, the driver's counter). kFailed while
  // backing off after a failure, or when this attempt failed.
  CommitResult CommitOrRetry(int64_t next_step, double now);
  // One attempt, outside the retry schedule (start-up).
  Status Commit(int64_t next_step);
  bool failing() const { return failing_; }
  bool backing_off(double now) const { return failing_ && now < retry_at_; }
  // The error a stop while failing returns (exit status 1).
  Status FailingError(double now) const;
  // Duration of the last commit attempt (seconds).
  double last_commit_seconds() const { return last_commit_seconds_; }
  bool fenced() const { return replica_ != nullptr && replica_->fenced(); }
  // Right before a release leaves: still the job's owner? (OK without a
  // replica.)
  Status ConfirmOwner();
  // Called (with the replica's error) when a commit finds that another
  // process owns the job, before the commit's failure is handled.
  void set_on_fenced(std::function<void(const Status&)> on_fenced) {
    on_fenced_ = std::move(on_fenced);
  }

  // The model after `step`, durably (every checkpoint_every steps and at
  // the end); the write's duration in `seconds`.
  Status SaveCheckpoint(Checkpoint checkpoint, double* seconds);
  int64_t checkpoint_step() const { return checkpoint_step_; }

  void Stick(const Status& error) { sticky_ = error; }
  const std::optional<Status>& sticky() const { return sticky_; }

 private:
  void OnFailure(const Status& error, double now);
  // The one writer of state_.
  Status Apply(const LedgerEdit& edit);

  Ledger ledger_;
  LedgerState state_;
  LedgerState committed_;
  std::unique_ptr<LedgerReplica> replica_;
  CheckpointStore checkpoints_;
  Metrics* const metrics_;
  const std::function<Status()> fault_;
  std::function<void(const Status&)> on_fenced_;
  std::function<void(const LedgerEdit&, const LedgerState&)> edit_observer_;
  // The step count a fixed schedule's check covers: every private step so
  // far plus one (global), or the residency window the next step closes.
  int64_t CheckedSteps() const;
  std::optional<privacy::FixedScheduleAccountant> fixed_schedule_;
  std::optional<Status> sticky_;
  int64_t checkpoint_step_ = -1;  // step of the last checkpoint written in this process
  double last_commit_seconds_ = 0;
  // A failing commit: retried with backoff (1 s to 60 s).
  bool failing_ = false;
  Status error_ = Status::Ok();
  int64_t failures_ = 0;
  double retry_at_ = 0;
  double backoff_ = 1;
  double failing_since_ = 0;
  double failure_logged_at_ = 0;
};

}  // namespace vipsd::daemon
