#include "daemon/daemon.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>

#include "core/base/format.h"
#include "core/base/log.h"
#include "core/privacy/filter_weights.h"
#include "core/privacy/secure_noise.h"
#include "connectors/file/file_util.h"
#include "core/release/release.h"
#include "daemon/budget.h"
#include "daemon/checkpoint.h"
#include "daemon/path_checks.h"

namespace vipsd::daemon {
namespace {

constexpr std::string_view kComponent = "daemon";
constexpr size_t kPollBatch = 512;
constexpr auto kPollTimeout = std::chrono::milliseconds(200);
constexpr int64_t kNoTarget = std::numeric_limits<int64_t>::max();

double WallNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string Fixed(double value, int digits = 4) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%.*f", digits, value);
  return buffer;
}

// Public settings and ε in log lines and alerts: shortest round-trip text.
std::string JsonNumber(double value) { return ShortestNumber(value); }

privacy::Adaptivity Adaptive() {
  // (q, σ) may change by reload after releases were seen: always account as
  // an RDP privacy filter (docs/privacy_accounting.md §5), from the first
  // step, so that ε is consistent across restarts and reloads.
  return privacy::Adaptivity::kAdaptiveFilter;
}

// Files a fresh start may find in the state directory.
bool IsHarmlessStateFile(const std::string& name) {
  return name == "lock" || name == "bootstrap" || name == "ledger.tmp" ||
         name == "checkpoint.tmp" || name == "status.json.tmp";
}

std::string Where(const config::VipsdConfig& config, const std::string& key) {
  return config.file + ":" + std::to_string(config.line_of(key)) + ": " + key + ": ";
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
        "; type, dimensions or vocabulary differ); the model cannot change for a state "
        "directory (use a new one)");
  }
  if (state.source != source) {
    return FailedPreconditionError(
        ledger_path + " was written by a " + std::string(SourceKindName(state.source)) +
        " run; this is a " + std::string(SourceKindName(source)) +
        " run (a state directory serves one kind of source; use a new one)");
  }
  if (state.mode != mode) {
    return FailedPreconditionError(
        Where(config, "privacy.accounting") + "the ledger " + ledger_path + " was written in " +
        std::string(AccountingModeName(state.mode)) +
        " mode; the accounting mode cannot change for a state directory (use a new one)");
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
        Where(config, config.is_private() ? "privacy.noise" : "privacy.noise_multiplier") +
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

// ε of one record that is a candidate in `window_steps` steps of the
// configured (q, σ), under the state directory's schedule: the start-up and
// reload check of residency mode.
StatusOr<privacy::CeilingCheck> ResidencyWindowCheck(const config::VipsdConfig& config,
                                                     const LedgerState& state) {
  if (state.schedule == ScheduleKind::kAdaptive) {
    return privacy::ResidencyAccountant::CheckConfiguration(
        config.window_steps, config.driver.sampling_rate, config.driver.noise_multiplier,
        config.driver.delta, config.driver.epsilon_ceiling, Adaptive(),
        state.accountant.filter_weights());
  }
  VIPSD_ASSIGN_OR_RETURN(auto fixed,
                         privacy::FixedScheduleAccountant::Create(config.driver.sampling_rate,
                                                                  config.driver.noise_multiplier));
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
        Where(config, "privacy.schedule") + "the ledger " + ledger_path + " was written with "
        "schedule " + std::string(ScheduleKindName(ledger->schedule)) +
        "; the schedule cannot change for a state directory (remove the key to keep the "
        "ledger's, or use a new state directory)");
  }
  if (ledger->schedule == ScheduleKind::kFixed && config.is_private()) {
    if (config.driver.sampling_rate != ledger->fixed_sampling_rate) {
      return FailedPreconditionError(
          Where(config, "privacy.sampling_rate") + "schedule fixed pins it to " +
          JsonNumber(ledger->fixed_sampling_rate) + " for this state directory (ledger " +
          ledger_path + "); got " + JsonNumber(config.driver.sampling_rate));
    }
    if (config.driver.noise_multiplier != ledger->fixed_noise_multiplier) {
      return FailedPreconditionError(
          Where(config, "privacy.noise_multiplier") + "schedule fixed pins it to " +
          JsonNumber(ledger->fixed_noise_multiplier) + " for this state directory (ledger " +
          ledger_path + "); got " + JsonNumber(config.driver.noise_multiplier));
    }
  }
  return ledger->schedule;
}

struct PreparedState {
  LedgerState state;
  int64_t model_step = 0;  // the step the restored checkpoint holds (0: none)
};

// A new state directory whose very first step would cross the ceiling
// would run nothing: refuse it instead of "halting" at ε = 0.
Status CheckFirstStepFits(const config::VipsdConfig& config, const LedgerState& state) {
  if (!config.is_private() || state.next_step != 1 || state.mode == AccountingMode::kResidency) {
    return Status::Ok();  // residency: the window check covers it (M ≥ 1)
  }
  const double q = config.driver.sampling_rate;
  const double sigma = config.driver.noise_multiplier;
  double first = 0;
  if (state.schedule == ScheduleKind::kFixed) {
    VIPSD_ASSIGN_OR_RETURN(auto fixed, privacy::FixedScheduleAccountant::Create(q, sigma));
    VIPSD_ASSIGN_OR_RETURN(auto at, fixed.Epsilon(1, config.driver.delta));
    first = at.epsilon;
  } else {
    VIPSD_ASSIGN_OR_RETURN(auto check,
                           state.accountant.CheckCeiling(q, sigma, 1, config.driver.delta,
                                                         config.driver.epsilon_ceiling,
                                                         privacy::RdpConversion::kImproved,
                                                         Adaptive()));
    first = check.epsilon_after;
  }
  if (first > config.driver.epsilon_ceiling) {
    return InvalidArgumentError(
        Where(config, "privacy.epsilon_ceiling") + "a single step at sampling_rate " +
        JsonNumber(q) + " and noise_multiplier " + JsonNumber(sigma) + " already spends epsilon " +
        Fixed(first) + " > " + JsonNumber(config.driver.epsilon_ceiling) + " (delta " +
        JsonNumber(config.driver.delta) + ", schedule " +
        std::string(ScheduleKindName(state.schedule)) +
        "): nothing could run; raise the ceiling or sigma, or lower q (vipsd-privacy plan "
        "--config FILE)");
  }
  return Status::Ok();
}

