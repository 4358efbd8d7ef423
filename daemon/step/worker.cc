#include "daemon/step/worker.h"

#include <chrono>
#include <map>
#include <sstream>
#include <thread>

#include "core/base/format.h"
#include "core/base/log.h"
#include "core/privacy/mechanisms/secure_noise.h"
#include "daemon/setup/startup_check.h"
#include "daemon/state/checkpoint.h"

namespace vipsd::daemon {

namespace {

constexpr std::string_view kComponent = "daemon";

int64_t SteadyNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

StatusOr<std::unique_ptr<Worker>> Worker::Create(const config::VipsdConfig& config,
                                                 SourceFactory make_source,
                                                 std::unique_ptr<OutputSink> sink,
                                                 Metrics* metrics,
                                                 std::unique_ptr<WorkExchange> exchange,
                                                 DaemonOptions options) {
  if (metrics == nullptr || sink == nullptr || !make_source || exchange == nullptr ||
      config.source_type != config::SourceType::kKafka) {
    return InvalidArgumentError(
        "a worker needs a source factory, a sink, metrics, a work exchange and a Kafka source");
  }
  VIPSD_RETURN_IF_ERROR(CheckFixedSeedFlag(config, options));
  VIPSD_ASSIGN_OR_RETURN(ModelBundle bundle, BuildModel(config));
  // The state directory stays locked while this process works (so that no
  // second process uses it), but a worker writes nothing there: the budget
  // is the coordinator's.
  VIPSD_ASSIGN_OR_RETURN(Ledger ledger, Ledger::Open(config.state_directory));
  // A worker draws no randomness: sampling and E-step seeds come from the
  // plan's key, the noise from the coordinator. The driver needs a source.
  VIPSD_ASSIGN_OR_RETURN(auto noise, privacy::SecureNoiseSource::Create());
  return std::unique_ptr<Worker>(new Worker(config, std::move(options), std::move(bundle),
                                            std::move(sink), metrics, std::move(ledger),
                                            std::move(noise), std::move(exchange),
                                            std::move(make_source)));
}

Worker::Worker(const config::VipsdConfig& config, DaemonOptions options, ModelBundle bundle,
               std::unique_ptr<OutputSink> sink, Metrics* metrics, Ledger ledger,
               std::unique_ptr<privacy::NoiseSource> noise,
               std::unique_ptr<WorkExchange> exchange, SourceFactory make_source)
    : WorkFollower(config, std::move(options), std::move(bundle), std::move(sink), metrics,
                   std::move(noise), std::move(exchange), std::move(make_source)),
      ledger_(std::move(ledger)) {}

Worker::~Worker() { Shutdown(); }

Status Worker::AdoptPlan(WorkPlan plan) {
  if (plan_.has_value()) {
    const int64_t published = pending_published_;
    pending_published_ = 0;
    // Counted now, at the next plan's (public) time.
    if (published > 0) {
      metrics_->work_partials_published_total().Increment(static_cast<double>(published));
    }
  }
  const PlanKey plan_id = KeyOf(plan);
  const auto adopt_start = std::chrono::steady_clock::now();
  if (plan_model_of_ != plan_id) {
    // A model first: one of another type or configuration is named as such
    // (its fingerprint). A released sum is applied only once the settings
    // are known to be this process's (another layout would not decode).
    Status restored = plan.model.empty() ? Status::Ok() : TakeModel(plan);
    if (restored.ok() && plan.is_private != config_.is_private()) {
      restored = InvalidArgumentError(
          "the coordinator's run is " + std::string(plan.is_private ? "" : "NOT ") +
          "private and this process's configuration is " +
          (config_.is_private() ? "" : "NOT ") + "private");
    }
    if (restored.ok() && plan.record_settings != bundle_.record_settings) {
      restored = InvalidArgumentError(
          "the coordinator decodes and sums records with other settings than this process (" +
          SettingsDifference(plan.record_settings, bundle_.record_settings, "coordinator", "this process") +
          "): its partial sums would differ, and it would dead-letter other records");
    }
    if (restored.ok() && plan.model.empty()) restored = TakeModel(plan);
    if (restored.ok()) {
      svi::DriverConfig driver_config = config_.driver;
      driver_config.adaptivity = privacy::Adaptivity::kAdaptiveFilter;
      driver_config.enforce_ceiling = false;  // a worker never charges
      // The plan's q is what the accountant charged: a reload on one
      // process must not change another's sample.
      driver_config.mechanism.sampling_rate = plan.sampling_rate;
      auto driver = svi::StepDriver::Create(bundle_.model.get(), noise_.get(),
                                            &unused_accountant_, driver_config, plan.step);
      restored = driver.status();
      if (driver.ok()) driver_ = std::move(*driver);
    }
    if (!restored.ok()) {
      plan_model_of_ = PlanKey{};
      plan_.reset();
      if (restored.code() == StatusCode::kInvalidArgument) {
        // This process's configuration is not the job's: it must not hold
        // partitions it cannot sum (the steps would wait for ever).
        return InvalidArgumentError("cannot follow the coordinator's plans: " +
                                    std::string(restored.message()));
      }
      Log(LogLevel::kError, kComponent,
          "cannot follow the plan of step " + std::to_string(plan.step) + ": " +
              restored.ToString());
      return Status::Ok();
    }
    plan_model_of_ = plan_id;
    adopt_seconds_ =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - adopt_start).count();
  }
  SlotTargets targets;
  targets.cut_time_ms = plan.cut_time_ms;
  for (const WorkStream& stream : plan.streams) {
    // A partition this process gets later resumes at its window's start;
    // records below it are never a candidate again.
    ingest_.SetResumeOffset(stream.name, stream.low);
    DropLocalBelow(ingest_, pool_, stream.name, stream.low);
    targets.streams[stream.name] = {stream.high, stream.floor};
  }
  ingest_.SetTargets(targets);
  const bool same_step = plan_.has_value() && KeyOf(*plan_) == KeyOf(plan);
  if (!same_step) {
    plan_sent_.clear();
  } else {
    // A partial the coordinator has read, for a partition it still wants,
    // was refused (it overlapped one merged first): sum the partition again.
    for (const std::string& name : plan.wanted) {
      const auto sent = plan_sent_.find(name);
      if (sent != plan_sent_.end() && sent->second < plan.partials_read) plan_sent_.erase(sent);
    }
  }
  plan.model.clear();
  plan.delta_sum.clear();
  plan_ = std::move(plan);
  return Status::Ok();
}

Status Worker::RestorePlanModel(const WorkPlan& plan) {
  VIPSD_ASSIGN_OR_RETURN(Checkpoint model, DecodePlanModel(plan.model, work_.Describe() + " plan",
                                                           bundle_, "the coordinator's"));
  applied_ahead_.reset();
  VIPSD_RETURN_IF_ERROR(bundle_.model->RestoreCheckpoint(model.arrays));
  model.arrays.clear();
  model_header_ = std::move(model);
  plan_model_of_ = KeyOf(plan);
  return Status::Ok();
}

StatusOr<std::string> Worker::ReleasedSumOf(const WorkPlan& plan) {
  if (!plan.delta_sum.empty()) return plan.delta_sum;
  VIPSD_ASSIGN_OR_RETURN(const std::string bytes,
                         work_.exchange().ReadAt(plan.delta_release_offset));
  VIPSD_ASSIGN_OR_RETURN(WorkRelease release, DecodeWorkRelease(bytes));
  if (release.job != plan.job || release.epoch != plan.epoch || release.owner != plan.owner ||
      release.step != plan.delta_base || release.delta_step != plan.delta_step ||
      release.delta_mechanism != plan.delta_mechanism || release.delta_rho != plan.delta_rho) {
    return DataLossError(work_.Describe() + " offset " +
                         std::to_string(plan.delta_release_offset) +
                         " is not the released sum the plan of step " +
                         std::to_string(plan.step) + " names");
  }
  return std::move(release.delta_sum);
}

Status Worker::ApplyDelta(const WorkPlan& plan) {
  // The coordinator's M-step (svi::StepDriver::Finish) on the same released
  // sum, q and ρ_t: the same model, bit for bit.
  VIPSD_ASSIGN_OR_RETURN(const std::string released, ReleasedSumOf(plan));
  VIPSD_ASSIGN_OR_RETURN(
      const Eigen::VectorXd sum,
      privacy::GaussianSumMechanism::DecodeReleased(bundle_.model->statistic_layout(),
                                                    released));
  plan_model_of_ = PlanKey{};  // changed from here on, until it is the plan's
  applied_ahead_.reset();
  VIPSD_RETURN_IF_ERROR(bundle_.model->MStep(sum, plan.delta_mechanism, plan.delta_rho));
  model_header_.step = plan.delta_step;
  plan_model_of_ = KeyOf(plan);
  return Status::Ok();
}

Status Worker::TakeModel(const WorkPlan& plan) {
  const Status taken = [&]() -> Status {
    if (!plan.model.empty()) return RestorePlanModel(plan);
    if (!plan.has_delta()) {
      return DataLossError("the plan of step " + std::to_string(plan.step) +
                           " carries neither a model nor a released sum");
    }
    if (applied_ahead_.has_value()) {
      // Applied ahead: the same sum, q and ρ on the same base model is the
      // same M-step, so the model held is this plan's bit for bit.
      const AppliedAhead& ahead = *applied_ahead_;
      if (ahead.epoch == plan.epoch && ahead.owner == plan.owner &&
          ahead.base_step == plan.delta_base &&
          ahead.delta_step == plan.delta_step &&
          ahead.mechanism == plan.delta_mechanism && ahead.rho == plan.delta_rho &&
          plan.delta_sum.empty() && ahead.offset == plan.delta_release_offset) {
        ahead_seconds_ = ahead.seconds;
        applied_ahead_.reset();
        plan_model_of_ = KeyOf(plan);
        releases_applied_ahead_.fetch_add(1);
        return Status::Ok();
      }
      // Another release, base or an inline sum (the coordinator changed, a
      // plan was missed, the append failed): the model held is no plan's;
      // read back to one with the model.
    }
    // Back along delta_base_offset to a plan whose model this process holds
    // or one that carries the model (the coordinator sends it at least every
    // kPlanModelEvery plans), then forward through each released sum.
    std::vector<WorkPlan> back;  // older plans, newest first
    back.reserve(kPlanModelEvery);  // `at` points into it: never reallocated
    std::optional<WorkPlan> root;
    for (const WorkPlan* at = &plan;
         plan_model_of_ != PlanKey{at->epoch, at->owner, at->delta_base};) {
      if (back.size() >= static_cast<size_t>(kPlanModelEvery)) {
        return DataLossError("no plan with the model within " +
                             std::to_string(kPlanModelEvery) + " plans before step " +
                             std::to_string(plan.step));
      }
      VIPSD_ASSIGN_OR_RETURN(const std::string bytes,
                             work_.exchange().ReadAt(at->delta_base_offset));
      VIPSD_ASSIGN_OR_RETURN(WorkPlan earlier, DecodeWorkPlan(bytes));
      if (earlier.epoch != at->epoch || earlier.owner != at->owner ||
          earlier.step != at->delta_base) {
        return DataLossError(work_.Describe() + " offset " +
                             std::to_string(at->delta_base_offset) + " is not the plan of step " +
                             std::to_string(at->delta_base));
      }
      if (!earlier.model.empty()) {
        root = std::move(earlier);
        break;
      }
      if (!earlier.has_delta()) {
        return DataLossError(work_.Describe() + " offset " +
                             std::to_string(at->delta_base_offset) +
                             ": a plan with neither a model nor a released sum");
      }
      back.push_back(std::move(earlier));
      at = &back.back();
    }
    if (root.has_value()) VIPSD_RETURN_IF_ERROR(RestorePlanModel(*root));
    for (auto it = back.rbegin(); it != back.rend(); ++it) VIPSD_RETURN_IF_ERROR(ApplyDelta(*it));
    return ApplyDelta(plan);
  }();
  if (!taken.ok()) plan_model_of_ = PlanKey{};
  return taken;
}

void Worker::ApplyReleasesAhead(const std::vector<std::pair<int64_t, std::string>>& messages) {
  for (const auto& [offset, bytes] : messages) {
    auto kind = WorkMessageKindOf(bytes);
    if (!kind.ok() || *kind != WorkMessageKind::kRelease) continue;
    auto release = DecodeWorkRelease(bytes);
    if (!release.ok()) {
      Log(LogLevel::kWarning, kComponent,
          work_.Describe() + " offset " + std::to_string(offset) + ": " +
              release.status().ToString() + "; ignored");
      continue;
    }
    // Only the plan in hand's release, onto that plan's model: anything
    // else (an older plan's, another coordinator's) is left to the plans.
    if (!plan_.has_value() || release->job != plan_->job || release->epoch != plan_->epoch ||
        release->owner != plan_->owner || release->step != plan_->step ||
        plan_model_of_ != KeyOf(*plan_)) {
      continue;
    }
    const auto start = std::chrono::steady_clock::now();
    auto sum = privacy::GaussianSumMechanism::DecodeReleased(bundle_.model->statistic_layout(),
                                                             release->delta_sum);
    if (!sum.ok()) {
      Log(LogLevel::kWarning, kComponent,
          work_.Describe() + " offset " + std::to_string(offset) +
              ": a released sum that does not decode (" + sum.status().ToString() +
              "); the next plan brings it");
      continue;
    }
    plan_model_of_ = PlanKey{};  // changed from here on
    const Status stepped =
        bundle_.model->MStep(*sum, release->delta_mechanism, release->delta_rho);
    if (!stepped.ok()) {
      applied_ahead_.reset();
      Log(LogLevel::kWarning, kComponent,
          "the released sum of step " + std::to_string(release->delta_step) +
              " could not be applied ahead (" + stepped.ToString() +
              "); the next plan's model is read back");
      continue;
    }
    model_header_.step = release->delta_step;
    applied_ahead_ = AppliedAhead{
        release->epoch,           release->owner,     release->step, release->delta_step,
        release->delta_mechanism, release->delta_rho, offset,
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()};
  }
}

std::string Worker::latest_plan_model() {
  if (applied_ahead_.has_value()) {
    // The plan in hand's model again, as a process that lacks it would
    // take it (read back through the plans), not the released step's.
    applied_ahead_.reset();
    plan_model_of_ = PlanKey{};
    if (!plan_.has_value() || plan_->plan_offset < 0) return "";
    auto bytes = work_.exchange().ReadAt(plan_->plan_offset);
    auto plan = bytes.ok() ? DecodeWorkPlan(*bytes) : StatusOr<WorkPlan>(bytes.status());
    if (!plan.ok() || KeyOf(*plan) != KeyOf(*plan_) ||
        !TakeModel(*plan).ok()) {
      return "";
    }
    plan_model_of_ = KeyOf(*plan);
  }
  if (plan_model_of_.step < 0) return "";
  Checkpoint model = model_header_;
  model.arrays = bundle_.model->CheckpointArrays();
  auto encoded = CheckpointStore::Encode(model);
  return encoded.ok() ? std::move(*encoded) : std::string();
}

void Worker::WorkOnPlan() {
  std::vector<LocalStream> ready;
  std::vector<PartialStream> overflowing;
  bool reading = false;  // a partition it holds whose window is not read yet
  for (const std::string& name : plan_->wanted) {
    if (plan_sent_.count(name) > 0) continue;
    const WorkStream* stream = FindStream(*plan_, name);
    if (stream == nullptr || !ingest_.Assigned(name)) continue;
    if (ingest_.Complete(name)) {
      ready.push_back({stream, ingest_.Target(name)});
    } else if (ingest_.Overflowing(name)) {
      overflowing.push_back({name, 0});
    } else {
      reading = true;
    }
  }
  WorkPartial header;
  header.job = plan_->job;
  header.epoch = plan_->epoch;
  header.owner = plan_->owner;
  header.step = plan_->step;
  header.slot = plan_->slot;
  header.instance = options_.instance_id;
  auto append = [&](WorkPartial& partial) {
    auto offset = work_.Append(EncodeWorkPartial(partial));
    if (!offset.ok()) return false;  // stopping
    for (const PartialStream& stream : partial.streams) plan_sent_[stream.name] = *offset;
    return true;
  };
  if (!overflowing.empty()) {
    // The step stops stepping (as one process would): no sum to wait for.
    WorkPartial partial = header;
    partial.streams = std::move(overflowing);
    partial.overflow = true;
    if (!append(partial)) return;
  }
  // A private run sends ONE partial: every partition it holds, pre-summed
  // once all their windows are read (integer grid sums: the coordinator's
  // total is the same whoever pre-summed what). A non-private run's float
  // sums go one partition each, added in name order by the coordinator.
  const bool presum = plan_->is_private;
  if (ready.empty() || (presum && reading)) return;
  const auto sum_start = std::chrono::steady_clock::now();
  work_.exchange().Rest();  // no plan is read while it sums
  if (presummed_ != nullptr) presummed_->Reset();
  std::vector<std::string> encoded(presum ? 1 : ready.size());
  const Status summed = SumLocalStreams(
      ingest_, pool_, *driver_, *plan_, ready,
      [&](size_t index, privacy::GaussianSumMechanism& partial) -> Status {
        if (!presum) {
          VIPSD_ASSIGN_OR_RETURN(encoded[index], partial.EncodeUnreleased());
          return Status::Ok();
        }
        if (presummed_ == nullptr) {
          presummed_ =
              std::make_unique<privacy::GaussianSumMechanism>(partial.layout(), partial.kind());
        }
        return presummed_->Merge(std::move(partial));
      });
  Status result = summed;
  if (result.ok() && presum) {
    auto bytes = presummed_->EncodeUnreleased();
    result = bytes.status();
    if (bytes.ok()) encoded[0] = std::move(*bytes);
  }
  if (!result.ok()) {
    // The coordinator waits for these partitions: leave the group (the
    // process stops with this error) so that another process sums them.
    ingest_.Fail(InternalError("partial sum for step " + std::to_string(plan_->step) +
                               " failed: " + result.ToString()));
    return;
  }
  const auto append_start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < encoded.size(); ++i) {
    WorkPartial partial = header;
    if (presum) {
      for (const LocalStream& local : ready) partial.streams.push_back({local.stream->name, local.cut});
    } else {
      partial.streams.push_back({ready[i].stream->name, ready[i].cut});
    }
    partial.sum = std::move(encoded[i]);
    if (!append(partial)) return;
    ++pending_published_;
  }
  if (config_.expose_step_timing) {
    // Work-dependent (how long this process's batch took): only where the
    // operator exposes step timing (issue 30's per-phase measurement).
    auto ms = [](std::chrono::steady_clock::duration d) {
      return FixedDecimal(std::chrono::duration<double, std::milli>(d).count(), 1);
    };
    Log(LogLevel::kInfo, kComponent,
        "step " + std::to_string(plan_->step) + ": " + std::to_string(ready.size()) +
            " partition(s) phase_ms=ahead:" + FixedDecimal(ahead_seconds_ * 1000, 1) +
            ",adopt:" + FixedDecimal(adopt_seconds_ * 1000, 1) +
            ",sum:" + ms(append_start - sum_start) +
            ",append:" + ms(std::chrono::steady_clock::now() - append_start));
  }
  adopt_seconds_ = 0;
  ahead_seconds_ = 0;
}

