// Worker: a process that helps the owner of a job whose work is shared
// (state.work_topic; daemon/io/work_exchange.h). It follows the coordinator's
// plans: it reads the partitions the consumer group gives it (joining the
// group when the first plan arrives; every partition resumes at the latest
// plan's window start), computes the partial sums of the windows it holds
// and appends them to the work topic. It adopts each plan's model, q and
// windows; a step's released sum, which the coordinator appends as soon as
// it has every partial (WorkRelease), it applies while it waits for the
// next plan. It charges nothing, writes no ledger (it holds the state
// directory's lock only, so that no second process uses it) and releases
// nothing: none of the ledger, checkpoint or release machinery exists here.
//
// A worker whose configuration is not the job's (another model, privacy on
// one side only) stops with INVALID_ARGUMENT before it holds partitions it
// could not sum; a partial sum that fails stops it too (its partitions then
// move to a process that can sum them).
//
// Privacy: partial sums are un-noised sums of private records and go to the
// work topic only; counters are counted at the next plan's public time.
//
// Thread-safety: Create and Run on one thread; RequestStop,
// last_plan_seen_ns from any thread; latest_plan_model after Run returned.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>

#include "config/config.h"
#include "core/base/status.h"
#include "core/privacy/mechanisms/gaussian_mechanism.h"
#include "core/privacy/mechanisms/noise_source.h"
#include "core/svi/step_driver.h"
#include "daemon/io/metrics.h"
#include "daemon/parts/ingest.h"
#include "daemon/parts/run_control.h"
#include "daemon/setup/model_setup.h"
#include "daemon/setup/startup_check.h"
#include "daemon/state/checkpoint.h"
#include "daemon/state/ledger.h"
#include "daemon/step/follower.h"
#include "daemon/step/work_io.h"

namespace vipsd::daemon {

class Worker final : public WorkFollower {
 public:
  static StatusOr<std::unique_ptr<Worker>> Create(const config::VipsdConfig& config,
                                                  SourceFactory make_source,
                                                  std::unique_ptr<OutputSink> sink,
                                                  Metrics* metrics,
                                                  std::unique_ptr<WorkExchange> exchange,
                                                  DaemonOptions options = {});
  ~Worker() override;

  // Follows plans until RequestStop (OK) or a failure that stops it.
  Status Run();

  // Steady-clock time (ns since its epoch) of the last plan or reminder of
  // the coordinator it saw; 0 before any. A standby that works takes over
  // only after the ledger AND the plans were silent.
  int64_t last_plan_seen_ns() const { return last_plan_seen_ns_.load(); }
  // After Run returned: the model of the last plan it followed, as a plan
  // carries it (DaemonOptions::takeover_model); empty if none. After a
  // release applied ahead (WorkRelease) it is still that plan's model, read
  // back from the plan log (empty if that fails): the release's step may
  // not be in the ledger yet (the coordinator commits it at the slot's
  // deadline), and a standby continues only from a model of a step the
  // ledger charges.
  std::string latest_plan_model();
  // Plans whose model was ready when they came: their released sum had
  // been applied ahead from a WorkRelease (tests; any thread).
  int64_t releases_applied_ahead() const { return releases_applied_ahead_.load(); }

 private:
  Worker(const config::VipsdConfig& config, DaemonOptions options, ModelBundle bundle,
         std::unique_ptr<OutputSink> sink, Metrics* metrics, Ledger ledger,
         std::unique_ptr<privacy::NoiseSource> noise, std::unique_ptr<WorkExchange> exchange,
         SourceFactory make_source);

