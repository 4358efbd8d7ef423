#include "daemon/coordinator.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "core/base/log.h"
#include "daemon/checkpoint.h"

namespace vipsd::daemon {
namespace {

constexpr std::string_view kComponent = "daemon";
constexpr auto kReminderInterval = std::chrono::seconds(1);
constexpr auto kWorkPoll = std::chrono::milliseconds(50);

}  // namespace

Coordinator::Coordinator(std::unique_ptr<WorkExchange> exchange, RunControl* control)
    : work_(std::move(exchange), control), control_(control) {}

StatusOr<svi::StepResult> Coordinator::Step(const Context& context, int64_t slot,
                                            SlotOutputs* out) {
  // Exactly svi::StepDriver::Step, with the partial sums of the partitions
  // computed wherever the consumer group put them.
  VIPSD_ASSIGN_OR_RETURN(svi::StepTicket ticket, context.driver->Begin());
  if (ticket.result.outcome == svi::StepResult::Outcome::kRefusedCeiling) return ticket.result;
  // From here the step is charged: if it does not finish, its number is
  // consumed (svi::StepDriver::Abandon) and the ledger's step counter stays
  // above the accountant's step count.
  StatusOr<svi::StepResult> result = StepCharged(context, ticket, slot, out);
  if (!result.ok()) context.driver->Abandon(ticket);
  return result;
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
  plan.sampling_rate = ticket.result.sampling_rate;  // what the step was charged at
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
  Checkpoint model;
  model.run_id = state.run_id;
  model.step = context.model_step;
  model.model_type = context.bundle->model->type();
  model.model_fingerprint = context.bundle->model_fingerprint;
  model.arrays = context.bundle->model->CheckpointArrays();
  VIPSD_ASSIGN_OR_RETURN(plan.model, CheckpointStore::Encode(model));
  VIPSD_ASSIGN_OR_RETURN(const int64_t plan_offset, work_.Append(EncodeWorkPlan(plan)));
  plan.model.clear();
  plan.plan_offset = plan_offset;
  return plan;
}

Status Coordinator::Remind(const Context& context, const WorkPlan& plan,
                           const std::map<std::string, std::string>& sums, SlotOutputs* out,
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
    if (sums.count(name) == 0) reminder.wanted.push_back(name);
  }
  auto appended = work_.exchange().Append(EncodeWorkPlan(reminder));
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
  const config::VipsdConfig& config = *context.config;
  Ingest& ingest = *context.ingest;
  VIPSD_ASSIGN_OR_RETURN(WorkPlan plan, AppendPlan(context, ticket, slot, out));
  // Partials come after the plan; the exchange reads on from where the
  // previous step stopped (earlier messages are filtered by step), which
  // keeps its reader's assignment (a seek would re-assign it).

  std::map<std::string, std::string> sums;  // PRIVATE: stream → encoded partial
  std::map<std::string, int64_t> cuts;       // stream → its cut (public: stream volume)
  for (const WorkStream& stream : plan.streams) {
    if (stream.high == stream.low) cuts[stream.name] = stream.high;  // nothing to read
  }
  auto last_reminder = std::chrono::steady_clock::now();
  bool logged = false;
  while (sums.size() < plan.wanted.size()) {
    if (control_->stopping()) return CancelledError("stopping");
    std::vector<const WorkStream*> ready;
    std::string overflowing;
    for (const std::string& name : plan.wanted) {
      if (sums.count(name) > 0) continue;
      const WorkStream* stream = FindStream(plan, name);
      if (!ingest.Assigned(name)) continue;
      if (ingest.Complete(name)) {
        ready.push_back(stream);
      } else if (ingest.Overflowing(name)) {
        overflowing = name;
      }
    }
    if (!overflowing.empty()) {
      return OutOfRangeError("the window of " + overflowing +
                             " does not fit this process's pool.capacity = " +
                             std::to_string(config.pool_capacity) +
                             " (no release; the step was charged)");
    }
    for (const WorkStream* stream : ready) {
      const int64_t cut = ingest.Target(stream->name);
      VIPSD_ASSIGN_OR_RETURN(sums[stream->name],
                             LocalPartial(ingest, *context.driver, plan, *stream, cut));
      cuts[stream->name] = cut;
      ++out->partials_local;
    }
    if (sums.size() == plan.wanted.size()) break;
    auto messages = work_.Poll(kWorkPoll);
    if (!messages.has_value()) continue;
    for (auto& [offset, bytes] : *messages) {
      auto kind = WorkMessageKindOf(bytes);
      if (!kind.ok() || *kind != WorkMessageKind::kPartial) continue;  // plans (ours)
      auto partial = DecodeWorkPartial(bytes);
      if (!partial.ok()) {
        // With the step's outputs, at its deadline: when this loop runs
        // follows the step's own work.
        out->log_lines.emplace_back(LogLevel::kWarning,
                                    work_.Describe() + " offset " + std::to_string(offset) +
                                        ": " + partial.status().ToString() + "; ignored");
        continue;
      }
      if (partial->epoch != plan.epoch || partial->owner != plan.owner ||
          partial->step != plan.step || partial->slot != plan.slot ||
          sums.count(partial->stream) > 0 ||
          !std::binary_search(plan.wanted.begin(), plan.wanted.end(), partial->stream)) {
        continue;  // another step's, a duplicate, or not wanted
      }
      if (partial->overflow) {
        return OutOfRangeError("the window of " + partial->stream +
                               " does not fit the pool.capacity of the process holding it (" +
                               partial->instance + "; no release; the step was charged)");
      }
      const WorkStream* stream = FindStream(plan, partial->stream);
      if (partial->cut < stream->floor || partial->cut > stream->high) {
        out->log_lines.emplace_back(
            LogLevel::kWarning,
            work_.Describe() + " offset " + std::to_string(offset) + ": the partial of " +
                partial->stream + " from " + partial->instance + " names cut " +
                std::to_string(partial->cut) + ", outside the plan's [" +
                std::to_string(stream->floor) + ", " + std::to_string(stream->high) +
                "]; ignored");
        continue;
      }
      sums[partial->stream] = std::move(partial->sum);
      cuts[partial->stream] = partial->cut;
      ++out->partials_remote;
    }
    const auto now = std::chrono::steady_clock::now();
    if (sums.size() < plan.wanted.size() && now - last_reminder >= kReminderInterval) {
      VIPSD_RETURN_IF_ERROR(Remind(context, plan, sums, out, &logged));
      last_reminder = now;
    }
  }
  const privacy::BlockLayout& layout = context.bundle->model->statistic_layout();
  const privacy::SumKind kind = privacy::SumKindFor(context.driver->config().noise_multiplier);
  if (total_ == nullptr || total_->kind() != kind) {
    total_ = std::make_unique<privacy::GaussianSumMechanism>(layout, kind);
  } else {
    total_->Reset();
  }
  // Partition-name order: the summation order of one process.
  for (const std::string& name : plan.wanted) {
    VIPSD_ASSIGN_OR_RETURN(auto partial,
                           privacy::GaussianSumMechanism::DecodeUnreleased(layout, sums.at(name)));
    VIPSD_RETURN_IF_ERROR(total_->Merge(std::move(*partial)));
  }
  VIPSD_ASSIGN_OR_RETURN(svi::StepResult result, context.driver->Finish(ticket, *total_));
  *context.cuts = std::move(cuts);
  return result;
}

}  // namespace vipsd::daemon
