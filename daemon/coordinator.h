// Coordinator: the shared step of the process that owns a job whose work is
// shared (state.work_topic; daemon/work_exchange.h has the protocol).
//
// Step() is svi::StepDriver::Step with its partial sums computed wherever
// the consumer group put the partitions: it charges the step and draws its
// key (Begin), appends the PLAN (step, slot, key, q, every partition's window
// and the model the step starts from), sums the partitions this process
// holds straight into the step's total once their windows are read, merges
// the partials other processes append as they arrive (a private run's
// integer sums in any order; a non-private run's float sums kept and added
// in partition-name order at the end), repeats the plan every second while
// partitions are missing (checking each time that it still owns the job),
// and finishes the step once every partition with a non-empty window is
// covered exactly once — bit for bit what one process computes.
// A step that was charged and does not finish consumes its number
// (svi::StepDriver::Abandon): an overcount, never an undercount.
//
// Errors: OUT_OF_RANGE when a process cannot hold a partition's window
// (pool.capacity; the daemon stops stepping as one process would);
// CANCELLED when stopping or fenced (another process owns the job).
//
// Privacy: the plan's key and the partials are PRIVATE (work topic only);
// log lines about a step are returned with its outputs, said at its
// deadline.
//
// Thread-safety: step thread only.
#pragma once

#include <chrono>
#include <functional>
#include <future>
#include <map>
#include <set>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "config/config.h"
#include "core/base/status.h"
#include "core/privacy/mechanisms/gaussian_mechanism.h"
#include "core/privacy/mechanisms/secure_aggregation.h"
#include "core/svi/step_driver.h"
#include "daemon/ingest.h"
#include "daemon/ledger_keeper.h"
#include "daemon/model_setup.h"
#include "daemon/publisher.h"
#include "daemon/work_io.h"

namespace vipsd::daemon {

class Coordinator {
 public:
  Coordinator(std::unique_ptr<WorkExchange> exchange, RunControl* control);

  // The daemon's parts a shared step uses, bound once before the first
  // Step (they outlive the coordinator; the configuration is read at every
  // step, so a reload's value applies).
  struct Parts {
    const config::VipsdConfig* config = nullptr;
    svi::StepDriver* driver = nullptr;
    Ingest* ingest = nullptr;
    LedgerKeeper* keeper = nullptr;
    ModelBundle* bundle = nullptr;
    // Whether this process's noise is private (not fixed-seed): a federated
    // round refuses shares drawn otherwise, so that a release stated
    // private is private.
    bool secure_noise = true;
    // Called when ownership is lost while waiting (the daemon stops).
    std::function<void(const Status&)> on_fenced;
  };
  void Bind(Parts parts) { parts_ = std::move(parts); }

  // One slot's step under `targets` (the slot's cut rule: the ends
  // observed, floors, slot time), on the model after step `model_step`.
  StatusOr<svi::StepResult> Step(int64_t slot, const SlotTargets& targets, int64_t model_step,
                                 SlotOutputs* out);
  // Every stream's cut that the last Step's partials named, taken (the
  // ledger records them); empty when it did not finish.
  std::map<std::string, int64_t> TakeCuts() { return std::exchange(cuts_, {}); }

  // Federated mode (federation.role: aggregator; daemon/aggregator_round.cc,
  // docs/federation.md): Step runs rounds instead — the plan names the
  // participating holders and carries no key and no windows; the step's
  // release is the sum of their masked, noised shares. Call before the
  // first Step; INVALID_ARGUMENT for a bad roster.
  Status EnableFederation(const config::FederationSettings& settings);
  bool federated() const { return !roster_.empty(); }
  // The last Step planned no round (too few holders ready): it returned
  // FAILED_PRECONDITION and charged nothing.
  bool round_unplanned() const { return round_unplanned_; }

 private:
  // One step's view: the bound parts and the slot's values.
  struct Context : Parts {
    int64_t model_step = 0;  // the step whose M-step the model includes
    const SlotTargets* targets = nullptr;
    std::map<std::string, int64_t>* cuts = nullptr;
  };

