// SoloStep: the step of one process (slot_step.h). The daemon cut the
// slot and admitted its window into the pool; the step samples the pool's
// candidates, each stream in offset order as the pool keeps them (the
// per-record randomness is keyed by the stream's name and the record's
// offset, core/svi/step_randomness.h, so the step is the same whichever
// process holds which partition), and runs svi::StepDriver::Step.
//
// A pool whose candidates cannot be listed (a broken window invariant)
// stops stepping for good (LedgerKeeper::Stick) before anything is charged.
//
// Thread-safety: step thread only.
#pragma once

#include "daemon/step/slot_step.h"

namespace vipsd::daemon {

class SoloStep final : public SlotStep {
 public:
  void Bind(StepParts parts) override { parts_ = std::move(parts); }
  bool CutsLocally() const override { return true; }
  StatusOr<svi::StepResult> Step(int64_t slot, const SlotTargets& targets, int64_t model_step,
                                 SlotOutputs* out) override;
  StepFailure Classify(const Status& error) const override;

 private:
  StepParts parts_;
  // The last Step found the window invariant broken (nothing charged).
  bool window_broken_ = false;
};

}  // namespace vipsd::daemon