// Everything a start checks and prepares against the state directory's
// ledger `previous` (none: a new directory) and checkpoint, without writing
// anything: the daemon's start and `vipsd --check-config` both run it.
// Restores the checkpoint into `bundle`'s model.
StatusOr<PreparedState> PrepareState(const config::VipsdConfig& config, ModelBundle& bundle,
                                     std::optional<LedgerState> previous,
                                     const std::string& ledger_path,
                                     bool checkpoint_usable = true, bool dry_run = false) {
  VIPSD_RETURN_IF_ERROR(CheckInputsAndOutputsApart(config));
  const AccountingMode mode = config.accounting == config::Accounting::kGlobal
                                  ? AccountingMode::kGlobal
                                  : AccountingMode::kResidency;
  const SourceKind source_kind =
      config.source_type == config::SourceType::kKafka ? SourceKind::kKafka : SourceKind::kFile;
  CheckpointStore checkpoints(config.state_directory);
  LedgerState state;
  if (previous.has_value()) {
    VIPSD_RETURN_IF_ERROR(CheckPrivacyModeOfDirectory(config, *previous, ledger_path));
  }
  VIPSD_ASSIGN_OR_RETURN(const ScheduleKind schedule,
                         ResolveSchedule(config, previous.has_value() ? &*previous : nullptr,
                                         ledger_path));
  if (previous.has_value()) {
    state = std::move(*previous);
    VIPSD_RETURN_IF_ERROR(
        CheckLedgerBelongs(config, bundle, state, ledger_path, mode, source_kind));
  } else {
    // No ledger: a fresh start only if nothing else of a previous run is
    // here (a missing ledger next to a checkpoint is lost state, not a new
    // budget).
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
    if (schedule == ScheduleKind::kFixed) {
      state.fixed_sampling_rate = config.driver.sampling_rate;
      state.fixed_noise_multiplier = config.driver.noise_multiplier;
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
              config.driver.sampling_rate, config.driver.noise_multiplier, config.driver.delta,
              config.driver.epsilon_ceiling,
              mode == AccountingMode::kResidency ? config.window_steps : 0));
      VIPSD_RETURN_IF_ERROR(state.accountant.SetFilterWeights(weights));
      if (state.residency.has_value()) {
        VIPSD_RETURN_IF_ERROR(state.residency->SetFilterWeights(std::move(weights)));
      }
    }
  }
  if (source_kind == SourceKind::kKafka) {
    // The window may be shortened, never lengthened, on a state directory;
    // the interval may change (slot times already passed keep theirs).
    if (config.window_steps != state.windows.window_slots()) {
      const Status changed = state.windows.SetWindowSlots(config.window_steps);
      if (!changed.ok()) {
        return InvalidArgumentError(Where(config, "schedule.window_steps") +
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
      return InvalidArgumentError(Where(config, "schedule.window_steps") +
                                  std::string(lowered.message()));
    }
    VIPSD_ASSIGN_OR_RETURN(auto check, ResidencyWindowCheck(config, state));
    if (check.would_exceed) {
      return InvalidArgumentError(
          Where(config, "schedule.window_steps") + "a record that is a candidate in " +
          std::to_string(config.window_steps) + " steps at sampling_rate " +
          JsonNumber(config.driver.sampling_rate) + " and noise_multiplier " +
          JsonNumber(config.driver.noise_multiplier) + " would spend epsilon " +
          Fixed(check.epsilon_after) + " > epsilon_ceiling " +
          JsonNumber(config.driver.epsilon_ceiling) + " (delta " +
          JsonNumber(config.driver.delta) + ", schedule " +
          std::string(ScheduleKindName(state.schedule)) +
          "); lower the window or q, or raise sigma (vipsd-privacy plan --config FILE gives "
          "the largest window)");
    }
  }

  if (dry_run) {
    // Only whether this state may be continued under this configuration
    // (the model checkpoint is decided with the state actually continued).
    VIPSD_RETURN_IF_ERROR(CheckFirstStepFits(config, state));
    return PreparedState{std::move(state), 0};
  }
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
    if (!previous.has_value()) {
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

  VIPSD_RETURN_IF_ERROR(CheckFirstStepFits(config, state));
  return PreparedState{std::move(state), model_step};
}

// A config key alone must never turn the privacy off.
Status CheckFixedSeedFlag(const config::VipsdConfig& config, const DaemonOptions& options) {
  if (config.noise_mode == config::NoiseMode::kFixedSeed && !options.allow_fixed_seed_noise) {
    return InvalidArgumentError(
        Where(config, "privacy.noise") +
        "fixed_seed noise is reproducible and NOT private; it also needs the command-line flag "
        "--insecure-fixed-seed-noise (tests and experiments only)");
  }
  return Status::Ok();
}

}  // namespace

std::string StreamName(const std::string& topic, int32_t partition) {
  return topic + ":" + std::to_string(partition);
}

svi::DriverConfig Daemon::DriverConfigFor(const config::VipsdConfig& config) const {
  svi::DriverConfig driver = config.driver;
  driver.adaptivity = Adaptive();
  // The daemon checks the budget itself (BudgetAdmitsStep) in residency mode
  // and for a fixed schedule; the driver's own check is the RDP filter.
  driver.enforce_ceiling = config.accounting == config::Accounting::kGlobal &&
                           state_.schedule == ScheduleKind::kAdaptive;
  return driver;
}

Status CheckStartUp(const config::VipsdConfig& config, const DaemonOptions& options) {
  VIPSD_RETURN_IF_ERROR(CheckFixedSeedFlag(config, options));
  VIPSD_ASSIGN_OR_RETURN(ModelBundle bundle, BuildModel(config));
  const Status address = ValidateMetricsListenAddress(config.metrics_listen);
  if (!address.ok()) {
    return InvalidArgumentError(Where(config, "metrics.listen") + std::string(address.message()));
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
    return InvalidArgumentError(Where(config, "state.directory") + existing.string() +
                                " is not a directory");
  }
  if (::access(existing.c_str(), W_OK | X_OK) != 0) {
    return InvalidArgumentError(Where(config, "state.directory") + existing.string() +
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

StatusOr<std::unique_ptr<Daemon>> Daemon::Create(const config::VipsdConfig& config,
                                                 SourceFactory make_source,
                                                 std::unique_ptr<OutputSink> sink,
                                                 Metrics* metrics, DaemonHooks hooks,
                                                 DaemonOptions options,
                                                 std::unique_ptr<LedgerReplica> replica,
                                                 std::unique_ptr<WorkExchange> exchange) {
  if (metrics == nullptr || sink == nullptr || !make_source) {
    return InvalidArgumentError("the daemon needs a source factory, a sink and metrics");
  }
  if (exchange != nullptr && (replica == nullptr || config.source_type != config::SourceType::kKafka)) {
    return InvalidArgumentError("shared work needs the ledger topic and a Kafka source");
  }
  VIPSD_RETURN_IF_ERROR(CheckFixedSeedFlag(config, options));
  VIPSD_ASSIGN_OR_RETURN(ModelBundle bundle, BuildModel(config));

  // Ledger: the budget of record.
  VIPSD_ASSIGN_OR_RETURN(Ledger ledger, Ledger::Open(config.state_directory));
  VIPSD_ASSIGN_OR_RETURN(auto previous, ledger.Load());
  if (replica != nullptr) {
    // The job's ledger of record: first what this process would continue
    // from, checked against its configuration without claiming anything (a
    // misconfigured process must refuse before it fences a healthy owner);
    // then the claim (fencing any earlier owner), continuing from the
    // topic's state of record (daemon/ledger_replica.h).
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
  LedgerState state = std::move(prepared.state);
  int64_t model_step = prepared.model_step;
  if (replica != nullptr && !options.takeover_model.empty()) {
    // A working standby took over: the model of the last plan it followed
    // is the record's lineage when its run id is the record's and its step
    // is one the record charges.
    auto plan_model = CheckpointStore::Decode(options.takeover_model, "the last plan's model");
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
  }

  // Noise.
  std::unique_ptr<privacy::NoiseSource> noise;
  if (config.noise_mode == config::NoiseMode::kSecure) {
    VIPSD_ASSIGN_OR_RETURN(auto secure, privacy::SecureNoiseSource::Create());
    noise = std::move(secure);
  } else {
    Log(LogLevel::kWarning, kComponent,
        "NOT PRIVATE: fixed-seed noise (privacy.noise: fixed_seed, --insecure-fixed-seed-noise); "
        "releases of this run are reproducible and carry no privacy guarantee");
    VIPSD_ASSIGN_OR_RETURN(noise, privacy::SecureNoiseSource::CreateReproducible(config.noise_seed));
  }

  std::unique_ptr<Daemon> daemon(new Daemon(config, options, std::move(bundle), std::move(sink),
                                            metrics, std::move(hooks), std::move(ledger),
                                            std::move(state), std::move(noise)));
  daemon->model_step_ = model_step;
  daemon->replica_ = std::move(replica);
  if (exchange != nullptr) {
    daemon->role_ = Role::kCoordinator;
    daemon->exchange_ = std::move(exchange);
  }
  daemon->instance_ = options.instance_id;
  if (daemon->replica_ != nullptr) {
    metrics->ledger_owner_epoch().Set(static_cast<double>(daemon->replica_->epoch()));
  }
  if (daemon->state_.schedule == ScheduleKind::kFixed && config.is_private()) {
    VIPSD_ASSIGN_OR_RETURN(daemon->fixed_schedule_,
                           privacy::FixedScheduleAccountant::Create(
                               daemon->state_.fixed_sampling_rate,
                               daemon->state_.fixed_noise_multiplier));
  }
  daemon->pool_.set_max_candidate_steps(daemon->paced_ ? config.window_steps : 0);
  VIPSD_ASSIGN_OR_RETURN(
      daemon->driver_,
      svi::StepDriver::Create(daemon->bundle_.model.get(), daemon->noise_.get(),
                              config.is_private() ? &daemon->state_.accountant : nullptr,
                              daemon->DriverConfigFor(config), daemon->state_.next_step));
  if (!daemon->paced_) {
    // The offline run: max_steps and max_epochs (one epoch = 1/q steps,
    // validated against overflow by the configuration) bound this run.
    int64_t limit = config.max_steps;
    if (config.max_epochs > 0) {
      const auto epochs =
          static_cast<int64_t>(std::ceil(config.max_epochs / config.driver.sampling_rate));
      limit = limit > 0 ? std::min(limit, epochs) : epochs;
    }
    daemon->step_limit_ = limit;
  }

  // The source resumes each partition where the ledger's windows begin.
  daemon->PublishResumeOffsets();
  Daemon* self = daemon.get();
  VIPSD_ASSIGN_OR_RETURN(daemon->source_,
                         make_source([self](const std::string& topic, int32_t partition)
                                         -> std::optional<int64_t> {
                           std::lock_guard<std::mutex> lock(self->mutex_);
                           const auto it =
                               self->resume_offsets_.find(StreamName(topic, partition));
                           if (it == self->resume_offsets_.end()) return std::nullopt;
                           return it->second;
                         }));
  return daemon;
}

StatusOr<std::unique_ptr<Daemon>> Daemon::CreateWorker(const config::VipsdConfig& config,
                                                       SourceFactory make_source,
                                                       std::unique_ptr<OutputSink> sink,
                                                       Metrics* metrics,
                                                       std::unique_ptr<WorkExchange> exchange,
                                                       DaemonOptions options) {
  if (metrics == nullptr || sink == nullptr || !make_source || exchange == nullptr ||
      config.source_type != config::SourceType::kKafka) {
    return InvalidArgumentError(
        "a worker needs a source factory, a sink, metrics, a work exchange and a Kafka source");
  }
  VIPSD_RETURN_IF_ERROR(CheckFixedSeedFlag(config, options));
  VIPSD_ASSIGN_OR_RETURN(ModelBundle bundle, BuildModel(config));
  // The state directory stays locked while this process works (so that no
  // second process uses it), but a worker writes nothing there: the budget
  // is the coordinator's.
  VIPSD_ASSIGN_OR_RETURN(Ledger ledger, Ledger::Open(config.state_directory));
  LedgerState state;
  state.model_type = bundle.model->type();
  state.model_fingerprint = bundle.model_fingerprint;
  // A worker draws no randomness: sampling and E-step seeds come from the
  // plan's key, the noise from the coordinator. The driver needs a source.
  VIPSD_ASSIGN_OR_RETURN(auto noise, privacy::SecureNoiseSource::Create());
  std::unique_ptr<Daemon> daemon(new Daemon(config, options, std::move(bundle), std::move(sink),
                                            metrics, DaemonHooks{}, std::move(ledger),
                                            std::move(state), std::move(noise)));
  daemon->role_ = Role::kWorker;
  daemon->exchange_ = std::move(exchange);
  daemon->make_source_ = std::move(make_source);
  daemon->instance_ = options.instance_id;
  return daemon;
}

Daemon::Daemon(const config::VipsdConfig& config, DaemonOptions options, ModelBundle bundle,
               std::unique_ptr<OutputSink> sink, Metrics* metrics, DaemonHooks hooks,
               Ledger ledger, LedgerState state, std::unique_ptr<privacy::NoiseSource> noise)
    : options_(options),
      paced_(config.source_type == config::SourceType::kKafka),
      config_(config),
      bundle_(std::move(bundle)),
      sink_(std::move(sink)),
      metrics_(metrics),
      hooks_(std::move(hooks)),
      ledger_(std::move(ledger)),
      state_(std::move(state)),
      committed_(state_),
      checkpoints_(config.state_directory),
      noise_(std::move(noise)) {}

Daemon::~Daemon() {
  RequestStop();
  if (clock_thread_.joinable()) clock_thread_.join();
  if (ingest_thread_.joinable()) ingest_thread_.join();
}

void Daemon::RequestStop() {
  std::lock_guard<std::mutex> lock(mutex_);
  stop_ = true;
  wake_.notify_all();
}

void Daemon::RequestReload() {
  std::lock_guard<std::mutex> lock(mutex_);
  reload_ = true;
  wake_.notify_all();
}

DaemonStatus Daemon::status() const {
  std::lock_guard<std::mutex> lock(mutex_);
  DaemonStatus status = status_;
  status.records_pooled = records_pooled_;
  status.records_rejected = records_rejected_;
  return status;
}

double Daemon::Now() const { return WallNow(); }

bool Daemon::SleepUntil(double unix_time) {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    if (stop_) return false;
    const double left = unix_time - Now();
    if (left <= 0) return true;
    wake_.wait_for(lock, std::chrono::duration<double>(std::min(left, 1.0)));
  }
}

std::string Daemon::AccountantName() const {
  auto spent = LedgerSpent(state_, config_.driver.delta,
                           fixed_schedule_.has_value() ? &*fixed_schedule_ : nullptr);
  if (spent.ok()) return spent->accountant;
  return state_.schedule == ScheduleKind::kFixed ? "fixed_rdp" : "rdp_filter";
}

double Daemon::EpsilonOf(const LedgerState& state) const {
  if (!config_.is_private()) return 0;
  auto spent = LedgerSpent(state, config_.driver.delta,
                           fixed_schedule_.has_value() ? &*fixed_schedule_ : nullptr);
  return spent.ok() ? spent->epsilon : std::numeric_limits<double>::infinity();
}

double Daemon::EpsilonSpent() const { return EpsilonOf(state_); }

double Daemon::CommittedEpsilon() const { return EpsilonOf(committed_); }

void Daemon::UpdateBudgetMetrics() {
  // What is durable, never a step whose ledger commit has not succeeded.
  const double spent = CommittedEpsilon();
  metrics_->SetPrivacyBudget(spent, config_.is_private() ? config_.driver.epsilon_ceiling : 0,
                             config_.is_private() ? config_.driver.delta : 0);
  metrics_->noise_multiplier().Set(config_.driver.noise_multiplier);
  metrics_->sampling_rate().Set(config_.driver.sampling_rate);
  metrics_->step_interval_seconds().Set(config_.step_interval_seconds);
  metrics_->pool_capacity().Set(static_cast<double>(config_.pool_capacity));
  metrics_->privacy_halted().Set(halted_ ? 1 : 0);
  metrics_->window_overflow().Set(overflow_ ? 1 : 0);
  metrics_->privacy_budget_warning_level().Set(state_.warning_level);
  std::lock_guard<std::mutex> lock(mutex_);
  status_.epsilon_spent = spent;
  status_.halted = halted_;
  status_.window_overflow = overflow_;
  status_.next_step = committed_.next_step;
  status_.steps_run = steps_run_ - (uncommitted_step_.has_value() ? 1 : 0);
  status_.slots_skipped = slots_skipped_;
  status_.last_slot = state_.windows.last_slot();
  status_.pool_records = pool_.size();
}

void Daemon::PublishResumeOffsets() {
  std::map<std::string, int64_t> resume;
  for (const std::string& stream : state_.windows.Streams()) {
    resume[stream] = state_.windows.ResumeOffset(stream);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  resume_offsets_ = std::move(resume);
  for (const auto& [stream, offset] : resume_offsets_) covered_streams_.insert(stream);
}

uint32_t Daemon::StreamId(const std::string& stream) {
  auto [it, inserted] = stream_ids_.emplace(stream, static_cast<uint32_t>(stream_names_.size()));
  if (inserted) {
    stream_names_.push_back(stream);
    staging_.emplace_back();
    next_unread_.push_back(0);
    target_.push_back(kNoTarget);
  }
  return it->second;
}

// ---------------------------------------------------------------------------
// Ingest thread

void Daemon::IngestLoop() {
  auto backoff = std::chrono::milliseconds(100);
  std::set<std::string> paused;
  for (;;) {
    std::set<std::string> pause, resume;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (stop_) return;
      // A stream read up to the cut the step thread gathers for is paused,
      // so that records of later slots do not crowd the window's.
      for (uint32_t id = 0; id < stream_names_.size(); ++id) {
        const bool done = target_[id] != kNoTarget && next_unread_[id] >= target_[id];
        const std::string& name = stream_names_[id];
        if (done && paused.count(name) == 0) pause.insert(name);
        if (!done && paused.count(name) > 0) resume.insert(name);
      }
      if (pause.empty() && resume.empty() && capacity_ > 0 &&
          pool_size_ + staged_in_window_ > capacity_) {
        // Back-pressure: the window's records fill pool.capacity and one
        // more was read (so an overflow is a fact, never a guess about
        // unread offsets that may be dead letters or transaction markers);
        // leave the rest in Kafka. The step thread decides whether the slot
        // overflows.
        wake_.wait_for(lock, std::chrono::milliseconds(100));
        continue;
      }
    }
    if (!pause.empty()) {
      const Status paused_ok = source_->Pause(pause);
      if (!paused_ok.ok()) Log(LogLevel::kWarning, kComponent, "pause: " + paused_ok.ToString());
      paused.insert(pause.begin(), pause.end());
    }
    if (!resume.empty()) {
      const Status resumed = source_->Resume(resume);
      if (!resumed.ok()) Log(LogLevel::kWarning, kComponent, "resume: " + resumed.ToString());
      for (const auto& name : resume) paused.erase(name);
    }
    auto polled = source_->Poll(kPollBatch, kPollTimeout);
    if (!polled.ok()) {
      Log(LogLevel::kError, kComponent, "input: " + polled.status().ToString());
      metrics_->kafka_errors_total(KafkaErrorKind::kConsume).Increment();
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait_for(lock, backoff, [&] { return stop_; });
      backoff = std::min(backoff * 2, std::chrono::milliseconds(5000));
      continue;
    }
    backoff = std::chrono::milliseconds(100);
    if (polled->assignment.has_value()) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (assigned_ != polled->assignment) {
        assigned_ = std::move(polled->assignment);
        wake_.notify_all();
      }
    }
    if (polled->records.empty() && polled->reached_end.empty()) continue;
    const Status status = IngestBatch(*polled);
    if (!status.ok()) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!stop_) {
        ingest_error_ = status;
        stop_ = true;
        wake_.notify_all();
      }
      return;
    }
  }
}

Status Daemon::IngestBatch(PollBatch& batch) {
  std::vector<InputRecord>& records = batch.records;
  // Re-delivered records (a rebalance or a restart re-reads from an earlier
  // offset) are dropped before they are decoded: the pool holds each offset
  // once.
  std::vector<bool> duplicate(records.size(), false);
  std::set<std::string> uncovered;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    std::map<uint32_t, int64_t> seen;
    for (size_t i = 0; i < records.size(); ++i) {
      const std::string stream = StreamName(records[i].topic, records[i].partition);
      const uint32_t id = StreamId(stream);
      int64_t& next = seen.try_emplace(id, next_unread_[id]).first->second;
      duplicate[i] = records[i].offset < next;
      next = std::max(next, records[i].offset + 1);
      // A worker's records are the coordinator's to account for: its plans
      // name where every partition resumes.
      if (role_ == Role::kWorker) covered_streams_.insert(stream);
      if (covered_streams_.count(stream) == 0) uncovered.insert(stream);
    }
  }
  std::vector<std::optional<model::Record>> decoded(records.size());
  std::vector<std::pair<size_t, connectors::RejectReason>> rejected;
  for (size_t i = 0; i < records.size(); ++i) {
    metrics_->records_consumed_total(records[i].topic).Increment();
    if (duplicate[i]) continue;
    if (records[i].oversize) {
      rejected.emplace_back(i, connectors::RejectReason::kRecordTooLarge);
      continue;
    }
    connectors::RecordDecodeResult result = bundle_.decoder->Decode(records[i].payload);
    if (auto* failure = std::get_if<connectors::DecodeFailure>(&result)) {
      rejected.emplace_back(i, failure->reason);  // the bytes go to the dead-letter topic
    } else {
      decoded[i] = std::move(std::get<model::Record>(result));
      records[i].payload.clear();  // the decoded record is all the pool keeps
      records[i].payload.shrink_to_fit();
    }
  }
  // Dead letters are delivered before any offset of the batch is marked
  // done, so a crash never skips a rejected record. Two exceptions keep one
  // record from stopping consumption or multiplying: a record re-read below
  // the group's committed offset was dead-lettered before (a restart
  // re-reads its window from the start), and a dead letter the sink refuses
  // for good (INVALID_ARGUMENT, e.g. a topic's size limit below it) is
  // counted, logged once and skipped — the record stays in the input topic.
  for (const auto& [index, reason] : rejected) {
    if (records[index].below_committed) {
      metrics_->records_rejected_total(reason).Increment();
      metrics_->dead_letters_skipped_total(DeadLetterSkip::kDeliveredBefore).Increment();
      records[index].payload.clear();
      continue;
    }
    auto backoff = std::chrono::milliseconds(200);
    for (;;) {
      const Status published = sink_->PublishDeadLetter(records[index], reason);
      if (published.ok()) {
        metrics_->records_rejected_total(reason).Increment();
        metrics_->dead_letters_published_total().Increment();
        break;
      }
      metrics_->kafka_errors_total(KafkaErrorKind::kProduce).Increment();
      if (published.code() == StatusCode::kInvalidArgument) {
        metrics_->records_rejected_total(reason).Increment();
        metrics_->dead_letters_skipped_total(DeadLetterSkip::kUndeliverable).Increment();
        if (!undeliverable_dead_letter_logged_) {
          undeliverable_dead_letter_logged_ = true;
          Log(LogLevel::kError, kComponent,
              "a dead letter can never be delivered; it is skipped and the record's offset "
              "committed, so that consumption goes on (the record stays in the input topic at " +
                  StreamName(records[index].topic, records[index].partition) + " offset " +
                  std::to_string(records[index].offset) +
                  "); further ones are only counted in "
                  "vipsd_dead_letters_skipped_total{cause=\"undeliverable\"}: " +
                  published.ToString());
        }
        break;
      }
      Log(LogLevel::kWarning, kComponent,
          "dead-letter publish failed, retrying (the record stays unacknowledged): " +
              published.ToString());
      std::unique_lock<std::mutex> lock(mutex_);
      if (wake_.wait_for(lock, backoff, [&] { return stop_; })) {
        // Stopping: leave this and later records unacknowledged; they are
        // read again at the next start.
        return Status::Ok();
      }
      backoff = std::min(backoff * 2, std::chrono::milliseconds(5000));
    }
    records[index].payload.clear();
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = 0; i < records.size(); ++i) {
      const uint32_t id = stream_ids_.at(StreamName(records[i].topic, records[i].partition));
      if (records[i].offset < next_unread_[id]) continue;  // duplicate
      next_unread_[id] = records[i].offset + 1;
      if (decoded[i].has_value()) {
        staging_[id].push_back({std::move(*decoded[i]), records[i].offset});
        if (records[i].offset < target_[id]) ++staged_in_window_;
        ++records_pooled_;
      } else {
        ++records_rejected_;
      }
    }
    for (const auto& [stream, end] : batch.reached_end) {
      const uint32_t id = StreamId(stream);
      next_unread_[id] = std::max(next_unread_[id], end);
    }
    if (!uncovered.empty()) cover_requested_ = true;
    wake_.notify_all();
  }
  if (!uncovered.empty()) {
    // A partition the ledger does not know yet: acknowledge its records only
    // once the ledger can re-read them after a crash.
    std::unique_lock<std::mutex> lock(mutex_);
    wake_.wait(lock, [&] {
      if (stop_) return true;
      return std::all_of(uncovered.begin(), uncovered.end(),
                         [&](const std::string& s) { return covered_streams_.count(s) > 0; });
    });
    if (stop_) return Status::Ok();  // read again at the next start
  }
  for (const InputRecord& record : records) {
    const Status done = source_->MarkDone(record);
    if (!done.ok()) {
      metrics_->kafka_errors_total(KafkaErrorKind::kCommit).Increment();
      Log(LogLevel::kWarning, kComponent, "storing an input offset failed: " + done.ToString());
    }
  }
  if (!rejected.empty()) {
    // Commit the dead-lettered offsets now rather than at the next
    // auto-commit: a crash before it would dead-letter them once more.
    const Status committed = source_->Commit();
    if (!committed.ok()) {
      metrics_->kafka_errors_total(KafkaErrorKind::kCommit).Increment();
      Log(LogLevel::kWarning, kComponent,
          "committing dead-lettered offsets failed (they are committed later; a crash before "
          "then dead-letters them again): " + committed.ToString());
    }
  }
  metrics_->consumer_lag_records().Set(static_cast<double>(source_->Lag()));
  return Status::Ok();
}

