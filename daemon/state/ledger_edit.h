// LedgerEdit: one change of the privacy record (LedgerState) while a daemon
// runs — the only way it changes once loaded (its start-up preparation,
// daemon/setup/startup_check.h, comes before). Like leveldb's VersionEdit applied
// by LogAndApply: the ledger keeper (daemon/parts/ledger_keeper.h) builds one edit
// per named operation and applies it with ApplyLedgerEdit, which validates it
// first; a failed edit changes nothing. The same function replays a run's
// edits on its starting state and arrives at the same state (a test does;
// DaemonHooks::ledger_edit hands them out).
//
// Edits carry public values only: stream names and offsets (stream volume
// is public), slot numbers and times, (q, σ) and the ε of a residency
// window, the configured ceiling and window, a budget-warning level, the
// aggregator run a holder serves.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "core/base/status.h"
#include "daemon/state/ledger.h"

namespace vipsd::daemon {

struct LedgerEdit {
  enum class Kind {
    kAddStream,          // `stream` joins the slot windows from offset `count` (its origin)
    kRecordCuts,         // slot `slot`'s cuts (`cuts`; none: the slot passed without any)
    kSetInterval,        // the slot interval `value` (seconds) from slot `slot` on
    kSetWindowSlots,     // schedule.window_steps: `count` (only ever shortened)
    kSetResidencySteps,  // residency mode's window M: `count` (only ever lowered)
    kLowerCeiling,       // privacy.epsilon_ceiling: `value` (only ever lowered)
    kCharge,             // one private step of `step` composed
    kNoteNoise,          // step `count` was charged with noise `noise` (the noise history)
    kResidencyStep,      // a step of `step` closing a window at ε `value`
    kWarningLevel,       // the highest budget-warning fraction announced: `value`
    kBindFederationRun,  // a holder's pads are bound to the aggregator run `stream`
    kSetNextStep,        // the driver's counter, written with a commit: `count`
  };
  enum class Noise { kPrivate, kNonPrivate, kFixedSeed };

  Kind kind = Kind::kRecordCuts;
  std::string stream{};
  int64_t slot = 0;
  int64_t count = 0;
  double value = 0;
  privacy::SampledGaussian step{};
  Noise noise = Noise::kPrivate;
  std::map<std::string, int64_t> cuts{};

  static LedgerEdit AddStream(const std::string& stream, int64_t origin);
  static LedgerEdit RecordCuts(int64_t slot, std::map<std::string, int64_t> cuts);
  static LedgerEdit SkipTo(int64_t slot) { return RecordCuts(slot, {}); }
  static LedgerEdit SetInterval(double interval_seconds, int64_t from_slot);
  static LedgerEdit SetWindowSlots(int64_t window_slots);
  static LedgerEdit SetResidencySteps(int64_t max_residency_steps);
  static LedgerEdit LowerCeiling(double epsilon_ceiling);
  static LedgerEdit Charge(const privacy::SampledGaussian& step);
  static LedgerEdit NoteNoise(int64_t step, Noise noise);
  static LedgerEdit ResidencyStep(const privacy::SampledGaussian& step, double window_epsilon);
  static LedgerEdit WarningLevel(double level);
  static LedgerEdit BindFederationRun(const std::string& run);
  static LedgerEdit SetNextStep(int64_t next_step);
};

std::string_view LedgerEditKindName(LedgerEdit::Kind kind);

// Applies `edit` to `state`, or changes nothing and says why: a cut below an
// earlier one or a slot not after the last (core/svi/slot_windows.h), a
// raised ceiling or window, a step counter that goes back, a charge the
// accountant refuses, a holder bound to another run, a residency edit on a
// global ledger.
Status ApplyLedgerEdit(const LedgerEdit& edit, LedgerState* state);

}  // namespace vipsd::daemon
