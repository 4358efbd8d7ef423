#include "daemon/setup/startup_check.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <set>

#include "connectors/file/file_util.h"
#include "core/base/format.h"
#include "core/base/log.h"
#include "core/privacy/accounting/filter_weights.h"
#include "core/privacy/accounting/fixed_schedule.h"
#include "core/privacy/mechanisms/secure_noise.h"
#include "daemon/io/metrics.h"
#include "daemon/parts/run_control.h"
#include "daemon/setup/federation.h"
#include "daemon/setup/path_checks.h"
#include "daemon/state/checkpoint.h"
#include "daemon/state/ledger_replica.h"

namespace vipsd::daemon {
namespace {

constexpr std::string_view kComponent = "daemon";


}  // namespace

privacy::Adaptivity AccountingAdaptivity() {
  // (q, σ) may change by reload after releases were seen: always account as
  // an RDP privacy filter (docs/privacy_accounting.md §5), from the first
  // step, so that ε is consistent across restarts and reloads.
  return privacy::Adaptivity::kAdaptiveFilter;
}

namespace {

// Files a fresh start may find in the state directory.
bool IsHarmlessStateFile(const std::string& name) {
  return name == "lock" || name == "bootstrap" || name == "ledger.tmp" ||
         name == "checkpoint.tmp" || name == "status.json.tmp";
}


// The start-up check of the ledger against the configuration (see daemon.h).
Status CheckLedgerBelongs(const config::VipsdConfig& config, const ModelBundle& bundle,
                          const LedgerState& state, const std::string& ledger_path,
                          AccountingMode mode, SourceKind source) {
  if (state.model_type != bundle.model->type() ||
      state.model_fingerprint != bundle.model_fingerprint) {
    return FailedPreconditionError(
        ledger_path + " belongs to a different model (ledger: " + state.model_type +
        ", configured: " + bundle.model->type() +
        "; type, dimensions, vocabulary or public prior (model.public_prior) differ); the "
        "model cannot change for a state directory (use a new one)");
  }
  if (state.source != source) {
    return FailedPreconditionError(
        ledger_path + " was written by a " + std::string(SourceKindName(state.source)) +
        " run; this is a " + std::string(SourceKindName(source)) +
        " run (a state directory serves one kind of source; use a new one)");
  }
  if (state.mode != mode) {
    return FailedPreconditionError(
        config::KeyWhere(config, "privacy.accounting") + "the ledger " + ledger_path + " was written in " +
        std::string(AccountingModeName(state.mode)) + " mode, configured: " +
        std::string(AccountingModeName(mode)) +
        "; the accounting mode cannot change for a state directory (use a new one)");
  }
  const std::string unit(config::PrivacyUnitName(config.privacy_unit));
  const std::string field =
      config.privacy_unit == config::PrivacyUnit::kField ? config.unit_field : "";
  const int64_t cap = config.privacy_unit == config::PrivacyUnit::kRecord
                          ? 0
                          : config.driver.max_records_per_unit;
  if (state.unit != unit || state.unit_field != field || state.max_records_per_unit != cap) {
    const auto describe = [](const std::string& u, const std::string& f, int64_t c) {
      return u == "record" ? std::string("unit record")
                           : "unit " + u + (f.empty() ? "" : " (field " + f + ")") +
                                 " with max_records_per_unit " + std::to_string(c);
    };
    return FailedPreconditionError(
        config::KeyWhere(config, "privacy.unit") + "the ledger " + ledger_path + " protects " +
        describe(state.unit, state.unit_field, state.max_records_per_unit) +
        "; this configuration says " + describe(unit, field, cap) +
        ": the privacy unit and its cap cannot change for a state directory (use a new one)");
  }
  return Status::Ok();
}

// One privacy mode per state directory: a private run never continues a
// model that took an un-noised or reproducibly-noised step, and a
// non-private or fixed-seed run never continues a private directory (its
// later releases would mix un-noised steps into a model of private ones).
// PrepareState checks it before every other ledger check (CheckLedgerBelongs
// included), so that the reason given is this one.
Status CheckPrivacyModeOfDirectory(const config::VipsdConfig& config, const LedgerState& state,
                                   const std::string& ledger_path) {
  const bool secure = config.is_private() && config.noise_mode == config::NoiseMode::kSecure;
  if (!secure && state.noise.private_steps > 0) {
    return FailedPreconditionError(
        config::KeyWhere(config, config.is_private() ? "privacy.noise" : "privacy.noise_multiplier") +
        ledger_path + ": this state directory ran " + std::to_string(state.noise.private_steps) +
        " private steps; a " +
        (config.is_private() ? std::string("fixed-seed (NOT private)")
                             : std::string("non-private (noise_multiplier 0)")) +
        " run would continue their model with steps that are not private; use a new state "
        "directory");
  }
  if (secure) {
    if (state.noise.non_private_steps > 0) {
      return FailedPreconditionError(
          ledger_path + ": this state directory ran " +
          std::to_string(state.noise.non_private_steps) +
          " non-private steps (noise_multiplier 0; the first was step " +
          std::to_string(state.noise.first_non_private_step) +
          "), so its model contains un-noised statistics; a private run needs a new state "
          "directory");
    }
    if (state.noise.fixed_seed_steps > 0) {
      return FailedPreconditionError(
          ledger_path + ": this state directory ran " +
          std::to_string(state.noise.fixed_seed_steps) +
          " steps with fixed-seed noise (NOT private; the first was step " +
          std::to_string(state.noise.first_fixed_seed_step) +
          "); a private run needs a new state directory");
    }
  }
  return Status::Ok();
}

}  // namespace

// ε of one record that is a candidate in `window_steps` steps of the
// configured (q, σ), under the state directory's schedule: the start-up and
// reload check of residency mode.
StatusOr<privacy::CeilingCheck> ResidencyWindowCheck(const config::VipsdConfig& config,
                                                     const LedgerState& state) {
  if (state.schedule == ScheduleKind::kAdaptive) {
    // Over the state directory's own order grid (an older ledger keeps its
    // grid, and its filter weights are aligned with it).
    const std::vector<double>& orders =
        state.residency.has_value() ? state.residency->orders() : state.accountant.orders();
    return privacy::ResidencyAccountant::CheckConfiguration(
        config.window_steps, config.driver.mechanism,
        {config.driver.epsilon_ceiling, config.driver.delta}, AccountingAdaptivity(), orders,
        state.accountant.filter_weights());
  }
  VIPSD_ASSIGN_OR_RETURN(auto fixed,
                         privacy::FixedScheduleAccountant::Create(config.driver.mechanism));
  VIPSD_ASSIGN_OR_RETURN(const auto at, fixed.Epsilon(config.window_steps, config.driver.delta));
  privacy::CeilingCheck check;
  check.epsilon_after = at.epsilon;
  check.would_exceed = at.epsilon > config.driver.epsilon_ceiling;
  return check;
}

// The schedule a run of `config` uses on a state directory whose ledger says
// `ledger` (null: a new directory), or why the combination is refused.
StatusOr<ScheduleKind> ResolveSchedule(const config::VipsdConfig& config,
                                       const LedgerState* ledger,
                                       const std::string& ledger_path) {
  auto kind_of = [](config::Schedule s) {
    return s == config::Schedule::kFixed ? ScheduleKind::kFixed : ScheduleKind::kAdaptive;
  };
  if (ledger == nullptr) {
    if (!config.is_private()) return ScheduleKind::kAdaptive;  // nothing is charged
    return config.schedule.has_value() ? kind_of(*config.schedule) : ScheduleKind::kFixed;
  }
  if (config.schedule.has_value() && kind_of(*config.schedule) != ledger->schedule) {
    return FailedPreconditionError(
        config::KeyWhere(config, "privacy.schedule") + "the ledger " + ledger_path + " was written with "
        "schedule " + std::string(ScheduleKindName(ledger->schedule)) +
        "; the schedule cannot change for a state directory (remove the key to keep the "
        "ledger's, or use a new state directory)");
  }
  if (ledger->schedule == ScheduleKind::kFixed && config.is_private()) {
    if (config.driver.mechanism.sampling_rate != ledger->fixed_step.sampling_rate) {
      return FailedPreconditionError(
          config::KeyWhere(config, "privacy.sampling_rate") + "schedule fixed pins it to " +
          ShortestNumber(ledger->fixed_step.sampling_rate) + " for this state directory (ledger " +
          ledger_path + "); got " + ShortestNumber(config.driver.mechanism.sampling_rate));
    }
    if (config.driver.mechanism.noise_multiplier != ledger->fixed_step.noise_multiplier) {
      return FailedPreconditionError(
          config::KeyWhere(config, "privacy.noise_multiplier") + "schedule fixed pins it to " +
          ShortestNumber(ledger->fixed_step.noise_multiplier) +
          " for this state directory (ledger " + ledger_path + "); got " +
          ShortestNumber(config.driver.mechanism.noise_multiplier));
    }
  }
  return ledger->schedule;
}

namespace {

// A new state directory whose very first step would cross the ceiling
// would run nothing: refuse it instead of "halting" at ε = 0.
Status CheckFirstStepFits(const config::VipsdConfig& config, const LedgerState& state) {
  if (!config.is_private() || state.next_step != 1 || state.mode == AccountingMode::kResidency) {
    return Status::Ok();  // residency: the window check covers it (M ≥ 1)
  }
  const double q = config.driver.mechanism.sampling_rate;
  const double sigma = config.driver.mechanism.noise_multiplier;
  double first = 0;
  if (state.schedule == ScheduleKind::kFixed) {
    VIPSD_ASSIGN_OR_RETURN(auto fixed, privacy::FixedScheduleAccountant::Create({q, sigma}));
    VIPSD_ASSIGN_OR_RETURN(auto at, fixed.Epsilon(1, config.driver.delta));
    first = at.epsilon;
  } else {
    VIPSD_ASSIGN_OR_RETURN(auto check,
                           state.accountant.CheckCeiling(
                               {q, sigma}, 1, {config.driver.epsilon_ceiling, config.driver.delta},
                               privacy::RdpConversion::kImproved, AccountingAdaptivity()));
    first = check.epsilon_after;
  }
  if (first > config.driver.epsilon_ceiling) {
    return InvalidArgumentError(
        config::KeyWhere(config, "privacy.epsilon_ceiling") + "a single step at sampling_rate " +
        ShortestNumber(q) + " and noise_multiplier " + ShortestNumber(sigma) + " already spends epsilon " +
        FixedDecimal(first, 4) + " > " + ShortestNumber(config.driver.epsilon_ceiling) + " (delta " +
        ShortestNumber(config.driver.delta) + ", schedule " +
        std::string(ScheduleKindName(state.schedule)) +
        "): nothing could run; raise the ceiling or sigma, or lower q (vipsd-privacy plan "
        "--config FILE)");
  }
  return Status::Ok();
}

}  // namespace

// Everything a start checks and prepares against the state directory's
// ledger `previous` (none: a new directory) and checkpoint, without writing
// anything: the daemon's start and `vipsd --check-config` both run it.
// Restores the checkpoint into `bundle`'s model.
namespace {

// A new state directory's state: only if nothing else of a previous run is
// there (a missing ledger next to a checkpoint is lost state, not a new
// budget).
StatusOr<LedgerState> FreshState(const config::VipsdConfig& config, const ModelBundle& bundle,
                                 const std::string& ledger_path, AccountingMode mode,
                                 SourceKind source_kind, ScheduleKind schedule) {
  LedgerState state;
  std::error_code error;
  std::set<std::string> found;  // sorted: the message does not depend on directory order
  for (const auto& entry : std::filesystem::directory_iterator(config.state_directory, error)) {
    const std::string name = entry.path().filename().string();
    if (!IsHarmlessStateFile(name)) found.insert(name);
  }
  if (!found.empty()) {
    std::string names;
    for (const auto& name : found) names += (names.empty() ? "" : ", ") + name;
    return DataLossError(ledger_path + " does not exist, but the state directory " +
                         config.state_directory + " holds " + names +
                         " of an earlier run: the spent budget is unknown; refusing to start "
                         "from zero (restore the ledger or use an empty directory)");
  }
  VIPSD_ASSIGN_OR_RETURN(state.run_id, NewRunId());
  state.model_type = bundle.model->type();
  state.model_fingerprint = bundle.model_fingerprint;
  state.source = source_kind;
  state.mode = mode;
  state.schedule = schedule;
  if (config.privacy_unit != config::PrivacyUnit::kRecord) {
    state.unit = std::string(config::PrivacyUnitName(config.privacy_unit));
    if (config.privacy_unit == config::PrivacyUnit::kField) state.unit_field = config.unit_field;
    state.max_records_per_unit = config.driver.max_records_per_unit;
  }
  if (schedule == ScheduleKind::kFixed) {
    state.fixed_step.sampling_rate = config.driver.mechanism.sampling_rate;
    state.fixed_step.noise_multiplier = config.driver.mechanism.noise_multiplier;
  }
  if (source_kind == SourceKind::kKafka) {
    const double start = config.start_time > 0 ? config.start_time : WallNow();
    VIPSD_ASSIGN_OR_RETURN(state.windows,
                           svi::SlotWindows::Create(start, config.step_interval_seconds,
                                                    config.window_steps));
  }
  if (mode == AccountingMode::kResidency) {
    VIPSD_ASSIGN_OR_RETURN(auto residency,
                           privacy::ResidencyAccountant::Create(config.window_steps));
    state.residency = std::move(residency);
  }
  if (schedule == ScheduleKind::kAdaptive && config.is_private()) {
    // The filter's split of δ over the orders, fixed now, before any
    // data, from public settings; the ledger keeps it for good.
    VIPSD_ASSIGN_OR_RETURN(
        auto weights,
        privacy::DesignFilterWeights(
            config.driver.mechanism.sampling_rate, config.driver.mechanism.noise_multiplier,
            config.driver.delta, config.driver.epsilon_ceiling,
            mode == AccountingMode::kResidency ? config.window_steps : 0));
    VIPSD_RETURN_IF_ERROR(state.accountant.SetFilterWeights(weights));
    if (state.residency.has_value()) {
      VIPSD_RETURN_IF_ERROR(state.residency->SetFilterWeights(std::move(weights)));
    }
  }
  return state;
}

// The state as this configuration continues it: a shorter window, a new
// interval, a lower residency M — refused when the window would grow or M
// would become unaffordable.
// The ceiling a state directory is held to can only go down: the adaptive
// filter's per-order budgets must be fixed before the first release
// (docs/privacy_accounting.md §5), and a claim stated at one ceiling must
// not be widened after releases were seen.
Status CheckCeilingNotRaised(const config::VipsdConfig& config, double held_to) {
  if (!config.is_private() || held_to <= 0 || config.driver.epsilon_ceiling <= held_to) {
    return Status::Ok();
  }
  return InvalidArgumentError(
      config::KeyWhere(config, "privacy.epsilon_ceiling") + ShortestNumber(config.driver.epsilon_ceiling) +
      " is above the ceiling this state directory is held to (" + ShortestNumber(held_to) +
      "): a ceiling can only be lowered, because the budget of every release so far was "
      "planned against it; to spend more, start a new state directory (the old one keeps the "
      "record of what was spent)");
}

// δ likewise: every ε of the directory is stated at the δ it records. A
// larger δ would make every past charge smaller (and the adaptive filter's
// budgets larger after releases were seen); a smaller one only tightens.
Status CheckDeltaNotRaised(const config::VipsdConfig& config, double held_to) {
  if (!config.is_private() || held_to <= 0 || config.driver.delta <= held_to) {
    return Status::Ok();
  }
  return InvalidArgumentError(
      config::KeyWhere(config, "privacy.delta") + ShortestNumber(config.driver.delta) +
      " is above the delta this state directory is held to (" + ShortestNumber(held_to) +
      "): delta can only be lowered, because every epsilon spent so far is stated at it and a "
      "larger delta would make past charges smaller; keep privacy.delta: " +
      ShortestNumber(held_to) + " (or lower), or start a new state directory");
}

Status AdjustToConfiguration(const config::VipsdConfig& config, SourceKind source_kind,
                             AccountingMode mode, LedgerState& state) {
  VIPSD_RETURN_IF_ERROR(CheckCeilingNotRaised(config, state.epsilon_ceiling));
  VIPSD_RETURN_IF_ERROR(CheckDeltaNotRaised(config, state.delta));
  if (config.is_private()) {
    state.epsilon_ceiling = config.driver.epsilon_ceiling;
    if (state.delta <= 0 && state.next_step > 1) {
      // A ledger written before δ was recorded (version 6 and older): the
      // configured δ is taken as the directory's from now on.
      Log(LogLevel::kWarning, kComponent,
          config::KeyWhere(config, "privacy.delta") + "the ledger does not record a delta (written "
          "by an earlier vipsd); recording " + ShortestNumber(config.driver.delta) +
          " for this state directory: every epsilon of it is stated at this delta from now "
          "on and it can only be lowered. If earlier runs used a smaller delta, stop now and "
          "configure that one");
    } else if (state.delta > 0 && config.driver.delta < state.delta) {
      Log(LogLevel::kInfo, kComponent,
          config::KeyWhere(config, "privacy.delta") + "lowering the delta this state directory is "
          "held to from " + ShortestNumber(state.delta) + " to " +
          ShortestNumber(config.driver.delta) + " (every epsilon, past ones included, is "
          "stated at the new delta)");
    }
    state.delta = config.driver.delta;
  }
  if (source_kind == SourceKind::kKafka) {
    // The window may be shortened, never lengthened, on a state directory;
    // the interval may change (slot times already passed keep theirs).
    if (config.window_steps != state.windows.window_slots()) {
      const Status changed = state.windows.SetWindowSlots(config.window_steps);
      if (!changed.ok()) {
        return InvalidArgumentError(config::KeyWhere(config, "schedule.window_steps") +
                                    "the ledger has a window of " +
                                    std::to_string(state.windows.window_slots()) +
                                    " slots (0 = all); it can only be shortened");
      }
    }
    if (config.step_interval_seconds != state.windows.interval_seconds()) {
      VIPSD_RETURN_IF_ERROR(state.windows.SetInterval(config.step_interval_seconds,
                                                      state.windows.last_slot()));
    }
  }
  if (mode == AccountingMode::kResidency) {
    // M may be lowered, never raised, against an existing ledger.
    const Status lowered = state.residency->SetMaxResidencySteps(config.window_steps);
    if (!lowered.ok()) {
      return InvalidArgumentError(config::KeyWhere(config, "schedule.window_steps") +
                                  std::string(lowered.message()));
    }
    VIPSD_ASSIGN_OR_RETURN(auto check, ResidencyWindowCheck(config, state));
    if (check.would_exceed) {
      return InvalidArgumentError(
          config::KeyWhere(config, "schedule.window_steps") + "a record that is a candidate in " +
          std::to_string(config.window_steps) + " steps at sampling_rate " +
          ShortestNumber(config.driver.mechanism.sampling_rate) + " and noise_multiplier " +
          ShortestNumber(config.driver.mechanism.noise_multiplier) + " would spend epsilon " +
          FixedDecimal(check.epsilon_after, 4) + " > epsilon_ceiling " +
          ShortestNumber(config.driver.epsilon_ceiling) + " (delta " +
          ShortestNumber(config.driver.delta) + ", schedule " +
          std::string(ScheduleKindName(state.schedule)) +
          "); lower the window or q, or raise sigma (vipsd-privacy plan --config FILE gives "
          "the largest window)");
    }
  }
  return Status::Ok();
}

// The model checkpoint, restored into `bundle` if it belongs to `state`'s
// ledger (or moved aside when the ledger of record does not charge it).
// Returns the step the model holds (0: none).
StatusOr<int64_t> RestoreCheckpoint(const config::VipsdConfig& config, ModelBundle& bundle,
                                    const LedgerState& state, bool had_ledger,
                                    const std::string& ledger_path, bool checkpoint_usable) {
  CheckpointStore checkpoints(config.state_directory);
  // Model state: the checkpoint must belong to this ledger.
  VIPSD_ASSIGN_OR_RETURN(auto checkpoint, checkpoints.Load());
  if (checkpoint.has_value() && !checkpoint_usable) {
    Log(LogLevel::kWarning, kComponent,
        "not resuming " + checkpoints.path() + " (model after step " +
            std::to_string(checkpoint->step) +
            "): the budget continues from the ledger of record on the ledger topic, which this "
            "directory's ledger does not match, so the checkpoint may hold a step the record "
            "does not charge; the model restarts from its prior (the file is kept as " +
            checkpoints.path() + ".discarded)");
    checkpoint.reset();
    // Out of the way before this directory's ledger becomes the record's:
    // left in place, the next start would find it beside a ledger it does
    // not belong to and refuse to start.
    const std::filesystem::path path(checkpoints.path());
    std::error_code error;
    std::filesystem::rename(path, path.string() + ".discarded", error);
    if (error) {
      return UnavailableError("cannot move " + path.string() + " aside: " + error.message());
    }
    VIPSD_RETURN_IF_ERROR(connectors::SyncDirectory(path.parent_path().string()));
  }
  int64_t model_step = 0;
  if (checkpoint.has_value()) {
    if (!had_ledger) {
      return DataLossError(checkpoints.path() + " exists but " + ledger_path +
                           " does not: the spent budget is unknown; refusing to start from "
                           "zero (restore the ledger or use an empty directory)");
    }
    if (checkpoint->run_id != state.run_id) {
      return FailedPreconditionError(checkpoints.path() + " belongs to run " +
                                     checkpoint->run_id + ", but " + ledger_path +
                                     " is run " + state.run_id +
                                     "; a checkpoint is only resumed next to its own ledger");
    }
    if (checkpoint->model_fingerprint != bundle.model_fingerprint ||
        checkpoint->model_type != bundle.model->type()) {
      return FailedPreconditionError(
          checkpoints.path() + " was written for a different model (type, dimensions or "
                               "vocabulary); the model cannot change for a state directory");
    }
    if (checkpoint->step > state.next_step - 1) {
      return DataLossError(checkpoints.path() + " holds the model after step " +
                           std::to_string(checkpoint->step) + ", but " + ledger_path +
                           " records only " + std::to_string(state.next_step - 1) +
                           " steps: the budget of the steps in between is unknown; refusing "
                           "to start");
    }
    const Status restored = bundle.model->RestoreCheckpoint(checkpoint->arrays);
    if (!restored.ok()) {
      return DataLossError(checkpoints.path() + ": " + std::string(restored.message()));
    }
    model_step = checkpoint->step;
    if (model_step < state.next_step - 1) {
      Log(LogLevel::kWarning, kComponent,
          "the checkpoint holds the model after step " + std::to_string(model_step) +
              "; steps up to " + std::to_string(state.next_step - 1) +
              " are spent budget without model progress (checkpoint_every > 1 or a crash)");
    }
  } else if (state.next_step > 1) {
    Log(LogLevel::kWarning, kComponent,
        "no model checkpoint in " + config.state_directory + ": the model restarts from its "
        "initial state; the spent budget continues from step " +
        std::to_string(state.next_step));
  }

  return model_step;
}

}  // namespace

StatusOr<PreparedState> PrepareState(const config::VipsdConfig& config, ModelBundle& bundle,
                                     std::optional<LedgerState> previous,
                                     const std::string& ledger_path, bool checkpoint_usable,
                                     bool dry_run) {
  VIPSD_RETURN_IF_ERROR(CheckInputsAndOutputsApart(config));
  const AccountingMode mode = config.accounting == config::Accounting::kGlobal
                                  ? AccountingMode::kGlobal
                                  : AccountingMode::kResidency;
  const SourceKind source_kind =
      config.source_type == config::SourceType::kKafka ? SourceKind::kKafka : SourceKind::kFile;
  const bool had_ledger = previous.has_value();
  if (had_ledger) {
    VIPSD_RETURN_IF_ERROR(CheckPrivacyModeOfDirectory(config, *previous, ledger_path));
  }
  VIPSD_ASSIGN_OR_RETURN(const ScheduleKind schedule,
                         ResolveSchedule(config, had_ledger ? &*previous : nullptr, ledger_path));
  LedgerState state;
  if (had_ledger) {
    state = std::move(*previous);
    VIPSD_RETURN_IF_ERROR(
        CheckLedgerBelongs(config, bundle, state, ledger_path, mode, source_kind));
  } else {
    VIPSD_ASSIGN_OR_RETURN(state,
                           FreshState(config, bundle, ledger_path, mode, source_kind, schedule));
  }
  VIPSD_RETURN_IF_ERROR(AdjustToConfiguration(config, source_kind, mode, state));
  if (dry_run) {
    // Only whether this state may be continued under this configuration
    // (the model checkpoint is decided with the state actually continued).
    VIPSD_RETURN_IF_ERROR(CheckFirstStepFits(config, state));
    return PreparedState{std::move(state), 0};
  }
  VIPSD_ASSIGN_OR_RETURN(const int64_t model_step,
                         RestoreCheckpoint(config, bundle, state, had_ledger, ledger_path,
                                           checkpoint_usable));
  VIPSD_RETURN_IF_ERROR(CheckFirstStepFits(config, state));
  return PreparedState{std::move(state), model_step};
}

Status CheckFixedSeedFlag(const config::VipsdConfig& config, const DaemonOptions& options) {
  if (config.noise_mode == config::NoiseMode::kFixedSeed && !options.allow_fixed_seed_noise) {
    return InvalidArgumentError(
        config::KeyWhere(config, "privacy.noise") +
        "fixed_seed noise is reproducible and NOT private; it also needs the command-line flag "
        "--insecure-fixed-seed-noise (tests and experiments only)");
  }
  return Status::Ok();
}

Status CheckStartUp(const config::VipsdConfig& config, const DaemonOptions& options) {
  VIPSD_RETURN_IF_ERROR(CheckFixedSeedFlag(config, options));
  // Federated mode: the roster's keys, and a holder's secret key against
  // its roster entry (a start refuses an unknown key the same way).
  if (config.federated()) {
    const Status roster = RosterOf(config.federation).status();
    if (!roster.ok()) {
      return InvalidArgumentError(config::KeyWhere(config, "federation.holders") +
                                  std::string(roster.message()));
    }
    if (config.federation.role == config::FederationRole::kHolder) {
      const Status key = HolderMaskerOf(config.federation).status();
      if (!key.ok()) {
        return InvalidArgumentError(config::KeyWhere(config, "federation.secret_key") +
                                    std::string(key.message()));
      }
    }
  }
  VIPSD_ASSIGN_OR_RETURN(ModelBundle bundle, BuildModel(config));
  const Status address = ValidateMetricsListenAddress(config.metrics_listen);
  if (!address.ok()) {
    return InvalidArgumentError(config::KeyWhere(config, "metrics.listen") + std::string(address.message()));
  }
  // The state directory: the daemon creates it if missing, so the nearest
  // existing ancestor must be a writable directory.
  namespace fs = std::filesystem;
  std::error_code error;
  fs::path existing = fs::absolute(config.state_directory, error);
  while (!existing.empty() && !fs::exists(existing, error) && existing != existing.parent_path()) {
    existing = existing.parent_path();
  }
  if (!fs::is_directory(existing, error)) {
    return InvalidArgumentError(config::KeyWhere(config, "state.directory") + existing.string() +
                                " is not a directory");
  }
  if (::access(existing.c_str(), W_OK | X_OK) != 0) {
    return InvalidArgumentError(config::KeyWhere(config, "state.directory") + existing.string() +
                                " is not writable by this user (the ledger and checkpoints "
                                "are written there)");
  }
  const std::string ledger_path = (fs::path(config.state_directory) / "ledger").string();
  std::optional<LedgerState> previous;
  if (fs::exists(ledger_path, error)) {
    VIPSD_ASSIGN_OR_RETURN(std::string bytes, connectors::ReadWholeFile(ledger_path));
    VIPSD_ASSIGN_OR_RETURN(LedgerState state, Ledger::Decode(bytes, ledger_path));
    previous = std::move(state);
  }
  return PrepareState(config, bundle, std::move(previous), ledger_path).status();
}

StatusOr<PreparedState> PrepareStart(const config::VipsdConfig& config, ModelBundle& bundle,
                                     const Ledger& ledger, LedgerReplica* replica,
                                     const DaemonOptions& options) {
  VIPSD_ASSIGN_OR_RETURN(auto previous, ledger.Load());
  if (replica != nullptr) {
    // The job's ledger of record: first what this process would continue
    // from, checked against its configuration without claiming anything (a
    // misconfigured process must refuse before it fences a healthy owner);
    // then the claim (fencing any earlier owner), continuing from the
    // topic's state of record (daemon/state/ledger_replica.h).
    VIPSD_ASSIGN_OR_RETURN(auto peeked, replica->Peek(previous, ledger.path()));
    const std::string peeked_from =
        replica->restored_from().empty() ? ledger.path() : replica->restored_from();
    VIPSD_RETURN_IF_ERROR(PrepareState(config, bundle, std::move(peeked), peeked_from,
                                       /*checkpoint_usable=*/false, /*dry_run=*/true)
                              .status());
    VIPSD_ASSIGN_OR_RETURN(previous, replica->Claim(std::move(previous), ledger.path()));
  }
  VIPSD_ASSIGN_OR_RETURN(PreparedState prepared,
                         PrepareState(config, bundle, std::move(previous), ledger.path(),
                                      replica == nullptr || replica->local_is_record()));
  if (replica != nullptr && !options.takeover_model.empty()) {
    prepared.model_step = ContinueFromTakeoverModel(options.takeover_model, prepared.state,
                                                    bundle, prepared.model_step);
  }
  return prepared;
}

StatusOr<std::unique_ptr<privacy::NoiseSource>> NewNoiseSource(const config::VipsdConfig& config) {
  if (config.noise_mode == config::NoiseMode::kSecure) {
    VIPSD_ASSIGN_OR_RETURN(auto secure, privacy::SecureNoiseSource::Create());
    return std::unique_ptr<privacy::NoiseSource>(std::move(secure));
  }
  Log(LogLevel::kWarning, kComponent,
      "NOT PRIVATE: fixed-seed noise (privacy.noise: fixed_seed, --insecure-fixed-seed-noise); "
      "releases of this run are reproducible and carry no privacy guarantee");
  VIPSD_ASSIGN_OR_RETURN(auto fixed, privacy::SecureNoiseSource::CreateReproducible(config.noise_seed));
  return std::unique_ptr<privacy::NoiseSource>(std::move(fixed));
}

int64_t ContinueFromTakeoverModel(const std::string& takeover_model, const LedgerState& state,
                                  ModelBundle& bundle, int64_t model_step) {
  // A working standby took over: the model of the last plan it followed
  // is the record's lineage when its run id is the record's and its step
  // is one the record charges.
  auto plan_model = CheckpointStore::Decode(takeover_model, "the last plan's model");
  Status usable = plan_model.status();
  if (usable.ok() && (plan_model->run_id != state.run_id ||
                      plan_model->model_type != bundle.model->type() ||
                      plan_model->model_fingerprint != bundle.model_fingerprint ||
                      plan_model->step > state.next_step - 1)) {
    usable = FailedPreconditionError("of another run or model, or of a step (" +
                                     std::to_string(plan_model->step) +
                                     ") the record does not charge");
  }
  if (usable.ok() && plan_model->step > model_step) {
    usable = bundle.model->RestoreCheckpoint(plan_model->arrays);
    if (usable.ok()) {
      model_step = plan_model->step;
      Log(LogLevel::kInfo, kComponent,
          "continuing from the model of step " + std::to_string(model_step) +
              " (the last plan this process worked on); the budget continues from step " +
              std::to_string(state.next_step));
    }
  }
  if (!usable.ok()) {
    Log(LogLevel::kWarning, kComponent,
        "not continuing from the last plan's model (" + std::string(usable.message()) +
            "); the model is " +
            (model_step > 0 ? "the checkpoint's" : std::string("its prior")));
  }
  return model_step;
}

StatusOr<ReloadedState> CheckReload(const config::VipsdConfig& running,
                                    const config::VipsdConfig& next, const LedgerState& state,
                                    const std::string& ledger_path, bool paced) {
  // Residency: the new (q, σ, M) must be affordable, and M may only drop.
  // A fixed schedule pins (q, σ) for the state directory.
  if (state.schedule == ScheduleKind::kFixed && running.is_private()) {
    VIPSD_RETURN_IF_ERROR(ResolveSchedule(next, &state, ledger_path).status());
  }
  VIPSD_RETURN_IF_ERROR(CheckCeilingNotRaised(next, state.epsilon_ceiling));
  ReloadedState reloaded{state.residency, state.windows};
  if (state.mode == AccountingMode::kResidency) {
    VIPSD_ASSIGN_OR_RETURN(auto check, ResidencyWindowCheck(next, state));
    if (check.would_exceed) {
      return InvalidArgumentError(
          config::KeyWhere(next, "schedule.window_steps") + std::to_string(next.window_steps) +
          " steps at the new sampling_rate/noise_multiplier would spend epsilon " +
          FixedDecimal(check.epsilon_after, 4) + " > epsilon_ceiling " +
          ShortestNumber(next.driver.epsilon_ceiling));
    }
    const Status lowered = reloaded.residency->SetMaxResidencySteps(next.window_steps);
    if (!lowered.ok()) {
      return InvalidArgumentError(config::KeyWhere(next, "schedule.window_steps") +
                                  std::string(lowered.message()));
    }
  }
  if (paced && next.window_steps != reloaded.windows.window_slots()) {
    const Status shortened = reloaded.windows.SetWindowSlots(next.window_steps);
    if (!shortened.ok()) {
      return InvalidArgumentError(config::KeyWhere(next, "schedule.window_steps") +
                                  std::string(shortened.message()));
    }
  }
  return reloaded;
}

}  // namespace vipsd::daemon