// ---------------------------------------------------------------------------
// Clock thread (paced runs): observes every slot's cuts at the slot's time.

void Daemon::ClockLoop() {
  for (;;) {
    int64_t slot = 0;
    double due = 0;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      for (;;) {
        if (stop_) return;
        slot = clock_next_slot_;
        due = clock_anchor_time_ + static_cast<double>(slot - clock_anchor_slot_) * clock_interval_;
        const double left = due - Now();
        if (left <= 0) break;
        wake_.wait_for(lock, std::chrono::duration<double>(std::min(left, 1.0)));
      }
    }
    auto bounds = ObserveWithRetry(due);
    if (!bounds.ok()) return;  // stopping
    std::lock_guard<std::mutex> lock(mutex_);
    const double due_now =
        clock_anchor_time_ + static_cast<double>(slot - clock_anchor_slot_) * clock_interval_;
    if (clock_next_slot_ != slot || due_now != due) {
      continue;  // a reload moved this slot's time meanwhile: observe it at its new time
    }
    observed_[slot] = std::move(*bounds);
    ++clock_next_slot_;
    wake_.notify_all();
  }
}

StatusOr<std::map<std::string, StreamBounds>> Daemon::ObserveWithRetry(double as_of) {
  auto backoff = std::chrono::milliseconds(250);
  int failures = 0;
  for (;;) {
    auto bounds = source_->ObserveBounds(as_of);
    if (bounds.ok()) {
      if (failures > 0) {
        Log(LogLevel::kWarning, kComponent,
            "observed the input's end offsets after " + std::to_string(failures) +
                " failed attempts; the cut is the log end at this later time");
      }
      return bounds;
    }
    if (failures++ == 0 || failures % 20 == 0) {
      Log(LogLevel::kWarning, kComponent,
          "cannot read the input's end offsets (retrying): " + bounds.status().ToString());
    }
    std::unique_lock<std::mutex> lock(mutex_);
    if (wake_.wait_for(lock, backoff, [&] { return stop_; })) {
      return CancelledError("stopping");
    }
    backoff = std::min(backoff * 2, std::chrono::milliseconds(5000));
  }
}

// ---------------------------------------------------------------------------
// Step thread

Status Daemon::Initialize() {
  // Streams and their origins. A fresh state directory takes every input
  // stream from its start (or its end, start_position: latest); a stream
  // that appears later starts at its first retained record.
  const bool fresh = state_.next_step == 1 && state_.windows.Streams().empty() &&
                     state_.windows.last_slot() == 0;
  VIPSD_ASSIGN_OR_RETURN(auto bounds, ObserveWithRetry(Now()));
  if (paced_) {
    for (const auto& [stream, b] : bounds) {
      if (state_.windows.HasStream(stream)) continue;
      const int64_t origin = fresh && config_.start_position == "latest" ? b.end : b.start;
      VIPSD_RETURN_IF_ERROR(state_.windows.AddStream(stream, origin));
    }
    // Slots whose time passed while no daemon observed them are missed: the
    // records appended meanwhile belong to the first slot observed now.
    const int64_t first = state_.windows.FirstSlotAtOrAfter(Now());
    if (first > state_.windows.last_slot() + 1) {
      const int64_t missed = first - 1 - state_.windows.last_slot();
      if (state_.windows.last_slot() > 0) {
        Log(LogLevel::kInfo, kComponent,
            std::to_string(missed) + " slots passed while vipsd was not running (" +
                std::to_string(state_.windows.last_slot() + 1) + " to " +
                std::to_string(first - 1) + "); the first slot observed is " +
                std::to_string(first));
        slots_skipped_ += missed;
        metrics_->slots_skipped_total(SkipReason::kMissed).Increment(static_cast<double>(missed));
      }
      VIPSD_RETURN_IF_ERROR(state_.windows.SkipTo(first - 1));
    }
    std::lock_guard<std::mutex> lock(mutex_);
    clock_next_slot_ = first;
    clock_anchor_slot_ = state_.windows.anchor_slot();
    clock_anchor_time_ = state_.windows.anchor_time();
    clock_interval_ = state_.windows.interval_seconds();
  }
  PendingOutput ignored;
  VIPSD_RETURN_IF_ERROR(CommitLedger(&ignored));
  PublishResumeOffsets();
  if (!paced_) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [stream, b] : bounds) covered_streams_.insert(stream);
  }
  return Status::Ok();
}

void Daemon::ServiceRequests(std::unique_lock<std::mutex>& lock) {
  if (reload_) {
    reload_ = false;
    lock.unlock();
    Reload();
    lock.lock();
  }
  if (cover_requested_) {
    cover_requested_ = false;
    lock.unlock();
    CoverNewStreams();
    lock.lock();
  }
}

void Daemon::CoverNewStreams() {
  // Records of a partition the ledger does not know would, after a crash,
  // be skipped once the source has stored their offsets. Adding the stream
  // (its origin is its first retained record) and committing the ledger
  // first makes a restart re-read them; the ingest thread acknowledges them
  // only after this.
  if (sticky_error_) return;
  if (ledger_failing_ && Now() < ledger_retry_at_) {
    std::lock_guard<std::mutex> lock(mutex_);
    cover_requested_ = true;  // the ingest thread keeps waiting; asked again later
    return;
  }
  auto bounds = ObserveWithRetry(Now());
  if (!bounds.ok()) return;
  bool added = false;
  for (const auto& [stream, b] : *bounds) {
    if (paced_ && !state_.windows.HasStream(stream)) {
      if (state_.windows.AddStream(stream, b.start).ok()) added = true;
    }
  }
  if (added || ledger_failing_) {
    PendingOutput ignored;
    if (!CommitOrRetryLedger(&ignored)) {
      std::lock_guard<std::mutex> lock(mutex_);
      cover_requested_ = true;
      return;
    }
  }
  PublishResumeOffsets();
  std::lock_guard<std::mutex> lock(mutex_);
  if (!paced_) {
    for (const auto& [stream, b] : *bounds) covered_streams_.insert(stream);
  }
  wake_.notify_all();
}

