// Coordinator: the shared step (slot_step.h) of the process that owns a job
// whose work is shared (state.work_topic; daemon/io/work_exchange.h has the
// protocol). A federation's aggregator is another SlotStep (aggregator.h).
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
// (pool.capacity; the daemon stops stepping as one process would:
// StepFailure::kWindowOverflow); CANCELLED when stopping or fenced (another
// process owns the job).
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
#include "core/svi/step_driver.h"
#include "daemon/parts/ingest.h"
#include "daemon/parts/ledger_keeper.h"
#include "daemon/parts/publisher.h"
#include "daemon/setup/model_setup.h"
#include "daemon/step/slot_step.h"
#include "daemon/step/work_io.h"

namespace vipsd::daemon {

class Coordinator final : public SlotStep {
 public:
  Coordinator(std::unique_ptr<WorkExchange> exchange, RunControl* control);

  void Bind(StepParts parts) override { parts_ = std::move(parts); }
  bool CutsLocally() const override { return false; }
  StatusOr<svi::StepResult> Step(int64_t slot, const SlotTargets& targets, int64_t model_step,
                                 SlotOutputs* out) override;
  StepFailure Classify(const Status& error) const override;
  std::map<std::string, int64_t> TakeCuts() override { return std::exchange(cuts_, {}); }

 private:
  // One step's view: the bound parts and the slot's values.
  struct Context : StepParts {
    int64_t model_step = 0;  // the step whose M-step the model includes
    const SlotTargets* targets = nullptr;
    std::map<std::string, int64_t>* cuts = nullptr;
  };

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
  StepParts parts_;
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
  // The last Step failed because a process could not hold a partition's
  // window (Classify: kWindowOverflow).
  bool window_overflow_ = false;
};

}  // namespace vipsd::daemon
