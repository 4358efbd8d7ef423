#include "daemon/step/solo_step.h"

namespace vipsd::daemon {

StatusOr<svi::StepResult> SoloStep::Step(int64_t slot, const SlotTargets& targets,
                                         int64_t model_step, SlotOutputs* out) {
  (void)slot;
  (void)targets;
  (void)model_step;
  window_broken_ = false;
  if (parts_.driver == nullptr) return FailedPreconditionError("solo step: no parts bound");
  auto streams = parts_.pool->Candidates(parts_.ingest->StreamNames());
  if (!streams.ok()) {
    window_broken_ = true;
    parts_.keeper->Stick(streams.status());
    out->log_lines.emplace_back(LogLevel::kError, "window invariant broken; no further step: " +
                                                      streams.status().ToString());
    return streams.status();
  }
  StatusOr<svi::StepResult> result = parts_.driver->Step(*streams);
  if (result.ok() && result->outcome != svi::StepResult::Outcome::kRefusedCeiling) {
    const svi::StepPhaseSeconds& phases = result->phase_seconds;
    out->phases = {{"charge", phases.charge}, {"sample", phases.sample}, {"estep", phases.estep},
                   {"noise", phases.noise},   {"mstep", phases.mstep}};
  }
  return result;
}

StepFailure SoloStep::Classify(const Status& error) const {
  (void)error;
  return window_broken_ ? StepFailure::kQuiet : StepFailure::kFailed;
}

}  // namespace vipsd::daemon