bool Daemon::WaitForCuts(int64_t slot, std::map<std::string, StreamBounds>* bounds) {
  if (!paced_) {
    // The offline run: the file is the whole data set; every step's window
    // is all of it.
    auto observed = ObserveWithRetry(Now());
    if (!observed.ok()) return false;
    *bounds = std::move(*observed);
    return true;
  }
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    if (stop_) return false;
    ServiceRequests(lock);
    auto it = observed_.find(slot);
    if (it != observed_.end()) {
      *bounds = std::move(it->second);
      observed_.erase(observed_.begin(), std::next(it));
      return true;
    }
    wake_.wait_for(lock, std::chrono::milliseconds(500));
  }
}

bool Daemon::WaitForWindow(const std::map<std::string, StreamBounds>& bounds, bool* overflow) {
  *overflow = false;
  std::map<std::string, int64_t> cuts;
  for (const auto& [stream, b] : bounds) cuts[stream] = b.end;
  SetTargets(cuts);
  std::unique_lock<std::mutex> lock(mutex_);
  bool logged = false;
  const auto wait_start = std::chrono::steady_clock::now();
  for (;;) {
    if (stop_) return false;
    ServiceRequests(lock);
    std::vector<std::string> behind;
    for (const auto& [stream, b] : bounds) {
      const uint32_t id = StreamId(stream);
      const int64_t low = paced_ ? state_.windows.ResumeOffset(stream) : 0;
      if (b.end > low && next_unread_[id] < b.end) behind.push_back(stream);
    }
    // Overflow iff the window holds more records than pool.capacity: the
    // ingest thread reads at most capacity + 1 of them.
    const int64_t held = pool_size_ + staged_in_window_;
    if (behind.empty()) {
      *overflow = capacity_ > 0 && held > capacity_;
      return true;
    }
    if (capacity_ > 0 && held > capacity_) {
      *overflow = true;
      return true;
    }
    if (!logged && std::chrono::steady_clock::now() - wait_start > std::chrono::seconds(5)) {
      logged = true;
      // Once per wait, with what it waits for (offsets are stream volume).
      std::string names;
      for (const auto& name : behind) {
        const int64_t read = std::max(next_unread_[StreamId(name)],
                                      paced_ ? state_.windows.ResumeOffset(name) : int64_t{0});
        names += (names.empty() ? "" : ", ") + name + " read to offset " + std::to_string(read) +
                 " of " + std::to_string(bounds.at(name).end);
      }
      Log(LogLevel::kInfo, kComponent,
          "waiting for input: the next slot needs the records below its cut of " + names +
              " (partitions not assigned to this process yet, or still being read)");
    }
    wake_.wait_for(lock, std::chrono::milliseconds(200));
  }
}

void Daemon::SetTargets(const std::map<std::string, int64_t>& cuts) {
  std::lock_guard<std::mutex> lock(mutex_);
  // The ingest thread counts staged records below the new targets.
  for (uint32_t id = 0; id < stream_names_.size(); ++id) target_[id] = kNoTarget;
  for (const auto& [stream, cut] : cuts) target_[StreamId(stream)] = cut;
  staged_in_window_ = 0;
  for (uint32_t id = 0; id < stream_names_.size(); ++id) {
    for (const Staged& staged : staging_[id]) {
      if (staged.offset < target_[id]) ++staged_in_window_;
    }
  }
  wake_.notify_all();
}

void Daemon::AdmitWindow(const std::map<std::string, StreamBounds>& bounds) {
  // Records below the slot's cut enter the pool; everything the window no
  // longer covers was evicted when the previous slot ended (AdvanceWindow).
  std::vector<std::pair<uint32_t, std::deque<Staged>>> admitted;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [stream, b] : bounds) {
      const uint32_t id = StreamId(stream);
      std::deque<Staged>& staged = staging_[id];
      std::deque<Staged> taken;
      while (!staged.empty() && staged.front().offset < b.end) {
        taken.push_back(std::move(staged.front()));
        staged.pop_front();
      }
      staged_in_window_ -= static_cast<int64_t>(taken.size());
      if (!taken.empty()) admitted.emplace_back(id, std::move(taken));
    }
    staged_in_window_ = std::max<int64_t>(staged_in_window_, 0);
  }
  for (auto& [id, taken] : admitted) {
    for (Staged& staged : taken) pool_.Add(std::move(staged.record), {id, staged.offset});
  }
  std::lock_guard<std::mutex> lock(mutex_);
  pool_size_ = pool_.size();
}

void Daemon::AdvanceWindow() {
  // The next slot's window starts at cut(k + 1 − M): records below it are
  // never a candidate again and leave memory now.
  std::map<uint32_t, int64_t> low;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const std::string& stream : state_.windows.Streams()) {
      low[StreamId(stream)] = state_.windows.ResumeOffset(stream);
    }
  }
  const int64_t evicted = paced_ ? pool_.EvictBelow(low) : 0;
  if (evicted > 0) metrics_->pool_evicted_total().Increment(static_cast<double>(evicted));
  std::lock_guard<std::mutex> lock(mutex_);
  for (uint32_t id = 0; id < stream_names_.size(); ++id) {
    // Staged records below the new window start (possible only after a
    // skipped slot) are dropped too.
    const auto it = low.find(id);
    if (it != low.end()) {
      while (!staging_[id].empty() && staging_[id].front().offset < it->second) {
        staging_[id].pop_front();
      }
    }
    // The next slot's cut is not known yet: every staged record counts.
    target_[id] = kNoTarget;
  }
  int64_t staged = 0;
  for (const auto& queue : staging_) staged += static_cast<int64_t>(queue.size());
  staged_in_window_ = staged;
  pool_size_ = pool_.size();
  wake_.notify_all();
}

bool Daemon::BudgetAdmitsStep(double* epsilon_after, double* window_epsilon) {
  *window_epsilon = 0;
  *epsilon_after = 0;
  if (!config_.is_private()) return true;
  const double q = config_.driver.sampling_rate;
  const double sigma = config_.driver.noise_multiplier;
  if (fixed_schedule_.has_value()) {
    // Fixed schedule: ε of the steps this one would complete — all private
    // steps so far plus one (global), or the window of at most M steps it
    // would close (residency).
    const int64_t steps =
        state_.mode == AccountingMode::kResidency
            ? std::min<int64_t>(state_.residency->max_residency_steps(),
                                state_.residency->steps() + 1)
            : state_.accountant.steps() + 1;
    auto at = fixed_schedule_->Epsilon(steps, config_.driver.delta);
    if (!at.ok()) {
      Log(LogLevel::kError, kComponent, "budget check failed: " + at.status().ToString());
      *epsilon_after = std::numeric_limits<double>::infinity();
      return false;
    }
    *epsilon_after = at->epsilon;
    *window_epsilon = at->epsilon;
    return at->epsilon <= config_.driver.epsilon_ceiling;
  }
  if (state_.mode == AccountingMode::kResidency) {
    auto check = state_.residency->CheckCeiling(q, sigma, config_.driver.delta,
                                                config_.driver.epsilon_ceiling, Adaptive());
    if (!check.ok()) {
      Log(LogLevel::kError, kComponent, "budget check failed: " + check.status().ToString());
      *epsilon_after = std::numeric_limits<double>::infinity();
      return false;
    }
    *epsilon_after = check->epsilon_after;
    *window_epsilon = check->epsilon_after;
    return !check->would_exceed;
  }
  auto check = state_.accountant.CheckCeiling(q, sigma, 1, config_.driver.delta,
                                              config_.driver.epsilon_ceiling,
                                              privacy::RdpConversion::kImproved, Adaptive());
  if (!check.ok()) {
    Log(LogLevel::kError, kComponent, "budget check failed: " + check.status().ToString());
    *epsilon_after = std::numeric_limits<double>::infinity();
    return false;
  }
  *epsilon_after = check->epsilon_after;
  return !check->would_exceed;
}

bool Daemon::RunStep(int64_t slot, PendingOutput* out) {
  const auto start = std::chrono::steady_clock::now();
  if (driver_->next_step() >= svi::kMaxCounter) {
    // The ledger reader accepts step counters up to 2^53: one more step
    // would commit a ledger that no start and no `vipsd status` could read.
    sticky_error_ = OutOfRangeError(
        "the step counter is at " + std::to_string(driver_->next_step()) +
        " = 2^53, the largest a ledger records; this state directory takes no further step "
        "(its ledger stays readable); continue in a new state directory");
    out->log_lines.emplace_back(LogLevel::kError, sticky_error_->ToString());
    return false;
  }
  double epsilon_after = 0, window_epsilon = 0;
  if (!BudgetAdmitsStep(&epsilon_after, &window_epsilon)) {
    OnCeiling(epsilon_after, out);
    return false;
  }
  std::vector<std::string> names;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    names = stream_names_;
  }
  if (hooks_.before_step) hooks_.before_step(driver_->next_step(), slot, pool_, names);
  StatusOr<svi::StepResult> result = UnavailableError("no step");
  if (role_ == Role::kCoordinator) {
    result = SharedStep(slot, out);
    if (!result.ok() && result.status().code() == StatusCode::kOutOfRange) {
      // A process could not hold a partition's window: stepping stops as
      // one process would stop (this step was charged: an overcount).
      ++slots_skipped_;
      metrics_->slots_skipped_total(SkipReason::kWindowOverflow).Increment();
      StopSteppingOnOverflow(slot, std::string(result.status().message()), out);
      return false;
    }
    if (!result.ok() && result.status().code() == StatusCode::kCancelled) return false;
  } else {
    // Each stream's candidates in offset order; the per-record randomness
    // is keyed by the stream's name and the record's offset
    // (svi/step_randomness.h), so the step is the same whichever process
    // holds which partition.
    auto streams = svi::GroupByStream(pool_.records(), pool_.origins(), names);
    if (!streams.ok()) {
      sticky_error_ = streams.status();
      out->log_lines.emplace_back(LogLevel::kError,
                                  "window invariant broken; no further step: " +
                                      streams.status().ToString());
      return false;
    }
    result = driver_->Step(*streams);
  }
  if (!result.ok()) {
    // Nothing about this step leaves the process; a charge already made is
    // in memory and goes to the ledger with the next commit, with the step's
    // number consumed (svi::StepDriver::Abandon): an overcount only.
    out->log_lines.emplace_back(LogLevel::kError, "step failed: " + result.status().ToString());
    return false;
  }
  if (result->outcome == svi::StepResult::Outcome::kRefusedCeiling) {
    OnCeiling(result->epsilon_refused, out);
    return false;
  }
  halted_ = false;
  const Status presence = pool_.CompleteStep();
  if (!presence.ok()) {
    sticky_error_ = presence;
    out->log_lines.emplace_back(LogLevel::kError,
                                "window invariant broken; no further step: " + presence.ToString());
  }
  if (config_.is_private() && state_.mode == AccountingMode::kResidency) {
    const Status recorded = state_.residency->RecordStep(
        config_.driver.sampling_rate, config_.driver.noise_multiplier, window_epsilon);
    if (!recorded.ok()) {
      sticky_error_ = recorded;
      out->log_lines.emplace_back(LogLevel::kError,
                                  "residency bookkeeping failed: " + recorded.ToString());
    }
  }
  NoiseHistory& noise = state_.noise;
  if (!config_.is_private()) {
    if (noise.non_private_steps++ == 0) noise.first_non_private_step = result->step;
  } else if (!noise_->is_private()) {
    if (noise.fixed_seed_steps++ == 0) noise.first_fixed_seed_step = result->step;
  } else {
    ++noise.private_steps;
  }
  model_step_ = result->step;
  last_rho_ = result->rho;
  last_step_q_ = config_.driver.sampling_rate;
  last_step_sigma_ = config_.driver.noise_multiplier;
  ++steps_run_;
  out->stepped = true;
  out->step = result->step;
  out->rho = result->rho;
  out->publish = result->step % config_.publish_every == 0;
  out->step_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CheckWarnings(out);
  return true;
}

