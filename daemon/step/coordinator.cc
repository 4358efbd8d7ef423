#include "daemon/step/coordinator.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/base/log.h"
#include "core/base/parallel.h"
#include "daemon/state/checkpoint.h"

namespace vipsd::daemon {
namespace {

constexpr std::string_view kComponent = "daemon";
constexpr auto kReminderInterval = std::chrono::seconds(1);
constexpr auto kWorkPoll = std::chrono::milliseconds(50);

}  // namespace

Coordinator::Coordinator(std::unique_ptr<WorkExchange> exchange, RunControl* control)
    : work_(std::move(exchange), control), control_(control) {}

StatusOr<svi::StepResult> Coordinator::Step(int64_t slot, const SlotTargets& targets,
                                            int64_t model_step, SlotOutputs* out) {
  // Exactly svi::StepDriver::Step, with the partial sums of the partitions
  // computed wherever the consumer group put them.
  if (parts_.driver == nullptr || parts_.pool == nullptr) {
    return FailedPreconditionError("coordinator: no parts bound");
  }
  cuts_.clear();
  window_overflow_ = false;
  Context context;
  static_cast<StepParts&>(context) = parts_;
  context.model_step = model_step;
  context.targets = &targets;
  context.cuts = &cuts_;
  VIPSD_ASSIGN_OR_RETURN(svi::StepTicket ticket, context.driver->Begin());
  if (ticket.result.outcome == svi::StepResult::Outcome::kRefusedCeiling) return ticket.result;
  // From here the step is charged: if it does not finish, its number is
  // consumed (svi::StepDriver::Abandon) and the ledger's step counter stays
  // above the accountant's step count.
  StatusOr<svi::StepResult> result = StepCharged(context, ticket, slot, out);
  if (!result.ok()) context.driver->Abandon(ticket);
  return result;
}

StepFailure Coordinator::Classify(const Status& error) const {
  // Only a window that a process cannot hold stops stepping as an overflow;
  // an OUT_OF_RANGE from the M-step (a sum that is not finite) is a failed
  // step, as in one process.
  if (window_overflow_) return StepFailure::kWindowOverflow;
  return error.code() == StatusCode::kCancelled ? StepFailure::kQuiet : StepFailure::kFailed;
}

StatusOr<WorkPlan> Coordinator::AppendPlan(const Context& context,
                                            const svi::StepTicket& ticket, int64_t slot,
                                            SlotOutputs* out) {
  const config::VipsdConfig& config = *context.config;
  LedgerKeeper& keeper = *context.keeper;
  const LedgerState& state = keeper.state();
  WorkPlan plan;
  plan.job = config.ledger_key;
  plan.epoch = keeper.replica()->epoch();
  plan.owner = keeper.replica()->owner();
  plan.step = ticket.result.step;
  plan.slot = slot;
  plan.sampling_rate = ticket.result.mechanism.sampling_rate;  // what the step was charged at
  plan.is_private = config.is_private();
  plan.key = ticket.key;
  plan.record_settings = context.bundle->record_settings;
  plan.cut_time_ms = context.targets->cut_time_ms;
  std::vector<std::string> names = state.windows.Streams();
  std::sort(names.begin(), names.end());
  int64_t window_offsets = 0;
  for (const std::string& name : names) {
    // [low, the last cut) before this slot's cut is recorded; the cut lies
    // in [floor, end] and the process that reads the stream finds it.
    const svi::OffsetRange window = state.windows.Window(name, slot);
    int64_t end = window.high, floor = window.high;
    if (const auto it = context.targets->streams.find(name);
        it != context.targets->streams.end()) {
      end = std::max(it->second.end, window.low);
      floor = std::clamp(it->second.floor, window.low, end);
    }
    plan.streams.push_back({name, window.low, floor, end});
    window_offsets += end - window.low;
    // An empty window adds nothing: its partial sum is zero.
    if (end > window.low) plan.wanted.push_back(name);
  }
  out->window_offsets = window_offsets;
  // The previous step's released sum instead of the model (about half the
  // bytes, and no checkpoint encode and decode) when the previous plan was
  // of this epoch, described this model object, and that step's M-step is
  // the only change since; the whole model at least every kPlanModelEvery
  // plans, so that a process that joins reads few plans back.
  const model::Model* model = context.bundle->model.get();
  const std::optional<Released> released = std::exchange(released_, std::nullopt);
  const bool delta = plan.is_private && last_plan_.has_value() &&
                     last_plan_->epoch == plan.epoch && last_plan_->model == model &&
                     last_plan_->deltas_since_model + 1 < kPlanModelEvery &&
                     released.has_value() && released->plan_step == last_plan_->step &&
                     released->step == context.model_step;
  // Encoded (and appended ahead as a WorkRelease) since that step's release
  // (StepCharged); waited for before this plan is appended, whether or not
  // the plan uses it: that thread may still be appending to the plan log.
  std::future<StatusOr<std::string>> released_encoded = std::move(released_encoded_);
  if (released_encoded.valid()) released_encoded.wait();
  if (delta && released_encoded.valid()) {
    StatusOr<std::string> encoded = released_encoded.get();
    if (encoded.ok()) {
      // Appended ahead (after the base plan): named, not sent again.
      if (released_offset_ > last_plan_->offset) {
        plan.delta_release_offset = released_offset_;
      } else {
        plan.delta_sum = std::move(*encoded);
      }
      plan.delta_base = last_plan_->step;
      plan.delta_base_offset = last_plan_->offset;
      plan.delta_step = released->step;
      plan.delta_mechanism.sampling_rate = released->sampling_rate;
      plan.delta_rho = released->rho;
      plan.delta_mechanism.noise_multiplier = released->noise_multiplier;
    }
  }
  if (!plan.has_delta()) {
    VIPSD_ASSIGN_OR_RETURN(plan.model, EncodePlanModel(context, context.model_step));
  }
  VIPSD_ASSIGN_OR_RETURN(const int64_t plan_offset, work_.Append(EncodeWorkPlan(plan)));
  LastPlan appended{plan.epoch, plan.step, plan_offset, model, plan_offset, 0};
  if (plan.has_delta()) {
    appended.model_offset = last_plan_->model_offset;
    appended.deltas_since_model = last_plan_->deltas_since_model + 1;
  }
  last_plan_ = appended;
  plan.model.clear();
  plan.delta_sum.clear();
  plan.delta_release_offset = -1;
  plan.delta_base = -1;
  plan.delta_base_offset = -1;
  plan.plan_offset = plan_offset;
  return plan;
}

Status Coordinator::Remind(const Context& context, WorkPlan& plan,
                           const std::set<std::string>& covered, SlotOutputs* out,
                           bool* logged) {
  LedgerKeeper& keeper = *context.keeper;
  // A coordinator that waits must notice a takeover: the new owner
  // waits in turn for the partitions this one holds, and this one
  // commits (and would learn it is fenced) only after its step.
  const Status owner = keeper.ConfirmOwner();
  if (!owner.ok() && keeper.fenced()) {
    context.on_fenced(owner);
    return CancelledError("fenced");
  }
  // Whoever holds a missing partition now (a rebalance, a new process)
  // finds the step.
  WorkPlan reminder = plan;
  reminder.wanted.clear();
  for (const std::string& name : plan.wanted) {
    if (covered.count(name) == 0) reminder.wanted.push_back(name);
  }
  reminder.partials_read = partials_read_;
  // A reminder names the step's plan; a process that lacks its model reads
  // back from there to the plan with the model. Once retention took that
  // one (the oldest of them), such a process could never read it: the plan
  // goes out whole again and later reminders (and the next step's released
  // sum) follow from the new one.
  const int64_t model_offset =
      last_plan_.has_value() && last_plan_->step == plan.step && last_plan_->epoch == plan.epoch
          ? last_plan_->model_offset
          : plan.plan_offset;
  const StatusOr<bool> held = work_.exchange().HoldsPlan(model_offset);
  const bool resend_model = held.ok() && !*held;
  if (resend_model) {
    auto model = EncodePlanModel(context, context.model_step);
    if (!model.ok()) return model.status();
    reminder.model = std::move(*model);
  }
  auto appended = work_.exchange().Append(EncodeWorkPlan(reminder));
  if (appended.ok() && resend_model) {
    plan.plan_offset = *appended;
    if (last_plan_.has_value()) {
      last_plan_->offset = last_plan_->model_offset = *appended;
      last_plan_->deltas_since_model = 0;
    }
    out->log_lines.emplace_back(
        LogLevel::kWarning, "step " + std::to_string(plan.step) + ": the " + work_.Describe() +
                                " no longer held its plan (retention); appended it again with "
                                "the model at offset " + std::to_string(*appended) +
                                " (raise the work topic's retention)");
  }
  if (!appended.ok()) {
    Log(LogLevel::kWarning, kComponent,
        "cannot append a plan reminder to the " + work_.Describe() + ": " +
            appended.status().ToString());
  }
  if (!*logged && out->deadline > 0 && WallNow() > out->deadline) {
    // Only once the step overran its deadline (which the overrun line
    // reveals anyway), and said at the step's output time: how long the
    // partials take follows the workers' batches.
    *logged = true;
    std::string missing;
    for (const std::string& name : reminder.wanted) {
      missing += (missing.empty() ? "" : ", ") + name;
    }
    out->log_lines.emplace_back(
        LogLevel::kInfo, "step " + std::to_string(plan.step) +
                             " overran its deadline waiting for the partial sums of " +
                             missing + " (partitions being moved, or read by a slow process)");
  }
  return Status::Ok();
}

StatusOr<svi::StepResult> Coordinator::StepCharged(const Context& context,
                                                   const svi::StepTicket& ticket, int64_t slot,
                                                   SlotOutputs* out) {
  // Where the step thread spends the step (SlotOutputs::phases): the plan,
  // this process's own partitions, waiting for and merging the others'.
  const auto start = std::chrono::steady_clock::now();
  VIPSD_ASSIGN_OR_RETURN(WorkPlan plan, AppendPlan(context, ticket, slot, out));
  const auto planned = std::chrono::steady_clock::now();
  const double plan_seconds = std::chrono::duration<double>(planned - start).count();
  // The noise is drawn while the partials are computed, off the serial
  // path that follows the last one (merge, noise, M-step, ledger).
  context.driver->DrawNoiseAhead();
  Gathered gathered;
  VIPSD_RETURN_IF_ERROR(Gather(context, plan, planned, &gathered, out));
  const bool ordered = total_->kind() == privacy::SumKind::kFloat;
  std::optional<Released> pending;
  ObserveRelease(context, plan, ordered, out->partials_remote > 0, &pending);
  StatusOr<svi::StepResult> finished = context.driver->Finish(ticket, *total_);
  context.driver->set_release_observer(nullptr);
  VIPSD_ASSIGN_OR_RETURN(svi::StepResult result, std::move(finished));
  released_ = pending;
  *context.cuts = std::move(gathered.cuts);
  out->phases = {{"charge", ticket.result.phase_seconds.charge},
                 {"plan", plan_seconds},
                 {"own", gathered.own_seconds},
                 {"wait", gathered.wait_seconds},
                 {"merge", gathered.merge_seconds},
                 {"noise", result.phase_seconds.noise},
                 {"mstep", result.phase_seconds.mstep}};
  return result;
}

Status Coordinator::Gather(const Context& context, WorkPlan& plan,
                           std::chrono::steady_clock::time_point clock, Gathered* gathered,
                           SlotOutputs* out) {
  const config::VipsdConfig& config = *context.config;
  Ingest& ingest = *context.ingest;
  using Clock = std::chrono::steady_clock;
  auto lap = [](Clock::time_point& since) {
    const Clock::time_point now = Clock::now();
    const double seconds = std::chrono::duration<double>(now - since).count();
    since = now;
    return seconds;
  };
  const privacy::BlockLayout& layout = context.bundle->model->statistic_layout();
  const privacy::SumKind kind =
      privacy::SumKindFor(context.driver->config().mechanism.noise_multiplier);
  if (total_ == nullptr || total_->kind() != kind) {
    total_ = std::make_unique<privacy::GaussianSumMechanism>(layout, kind);
  } else {
    total_->Reset();
  }
  // A private run's grid sums are integers: each partial is merged into the
  // total as it arrives (or as this process sums its own partitions), in
  // whatever order, and the total is the one a single process forms. A
  // non-private run's float sums are kept per partition and added in
  // partition-name order at the end, the summation order of one process.
  const bool ordered = kind == privacy::SumKind::kFloat;
  std::map<std::string, std::unique_ptr<privacy::GaussianSumMechanism>> float_sums;  // PRIVATE
  std::set<std::string> covered;        // wanted partitions whose sum is in
  std::map<std::string, int64_t>& cuts = gathered->cuts;  // public: stream volume
  for (const WorkStream& stream : plan.streams) {
    if (stream.high == stream.low) cuts[stream.name] = stream.high;  // nothing to read
  }
  auto last_reminder = std::chrono::steady_clock::now();
  bool logged = false;
  while (covered.size() < plan.wanted.size()) {
    if (control_->stopping()) return CancelledError("stopping");
    std::vector<LocalStream> ready;
    std::string overflowing;
    for (const std::string& name : plan.wanted) {
      if (covered.count(name) > 0) continue;
      const WorkStream* stream = FindStream(plan, name);
      if (!ingest.Assigned(name)) continue;
      if (ingest.Complete(name)) {
        ready.push_back({stream, ingest.Target(name)});
      } else if (ingest.Overflowing(name)) {
        overflowing = name;
      }
    }
    if (!overflowing.empty()) {
      window_overflow_ = true;
      return OutOfRangeError("the window of " + overflowing +
                             " does not fit this process's pool.capacity = " +
                             std::to_string(config.pool_capacity) +
                             " (no release; the step was charged)");
    }
    gathered->wait_seconds += lap(clock);
    if (!ready.empty()) {
      // This process's own partitions go into the total without being
      // encoded: one SumStreams call over all of them.
      VIPSD_RETURN_IF_ERROR(SumLocalStreams(
          ingest, *context.pool, *context.driver, plan, ready,
          [&](size_t index, privacy::GaussianSumMechanism& partial) -> Status {
            if (!ordered) return total_->Merge(std::move(partial));
            auto& sum = float_sums[ready[index].stream->name];
            sum = std::make_unique<privacy::GaussianSumMechanism>(layout, kind);
            return sum->Merge(std::move(partial));
          }));
      for (const LocalStream& local : ready) {
        covered.insert(local.stream->name);
        cuts[local.stream->name] = local.cut;
      }
      out->partials_local += ordered ? static_cast<int64_t>(ready.size()) : 1;
      gathered->own_seconds += lap(clock);
    }
    if (covered.size() == plan.wanted.size()) break;
    auto messages = work_.Poll(kWorkPoll);
    gathered->wait_seconds += lap(clock);
    if (!messages.has_value()) continue;
    // Partials that arrive together (processes that finish at once) are
    // decoded on the step's threads, then merged one by one in log order:
    // decoding a dense partial is most of its cost (18 ms at K·V = 500,000)
    // and N of them in series would grow the step's serial part with N.
    std::vector<DecodedPartial> decoded(messages->size());
    ForEachIndexOnThreads(decoded.size(), context.driver->config().threads, [&](size_t i) {
      decoded[i] = DecodePartial(plan, (*messages)[i].second, layout);
    });
    for (size_t i = 0; i < messages->size(); ++i) {
      const int64_t offset = (*messages)[i].first;
      partials_read_ = std::max(partials_read_, offset + 1);
      VIPSD_RETURN_IF_ERROR(MergePartial(plan, offset, std::move(decoded[i]), ordered, &covered,
                                         &cuts, &float_sums, out));
    }
    // Partials that retention took before they were read count as read:
    // the next reminder asks their senders for those partitions again.
    partials_read_ = std::max(partials_read_, work_.exchange().read_position());
    gathered->merge_seconds += lap(clock);
    const auto now = std::chrono::steady_clock::now();
    if (covered.size() < plan.wanted.size() && now - last_reminder >= kReminderInterval) {
      VIPSD_RETURN_IF_ERROR(Remind(context, plan, covered, out, &logged));
      last_reminder = now;
    }
  }
  // Every partial is in: the reader stops fetching until the next step
  // polls (after its plan, usually after its own partitions' sum).
  work_.exchange().Rest();
  if (ordered) {
    // Partition-name order: the summation order of one process.
    for (const std::string& name : plan.wanted) {
      VIPSD_RETURN_IF_ERROR(total_->Merge(std::move(*float_sums.at(name))));
    }
  }
  gathered->merge_seconds += lap(clock);
  return Status::Ok();
}

void Coordinator::ObserveRelease(const Context& context, const WorkPlan& plan, bool ordered,
                                 bool workers, std::optional<Released>* pending) {
  const privacy::BlockLayout& layout = context.bundle->model->statistic_layout();
  // The released sum, for the next plan (public); a private run's only: a
  // non-private one's float sums are not on the grid.
  // Called before the M-step: the sum is encoded for the next plan on a
  // thread of its own meanwhile (off the serial path, with the workers
  // idle until that plan). It counts as released only once the M-step
  // succeeded.
  // With workers in the step, the same thread then appends the sum to the
  // plan log (WorkRelease, one try), so that they run their M-step beside
  // this one's and the ledger commit instead of after the next plan, which
  // then names it by its offset instead of carrying it again (or carries
  // it, if the append failed). Nothing else uses the exchange until the
  // next plan, which waits for this thread first.
  if (!ordered) {
    WorkRelease header;
    header.job = plan.job;
    header.epoch = plan.epoch;
    header.owner = plan.owner;
    header.step = plan.step;
    header.slot = plan.slot;
    context.driver->set_release_observer(
        [this, header, workers, pending, layout](const Eigen::VectorXd& sum, int64_t step,
                                                  const privacy::SampledGaussian& mechanism,
                                                  double rho) {
          const double q = mechanism.sampling_rate;
          const double sigma = mechanism.noise_multiplier;
          if (released_encoded_.valid()) released_encoded_.wait();  // it reads released_sum_
          released_sum_ = sum;
          released_offset_ = -1;
          *pending = Released{header.step, step, q, rho, sigma};
          WorkRelease release = header;
          release.delta_step = step;
          release.delta_mechanism.sampling_rate = q;
          release.delta_rho = rho;
          release.delta_mechanism.noise_multiplier = sigma;
          released_encoded_ = std::async(
              std::launch::async,
              [this, layout, workers, release = std::move(release)]() mutable
              -> StatusOr<std::string> {
                VIPSD_ASSIGN_OR_RETURN(
                    std::string encoded,
                    privacy::GaussianSumMechanism::EncodeReleased(layout, released_sum_));
                if (workers) {
                  release.delta_sum = std::move(encoded);
                  const auto appended = work_.exchange().Append(EncodeWorkRelease(release));
                  if (appended.ok()) released_offset_ = *appended;
                  if (!appended.ok()) {
                    Log(LogLevel::kWarning, kComponent,
                        "step " + std::to_string(release.delta_step) +
                            ": the released sum was not appended ahead of the next plan (" +
                            appended.status().ToString() +
                            "); the next plan carries it");
                  }
                  encoded = std::move(release.delta_sum);
                }
                return encoded;
              });
        });
  }
}

Coordinator::DecodedPartial Coordinator::DecodePartial(const WorkPlan& plan,
                                                       const std::string& bytes,
                                                       const privacy::BlockLayout& layout) {
  DecodedPartial decoded;
  auto kind = WorkMessageKindOf(bytes);
  if (!kind.ok() || *kind != WorkMessageKind::kPartial) return decoded;  // plans (ours)
  decoded.partial = DecodeWorkPartial(bytes);
  const StatusOr<WorkPartial>& partial = *decoded.partial;
  if (partial.ok() && partial->epoch == plan.epoch && partial->owner == plan.owner &&
      partial->step == plan.step && partial->slot == plan.slot && !partial->overflow) {
    // This step's: its sum, whether or not it will be merged. The work
    // message's BLAKE2b-256, checked by DecodeWorkPartial, covers the sum's
    // bytes; the sum's own trailing one is not computed a second time.
    decoded.sum = privacy::GaussianSumMechanism::DecodeUnreleased(
        layout, partial->sum, privacy::GaussianSumMechanism::Checksum::kVerifiedByCaller);
  }
  return decoded;
}

Status Coordinator::MergePartial(
    const WorkPlan& plan, int64_t offset, DecodedPartial decoded, bool ordered,
    std::set<std::string>* covered, std::map<std::string, int64_t>* cuts,
    std::map<std::string, std::unique_ptr<privacy::GaussianSumMechanism>>* float_sums,
    SlotOutputs* out) {
  if (!decoded.partial.has_value()) return Status::Ok();  // not a partial
  StatusOr<WorkPartial>& partial = *decoded.partial;
  auto ignored = [&](const std::string& why) {
    // With the step's outputs, at its deadline: when this loop runs
    // follows the step's own work.
    out->log_lines.emplace_back(LogLevel::kWarning, work_.Describe() + " offset " +
                                                        std::to_string(offset) + ": " + why +
                                                        "; ignored");
    return Status::Ok();
  };
  if (!partial.ok()) return ignored(partial.status().ToString());
  if (partial->epoch != plan.epoch || partial->owner != plan.owner ||
      partial->step != plan.step || partial->slot != plan.slot) {
    return Status::Ok();  // another step's
  }
  for (const PartialStream& stream : partial->streams) {
    // A partition summed already (a rebalance moved it and two processes
    // summed it) or not wanted: the whole partial is refused — its sum
    // cannot be split — and the next reminder asks its sender for the
    // partitions still missing (WorkPlan::partials_read).
    if (covered->count(stream.name) > 0 ||
        !std::binary_search(plan.wanted.begin(), plan.wanted.end(), stream.name)) {
      return Status::Ok();
    }
  }
  if (partial->overflow) {
    window_overflow_ = true;
    return OutOfRangeError("the window of " + partial->streams.front().name +
                           " does not fit the pool.capacity of the process holding it (" +
                           partial->instance + "; no release; the step was charged)");
  }
  if (ordered && partial->streams.size() != 1) {
    return ignored("a non-private partial sum from " + partial->instance + " covers " +
                   std::to_string(partial->streams.size()) +
                   " partitions (float sums are added one partition at a time, in name order)");
  }
  for (const PartialStream& stream : partial->streams) {
    const WorkStream* planned = FindStream(plan, stream.name);
    if (stream.cut < planned->floor || stream.cut > planned->high) {
      return ignored("the partial of " + stream.name + " from " + partial->instance +
                     " names cut " + std::to_string(stream.cut) + ", outside the plan's [" +
                     std::to_string(planned->floor) + ", " + std::to_string(planned->high) + "]");
    }
  }
  auto& sum = decoded.sum;
  if (!sum.ok()) return sum.status();
  if (ordered) {
    (*float_sums)[partial->streams.front().name] = std::move(*sum);
  } else {
    VIPSD_RETURN_IF_ERROR(total_->Merge(std::move(**sum)));
  }
  for (const PartialStream& stream : partial->streams) {
    covered->insert(stream.name);
    (*cuts)[stream.name] = stream.cut;
  }
  ++out->partials_remote;
  return Status::Ok();
}

}  // namespace vipsd::daemon
