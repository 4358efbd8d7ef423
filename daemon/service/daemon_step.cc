#include "daemon/service/daemon.h"

#include <chrono>
#include <limits>

#include "core/base/format.h"
#include "core/base/log.h"
#include "daemon/parts/ingest.h"
#include "daemon/parts/ledger_keeper.h"
#include "daemon/parts/publisher.h"
#include "daemon/step/slot_step.h"

// Daemon: the step of a slot (daemon.h, step 3 and 4 of a slot) — the
// ceiling check on public parameters, the mode's step (step_: solo, shared
// or federated, daemon/step/slot_step.h), what a step that ran records, and
// the ceiling, overflow and warning outputs.

namespace vipsd::daemon {

bool Daemon::RunStep(int64_t slot, SlotOutputs* out) {
  const auto start = std::chrono::steady_clock::now();
  if (driver_->next_step() >= svi::kMaxCounter) {
    // The ledger reader accepts step counters up to 2^53: one more step
    // would commit a ledger that no start and no `vipsd status` could read.
    keeper_->Stick(OutOfRangeError(
        "the step counter is at " + std::to_string(driver_->next_step()) +
        " = 2^53, the largest a ledger records; this state directory takes no further step "
        "(its ledger stays readable); continue in a new state directory"));
    out->log_lines.emplace_back(LogLevel::kError, keeper_->sticky()->ToString());
    return false;
  }
  double epsilon_after = 0, window_epsilon = 0;
  if (config_.is_private() &&
      !keeper_->AdmitsStep(driver_->config().mechanism,
                           {config_.driver.epsilon_ceiling, config_.driver.delta}, &epsilon_after,
                           &window_epsilon)) {
    OnCeiling(epsilon_after, out);
    return false;
  }
  if (hooks_.before_step) hooks_.before_step(driver_->next_step(), slot, pool_, ingest_->StreamNames());
  const int64_t charged_before = keeper_->state().accountant.steps();
  StatusOr<svi::StepResult> result = step_->Step(slot, slot_targets_, model_step_, out);
  shared_cuts_ = step_->TakeCuts();
  if (!result.ok()) {
    switch (step_->Classify(result.status())) {
      case StepFailure::kWindowOverflow:
        // A process could not hold a partition's window: stepping stops as
        // one process would stop (this step was charged: an overcount).
        ++slots_skipped_;
        metrics_->slots_skipped_total(SkipReason::kWindowOverflow).Increment();
        StopSteppingOnOverflow(slot, std::string(result.status().message()), out);
        return false;
      case StepFailure::kQuiet:
        return false;
      case StepFailure::kFailed:
        break;
    }
  }
  if (!result.ok()) {
    // Nothing about this step leaves the process; a charge already made is
    // in memory and goes to the ledger with the next commit, with the step's
    // number consumed (svi::StepDriver::Abandon): an overcount only. It is a
    // step of the directory's noise history like any charged one, so that
    // private_steps counts charged steps on every role.
    if (keeper_->state().accountant.steps() > charged_before) {
      keeper_->RecordCharged(config_.is_private(), noise_->is_private(),
                             driver_->next_step() - 1);
      out->charged_unfinished = true;
    }
    out->log_lines.emplace_back(LogLevel::kError, "step failed: " + result.status().ToString());
    return false;
  }
  if (result->outcome == svi::StepResult::Outcome::kRefusedCeiling) {
    OnCeiling(result->epsilon_refused, out);
    return false;
  }
  RecordStep(*result, window_epsilon, out);
  out->step_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CheckWarnings(out);
  return true;
}

void Daemon::RecordStep(const svi::StepResult& result, double window_epsilon, SlotOutputs* out) {
  halted_ = false;
  out->pool_records = static_cast<int64_t>(pool_.size());
  const Status presence = pool_.CompleteStep();
  if (!presence.ok()) {
    keeper_->Stick(presence);
    out->log_lines.emplace_back(LogLevel::kError,
                                "window invariant broken; no further step: " + presence.ToString());
  }
  const Status recorded =
      keeper_->RecordStep(result, config_.is_private(), noise_->is_private(), window_epsilon);
  if (!recorded.ok()) {
    keeper_->Stick(recorded);
    out->log_lines.emplace_back(LogLevel::kError,
                                "residency bookkeeping failed: " + recorded.ToString());
  }
  model_step_ = result.step;
  model_step_result_ = result;
  ++steps_run_;
  out->stepped = true;
  out->step = result.step;
  out->rho = result.rho;
  out->publish = result.step % config_.publish_every == 0;
}

void Daemon::StopSteppingOnOverflow(int64_t slot, const std::string& why, SlotOutputs* out) {
  overflow_ = true;
  overflow_capacity_ = config_.pool_capacity;
  out->log_lines.emplace_back(
      LogLevel::kError,
      "slot " + std::to_string(slot) + ": " + why +
          "; stepping STOPS (no step, no charge, no release from this slot on; nothing is "
          "dropped: the records stay in Kafka) until a reload raises pool.capacity or vipsd "
          "restarts. Which slot stopped the steps is a function of record counts that the "
          "epsilon guarantee does not cover (SECURITY.md); raise pool.capacity or shorten "
          "schedule.window_steps");
  out->alerts.push_back("{\"event\": \"window_overflow\", \"slot\": " + std::to_string(slot) +
                        ", \"pool_capacity\": " + std::to_string(config_.pool_capacity) +
                        ", \"stepping\": \"stopped\"}");
}

void Daemon::OnCeiling(double epsilon_refused, SlotOutputs* out) {
  metrics_->steps_refused_total().Increment();
  ++slots_skipped_;
  metrics_->slots_skipped_total(SkipReason::kCeiling).Increment();
  if (halted_) return;
  halted_ = true;
  const double spent = EpsilonSpent();
  out->log_lines.emplace_back(
      LogLevel::kWarning,
      "epsilon ceiling reached: the next step (t=" + std::to_string(driver_->next_step()) +
          ") would spend epsilon=" + FixedDecimal(epsilon_refused, 4) + " > ceiling=" +
          ShortestNumber(config_.driver.epsilon_ceiling) + "; epsilon_spent=" + FixedDecimal(spent, 4) +
          "; halting updates (on_ceiling=" +
          (config_.on_ceiling == config::CeilingAction::kHalt && paced_ ? "halt" : "exit") + ")");
  // The final release: the model of the last step this process ran, if it
  // was not published yet (after a restart that runs no step, the previous
  // run published — or, after a crash, lost — that release).
  if (steps_run_ > 0 && publisher_->published_step() != model_step_) out->publish = true;
  out->alerts.push_back(AlertJson("halted", spent));
  if (!paced_ && steps_run_ == 0) {
    run_error_ = FailedPreconditionError(
        "the epsilon ceiling admits no step: the next step (t=" +
        std::to_string(driver_->next_step()) + ") would spend epsilon " + FixedDecimal(epsilon_refused, 4) +
        " > privacy.epsilon_ceiling " + ShortestNumber(config_.driver.epsilon_ceiling) +
        " (epsilon already spent: " + FixedDecimal(spent, 4) + "); nothing was run");
  }
}

std::string Daemon::AlertJson(const std::string& event, double spent) const {
  return "{\"event\": \"" + event + "\", \"epsilon_spent\": " + ShortestNumber(spent) +
         ", \"epsilon_ceiling\": " + ShortestNumber(config_.driver.epsilon_ceiling) +
         ", \"delta\": " + ShortestNumber(config_.driver.delta) +
         ", \"next_step\": " + std::to_string(driver_->next_step()) + "}";
}

void Daemon::CheckWarnings(SlotOutputs* out) {
  if (!config_.is_private()) return;
  const double spent = EpsilonSpent();
  const double ceiling = config_.driver.epsilon_ceiling;
  double level = 0;
  for (double fraction : config_.warn_at) {
    if (spent >= fraction * ceiling) level = fraction;
  }
  if (level <= keeper_->state().warning_level) return;
  (void)keeper_->RaiseWarningLevel(level);  // rises, within (0, 1]: cannot fail
  out->log_lines.emplace_back(LogLevel::kWarning,
                              "privacy budget warning: epsilon_spent=" + FixedDecimal(spent, 4) +
                                  " of ceiling=" + ShortestNumber(ceiling) +
                                  " crossed warn_at=" + ShortestNumber(level));
  out->alerts.push_back("{\"event\": \"budget_warning\", \"fraction\": " + ShortestNumber(level) +
                        ", \"epsilon_spent\": " + ShortestNumber(spent) +
                        ", \"epsilon_ceiling\": " + ShortestNumber(ceiling) +
                        ", \"delta\": " + ShortestNumber(config_.driver.delta) +
                        ", \"step\": " + std::to_string(driver_->next_step() - 1) + "}");
}

}  // namespace vipsd::daemon