void Daemon::ProcessSlot(int64_t slot, const std::map<std::string, StreamBounds>& bounds) {
  PendingOutput out;
  out.slot = slot;
  out.deadline = paced_ ? state_.windows.SlotTime(slot) + config_.release_delay_seconds : 0;
  // New partitions of the input: their records from the first retained one.
  if (paced_) {
    for (const auto& [stream, b] : bounds) {
      if (!state_.windows.HasStream(stream)) (void)state_.windows.AddStream(stream, b.start);
    }
  }
  bool overflow = false;
  if (role_ == Role::kCoordinator) {
    // Shared work: the partitions are spread over the processes; the step
    // itself waits for every partition's partial sum (SharedStep).
    std::map<std::string, int64_t> cuts;
    for (const auto& [stream, b] : bounds) cuts[stream] = b.end;
    SetTargets(cuts);
  } else if (!WaitForWindow(bounds, &overflow)) {
    return;  // stopping
  }
  if (paced_) {
    std::map<std::string, int64_t> cuts;
    for (const auto& [stream, b] : bounds) cuts[stream] = b.end;
    const Status recorded = state_.windows.RecordCuts(slot, cuts);
    if (!recorded.ok()) {
      // A log end below an earlier cut (the topic was deleted and recreated,
      // or truncated): the windows would be wrong; stop stepping.
      sticky_error_ = recorded;
      Log(LogLevel::kError, kComponent,
          "slot " + std::to_string(slot) + ": " + recorded.ToString() +
              "; no further step until an operator acts");
      (void)state_.windows.SkipTo(slot);
    }
  } else {
    (void)state_.windows.SkipTo(slot);
  }
  if (overflow && !overflow_) {
    StopSteppingOnOverflow(slot,
                           "its window holds more than pool.capacity = " +
                               std::to_string(config_.pool_capacity) + " records",
                           &out);
  }
  if (!overflow && role_ != Role::kCoordinator) AdmitWindow(bounds);

  bool stepped = false;
  if (ledger_failing_) {
    ++slots_skipped_;
    metrics_->slots_skipped_total(SkipReason::kError).Increment();
  } else if (sticky_error_) {
    ++slots_skipped_;
    metrics_->slots_skipped_total(SkipReason::kError).Increment();
    // Said at the first slot it stops, then every 5 minutes (the skips are
    // counted in vipsd_slots_skipped_total{reason="error"}).
    if (sticky_logged_at_ == 0 || Now() - sticky_logged_at_ >= 300) {
      sticky_logged_at_ = Now();
      out.log_lines.emplace_back(LogLevel::kError,
                                 "slot " + std::to_string(slot) +
                                     ": not stepping after an earlier failure (" +
                                     sticky_error_->ToString() +
                                     "); restart vipsd after fixing the cause");
    }
  } else if (overflow_) {
    // Stepping stopped at the first overflow (StopSteppingOnOverflow).
    ++slots_skipped_;
    metrics_->slots_skipped_total(SkipReason::kWindowOverflow).Increment();
  } else {
    const bool was_halted = halted_;
    stepped = RunStep(slot, &out);
    if (stepped && was_halted) {
      out.log_lines.emplace_back(LogLevel::kInfo, "the budget admits the next step again; resuming");
    }
  }
  // Nothing about this slot happens before its public deadline, not even
  // the ledger commit: the ledger file's times and its ledger-topic entry
  // would otherwise tell when the step finished, hence its batch size.
  const bool on_time = WaitForDeadline(out);
  // Durable BEFORE anything about this slot leaves the process.
  const bool committed = CommitOrRetryLedger(&out);
  if (!committed) {
    out.publish = false;
    if (out.stepped) HoldUntilCommitted(out);
  }
  if (on_time) {
    Emit(out);
  } else {
    WithholdOnStop(out);
  }
  // After the release: the checkpoint's write time depends on the model's
  // size and the disk only, but it need not delay the release.
  if (stepped && committed && out.step % config_.checkpoint_every == 0) SaveCheckpointNow();
  AdvanceWindow();
}

void Daemon::HoldUntilCommitted(PendingOutput& out) {
  // Nothing about a step appears before its charge is durable: its log
  // lines, alerts and metrics wait for the commit that covers it (a retry's,
  // which then reports it); a restart before that runs the step again.
  PendingOutput held = out;
  held.publish = false;  // release_owed_ sends its model once committed
  uncommitted_step_ = std::move(held);
  out.stepped = false;
  out.partials_local = out.partials_remote = 0;
  out.alerts.clear();
  out.log_lines.clear();
  out.log_lines.emplace_back(
      LogLevel::kError,
      "slot " + std::to_string(out.slot) + ": step " + std::to_string(out.step) +
          " ran but its ledger commit failed; nothing about it is released or reported until "
          "a commit succeeds (a restart before then runs step " + std::to_string(out.step) +
          " again)");
}

void Daemon::StopSteppingOnOverflow(int64_t slot, const std::string& why, PendingOutput* out) {
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

bool Daemon::CommitOrRetryLedger(PendingOutput* out) {
  if (ledger_failing_ && Now() < ledger_retry_at_) return false;  // backing off
  const Status committed = CommitLedger(out);
  if (!committed.ok()) {
    OnLedgerFailure(committed);
    return false;
  }
  if (ledger_failing_) {
    Log(LogLevel::kInfo, kComponent,
        "ledger commit succeeded again after " + std::to_string(ledger_failures_) +
            " failed attempts; stepping resumes and the current model is released at the next "
            "deadline");
    ledger_failing_ = false;
    ledger_failures_ = 0;
    ledger_backoff_ = 1;
    ledger_error_ = Status::Ok();
    metrics_->ledger_failing().Set(0);
    if (model_step_ > 0 && published_model_step_ != model_step_) {
      // A step that ran before the failure was never released; its charge
      // is durable now, so its model may leave.
      release_owed_ = true;
      release_retry_at_ = 0;
    }
  }
  return true;
}

void Daemon::OnFenced(const Status& error) {
  // Another process owns the budget now: nothing of this process may leave
  // any more, and it stops (Run returns this error).
  sticky_error_ = error;
  run_error_ = error;
  Log(LogLevel::kError, kComponent, error.ToString());
  RequestStop();
}

void Daemon::OnLedgerFailure(const Status& error) {
  // No step and no release until a commit succeeds; the ledger on disk stays
  // an upper bound of what was released. Retried with backoff (1 s to 60 s);
  // logged once, then every 5 minutes.
  ++ledger_failures_;
  ledger_error_ = error;
  ledger_retry_at_ = Now() + ledger_backoff_;
  ledger_backoff_ = std::min(ledger_backoff_ * 2, 60.0);
  metrics_->ledger_failing().Set(1);
  if (!ledger_failing_) {
    ledger_failing_ = true;
    ledger_failing_since_ = Now();
    ledger_failure_logged_at_ = Now();
    Log(LogLevel::kError, kComponent,
        "ledger commit failed; no step or release until it succeeds (retrying with backoff): " +
            error.ToString());
  } else if (Now() - ledger_failure_logged_at_ >= 300) {
    ledger_failure_logged_at_ = Now();
    Log(LogLevel::kError, kComponent,
        "ledger commit still failing after " + std::to_string(ledger_failures_) +
            " attempts: " + error.ToString());
  }
}

void Daemon::SaveCheckpoint(PendingOutput* out) {
  const auto start = std::chrono::steady_clock::now();
  const Status saved = checkpoints_.Save({state_.run_id, model_step_, bundle_.model->type(),
                                          bundle_.model_fingerprint,
                                          bundle_.model->CheckpointArrays()});
  if (saved.ok()) {
    checkpoint_step_ = model_step_;
    out->checkpoint_written = true;
    out->checkpoint_write_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  } else {
    out->checkpoint_failed = true;
    out->log_lines.emplace_back(LogLevel::kError, "checkpoint failed: " + saved.ToString());
  }
}

void Daemon::SaveCheckpointNow() {
  PendingOutput out;
  SaveCheckpoint(&out);
  if (out.checkpoint_written) {
    metrics_->checkpoint_writes_total().Increment();
    metrics_->checkpoint_write_duration_seconds().Observe(out.checkpoint_write_seconds);
  }
  if (out.checkpoint_failed) metrics_->checkpoint_failures_total().Increment();
  for (const auto& [level, line] : out.log_lines) Log(level, kComponent, line);
}

void Daemon::WithholdOnStop(PendingOutput& out) {
  // Stopping before the deadline: publishing now would reveal when the step
  // finished. The ledger is committed; the next release includes the step.
  if (out.publish) {
    Log(LogLevel::kInfo, kComponent,
        "stopping before the release deadline of step " + std::to_string(out.step) +
            "; its release is withheld (the next release includes it)");
    release_owed_ = false;
  }
  for (const auto& [level, line] : out.log_lines) Log(level, kComponent, line);
}

bool Daemon::WaitForDeadline(const PendingOutput& out) {
  if (out.deadline <= 0) return true;
  const bool overran = Now() > out.deadline;
  if (!SleepUntil(out.deadline)) return false;
  if (overran) {
    metrics_->release_deadline_overruns_total().Increment();
    ++overruns_unreported_;
    if (Now() - last_overrun_log_ >= 10) {
      Log(LogLevel::kWarning, kComponent,
          std::to_string(overruns_unreported_) + " slot(s) up to slot " +
              std::to_string(out.slot) +
              " finished after their release deadline (slot time + release_delay_seconds; at "
              "start-up the consumer group join delays the first slots); their outputs left "
              "at once, and this line and vipsd_release_deadline_overruns_total reveal the "
              "overruns. If it persists, raise schedule.release_delay_seconds up to "
              "schedule.interval_seconds, then the interval (steps run one after another: "
              "none gets more than one interval)");
      last_overrun_log_ = Now();
      overruns_unreported_ = 0;
    }
  }
  return true;
}

std::string Daemon::ReportStep(const PendingOutput& out) {
  for (const auto& [level, line] : out.log_lines) Log(level, kComponent, line);
  if (!out.stepped) return "";
  metrics_->steps_total().Increment();
  metrics_->step().Set(static_cast<double>(out.step));
  metrics_->step_size_rho().Set(out.rho);
  if (config_.expose_step_timing) {
    metrics_->step_duration_seconds().Observe(out.step_seconds);
    metrics_->last_step_timestamp_seconds().Set(Now());
  }
  if (out.partials_local > 0) {
    metrics_->work_partials_merged_total("local")
        .Increment(static_cast<double>(out.partials_local));
  }
  if (out.partials_remote > 0) {
    metrics_->work_partials_merged_total("remote")
        .Increment(static_cast<double>(out.partials_remote));
  }
  if (out.partials_local + out.partials_remote > 0) {
    std::lock_guard<std::mutex> lock(mutex_);
    status_.partials_merged_local += out.partials_local;
    status_.partials_merged_remote += out.partials_remote;
  }
  std::string line = "step=" + std::to_string(out.step) + " slot=" + std::to_string(out.slot) +
                     " rho=" + Fixed(out.rho);
  if (config_.is_private()) {
    line += " epsilon=" + Fixed(CommittedEpsilon()) + "/" +
            JsonNumber(config_.driver.epsilon_ceiling);
  }
  line += " window=" + std::to_string(out.window_offsets >= 0
                                           ? out.window_offsets
                                           : static_cast<int64_t>(pool_.size()));
  if (role_ == Role::kCoordinator) {
    line += " partials=" + std::to_string(out.partials_local) + "+" +
            std::to_string(out.partials_remote);
  }
  return line;
}

void Daemon::Emit(PendingOutput& out) {
  // Called at the slot's deadline (WaitForDeadline): everything is at a
  // public time.
  if (out.ledger_committed && uncommitted_step_.has_value()) {
    // This slot's commit also covers a step whose own commit failed: it is
    // reported now (its model leaves through release_owed_).
    PendingOutput held = std::move(*uncommitted_step_);
    uncommitted_step_.reset();
    const std::string line = ReportStep(held);
    for (const std::string& alert : held.alerts) PublishAlertJson(alert);
    Log(LogLevel::kInfo, kComponent, line + " committed_at_slot=" + std::to_string(out.slot));
  }
  if (out.ledger_committed) {
    metrics_->ledger_commits_total().Increment();
    metrics_->ledger_commit_duration_seconds().Observe(out.ledger_commit_seconds);
  }
  metrics_->slot().Set(static_cast<double>(out.slot));
  metrics_->last_slot_timestamp_seconds().Set(paced_ ? state_.windows.SlotTime(out.slot) : Now());
  metrics_->pool_records().Set(static_cast<double>(
      out.window_offsets >= 0 ? out.window_offsets : static_cast<int64_t>(pool_.size())));
  // An unpaced (offline) run has no public clock: its releases carry the
  // time the run started, never the moment a step finished.
  const double publish_time = out.deadline > 0 ? out.deadline : run_started_at_;
  std::string line = ReportStep(out);
  UpdateBudgetMetrics();
  const bool retry_due = release_owed_ && Now() >= release_retry_at_;
  if (!sticky_error_ && !ledger_failing_ && model_step_ > 0 && (out.publish || retry_due)) {
    const Status published = PublishModel(model_step_, last_rho_, publish_time);
    if (published.ok()) {
      if (out.stepped) line += " released=step-" + std::to_string(model_step_);
    } else {
      Log(LogLevel::kError, kComponent, "release failed: " + published.ToString());
    }
  }
  for (const std::string& alert : out.alerts) PublishAlertJson(alert);
  if (!line.empty()) Log(LogLevel::kInfo, kComponent, line);
  WriteStatusFile();
}

void Daemon::WriteStatusFile() {
  const bool is_private = config_.is_private();
  std::string json = "{\"schema_version\": 1, \"pid\": " + std::to_string(getpid()) +
                     ", \"config\": " + JsonString(config_.file) +
                     ", \"private\": " + (is_private ? "true" : "false") +
                     ", \"delta\": " + JsonNumber(config_.driver.delta) +
                     ", \"epsilon_ceiling\": " + JsonNumber(config_.driver.epsilon_ceiling) +
                     ", \"halted\": " + (halted_ ? "true" : "false") +
                     ", \"ledger_failing\": " + (ledger_failing_ ? "true" : "false") +
                     ", \"last_slot\": " + std::to_string(committed_.windows.last_slot()) +
                     ", \"last_release_step\": " +
                     std::to_string(std::max<int64_t>(published_model_step_, 0)) +
                     ", \"last_release_time\": " + JsonNumber(published_time_) + "}\n";
  // Informational (the ledger is the record): renamed into place, not
  // fsync'd, so that the slot path pays no extra disk flush.
  const std::string path = config_.state_directory + "/status.json";
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << json;
    if (!out) return;
  }
  std::error_code error;
  std::filesystem::rename(tmp, path, error);
}

