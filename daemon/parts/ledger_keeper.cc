#include "daemon/parts/ledger_keeper.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>

#include "core/base/format.h"
#include "core/base/log.h"

namespace vipsd::daemon {
namespace {

constexpr std::string_view kComponent = "daemon";

}  // namespace

LedgerKeeper::LedgerKeeper(Ledger ledger, LedgerState state,
                           std::unique_ptr<LedgerReplica> replica,
                           const std::string& state_directory, Metrics* metrics,
                           std::function<Status()> fault)
    : ledger_(std::move(ledger)),
      state_(std::move(state)),
      committed_(state_),
      replica_(std::move(replica)),
      checkpoints_(state_directory),
      metrics_(metrics),
      fault_(std::move(fault)) {}

Status LedgerKeeper::UseFixedSchedule(bool is_private) {
  if (state_.schedule != ScheduleKind::kFixed || !is_private) return Status::Ok();
  VIPSD_ASSIGN_OR_RETURN(fixed_schedule_,
                         privacy::FixedScheduleAccountant::Create(state_.fixed_step));
  return Status::Ok();
}

double LedgerKeeper::EpsilonOf(const LedgerState& state, double delta, bool is_private) const {
  if (!is_private) return 0;
  auto spent = LedgerSpent(state, delta, fixed_schedule());
  return spent.ok() ? spent->epsilon : std::numeric_limits<double>::infinity();
}

std::string LedgerKeeper::AccountantName(double delta) const {
  auto spent = LedgerSpent(state_, delta, fixed_schedule());
  if (spent.ok()) return spent->accountant;
  return state_.schedule == ScheduleKind::kFixed ? "fixed_rdp" : "rdp_filter";
}

int64_t LedgerKeeper::CheckedSteps() const {
  return state_.mode == AccountingMode::kResidency
             ? std::min<int64_t>(state_.residency->max_residency_steps(),
                                 state_.residency->steps() + 1)
             : state_.accountant.steps() + 1;
}

void LedgerKeeper::PrefetchNextCheck(double delta) const {
  if (fixed_schedule_.has_value()) fixed_schedule_->Prefetch(CheckedSteps(), delta);
}

bool LedgerKeeper::AdmitsStep(const privacy::SampledGaussian& step,
                              const privacy::EpsilonDelta& ceiling, double* epsilon_after,
                              double* window_epsilon) {
  const double delta = ceiling.delta;
  *window_epsilon = 0;
  *epsilon_after = 0;
  auto refuse = [&](const Status& error) {
    Log(LogLevel::kError, kComponent, "budget check failed: " + error.ToString());
    *epsilon_after = std::numeric_limits<double>::infinity();
    return false;
  };
  if (fixed_schedule_.has_value()) {
    // Fixed schedule: ε of the steps this one would complete — all private
    // steps so far plus one (global), or the window of at most M steps it
    // would close (residency).
    const int64_t steps = CheckedSteps();
    auto at = fixed_schedule_->Epsilon(steps, delta);
    if (!at.ok()) return refuse(at.status());
    // The next step's check, computed while this step runs (a new step
    // count is a PLD composition; issue 30: off the step's serial path).
    const int64_t next = state_.mode == AccountingMode::kResidency
                             ? std::min<int64_t>(state_.residency->max_residency_steps(), steps + 1)
                             : steps + 1;
    if (next != steps) fixed_schedule_->Prefetch(next, delta);
    *epsilon_after = at->epsilon;
    *window_epsilon = at->epsilon;
    return at->epsilon <= ceiling.epsilon;
  }
  if (state_.mode == AccountingMode::kResidency) {
    auto check = state_.residency->CheckCeiling(step, ceiling,
                                                privacy::Adaptivity::kAdaptiveFilter);
    if (!check.ok()) return refuse(check.status());
    *epsilon_after = check->epsilon_after;
    *window_epsilon = check->epsilon_after;
    return !check->would_exceed;
  }
  auto check = state_.accountant.CheckCeiling(step, 1, ceiling, privacy::RdpConversion::kImproved,
                                              privacy::Adaptivity::kAdaptiveFilter);
  if (!check.ok()) return refuse(check.status());
  *epsilon_after = check->epsilon_after;
  return !check->would_exceed;
}

Status LedgerKeeper::Apply(const LedgerEdit& edit) {
  VIPSD_RETURN_IF_ERROR(ApplyLedgerEdit(edit, &state_));
  if (edit_observer_) edit_observer_(edit, state_);
  return Status::Ok();
}

Status LedgerKeeper::AddStream(const std::string& stream, int64_t origin) {
  return Apply(LedgerEdit::AddStream(stream, origin));
}

Status LedgerKeeper::RecordCuts(int64_t slot, const std::map<std::string, int64_t>& cuts) {
  return Apply(LedgerEdit::RecordCuts(slot, cuts));
}

Status LedgerKeeper::SkipTo(int64_t slot) { return Apply(LedgerEdit::SkipTo(slot)); }

Status LedgerKeeper::ApplyReload(const std::vector<LedgerEdit>& edits) {
  LedgerState trial = state_;
  for (const LedgerEdit& edit : edits) VIPSD_RETURN_IF_ERROR(ApplyLedgerEdit(edit, &trial));
  for (const LedgerEdit& edit : edits) VIPSD_RETURN_IF_ERROR(Apply(edit));
  return Status::Ok();
}

Status LedgerKeeper::RaiseWarningLevel(double level) {
  return Apply(LedgerEdit::WarningLevel(level));
}

Status LedgerKeeper::BindFederationRun(const std::string& run) {
  if (state_.federation_run == run) return Status::Ok();
  return Apply(LedgerEdit::BindFederationRun(run));
}

Status LedgerKeeper::Charge(const privacy::SampledGaussian& step) {
  return Apply(LedgerEdit::Charge(step));
}

void LedgerKeeper::RecordCharged(bool is_private, bool secure_noise, int64_t step) {
  const LedgerEdit::Noise noise = !is_private     ? LedgerEdit::Noise::kNonPrivate
                                  : !secure_noise ? LedgerEdit::Noise::kFixedSeed
                                                  : LedgerEdit::Noise::kPrivate;
  (void)Apply(LedgerEdit::NoteNoise(step, noise));  // cannot fail
}

Status LedgerKeeper::RecordStep(const svi::StepResult& result, bool is_private, bool secure_noise,
                                double window_epsilon) {
  RecordCharged(is_private, secure_noise, result.step);
  if (!is_private || state_.mode != AccountingMode::kResidency) return Status::Ok();
  return Apply(LedgerEdit::ResidencyStep(result.mechanism, window_epsilon));
}

Status LedgerKeeper::Commit(int64_t next_step) {
  if (next_step != state_.next_step) {
    VIPSD_RETURN_IF_ERROR(Apply(LedgerEdit::SetNextStep(next_step)));
  }
  const auto start = std::chrono::steady_clock::now();
  Status committed = fault_ ? fault_() : Status::Ok();
  if (committed.ok()) committed = ledger_.Commit(state_);
  if (committed.ok() && replica_ != nullptr) {
    committed = replica_->Commit(state_);
    if (!committed.ok() && replica_->fenced() && on_fenced_) on_fenced_(committed);
  }
  last_commit_seconds_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!committed.ok()) {
    metrics_->ledger_commit_failures_total().Increment();
    return committed;
  }
  committed_ = state_;
  return Status::Ok();
}