  // A federated round: the plan, the shares of every participant within
  // federation.round_timeout_seconds, their sum, the M-step. A round that
  // misses or is declined a share is abandoned (UNAVAILABLE; charged, never
  // released) and the holders concerned leave the participants until they
  // ask to join again.
  StatusOr<svi::StepResult> FederatedRound(const Context& context, const svi::StepTicket& ticket,
                                           int64_t slot, SlotOutputs* out);
  // Reads the share log for joins (a holder not among the participants that
  // is ready again) without waiting.
  void DrainJoins(const Context& context, SlotOutputs* out);
  // One share-log message: a join is noted; a share or decline of `plan`'s
  // round from a participant is kept in `shares` / `declined`.
  void TakeShare(const Context& context, const FederatedPlan& plan, int64_t offset,
                 const std::string& bytes, std::map<std::string, FederatedShare>* shares,
                 std::map<std::string, std::string>* declined, SlotOutputs* out);
  // What a step gathers besides the total (total_): every stream's cut
  // (public: stream volume) and where the time went.
  struct Gathered {
    std::map<std::string, int64_t> cuts;
    double own_seconds = 0, wait_seconds = 0, merge_seconds = 0;
  };
  // Every wanted partition's sum into total_ (reset here): this process's
  // own, summed here, and the others' partials as they arrive, reminding
  // their senders; `clock` is when the plan was appended.
  Status Gather(const Context& context, WorkPlan& plan,
                std::chrono::steady_clock::time_point clock, Gathered* gathered,
                SlotOutputs* out);
  StatusOr<svi::StepResult> StepCharged(const Context& context, const svi::StepTicket& ticket,
                                        int64_t slot, SlotOutputs* out);
  // The step's plan (every partition's window for `slot`, the model it
  // starts from, or the previous step's released sum when the previous plan
  // was of this epoch and described the model that sum's M-step changed),
  // appended to the work topic. The plan returned has neither.
  StatusOr<WorkPlan> AppendPlan(const Context& context, const svi::StepTicket& ticket,
                                int64_t slot, SlotOutputs* out);
  // The model the step starts from, as a plan carries it (CheckpointStore
  // bytes of the job's run id and context.model_step).
  static StatusOr<std::string> PlanModel(const Context& context);
  // Every second while partials are missing: still the owner? (CANCELLED
  // when fenced), then the plan again for the partitions still missing (with
  // the model, and `plan.plan_offset` moved to it, once retention took the
  // plan with the model that the step's plan follows from).
  Status Remind(const Context& context, WorkPlan& plan,
                const std::set<std::string>& covered, SlotOutputs* out, bool* logged);
  // A message of the partial log decoded (any thread): `partial` unset for
  // a message that is not a partial; `sum` decoded only for a partial of
  // `plan`'s step (no overflow).
  struct DecodedPartial {
    std::optional<StatusOr<WorkPartial>> partial;
    StatusOr<std::unique_ptr<privacy::GaussianSumMechanism>> sum =
        UnavailableError("not this step's partial");
  };
  static DecodedPartial DecodePartial(const WorkPlan& plan, const std::string& bytes,
                                      const privacy::BlockLayout& layout);
  // One decoded message of the partial log: a partial of this plan's step whose
  // partitions are all wanted and none covered yet is merged into the total
  // (a private run) or kept for the ordered merge (`float_sums`); anything
  // else is skipped (a malformed or out-of-range one with a warning line).
  // OUT_OF_RANGE for an overflow partial; DATA_LOSS for a sum that does not
  // decode against the layout.
  Status MergePartial(
      const WorkPlan& plan, int64_t offset, DecodedPartial decoded, bool ordered,
      std::set<std::string>* covered, std::map<std::string, int64_t>* cuts,
      std::map<std::string, std::unique_ptr<privacy::GaussianSumMechanism>>* float_sums,
      SlotOutputs* out);

  WorkIo work_;
  RunControl* const control_;
  Parts parts_;
  std::map<std::string, int64_t> cuts_;
  std::unique_ptr<privacy::GaussianSumMechanism> total_;
  // What the workers hold (WorkPlan::delta_sum): the last plan appended
  // (its epoch, step and offset, the model object it described), where the
  // plan with the model that it follows from lies, and how many plans since
  // carried a released sum instead.
  struct LastPlan {
    uint64_t epoch = 0;
    int64_t step = 0;
    int64_t offset = -1;
    const model::Model* model = nullptr;
    int64_t model_offset = -1;
    int deltas_since_model = 0;
  };
  std::optional<LastPlan> last_plan_;
  // The released sum of the last finished step (public), the plan step whose
  // model its M-step changed, its step, q and ρ_t; unset once a plan used it
  // or when a step did not finish.
  struct Released {
    int64_t plan_step = 0;
    int64_t step = 0;
    double sampling_rate = 0;
    double rho = 0;
    double noise_multiplier = 0;
  };
  std::optional<Released> released_;
  // A private step's released sum, encoded beside the M-step for the next
  // plan (and appended to the work topic ahead of it when `workers` take
  // part); *pending names it once the M-step succeeded. Nothing for a
  // non-private (`ordered`) step.
  void ObserveRelease(const Context& context, const WorkPlan& plan, bool ordered, bool workers,
                      std::optional<Released>* pending);
  // Its sum, and that sum encoded for the next plan (EncodeReleased) on a
  // thread of its own while the M-step, the ledger commit and the next
  // step's charge run; with workers in the step, that thread also appends
  // it to the plan log (WorkRelease). Waited for before released_sum_
  // changes, before the next plan is appended (the exchange has one user at
  // a time) and by the destructor (declared after work_ and the sum).
  Eigen::VectorXd released_sum_;
  // Where that thread appended it (−1: not appended); read once it is done.
  int64_t released_offset_ = -1;
  std::future<StatusOr<std::string>> released_encoded_;
  // Every partial below this offset of the partial log has been read
  // (WorkPlan::partials_read).
  int64_t partials_read_ = 0;
  // Federated mode: the roster (public), its fingerprint, tolerated_holders,
  // the round timeout, the participants of the next round and the holders
  // that asked to join since the last plan.
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
  bool round_unplanned_ = false;
  // A federated message of an older vipsd (an old holder's joins and
  // shares) was logged: said once per run, as it repeats every few seconds.
  bool warned_old_message_ = false;
};

}  // namespace vipsd::daemon