void Daemon::OnCeiling(double epsilon_refused, PendingOutput* out) {
  metrics_->steps_refused_total().Increment();
  ++slots_skipped_;
  metrics_->slots_skipped_total(SkipReason::kCeiling).Increment();
  if (halted_) return;
  halted_ = true;
  const double spent = EpsilonSpent();
  out->log_lines.emplace_back(
      LogLevel::kWarning,
      "epsilon ceiling reached: the next step (t=" + std::to_string(driver_->next_step()) +
          ") would spend epsilon=" + Fixed(epsilon_refused) + " > ceiling=" +
          JsonNumber(config_.driver.epsilon_ceiling) + "; epsilon_spent=" + Fixed(spent) +
          "; halting updates (on_ceiling=" +
          (config_.on_ceiling == config::CeilingAction::kHalt && paced_ ? "halt" : "exit") + ")");
  // The final release: the model of the last step this process ran, if it
  // was not published yet (after a restart that runs no step, the previous
  // run published — or, after a crash, lost — that release).
  if (steps_run_ > 0 && published_model_step_ != model_step_) out->publish = true;
  out->alerts.push_back(AlertJson("halted", spent));
  if (!paced_ && steps_run_ == 0) {
    {
      run_error_ = FailedPreconditionError(
          "the epsilon ceiling admits no step: the next step (t=" +
          std::to_string(driver_->next_step()) + ") would spend epsilon " +
          Fixed(epsilon_refused) + " > privacy.epsilon_ceiling " +
          JsonNumber(config_.driver.epsilon_ceiling) + " (epsilon already spent: " +
          Fixed(spent) + "); nothing was run");
    }
  }
}

std::string Daemon::AlertJson(const std::string& event, double spent) const {
  return "{\"event\": \"" + event + "\", \"epsilon_spent\": " + JsonNumber(spent) +
         ", \"epsilon_ceiling\": " + JsonNumber(config_.driver.epsilon_ceiling) +
         ", \"delta\": " + JsonNumber(config_.driver.delta) +
         ", \"next_step\": " + std::to_string(driver_->next_step()) + "}";
}

void Daemon::PublishAlertJson(const std::string& json) {
  if (paced_ && config_.alert_topic.empty()) return;
  const Status published = sink_->PublishAlert(json);
  if (published.ok()) {
    metrics_->alerts_published_total().Increment();
  } else {
    metrics_->kafka_errors_total(KafkaErrorKind::kProduce).Increment();
    Log(LogLevel::kWarning, kComponent, "alert publish failed: " + published.ToString());
  }
}

void Daemon::CheckWarnings(PendingOutput* out) {
  if (!config_.is_private()) return;
  const double spent = EpsilonSpent();
  const double ceiling = config_.driver.epsilon_ceiling;
  double level = 0;
  for (double fraction : config_.warn_at) {
    if (spent >= fraction * ceiling) level = fraction;
  }
  if (level <= state_.warning_level) return;
  state_.warning_level = level;
  out->log_lines.emplace_back(LogLevel::kWarning,
                              "privacy budget warning: epsilon_spent=" + Fixed(spent) +
                                  " of ceiling=" + JsonNumber(ceiling) +
                                  " crossed warn_at=" + JsonNumber(level));
  out->alerts.push_back("{\"event\": \"budget_warning\", \"fraction\": " + JsonNumber(level) +
                        ", \"epsilon_spent\": " + JsonNumber(spent) +
                        ", \"epsilon_ceiling\": " + JsonNumber(ceiling) +
                        ", \"delta\": " + JsonNumber(config_.driver.delta) +
                        ", \"step\": " + std::to_string(driver_->next_step() - 1) + "}");
}

Status Daemon::CommitLedger(PendingOutput* out) {
  state_.next_step = driver_->next_step();
  const auto start = std::chrono::steady_clock::now();
  Status committed = hooks_.ledger_fault ? hooks_.ledger_fault() : Status::Ok();
  if (committed.ok()) committed = ledger_.Commit(state_);
  if (committed.ok() && replica_ != nullptr) {
    committed = replica_->Commit(state_);
    if (!committed.ok() && replica_->fenced()) OnFenced(committed);
  }
  out->ledger_commit_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!committed.ok()) {
    metrics_->ledger_commit_failures_total().Increment();
    return committed;
  }
  out->ledger_committed = true;
  committed_ = state_;
  PublishResumeOffsets();
  return Status::Ok();
}

Status Daemon::PublishModel(int64_t step, double rho, double publish_time) {
  if (!unconfirmed_release_.has_value() || unconfirmed_release_->step != step) {
    unconfirmed_release_.reset();
    ReleaseFacts facts;
    facts.step = step;
    facts.rho = rho;
    // ε, accountant and conversion from one evaluation of the ledger
    // (MakeRelease writes "none" / 0 for non-private runs).
    auto spent = LedgerSpent(state_, config_.driver.delta,
                             fixed_schedule_.has_value() ? &*fixed_schedule_ : nullptr);
    facts.epsilon_spent =
        spent.ok() ? spent->epsilon : std::numeric_limits<double>::infinity();
    facts.accountant = spent.ok() ? spent->accountant : AccountantName();
    facts.conversion = spent.ok() ? spent->conversion : "rdp_improved";
    facts.schedule = ScheduleKindName(state_.schedule);
    facts.noise_is_private = noise_->is_private();
    facts.noise_description = noise_->description();
    facts.noise_multiplier =
        last_step_sigma_ >= 0 ? last_step_sigma_ : config_.driver.noise_multiplier;
    facts.sampling_rate = last_step_q_ >= 0 ? last_step_q_ : config_.driver.sampling_rate;
    facts.created_at = publish_time;
    if (facts.rho <= 0) {
      facts.rho = svi::StepSize(config_.driver.tau0, config_.driver.kappa, std::max<int64_t>(step, 1));
    }
    release::Release out = MakeRelease(bundle_, config_, facts);
    VIPSD_ASSIGN_OR_RETURN(release::EncodedRelease encoded, release::EncodeRelease(out));
    unconfirmed_release_ = UnconfirmedRelease{step, publish_time, std::move(out), std::move(encoded)};
  }
  const release::Release& out = unconfirmed_release_->release;
  const release::EncodedRelease& encoded = unconfirmed_release_->encoded;
  publish_time = unconfirmed_release_->publish_time;
  size_t bytes = 0;
  for (const auto& file : encoded.files) bytes += file.bytes.size();
  // Right before the release leaves: still the owner? A process paused
  // since its commit may have been replaced meanwhile (the standby took
  // over); then nothing more leaves. This narrows, but cannot close, the
  // window in which a paused owner publishes late (README "Several
  // instances"). A ledger topic that cannot be read now is retried like a
  // failed publish.
  const Status owner = replica_ != nullptr ? replica_->ConfirmOwner() : Status::Ok();
  if (!owner.ok() && replica_->fenced()) {
    OnFenced(owner);
    return owner;
  }
  const auto start = std::chrono::steady_clock::now();
  const Status published =
      owner.ok() ? sink_->PublishRelease(out, encoded, publish_time) : owner;
  if (!published.ok()) {
    metrics_->releases_failed_total().Increment();
    if (owner.ok()) metrics_->kafka_errors_total(KafkaErrorKind::kProduce).Increment();
    ++release_attempts_failed_;
    release_owed_ = true;
    metrics_->release_pending().Set(1);
    release_retry_at_ = Now() + release_retry_backoff_;
    release_retry_backoff_ = std::min(release_retry_backoff_ * 2, 60.0);
    return published;
  }
  metrics_->release_publish_duration_seconds().Observe(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  metrics_->releases_published_total().Increment();
  metrics_->last_release_step().Set(static_cast<double>(step));
  metrics_->last_release_timestamp_seconds().Set(Now());
  metrics_->release_bytes().Set(static_cast<double>(bytes));
  published_model_step_ = step;
  published_time_ = publish_time;
  release_owed_ = false;
  release_retry_backoff_ = 1;
  metrics_->release_pending().Set(0);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    status_.last_published_step = step;
  }
  if (hooks_.after_release) hooks_.after_release(out);
  unconfirmed_release_.reset();
  return Status::Ok();
}

void Daemon::Reload() {
  const double now = Now();
  auto fail = [&](const Status& status) {
    Log(LogLevel::kError, kComponent,
        "reload refused, the running configuration stays: " + std::string(status.message()));
    metrics_->RecordReload(ReloadResult::kFailure, now);
  };
  auto next = config::LoadConfigFile(config_.file);
  if (!next.ok()) return fail(next.status());
  std::vector<std::string> described;
  auto changed = config::ChangedReloadableKeys(config_, *next, &described);
  if (!changed.ok()) return fail(changed.status());
  // The vocabulary file itself must not change either.
  if (bundle_.vocabulary != nullptr) {
    auto rebuilt = BuildModel(*next);
    if (!rebuilt.ok()) return fail(rebuilt.status());
    if (rebuilt->vocabulary_fingerprint != bundle_.vocabulary_fingerprint) {
      return fail(InvalidArgumentError(
          Where(*next, "model.lda.vocabulary") +
          "the vocabulary file's content changed; it cannot change on reload (restart with a "
          "new state directory)"));
    }
  }
  if (changed->empty()) {
    Log(LogLevel::kInfo, kComponent, "reload: nothing changed");
    metrics_->RecordReload(ReloadResult::kSuccess, now);
    return;
  }
  // Residency: the new (q, σ, M) must be affordable, and M may only drop.
  // A fixed schedule pins (q, σ) for the state directory.
  if (state_.schedule == ScheduleKind::kFixed && config_.is_private()) {
    auto same = ResolveSchedule(*next, &state_, ledger_.path());
    if (!same.ok()) return fail(same.status());
  }
  std::optional<privacy::ResidencyAccountant> residency = state_.residency;
  if (state_.mode == AccountingMode::kResidency) {
    auto check = ResidencyWindowCheck(*next, state_);
    if (!check.ok()) return fail(check.status());
    if (check->would_exceed) {
      return fail(InvalidArgumentError(
          Where(*next, "schedule.window_steps") + std::to_string(next->window_steps) +
          " steps at the new sampling_rate/noise_multiplier would spend epsilon " +
          Fixed(check->epsilon_after) + " > epsilon_ceiling " +
          JsonNumber(next->driver.epsilon_ceiling)));
    }
    const Status lowered = residency->SetMaxResidencySteps(next->window_steps);
    if (!lowered.ok()) {
      return fail(InvalidArgumentError(Where(*next, "schedule.window_steps") +
                                       std::string(lowered.message())));
    }
  }
  svi::SlotWindows windows = state_.windows;
  if (paced_) {
    if (next->window_steps != windows.window_slots()) {
      const Status shortened = windows.SetWindowSlots(next->window_steps);
      if (!shortened.ok()) {
        return fail(InvalidArgumentError(Where(*next, "schedule.window_steps") +
                                         std::string(shortened.message())));
      }
    }
  }
  const Status driver_ok = driver_->Reconfigure(DriverConfigFor(*next));
  if (!driver_ok.ok()) return fail(driver_ok);
  if (state_.mode == AccountingMode::kResidency) state_.residency = std::move(residency);
  if (paced_) {
    // A new interval applies after the last slot the clock has observed;
    // slot times already observed keep theirs.
    std::lock_guard<std::mutex> lock(mutex_);
    if (next->step_interval_seconds != windows.interval_seconds()) {
      const int64_t from = std::max(clock_next_slot_ - 1, windows.last_slot());
      const Status moved = windows.SetInterval(next->step_interval_seconds, from);
      if (!moved.ok()) {
        (void)driver_->Reconfigure(DriverConfigFor(config_));
        return fail(InvalidArgumentError(Where(*next, "schedule.interval_seconds") +
                                         std::string(moved.message())));
      }
      clock_anchor_time_ = windows.anchor_time();
      clock_anchor_slot_ = windows.anchor_slot();
      clock_interval_ = windows.interval_seconds();
    }
    capacity_ = next->pool_capacity;
    wake_.notify_all();
  }
  state_.windows = std::move(windows);
  pool_.set_max_candidate_steps(paced_ ? next->window_steps : 0);
  if (overflow_ && (next->pool_capacity > overflow_capacity_)) {
    described.push_back("stepping resumes at the next slot (pool.capacity raised from " +
                        std::to_string(overflow_capacity_) + " after a window overflow)");
    overflow_ = false;
  }
  std::string changes;
  for (const auto& change : described) changes += (changes.empty() ? "" : "; ") + change;
  config_ = std::move(*next);
  SetMinLogLevel(config_.log_level);
  SetLogFormat(config_.log_format);
  // The gauges of the new configuration first: whoever sees the success
  // counter move (a scrape, a test) sees them too.
  UpdateBudgetMetrics();
  metrics_->RecordReload(ReloadResult::kSuccess, now);
  Log(LogLevel::kInfo, kComponent, "reload applied: " + changes);
}

