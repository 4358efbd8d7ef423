#include "daemon/state/ledger_edit.h"

#include <cmath>
#include <utility>

#include "core/base/format.h"

namespace vipsd::daemon {

// Designated initializers in the members' order (ledger_edit.h).
LedgerEdit LedgerEdit::AddStream(const std::string& stream, int64_t origin) {
  return {.kind = Kind::kAddStream, .stream = stream, .count = origin};
}

LedgerEdit LedgerEdit::RecordCuts(int64_t slot, std::map<std::string, int64_t> cuts) {
  return {.kind = Kind::kRecordCuts, .slot = slot, .cuts = std::move(cuts)};
}

LedgerEdit LedgerEdit::SetInterval(double interval_seconds, int64_t from_slot) {
  return {.kind = Kind::kSetInterval, .slot = from_slot, .value = interval_seconds};
}

LedgerEdit LedgerEdit::SetWindowSlots(int64_t window_slots) {
  return {.kind = Kind::kSetWindowSlots, .count = window_slots};
}

LedgerEdit LedgerEdit::SetResidencySteps(int64_t max_residency_steps) {
  return {.kind = Kind::kSetResidencySteps, .count = max_residency_steps};
}

LedgerEdit LedgerEdit::LowerCeiling(double epsilon_ceiling) {
  return {.kind = Kind::kLowerCeiling, .value = epsilon_ceiling};
}

LedgerEdit LedgerEdit::Charge(const privacy::SampledGaussian& step) {
  return {.kind = Kind::kCharge, .step = step};
}

LedgerEdit LedgerEdit::NoteNoise(int64_t step, Noise noise) {
  return {.kind = Kind::kNoteNoise, .count = step, .noise = noise};
}

LedgerEdit LedgerEdit::ResidencyStep(const privacy::SampledGaussian& step,
                                     double window_epsilon) {
  return {.kind = Kind::kResidencyStep, .value = window_epsilon, .step = step};
}

LedgerEdit LedgerEdit::WarningLevel(double level) {
  return {.kind = Kind::kWarningLevel, .value = level};
}

LedgerEdit LedgerEdit::BindFederationRun(const std::string& run) {
  return {.kind = Kind::kBindFederationRun, .stream = run};
}

LedgerEdit LedgerEdit::SetNextStep(int64_t next_step) {
  return {.kind = Kind::kSetNextStep, .count = next_step};
}

std::string_view LedgerEditKindName(LedgerEdit::Kind kind) {
  switch (kind) {
    case LedgerEdit::Kind::kAddStream: return "add_stream";
    case LedgerEdit::Kind::kRecordCuts: return "record_cuts";
    case LedgerEdit::Kind::kSetInterval: return "set_interval";
    case LedgerEdit::Kind::kSetWindowSlots: return "set_window_slots";
    case LedgerEdit::Kind::kSetResidencySteps: return "set_residency_steps";
    case LedgerEdit::Kind::kLowerCeiling: return "lower_ceiling";
    case LedgerEdit::Kind::kCharge: return "charge";
    case LedgerEdit::Kind::kNoteNoise: return "note_noise";
    case LedgerEdit::Kind::kResidencyStep: return "residency_step";
    case LedgerEdit::Kind::kWarningLevel: return "warning_level";
    case LedgerEdit::Kind::kBindFederationRun: return "bind_federation_run";
    case LedgerEdit::Kind::kSetNextStep: return "set_next_step";
  }
  return "unknown";
}

namespace {

Status Refuse(const LedgerEdit& edit, const std::string& why) {
  return InvalidArgumentError("ledger edit " + std::string(LedgerEditKindName(edit.kind)) +
                              ": " + why);
}

}  // namespace

Status ApplyLedgerEdit(const LedgerEdit& edit, LedgerState* state) {
  // Each case validates before it changes anything; the component methods
  // it calls (SlotWindows, the accountants) do too.
  switch (edit.kind) {
    case LedgerEdit::Kind::kAddStream:
      if (state->windows.HasStream(edit.stream)) {
        return Refuse(edit, "the stream " + edit.stream + " is in the windows already");
      }
      return state->windows.AddStream(edit.stream, edit.count);
    case LedgerEdit::Kind::kRecordCuts:
      return state->windows.RecordCuts(edit.slot, edit.cuts);
    case LedgerEdit::Kind::kSetInterval:
      return state->windows.SetInterval(edit.value, edit.slot);
    case LedgerEdit::Kind::kSetWindowSlots:
      return state->windows.SetWindowSlots(edit.count);
    case LedgerEdit::Kind::kSetResidencySteps:
      if (!state->residency.has_value()) return Refuse(edit, "the ledger is not in residency mode");
      return state->residency->SetMaxResidencySteps(edit.count);
    case LedgerEdit::Kind::kLowerCeiling:
      if (!(edit.value > 0) || !std::isfinite(edit.value)) {
        return Refuse(edit, "the ceiling must be positive and finite");
      }
      if (state->epsilon_ceiling > 0 && edit.value > state->epsilon_ceiling) {
        return Refuse(edit, "the ceiling " + ShortestNumber(edit.value) +
                                " is above the recorded " +
                                ShortestNumber(state->epsilon_ceiling) + " (it is only lowered)");
      }
      state->epsilon_ceiling = edit.value;
      return Status::Ok();
    case LedgerEdit::Kind::kCharge:
      return state->accountant.Compose(edit.step, 1);
    case LedgerEdit::Kind::kNoteNoise: {
      NoiseHistory& noise = state->noise;
      switch (edit.noise) {
        case LedgerEdit::Noise::kNonPrivate:
          if (noise.non_private_steps++ == 0) noise.first_non_private_step = edit.count;
          break;
        case LedgerEdit::Noise::kFixedSeed:
          if (noise.fixed_seed_steps++ == 0) noise.first_fixed_seed_step = edit.count;
          break;
        case LedgerEdit::Noise::kPrivate:
          ++noise.private_steps;
          break;
      }
      return Status::Ok();
    }
    case LedgerEdit::Kind::kResidencyStep:
      if (!state->residency.has_value()) return Refuse(edit, "the ledger is not in residency mode");
      return state->residency->RecordStep(edit.step, edit.value);
    case LedgerEdit::Kind::kWarningLevel:
      if (!(edit.value > state->warning_level) || edit.value > 1) {
        return Refuse(edit, "a warning level only rises, up to 1");
      }
      state->warning_level = edit.value;
      return Status::Ok();
    case LedgerEdit::Kind::kBindFederationRun:
      if (!IsRunId(edit.stream)) return Refuse(edit, "not a run id");
      if (!state->federation_run.empty() && state->federation_run != edit.stream) {
        return Refuse(edit, "the directory serves the aggregator run " + state->federation_run);
      }
      state->federation_run = edit.stream;
      return Status::Ok();
    case LedgerEdit::Kind::kSetNextStep:
      if (edit.count < state->next_step) {
        return Refuse(edit, "the step counter goes back from " + std::to_string(state->next_step) +
                                " to " + std::to_string(edit.count));
      }
      state->next_step = edit.count;
      return Status::Ok();
  }
  return Refuse(edit, "unknown kind");
}

}  // namespace vipsd::daemon