LedgerKeeper::CommitResult LedgerKeeper::CommitOrRetry(int64_t next_step, double now) {
  if (backing_off(now)) return CommitResult::kFailed;
  const Status committed = Commit(next_step);
  if (!committed.ok()) {
    OnFailure(committed, now);
    return CommitResult::kFailed;
  }
  if (!failing_) return CommitResult::kCommitted;
  Log(LogLevel::kInfo, kComponent,
      "ledger commit succeeded again after " + std::to_string(failures_) +
          " failed attempts; stepping resumes and the current model is released at the next "
          "deadline");
  failing_ = false;
  failures_ = 0;
  backoff_ = 1;
  error_ = Status::Ok();
  metrics_->ledger_failing().Set(0);
  return CommitResult::kRecovered;
}

void LedgerKeeper::OnFailure(const Status& error, double now) {
  // No step and no release until a commit succeeds; the ledger on disk stays
  // an upper bound of what was released. Retried with backoff (1 s to 60 s);
  // logged once, then every 5 minutes.
  ++failures_;
  error_ = error;
  retry_at_ = now + backoff_;
  backoff_ = std::min(backoff_ * 2, 60.0);
  metrics_->ledger_failing().Set(1);
  if (!failing_) {
    failing_ = true;
    failing_since_ = now;
    failure_logged_at_ = now;
    Log(LogLevel::kError, kComponent,
        "ledger commit failed; no step or release until it succeeds (retrying with backoff): " +
            error.ToString());
  } else if (now - failure_logged_at_ >= 300) {
    failure_logged_at_ = now;
    Log(LogLevel::kError, kComponent,
        "ledger commit still failing after " + std::to_string(failures_) +
            " attempts: " + error.ToString());
  }
}

Status LedgerKeeper::FailingError(double now) const {
  // A supervisor must notice: the ledger has not been durable since then.
  return UnavailableError("stopped while the ledger could not be committed (" +
                          std::to_string(failures_) + " failed attempts over " +
                          FixedDecimal(now - failing_since_, 0) +
                          " s; last error: " + std::string(error_.message()) +
                          "); steps after the last durable commit were never released");
}

Status LedgerKeeper::ConfirmOwner() {
  return replica_ != nullptr ? replica_->ConfirmOwner() : Status::Ok();
}

Status LedgerKeeper::SaveCheckpoint(Checkpoint checkpoint, double* seconds) {
  const auto start = std::chrono::steady_clock::now();
  const int64_t step = checkpoint.step;
  VIPSD_RETURN_IF_ERROR(checkpoints_.Save(std::move(checkpoint)));
  checkpoint_step_ = step;
  *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return Status::Ok();
}

}  // namespace vipsd::daemon