bool Daemon::IsFinished() const {
  if (config_.max_steps > 0 && paced_ && steps_run_ >= config_.max_steps) return true;
  if (!paced_ && step_limit_ > 0 && steps_run_ >= step_limit_) return true;
  if (halted_ && (config_.on_ceiling == config::CeilingAction::kExit || !paced_)) return true;
  if (!paced_ && (sticky_error_ || ledger_failing_)) return true;
  return false;
}

void Daemon::CloseIo() {
  if (source_ != nullptr) {  // a worker that never saw a plan has none
    const Status committed = source_->Commit();
    if (!committed.ok()) Log(LogLevel::kWarning, kComponent, "final offset commit: " + committed.ToString());
    const Status closed = source_->Close();
    if (!closed.ok()) Log(LogLevel::kWarning, kComponent, "closing the source: " + closed.ToString());
  }
  const Status flushed = sink_->Close();
  if (!flushed.ok()) Log(LogLevel::kWarning, kComponent, "closing the sink: " + flushed.ToString());
}

Status Daemon::Run() {
  if (role_ == Role::kWorker) return RunWorker();
  run_started_at_ = std::floor(Now());
  {
    std::lock_guard<std::mutex> lock(mutex_);
    capacity_ = paced_ ? config_.pool_capacity : 0;
  }
  metrics_->SetAccountingMode(state_.mode);
  metrics_->step().Set(static_cast<double>(driver_->next_step() - 1));
  const Status initialized = Initialize();
  if (!initialized.ok()) {
    if (initialized.code() == StatusCode::kCancelled) return Status::Ok();
    return initialized;
  }
  UpdateBudgetMetrics();
  Log(LogLevel::kInfo, kComponent,
      "started: model=" + bundle_.model->type() + " next_step=" +
          std::to_string(driver_->next_step()) + " accounting=" +
          std::string(AccountingModeName(state_.mode)) +
          (config_.is_private() ? " epsilon_spent=" + Fixed(EpsilonSpent()) + "/" +
                                      JsonNumber(config_.driver.epsilon_ceiling)
                                : " NOT PRIVATE (noise_multiplier 0)") +
          " model_step=" + std::to_string(model_step_) +
          (paced_ ? " slot_interval=" + JsonNumber(config_.step_interval_seconds) +
                        "s window_steps=" +
                        (config_.window_steps == svi::kWindowAll
                             ? std::string("all")
                             : std::to_string(config_.window_steps))
                  : std::string(" source=file")));
  ingest_thread_ = std::thread([this] { IngestLoop(); });
  if (paced_) clock_thread_ = std::thread([this] { ClockLoop(); });
  int64_t slot = state_.windows.last_slot() + 1;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (paced_) slot = clock_next_slot_;
  }
  while (!IsFinished()) {
    std::map<std::string, StreamBounds> bounds;
    if (!WaitForCuts(slot, &bounds)) break;
    ProcessSlot(slot, bounds);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stop_) break;
    }
    ++slot;
  }
  if (config_.max_steps > 0 && steps_run_ >= config_.max_steps) {
    Log(LogLevel::kInfo, kComponent, "schedule.max_steps reached; stopping");
  }
  if (!sticky_error_ && !ledger_failing_ && model_step_ > checkpoint_step_ && steps_run_ > 0) {
    // The model of the last step (checkpoint_every > 1): kept for a restart.
    SaveCheckpointNow();
  }
  const bool completed = IsFinished();
  if (completed && !sticky_error_ && !ledger_failing_ && steps_run_ > 0 &&
      published_model_step_ != model_step_ &&
      (!halted_ || !paced_)) {
    // The run ended by itself (max_steps, max_epochs, an offline ceiling):
    // its last model is the final release, at the end of the run.
    const Status published = PublishModel(model_step_, last_rho_, paced_ ? Now() : run_started_at_);
    if (!published.ok()) Log(LogLevel::kError, kComponent, "final release failed: " + published.ToString());
    WriteStatusFile();
  }
  if (release_owed_ && !sticky_error_) {
    Log(LogLevel::kWarning, kComponent,
        "stopping with the release of step " + std::to_string(model_step_) +
            " undelivered (the sink kept failing); the next release will include it");
  }
  RequestStop();
  if (clock_thread_.joinable()) clock_thread_.join();
  if (ingest_thread_.joinable()) ingest_thread_.join();
  Status result = Status::Ok();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (ingest_error_) result = *ingest_error_;
  }
  if (result.ok() && run_error_) result = *run_error_;
  if (result.ok() && !paced_ && sticky_error_) result = *sticky_error_;
  if (result.ok() && ledger_failing_) {
    // A supervisor must notice: the ledger has not been durable since then.
    result = UnavailableError(
        "stopped while the ledger could not be committed (" + std::to_string(ledger_failures_) +
        " failed attempts over " + Fixed(Now() - ledger_failing_since_, 0) +
        " s; last error: " + std::string(ledger_error_.message()) +
        "); steps after the last durable commit were never released");
  }
  CloseIo();
  UpdateBudgetMetrics();
  // What is durable: a step whose commit never succeeded is not counted.
  Log(LogLevel::kInfo, kComponent,
      "stopped: next_step=" + std::to_string(committed_.next_step) + " steps_this_run=" +
          std::to_string(steps_run_ - (uncommitted_step_.has_value() ? 1 : 0)) +
          (config_.is_private() ? " epsilon_spent=" + Fixed(CommittedEpsilon()) : ""));
  return result;
}


// ---------------------------------------------------------------------------
// Shared work (daemon/work_exchange.h)

namespace {

constexpr auto kReminderInterval = std::chrono::seconds(1);
constexpr auto kWorkPoll = std::chrono::milliseconds(50);

int64_t SteadyNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

const WorkStream* FindStream(const WorkPlan& plan, const std::string& name) {
  const auto it = std::lower_bound(plan.streams.begin(), plan.streams.end(), name,
                                   [](const WorkStream& s, const std::string& n) { return s.name < n; });
  return it != plan.streams.end() && it->name == name ? &*it : nullptr;
}

}  // namespace

bool Daemon::LocallyComplete(const WorkStream& stream) {
  // Reading starts at a window's start (the resume offsets are windows'
  // lows, which never decrease), and re-delivered offsets are dropped, so
  // everything in [low, next_unread) has been read here.
  return next_unread_[StreamId(stream.name)] >= stream.high;
}

bool Daemon::LocallyAssigned(const std::string& stream) {
  // Only the partition's current holder sums it: a process that read a
  // partition before a rebalance moved it away could (its records are still
  // staged), but would then do the new holder's work twice.
  return !assigned_.has_value() || assigned_->count(stream) > 0;
}

bool Daemon::LocallyOverflowing(const WorkStream& stream) {
  if (capacity_ <= 0 || pool_size_ + staged_in_window_ <= capacity_) return false;
  return LocallyAssigned(stream.name) && !LocallyComplete(stream);
}

StatusOr<std::string> Daemon::LocalPartial(const svi::StepKey& key, const WorkStream& stream) {
  std::vector<svi::StreamCandidates> one(1);
  one[0].stream = stream.name;
  {
    // Pointers into the staging deque stay valid while the ingest thread
    // appends (std::deque::push_back keeps references); only this thread
    // removes staged records.
    std::lock_guard<std::mutex> lock(mutex_);
    for (const Staged& staged : staging_[StreamId(stream.name)]) {
      if (staged.offset >= stream.high) break;
      if (staged.offset < stream.low) continue;
      one[0].records.push_back(&staged.record);
      one[0].offsets.push_back(staged.offset);
    }
  }
  std::string encoded;
  VIPSD_RETURN_IF_ERROR(driver_->SumStreams(
      key, one, [&encoded](size_t, privacy::GaussianSumMechanism& partial) -> Status {
        VIPSD_ASSIGN_OR_RETURN(encoded, partial.EncodeUnreleased());
        return Status::Ok();
      }));
  return encoded;
}

std::optional<std::vector<std::pair<int64_t, std::string>>> Daemon::PollWork(
    std::chrono::milliseconds wait, int* failures) {
  auto messages = exchange_->Poll(wait);
  if (messages.ok()) return std::move(*messages);
  if ((*failures)++ % 20 == 0) {
    Log(LogLevel::kWarning, kComponent,
        "cannot read the " + exchange_->Describe() + " (retrying): " +
            messages.status().ToString());
  }
  std::unique_lock<std::mutex> lock(mutex_);
  wake_.wait_for(lock, std::chrono::milliseconds(300), [&] { return stop_; });
  return std::nullopt;
}

StatusOr<int64_t> Daemon::AppendWork(const std::string& bytes) {
  auto backoff = std::chrono::milliseconds(200);
  int failures = 0;
  for (;;) {
    auto appended = exchange_->Append(bytes);
    if (appended.ok()) return appended;
    if (failures++ == 0 || failures % 10 == 0) {
      Log(LogLevel::kWarning, kComponent,
          "cannot append to the " + exchange_->Describe() + " (retrying): " +
              appended.status().ToString());
    }
    std::unique_lock<std::mutex> lock(mutex_);
    if (wake_.wait_for(lock, backoff, [&] { return stop_; })) return CancelledError("stopping");
    backoff = std::min(backoff * 2, std::chrono::milliseconds(5000));
  }
}

StatusOr<svi::StepResult> Daemon::SharedStep(int64_t slot, PendingOutput* out) {
  // Exactly svi::StepDriver::Step, with the partial sums of the partitions
  // computed wherever the consumer group put them.
  VIPSD_ASSIGN_OR_RETURN(svi::StepTicket ticket, driver_->Begin());
  if (ticket.result.outcome == svi::StepResult::Outcome::kRefusedCeiling) return ticket.result;
  // From here the step is charged: if it does not finish, its number is
  // consumed (svi::StepDriver::Abandon) and the ledger's step counter stays
  // above the accountant's step count.
  StatusOr<svi::StepResult> result = SharedStepCharged(ticket, slot, out);
  if (!result.ok()) driver_->Abandon(ticket);
  return result;
}

