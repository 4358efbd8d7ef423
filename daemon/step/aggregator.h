// Aggregator: the step (slot_step.h) of a federation's aggregator
// (federation.role: aggregator; docs/federation.md): one step is one ROUND
// of the holders' masked, noised shares (aggregator.cc says how a round
// goes). The aggregator holds no data: its input is NoInputSource and it
// sees only masked shares and their sum.
//
// Errors: FAILED_PRECONDITION when no round could be planned (too few
// holders ready; nothing charged; said when the reason changes); UNAVAILABLE
// for a round abandoned (charged, never released); CANCELLED when stopping
// or fenced.
//
// Thread-safety: step thread only.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/base/status.h"
#include "core/privacy/mechanisms/secure_aggregation.h"
#include "core/svi/step_driver.h"
#include "daemon/step/slot_step.h"
#include "daemon/step/work_io.h"

namespace vipsd::daemon {

class Aggregator final : public SlotStep {
 public:
  Aggregator(std::unique_ptr<WorkExchange> exchange, RunControl* control);

  // The roster, tolerated_holders and the round timeout. Call before the
  // first Step; INVALID_ARGUMENT for a bad roster.
  Status Configure(const config::FederationSettings& settings);

  void Bind(StepParts parts) override { parts_ = std::move(parts); }
  bool CutsLocally() const override { return false; }
  // A round: the plan names the participating holders and carries no key
  // and no windows; the step's release is the sum of their shares.
  StatusOr<svi::StepResult> Step(int64_t slot, const SlotTargets& targets, int64_t model_step,
                                 SlotOutputs* out) override;
  StepFailure Classify(const Status& error) const override;

 private:
  // A round: the plan, the shares of every participant within
  // federation.round_timeout_seconds, their sum, the M-step. A round that
  // misses or is declined a share is abandoned (UNAVAILABLE; charged, never
  // released) and the holders concerned leave the participants until they
  // ask to join again.
  StatusOr<svi::StepResult> Round(const svi::StepTicket& ticket, int64_t slot,
                                  const SlotTargets& targets, int64_t model_step,
                                  SlotOutputs* out);
  // Reads the share log for joins (a holder not among the participants that
  // is ready again) without waiting.
  void DrainJoins(SlotOutputs* out);
  // One share-log message: a join is noted; a share or decline of `plan`'s
  // round from a participant is kept in `shares` / `declined`.
  void TakeShare(const FederatedPlan& plan, int64_t offset, const std::string& bytes,
                 std::map<std::string, FederatedShare>* shares,
                 std::map<std::string, std::string>* declined, SlotOutputs* out);

  WorkIo work_;
  RunControl* const control_;
  StepParts parts_;
  // The roster (public), its fingerprint, tolerated_holders, the round
  // timeout, the participants of the next round and the holders that asked
  // to join since the last plan.
  std::vector<privacy::RosterEntry> roster_;
  std::string roster_fingerprint_;
  uint32_t tolerated_ = 0;
  std::chrono::milliseconds round_timeout_{30000};
  // The last refusal said to each holder (its incarnation and why), so that
  // a holder that keeps asking is refused once, not at every join.
  std::map<std::string, std::string> refused_;
  std::set<std::string> participants_;
  std::set<std::string> joining_;
  // Each holder's incarnation from its last join (FederatedPlan::incarnations).
  std::map<std::string, std::string> incarnations_;
  // The last Step planned no round (too few holders ready): it returned
  // FAILED_PRECONDITION and charged nothing.
  bool round_unplanned_ = false;
  // The last "no round" reason said, so that it is said when it changes,
  // not at every slot.
  std::string no_round_said_;
  // A federated message of an older vipsd (an old holder's joins and
  // shares) was logged: said once per run, as it repeats every few seconds.
  bool warned_old_message_ = false;
};

}  // namespace vipsd::daemon