std::optional<WorkPlan> Worker::NewestPlan(
    std::vector<std::pair<int64_t, std::string>>& messages) {
  // The newest plan of the highest epoch; a reminder of the plan in hand
  // updates what is still wanted.
  std::optional<WorkPlan> next;
  int64_t next_offset = -1;
  for (auto& [offset, bytes] : messages) {
    auto kind = WorkMessageKindOf(bytes);
    if (!kind.ok() && kind.status().code() == StatusCode::kFailedPrecondition &&
        !warned_old_plan_) {
      warned_old_plan_ = true;  // once: the coordinator repeats its plans every second
      Log(LogLevel::kError, kComponent,
          work_.Describe() + " offset " + std::to_string(offset) + ": " +
              kind.status().ToString() + "; this process waits for a plan it can follow");
    }
    if (!kind.ok() || *kind != WorkMessageKind::kPlan) continue;
    auto plan = DecodeWorkPlan(bytes);
    if (!plan.ok()) {
      Log(LogLevel::kWarning, kComponent,
          work_.Describe() + " offset " + std::to_string(offset) + ": " +
              plan.status().ToString() + "; ignored");
      continue;
    }
    // Coordinators are ordered as the ledger orders owners: by epoch, then
    // owner id (two processes that claimed at once share a counter, and the
    // lower one is fenced at its first commit — after it may have planned
    // steps this one must not follow, or it would never answer the winner).
    const std::pair<uint64_t, std::string> coordinator{plan->epoch, plan->owner};
    if (coordinator < highest_coordinator_) continue;  // a replaced coordinator's
    highest_coordinator_ = coordinator;
    last_plan_seen_ns_.store(SteadyNowNs());
    const WorkPlan* current = next.has_value() ? &*next : (plan_.has_value() ? &*plan_ : nullptr);
    if (current != nullptr && current->epoch == plan->epoch && current->owner == plan->owner &&
        (plan->step < current->step ||
         (plan->step == current->step && plan->slot < current->slot))) {
      continue;  // older than the plan in hand
    }
    next = std::move(*plan);
    next_offset = offset;
  }
  if (!next.has_value()) return next;
  if (!next->model.empty() || next->has_delta()) {
    next->plan_offset = next_offset;  // a reminder with the model: itself
    return next;
  }
  // A reminder: the model (or the released sum) is in the step's plan.
  if (plan_model_of_ == KeyOf(*next)) return next;
  auto full = work_.exchange().ReadAt(next->plan_offset);
  auto decoded = full.ok() ? DecodeWorkPlan(*full) : StatusOr<WorkPlan>(full.status());
  if (!decoded.ok() || KeyOf(*decoded) != KeyOf(*next)) {
    Log(LogLevel::kWarning, kComponent,
        "the plan of step " + std::to_string(next->step) + " at " + work_.Describe() +
            " offset " + std::to_string(next->plan_offset) + " cannot be read (" +
            (decoded.ok() ? std::string("another step") : decoded.status().ToString()) +
            "); waiting for the next plan");
    return std::nullopt;
  }
  decoded->wanted = std::move(next->wanted);
  decoded->plan_offset = next->plan_offset;
  return std::move(*decoded);
}

