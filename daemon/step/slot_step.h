// SlotStep: one slot's step, whatever the mode. The daemon
// (daemon/service/daemon.h) keeps the public clock: it cuts each slot,
// checks the budget on public parameters, calls its SlotStep, then records
// the step, holds a late slot (Daemon::HoldIfLate) and releases at the
// deadline. What differs between the modes is this interface's three
// implementations:
//   SoloStep     (solo_step.h)    one process: the daemon admitted the
//                                 slot's window into its pool; the step is
//                                 svi::StepDriver::Step on the pool's
//                                 candidates
//   Coordinator  (coordinator.h)  shared work: the same step with the
//                                 partial sums of the partitions computed
//                                 wherever the consumer group put them
//   Aggregator   (aggregator.h)   a federation: one round, the sum of the
//                                 holders' masked, noised shares
// Each is bound once to the daemon's parts (StepParts, which outlive it)
// and charges through the driver, hence through the ledger keeper, the only
// writer of the privacy record.
//
// Thread-safety: step thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "config/config.h"
#include "core/base/status.h"
#include "core/svi/record_pool.h"
#include "core/svi/step_driver.h"
#include "daemon/parts/ingest.h"
#include "daemon/parts/ledger_keeper.h"
#include "daemon/parts/publisher.h"
#include "daemon/setup/model_setup.h"

namespace vipsd::daemon {

// The daemon's parts a step uses, bound once before the first Step (they
// outlive the step; the configuration is read at every step, so a reload's
// value applies).
struct StepParts {
  const config::VipsdConfig* config = nullptr;
  svi::StepDriver* driver = nullptr;
  Ingest* ingest = nullptr;
  LedgerKeeper* keeper = nullptr;
  ModelBundle* bundle = nullptr;
  // The pool every step samples from: the daemon admits a slot's window
  // into it (the solo step's candidates); a coordinator its own
  // partitions' windows as it sums them (SumLocalStreams). The daemon
  // evicts it as its windows move (AdvanceWindow).
  svi::RecordPool* pool = nullptr;
  // Whether this process's noise is private (not fixed-seed): a federated
  // round refuses shares drawn otherwise, so that a release stated private
  // is private.
  bool secure_noise = true;
  // Called when ownership is lost while waiting (the daemon stops).
  std::function<void(const Status&)> on_fenced;
};

// What the slot loop does after a Step that failed.
enum class StepFailure {
  kFailed,          // "step failed: ..." (a charge already made is recorded)
  kWindowOverflow,  // a process could not hold a partition's window: stepping
                    // stops as one process's overflow stops it
  kQuiet,           // stopping, fenced, no round planned, or a broken window
                    // (said by the step, if at all)
};

class SlotStep {
 public:
  virtual ~SlotStep() = default;

  virtual void Bind(StepParts parts) = 0;

  // Whether this process cuts each slot's window and admits it into its
  // pool (the solo step) — or the processes that read the partitions find
  // the cuts and name them to the step (TakeCuts).
  virtual bool CutsLocally() const = 0;

  // One slot's step under `targets` (the slot's cut rule: the ends
  // observed, floors, slot time; unused by the solo step, whose pool is the
  // window), on the model after step `model_step`. Log lines, phases and
  // partial counts go to `out`, said at the slot's deadline.
  virtual StatusOr<svi::StepResult> Step(int64_t slot, const SlotTargets& targets,
                                         int64_t model_step, SlotOutputs* out) = 0;

  // What the slot loop does with the error the last Step returned.
  virtual StepFailure Classify(const Status& error) const = 0;

  // Every stream's cut that the last Step's partials named, taken (the
  // ledger records them); empty when it did not finish, and for the solo
  // step (the daemon recorded its own cuts).
  virtual std::map<std::string, int64_t> TakeCuts() { return {}; }
};

// The model a plan carries: CheckpointStore bytes of the job's run id and
// step `model_step` (shared work and federated rounds).
StatusOr<std::string> EncodePlanModel(const StepParts& parts, int64_t model_step);

}  // namespace vipsd::daemon
