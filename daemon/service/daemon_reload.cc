#include "daemon/service/daemon.h"

#include <algorithm>

#include "core/base/format.h"
#include "core/base/log.h"
#include "daemon/parts/ingest.h"
#include "daemon/parts/ledger_keeper.h"
#include "daemon/parts/slot_clock.h"
#include "daemon/setup/step_calibration.h"

// Daemon: reload (SIGHUP). What may change live changes between slots; what
// may not is refused with the old configuration kept (config/ decides the
// keys; startup_check.h CheckReload what the state directory allows).

namespace vipsd::daemon {
namespace {

constexpr std::string_view kComponent = "daemon";

}  // namespace


void Daemon::Reload() {
  const double now = WallNow();
  auto next = config::LoadConfigFile(config_.file);
  std::vector<std::string> described;
  Status durable = Status::Ok();
  const StatusOr<bool> applied = next.ok() ? ApplyReload(std::move(*next), &described, &durable)
                                           : StatusOr<bool>(next.status());
  if (!applied.ok()) {
    Log(LogLevel::kError, kComponent,
        "reload refused, the running configuration stays: " +
            std::string(applied.status().message()));
    metrics_->RecordReload(ReloadResult::kFailure, now);
    return;
  }
  if (!*applied) {
    Log(LogLevel::kInfo, kComponent, "reload: nothing changed");
    metrics_->RecordReload(ReloadResult::kSuccess, now);
    return;
  }
  std::string changes;
  for (const auto& change : described) changes += (changes.empty() ? "" : "; ") + change;
  SetMinLogLevel(config_.log_level);
  SetLogFormat(config_.log_format);
  // The gauges of the new configuration first: whoever sees the success
  // counter move (a scrape, a test) sees them too.
  UpdateBudgetMetrics();
  if (!durable.ok()) {
    // Applied (only tighter), but not yet on record: not acknowledged.
    metrics_->RecordReload(ReloadResult::kFailure, now);
    Log(LogLevel::kError, kComponent,
        "reload applied in this process but the lowered epsilon ceiling could not be "
        "committed (" + durable.ToString() + "); it is committed with the next step, and a "
        "restart before then is held to the old ceiling: " + changes);
    return;
  }
  metrics_->RecordReload(ReloadResult::kSuccess, now);
  Log(LogLevel::kInfo, kComponent, "reload applied: " + changes);
}

StatusOr<bool> Daemon::ApplyReload(config::VipsdConfig next, std::vector<std::string>* described,
                                   Status* durable) {
  VIPSD_ASSIGN_OR_RETURN(auto changed, config::ChangedReloadableKeys(config_, next, described));
  // The vocabulary file itself must not change either.
  if (bundle_.vocabulary != nullptr) {
    VIPSD_ASSIGN_OR_RETURN(auto rebuilt, BuildModel(next));
    if (rebuilt.vocabulary_fingerprint != bundle_.vocabulary_fingerprint) {
      return InvalidArgumentError(
          config::KeyWhere(next, "model.lda.vocabulary") +
          "the vocabulary file's content changed; it cannot change on reload (restart with a "
          "new state directory)");
    }
  }
  if (changed.empty()) return false;
  const LedgerState& state = keeper_->state();
  VIPSD_ASSIGN_OR_RETURN(ReloadedState reloaded,
                         CheckReload(config_, next, state, keeper_->ledger().path(), paced_));
  svi::SlotWindows& windows = reloaded.windows;
  if (options_.time_reloads && next.source_type == config::SourceType::kKafka) {
    // A change of what a step costs or of the time it gets is timed as a
    // start times it, and refused as a start would be (step_calibration.h).
    // It holds this thread for about two worst-case steps, on synthetic
    // records: the slot after it may start late and run no step, a delay
    // that says nothing about the data.
    const std::vector<std::string>& cost = StepCostKeys();
    const auto first = std::find_if(changed.begin(), changed.end(), [&](const std::string& key) {
      return std::find(cost.begin(), cost.end(), key) != cost.end();
    });
    if (first != changed.end()) {
      VIPSD_ASSIGN_OR_RETURN(const StepCalibration timing, CalibrateWorstCaseStep(next));
      if (timing.refused) {
        return InvalidArgumentError(config::KeyWhere(next, *first) +
                                    "the reload's worst-case step does not fit its slot: " +
                                    timing.text);
      }
      described->push_back("worst-case step timed: " + timing.text);
    }
  }
  VIPSD_RETURN_IF_ERROR(driver_->Reconfigure(DriverConfigFor(next)));
  // The ledger's changes, tried on copies above (CheckReload) and below (the
  // interval), applied together once everything else held.
  std::vector<LedgerEdit> edits;
  if (windows.window_slots() != state.windows.window_slots()) {
    edits.push_back(LedgerEdit::SetWindowSlots(windows.window_slots()));
  }
  if (paced_ && next.step_interval_seconds != windows.interval_seconds()) {
    // A new interval applies after the last slot the clock has observed;
    // slot times already observed keep theirs.
    const Status moved = clock_->Retime([&](int64_t next_slot) -> StatusOr<SlotClock::Anchor> {
      const int64_t from = std::max(next_slot - 1, windows.last_slot());
      const Status set = windows.SetInterval(next.step_interval_seconds, from);
      if (!set.ok()) {
        return InvalidArgumentError(config::KeyWhere(next, "schedule.interval_seconds") +
                                    std::string(set.message()));
      }
      edits.push_back(LedgerEdit::SetInterval(next.step_interval_seconds, from));
      return SlotClock::Anchor{windows.anchor_slot(), windows.anchor_time(),
                               windows.interval_seconds()};
    });
    if (!moved.ok()) {
      (void)driver_->Reconfigure(DriverConfigFor(config_));
      return moved;
    }
  }
  if (paced_) {
    ingest_->SetCapacity(next.pool_capacity);
    clock_->SetGrace(next.cut_grace_seconds);
  }
  if (state.mode == AccountingMode::kResidency &&
      reloaded.residency->max_residency_steps() != state.residency->max_residency_steps()) {
    edits.push_back(LedgerEdit::SetResidencySteps(reloaded.residency->max_residency_steps()));
  }
  // Only ever lower (CheckReload refused a raise), and on record before the
  // reload is acknowledged: a crash right after it must not lose it.
  const bool lowered = next.is_private() && next.driver.epsilon_ceiling < state.epsilon_ceiling;
  if (next.is_private() && next.driver.epsilon_ceiling != state.epsilon_ceiling) {
    edits.push_back(LedgerEdit::LowerCeiling(next.driver.epsilon_ceiling));
  }
  // Validated on copies: cannot fail here (if it did, nothing changed).
  VIPSD_RETURN_IF_ERROR(keeper_->ApplyReload(edits));
  pool_.set_max_candidate_steps(paced_ ? next.window_steps : 0);
  if (overflow_ && (next.pool_capacity > overflow_capacity_)) {
    described->push_back("stepping resumes at the next slot (pool.capacity raised from " +
                         std::to_string(overflow_capacity_) + " after a window overflow)");
    overflow_ = false;
  }
  config_ = std::move(next);
  if (lowered) *durable = keeper_->Commit(driver_->next_step());
  return true;
}

}  // namespace vipsd::daemon