Status Worker::Run() {
  ingest_.SetCapacity(config_.pool_capacity);
  ingest_.SetTimestampPolicy(config_.source_timestamps == "create_time"
                                 ? TimestampPolicy::kAny
                                 : TimestampPolicy::kLogAppendTime);
  metrics_->worker().Set(1);
  Log(LogLevel::kInfo, kComponent,
      "working for job '" + config_.ledger_key + "' on " + work_.Describe() +
          (options_.instance_id.empty() ? "" : " as " + options_.instance_id) +
          ": it joins the consumer group at the coordinator's first plan and sums the "
          "partitions the group gives it");
  while (!control_.stopping()) {
    // Only with the plan's model: after a release applied ahead, the plan's
    // work is over (the coordinator had every partial when it sent it).
    if (plan_.has_value() && plan_model_of_ == KeyOf(*plan_)) {
      WorkOnPlan();
    }
    auto messages = work_.Poll(std::chrono::milliseconds(100));
    if (!messages.has_value()) continue;
    ApplyReleasesAhead(*messages);
    std::optional<WorkPlan> next = NewestPlan(*messages);
    if (!next.has_value()) continue;
    const Status adopted = AdoptPlan(std::move(*next));
    if (!adopted.ok()) {
      ingest_.Fail(adopted);  // Run()'s result
      break;
    }
    if (!ingest_.started() && plan_.has_value()) {
      // The group is joined once a plan names every partition's window
      // start: a partition resumes there (one no plan names yet: at its
      // first retained record). Reading from below a window's start is
      // always complete; what lies below is dropped at the next plan.
      Ingest* ingest = &ingest_;
      auto source = make_source_([ingest](const std::string& topic, int32_t partition)
                                     -> std::optional<int64_t> {
        return ingest->ResumeOffset(topic, partition).value_or(0);
      });
      if (!source.ok()) {
        metrics_->worker().Set(0);
        return source.status();
      }
      ingest_.Start(std::move(*source));
    }
  }
  RequestStop();
  ingest_.Join();
  Status result = ingest_.error().value_or(Status::Ok());
  ingest_.Close();
  const Status flushed = sink_->Close();
  if (!flushed.ok()) Log(LogLevel::kWarning, kComponent, "closing the sink: " + flushed.ToString());
  metrics_->worker().Set(0);
  Log(LogLevel::kInfo, kComponent, "worker stopped");
  return result;
}

}  // namespace vipsd::daemon