  // Makes `plan` the one it works on (model, q, windows, resume offsets).
  // INVALID_ARGUMENT when this configuration is not the coordinator's; other
  // failures are logged and the plan is skipped.
  Status AdoptPlan(WorkPlan plan);
  // Appends the partials of the plan's partitions this process holds.
  void WorkOnPlan();
  // The newest plan of the highest epoch among `messages` (nullopt: none),
  // with plan_offset set to where the message that carries its model or
  // released sum lies in the plan log (latest_plan_model reads it back).
  std::optional<WorkPlan> NewestPlan(std::vector<std::pair<int64_t, std::string>>& messages);
  // Holds `plan`'s model (plan_model_of_ names it): restores the model it
  // carries, or applies its released sum to the model it follows from,
  // reading plans back (ReadAt) to one this process holds or one with the
  // model. On failure plan_model_of_ names none.
  Status TakeModel(const WorkPlan& plan);
  Status RestorePlanModel(const WorkPlan& plan);
  Status ApplyDelta(const WorkPlan& plan);
  // The released sum `plan` applies: its own bytes, or those of the release
  // it names, checked to be that plan's (DATA_LOSS otherwise).
  StatusOr<std::string> ReleasedSumOf(const WorkPlan& plan);
  // Applies the released sum of every WorkRelease among `messages` that
  // follows the plan in hand, whose model this process holds, through the
  // M-step the next plan would run (the plan's work is over: the
  // coordinator has every partial). A malformed one is logged and skipped;
  // one that fails leaves no model held (the next plan reads back).
  void ApplyReleasesAhead(const std::vector<std::pair<int64_t, std::string>>& messages);

  Ledger ledger_;  // held for its lock only
  // A worker's driver samples and E-steps under the plan's key; its
  // accountant is never charged (the coordinator's is).
  privacy::RdpAccountant unused_accountant_;
  std::unique_ptr<svi::StepDriver> driver_;
  // The plan followed, where its model came from, and the partials already
  // appended for it.
  std::optional<WorkPlan> plan_;
  // A plan as the ledger orders coordinators (epoch, then owner id: a claim
  // race leaves two owners under one epoch counter) and its step.
  struct PlanKey {
    uint64_t epoch = 0;
    std::string owner;
    int64_t step = -1;
    bool operator==(const PlanKey&) const = default;
  };
  static PlanKey KeyOf(const WorkPlan& plan) { return {plan.epoch, plan.owner, plan.step}; }
  PlanKey plan_model_of_;  // the plan whose model is held (step −1: none)
  // A released sum applied ahead (ApplyReleasesAhead): the model held is
  // that of the plan of `base_step` after the M-step of `delta_step` on the
  // sum of the release at `offset` with q and ρ — the model of the next
  // plan that names that release (TakeModel then takes it as is; a plan
  // that carries its sum inline was made because no release was appended).
  // plan_model_of_ names no plan meanwhile.
  struct AppliedAhead {
    uint64_t epoch = 0;
    std::string owner;
    int64_t base_step = 0;
    int64_t delta_step = 0;
    privacy::SampledGaussian mechanism;
    double rho = 0;
    int64_t offset = -1;  // of the WorkRelease in the plan log
    double seconds = 0;
  };
  std::optional<AppliedAhead> applied_ahead_;
  std::atomic<int64_t> releases_applied_ahead_{0};
  // Partitions of the plan in hand whose partial this process appended, and
  // the offset of that partial in the partial log (a reminder whose
  // partials_read is above it and still wants the partition: refused).
  std::map<std::string, int64_t> plan_sent_;
  // The pre-summed partial (PRIVATE), kept and Reset from step to step so
  // that its statistic-sized buffer is not allocated and faulted in anew.
  std::unique_ptr<privacy::GaussianSumMechanism> presummed_;
  // The checkpoint header (run id, model type and fingerprint, model step)
  // of the model held, for latest_plan_model; its arrays stay empty.
  Checkpoint model_header_;
  // The highest coordinator (epoch, owner) whose plan was seen.
  std::pair<uint64_t, std::string> highest_coordinator_{0, ""};
  bool warned_old_plan_ = false;  // a plan of an older vipsd was logged once
  int64_t pending_published_ = 0;  // counted at the next plan (public time)
  // Seconds the last plan took to adopt (decode and restore its model, or
  // apply its released sum; 0 when the model was held) and, when its
  // released sum was applied ahead (WorkRelease), what that took; logged
  // with the step's partial under metrics.expose_step_timing.
  double adopt_seconds_ = 0;
  double ahead_seconds_ = 0;
  std::atomic<int64_t> last_plan_seen_ns_{0};
};

}  // namespace vipsd::daemon