StatusOr<svi::StepResult> Daemon::SharedStepCharged(const svi::StepTicket& ticket, int64_t slot,
                                                    PendingOutput* out) {
  WorkPlan plan;
  plan.job = config_.ledger_key;
  plan.epoch = replica_->epoch();
  plan.owner = replica_->owner();
  plan.step = ticket.result.step;
  plan.slot = slot;
  plan.sampling_rate = config_.driver.sampling_rate;
  plan.is_private = config_.is_private();
  plan.key = ticket.key;
  std::vector<std::string> names = state_.windows.Streams();
  std::sort(names.begin(), names.end());
  int64_t window_offsets = 0;
  for (const std::string& name : names) {
    const svi::OffsetRange window = state_.windows.Window(name, slot);
    plan.streams.push_back({name, window.low, window.high});
    window_offsets += window.high - window.low;
    // An empty window adds nothing: its partial sum is zero.
    if (window.high > window.low) plan.wanted.push_back(name);
  }
  out->window_offsets = window_offsets;
  Checkpoint model;
  model.run_id = state_.run_id;
  model.step = model_step_;
  model.model_type = bundle_.model->type();
  model.model_fingerprint = bundle_.model_fingerprint;
  model.arrays = bundle_.model->CheckpointArrays();
  VIPSD_ASSIGN_OR_RETURN(plan.model, CheckpointStore::Encode(model));
  VIPSD_ASSIGN_OR_RETURN(const int64_t plan_offset, AppendWork(EncodeWorkPlan(plan)));
  plan.model.clear();
  plan.plan_offset = plan_offset;
  // Partials come after the plan; the exchange reads on from where the
  // previous step stopped (earlier messages are filtered by step), which
  // keeps its reader's assignment (a seek would re-assign it).

  std::map<std::string, std::string> sums;  // PRIVATE: stream → encoded partial
  auto last_reminder = std::chrono::steady_clock::now();
  bool logged = false;
  int poll_failures = 0;
  while (sums.size() < plan.wanted.size()) {
    std::vector<const WorkStream*> ready;
    std::string overflowing;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stop_) return CancelledError("stopping");
      for (const std::string& name : plan.wanted) {
        if (sums.count(name) > 0) continue;
        const WorkStream* stream = FindStream(plan, name);
        if (!LocallyAssigned(name)) continue;
        if (LocallyComplete(*stream)) {
          ready.push_back(stream);
        } else if (LocallyOverflowing(*stream)) {
          overflowing = name;
        }
      }
    }
    if (!overflowing.empty()) {
      return OutOfRangeError("the window of " + overflowing +
                             " does not fit this process's pool.capacity = " +
                             std::to_string(config_.pool_capacity) +
                             " (no release; the step was charged)");
    }
    for (const WorkStream* stream : ready) {
      VIPSD_ASSIGN_OR_RETURN(sums[stream->name], LocalPartial(plan.key, *stream));
      ++out->partials_local;
    }
    if (sums.size() == plan.wanted.size()) break;
    auto messages = PollWork(kWorkPoll, &poll_failures);
    if (!messages.has_value()) continue;
    for (auto& [offset, bytes] : *messages) {
      auto kind = WorkMessageKindOf(bytes);
      if (!kind.ok() || *kind != WorkMessageKind::kPartial) continue;  // plans (ours)
      auto partial = DecodeWorkPartial(bytes);
      if (!partial.ok()) {
        // With the step's outputs, at its deadline: when this loop runs
        // follows the step's own work.
        out->log_lines.emplace_back(LogLevel::kWarning,
                                    exchange_->Describe() + " offset " + std::to_string(offset) +
                                        ": " + partial.status().ToString() + "; ignored");
        continue;
      }
      if (partial->epoch != plan.epoch || partial->owner != plan.owner ||
          partial->step != plan.step || partial->slot != plan.slot ||
          sums.count(partial->stream) > 0 ||
          !std::binary_search(plan.wanted.begin(), plan.wanted.end(), partial->stream)) {
        continue;  // another step's, a duplicate, or not wanted
      }
      if (partial->overflow) {
        return OutOfRangeError("the window of " + partial->stream +
                               " does not fit the pool.capacity of the process holding it (" +
                               partial->instance + "; no release; the step was charged)");
      }
      sums[partial->stream] = std::move(partial->sum);
      ++out->partials_remote;
    }
    const auto now = std::chrono::steady_clock::now();
    if (sums.size() < plan.wanted.size() && now - last_reminder >= kReminderInterval) {
      // A coordinator that waits must notice a takeover: the new owner
      // waits in turn for the partitions this one holds, and this one
      // commits (and would learn it is fenced) only after its step.
      const Status owner = replica_->ConfirmOwner();
      if (!owner.ok() && replica_->fenced()) {
        OnFenced(owner);
        return CancelledError("fenced");
      }
      // Whoever holds a missing partition now (a rebalance, a new process)
      // finds the step.
      WorkPlan reminder = plan;
      reminder.wanted.clear();
      for (const std::string& name : plan.wanted) {
        if (sums.count(name) == 0) reminder.wanted.push_back(name);
      }
      auto appended = exchange_->Append(EncodeWorkPlan(reminder));
      if (!appended.ok()) {
        Log(LogLevel::kWarning, kComponent,
            "cannot append a plan reminder to the " + exchange_->Describe() + ": " +
                appended.status().ToString());
      }
      last_reminder = now;
      if (!logged && out->deadline > 0 && Now() > out->deadline) {
        // Only once the step overran its deadline (which the overrun line
        // reveals anyway), and said at the step's output time: how long the
        // partials take follows the workers' batches.
        logged = true;
        std::string missing;
        for (const std::string& name : reminder.wanted) missing += (missing.empty() ? "" : ", ") + name;
        out->log_lines.emplace_back(
            LogLevel::kInfo, "step " + std::to_string(plan.step) +
                                 " overran its deadline waiting for the partial sums of " +
                                 missing + " (partitions being moved, or read by a slow process)");
      }
    }
  }
  const privacy::BlockLayout& layout = bundle_.model->statistic_layout();
  if (shared_total_ == nullptr) {
    shared_total_ = std::make_unique<privacy::GaussianSumMechanism>(layout);
  } else {
    shared_total_->Reset();
  }
  // Partition-name order: the summation order of one process.
  for (const std::string& name : plan.wanted) {
    VIPSD_ASSIGN_OR_RETURN(auto partial,
                           privacy::GaussianSumMechanism::DecodeUnreleased(layout, sums.at(name)));
    VIPSD_RETURN_IF_ERROR(shared_total_->Merge(std::move(*partial)));
  }
  return driver_->Finish(ticket, *shared_total_);
}

Status Daemon::AdoptPlan(WorkPlan plan) {
  if (plan_.has_value()) {
    const int64_t published = pending_published_;
    pending_published_ = 0;
    if (published > 0) {
      // Counted now, at the next plan's (public) time.
      metrics_->work_partials_published_total().Increment(static_cast<double>(published));
      std::lock_guard<std::mutex> lock(mutex_);
      status_.partials_published += published;
      ++status_.plans_followed;
    }
  }
  const std::pair<uint64_t, int64_t> plan_id{plan.epoch, plan.step};
  if (plan_model_of_ != plan_id) {
    auto model = CheckpointStore::Decode(plan.model, exchange_->Describe() + " plan");
    Status restored = model.status();
    if (restored.ok() && (model->model_type != bundle_.model->type() ||
                          model->model_fingerprint != bundle_.model_fingerprint)) {
      restored = InvalidArgumentError(
          "the coordinator's model (" + model->model_type + ", fingerprint " +
          model->model_fingerprint.substr(0, 12) + "…) is not this process's (" +
          bundle_.model->type() + ", " + bundle_.model_fingerprint.substr(0, 12) +
          "…): the processes of a job need one model configuration");
    }
    if (restored.ok() && plan.is_private != config_.is_private()) {
      restored = InvalidArgumentError(
          "the coordinator's run is " + std::string(plan.is_private ? "" : "NOT ") +
          "private and this process's configuration is " +
          (config_.is_private() ? "" : "NOT ") + "private");
    }
    if (restored.ok()) restored = bundle_.model->RestoreCheckpoint(model->arrays);
    if (restored.ok()) {
      latest_plan_model_ = plan.model;
      svi::DriverConfig driver_config = DriverConfigFor(config_);
      // The plan's q is what the accountant charged: a reload on one
      // process must not change another's sample.
      driver_config.sampling_rate = plan.sampling_rate;
      auto driver = svi::StepDriver::Create(bundle_.model.get(), noise_.get(), &state_.accountant,
                                            driver_config, plan.step);
      restored = driver.status();
      if (driver.ok()) driver_ = std::move(*driver);
    }
    if (!restored.ok()) {
      plan_model_of_ = {0, -1};
      plan_.reset();
      if (restored.code() == StatusCode::kInvalidArgument) {
        // This process's configuration is not the job's: it must not hold
        // partitions it cannot sum (the steps would wait for ever).
        return InvalidArgumentError("cannot follow the coordinator's plans: " +
                                    std::string(restored.message()));
      }
      Log(LogLevel::kError, kComponent,
          "cannot follow the plan of step " + std::to_string(plan.step) + ": " +
              restored.ToString());
      return Status::Ok();
    }
    plan_model_of_ = plan_id;
  }
  std::map<std::string, int64_t> cuts;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const WorkStream& stream : plan.streams) {
      // A partition this process gets later resumes at its window's start;
      // records below it are never a candidate again.
      resume_offsets_[stream.name] = stream.low;
      cuts[stream.name] = stream.high;
      std::deque<Staged>& staged = staging_[StreamId(stream.name)];
      while (!staged.empty() && staged.front().offset < stream.low) staged.pop_front();
    }
  }
  SetTargets(cuts);
  const bool same_step = plan_.has_value() && plan_->epoch == plan.epoch && plan_->step == plan.step;
  if (!same_step) plan_sent_.clear();
  plan.model.clear();
  plan_ = std::move(plan);
  return Status::Ok();
}

void Daemon::WorkOnPlan() {
  std::vector<const WorkStream*> ready, overflowing;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const std::string& name : plan_->wanted) {
      if (plan_sent_.count(name) > 0) continue;
      const WorkStream* stream = FindStream(*plan_, name);
      if (stream == nullptr || !LocallyAssigned(name)) continue;
      if (LocallyComplete(*stream)) {
        ready.push_back(stream);
      } else if (LocallyOverflowing(*stream)) {
        overflowing.push_back(stream);
      }
    }
  }
  auto partial_of = [&](const WorkStream& stream) {
    WorkPartial partial;
    partial.job = plan_->job;
    partial.epoch = plan_->epoch;
    partial.owner = plan_->owner;
    partial.step = plan_->step;
    partial.slot = plan_->slot;
    partial.stream = stream.name;
    partial.instance = instance_;
    return partial;
  };
  for (const WorkStream* stream : ready) {
    WorkPartial partial = partial_of(*stream);
    auto sum = LocalPartial(plan_->key, *stream);
    if (!sum.ok()) {
      // The coordinator waits for this partition: leave the group (the
      // process stops with this error) so that another process sums it.
      std::lock_guard<std::mutex> lock(mutex_);
      if (!ingest_error_) {
        ingest_error_ = InternalError("partial sum of " + stream->name + " for step " +
                                      std::to_string(plan_->step) +
                                      " failed: " + sum.status().ToString());
      }
      stop_ = true;
      wake_.notify_all();
      return;
    }
    partial.sum = std::move(*sum);
    if (!AppendWork(EncodeWorkPartial(partial)).ok()) return;  // stopping
    plan_sent_.insert(stream->name);
    ++pending_published_;
  }
  for (const WorkStream* stream : overflowing) {
    WorkPartial partial = partial_of(*stream);
    partial.overflow = true;
    if (!AppendWork(EncodeWorkPartial(partial)).ok()) return;
    plan_sent_.insert(stream->name);
  }
}

Status Daemon::RunWorker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    capacity_ = config_.pool_capacity;
  }
  metrics_->worker().Set(1);
  Log(LogLevel::kInfo, kComponent,
      "working for job '" + config_.ledger_key + "' on " + exchange_->Describe() +
          (instance_.empty() ? "" : " as " + instance_) +
          ": it joins the consumer group at the coordinator's first plan and sums the "
          "partitions the group gives it");
  int failures = 0;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stop_) break;
    }
    if (plan_.has_value()) WorkOnPlan();
    auto messages = PollWork(std::chrono::milliseconds(100), &failures);
    if (!messages.has_value()) continue;
    // The newest plan of the highest epoch; a reminder of the plan in hand
    // updates what is still wanted.
    std::optional<WorkPlan> next;
    for (auto& [offset, bytes] : *messages) {
      auto kind = WorkMessageKindOf(bytes);
      if (!kind.ok() || *kind != WorkMessageKind::kPlan) continue;
      auto plan = DecodeWorkPlan(bytes);
      if (!plan.ok()) {
        Log(LogLevel::kWarning, kComponent,
            exchange_->Describe() + " offset " + std::to_string(offset) + ": " +
                plan.status().ToString() + "; ignored");
        continue;
      }
      if (plan->epoch < highest_epoch_) continue;  // a replaced coordinator's
      highest_epoch_ = plan->epoch;
      last_plan_seen_ns_.store(SteadyNowNs());
      const WorkPlan* current = next.has_value() ? &*next : (plan_.has_value() ? &*plan_ : nullptr);
      if (current != nullptr && current->epoch == plan->epoch &&
          (plan->step < current->step ||
           (plan->step == current->step && plan->slot < current->slot))) {
        continue;  // older than the plan in hand
      }
      next = std::move(*plan);
    }
    if (!next.has_value()) continue;
    if (next->model.empty()) {
      // A reminder: the model is in the full plan.
      const bool have_model = plan_model_of_ == std::make_pair(next->epoch, next->step);
      if (!have_model) {
        auto full = exchange_->ReadAt(next->plan_offset);
        auto decoded = full.ok() ? DecodeWorkPlan(*full) : StatusOr<WorkPlan>(full.status());
        if (!decoded.ok() || decoded->epoch != next->epoch || decoded->step != next->step) {
          Log(LogLevel::kWarning, kComponent,
              "the plan of step " + std::to_string(next->step) + " at " + exchange_->Describe() +
                  " offset " + std::to_string(next->plan_offset) + " cannot be read (" +
                  (decoded.ok() ? std::string("another step") : decoded.status().ToString()) +
                  "); waiting for the next plan");
          continue;
        }
        decoded->wanted = std::move(next->wanted);
        next = std::move(*decoded);
      }
    }
    const Status adopted = AdoptPlan(std::move(*next));
    if (!adopted.ok()) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!ingest_error_) ingest_error_ = adopted;  // Run()'s result
      break;
    }
    if (source_ == nullptr && plan_.has_value()) {
      // The group is joined once a plan names every partition's window
      // start: a partition resumes there (one no plan names yet: at its
      // first retained record). Reading from below a window's start is
      // always complete; what lies below is dropped at the next plan.
      Daemon* self = this;
      auto source = make_source_([self](const std::string& topic, int32_t partition)
                                     -> std::optional<int64_t> {
        std::lock_guard<std::mutex> lock(self->mutex_);
        const auto it = self->resume_offsets_.find(StreamName(topic, partition));
        return it == self->resume_offsets_.end() ? int64_t{0} : it->second;
      });
      if (!source.ok()) {
        metrics_->worker().Set(0);
        return source.status();
      }
      source_ = std::move(*source);
      ingest_thread_ = std::thread([this] { IngestLoop(); });
    }
  }
  RequestStop();
  if (ingest_thread_.joinable()) ingest_thread_.join();
  Status result = Status::Ok();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (ingest_error_) result = *ingest_error_;
  }
  CloseIo();
  metrics_->worker().Set(0);
  Log(LogLevel::kInfo, kComponent, "worker stopped");
  return result;
}

}  // namespace vipsd::daemon
