#include "daemon/step/work_io.h"

#include <algorithm>
#include <charconv>

#include "core/base/log.h"
#include "core/privacy/mechanisms/gaussian_mechanism.h"

namespace vipsd::daemon {
namespace {

constexpr std::string_view kComponent = "daemon";

}  // namespace

WorkIo::WorkIo(std::unique_ptr<WorkExchange> exchange, RunControl* control)
    : exchange_(std::move(exchange)), control_(control) {}

StatusOr<int64_t> WorkIo::Append(const std::string& bytes) {
  auto backoff = std::chrono::milliseconds(200);
  int failures = 0;
  for (;;) {
    auto appended = exchange_->Append(bytes);
    if (appended.ok()) return appended;
    if (failures++ == 0 || failures % 10 == 0) {
      Log(LogLevel::kWarning, kComponent,
          "cannot append to the " + exchange_->Describe() + " (retrying): " +
              appended.status().ToString());
    }
    if (!control_->PauseFor(backoff)) return CancelledError("stopping");
    backoff = std::min(backoff * 2, std::chrono::milliseconds(5000));
  }
}

std::optional<std::vector<std::pair<int64_t, std::string>>> WorkIo::Poll(
    std::chrono::milliseconds wait) {
  auto messages = exchange_->Poll(wait);
  if (messages.ok()) return std::move(*messages);
  if (poll_failures_++ % 20 == 0) {
    Log(LogLevel::kWarning, kComponent,
        "cannot read the " + exchange_->Describe() + " (retrying): " +
            messages.status().ToString());
  }
  (void)control_->PauseFor(std::chrono::milliseconds(300));
  return std::nullopt;
}

void DropLocalBelow(Ingest& ingest, svi::RecordPool& pool, const std::string& stream,
                    int64_t low) {
  const uint32_t id = ingest.StreamId(stream);
  if (ingest.DropBelow(stream, low)) {
    pool.DropStream(id);
  } else {
    pool.EvictBelow({{id, low}});
  }
  ingest.SetPoolSize(pool.size());
}

Status SumLocalStreams(Ingest& ingest, svi::RecordPool& pool, svi::StepDriver& driver,
                       const WorkPlan& plan, const std::vector<LocalStream>& streams,
                       const svi::PartialSink& sink) {
  // Into the pool first: the candidates' pointers are valid until the
  // pool's next change.
  for (size_t i = 0; i < streams.size(); ++i) {
    const WorkStream& stream = *streams[i].stream;
    if (i > 0 && !(streams[i - 1].stream->name < stream.name)) {
      return InternalError("local partial sums must be listed by partition name, each once");
    }
    for (auto& [id, taken] : ingest.Admit({{stream.name, streams[i].cut}})) {
      for (Staged& staged : taken) pool.Add(std::move(staged.record), {id, staged.offset});
    }
    pool.EvictBelow({{ingest.StreamId(stream.name), stream.low}});
  }
  ingest.SetPoolSize(pool.size());
  std::vector<svi::StreamCandidates> candidates;
  candidates.reserve(streams.size());
  for (const LocalStream& local : streams) {
    const WorkStream& stream = *local.stream;
    VIPSD_ASSIGN_OR_RETURN(
        svi::StreamCandidates window,
        pool.CandidatesIn(ingest.StreamId(stream.name), stream.name, stream.low, local.cut));
    candidates.push_back(std::move(window));
    if (driver.config().max_records_per_unit == 0) continue;
    // "topic:partition"; the topic's partitions are the plan's streams
    // named "topic:*".
    const size_t colon = stream.name.rfind(':');
    if (colon == std::string::npos) {
      return InternalError("work plan stream '" + stream.name + "' is not topic:partition");
    }
    const std::string prefix = stream.name.substr(0, colon + 1);
    int32_t count = 0;
    for (const WorkStream& s : plan.streams) count += s.name.rfind(prefix, 0) == 0 ? 1 : 0;
    int32_t partition = -1;
    const char* first = stream.name.data() + colon + 1;
    const char* last = stream.name.data() + stream.name.size();
    const auto [end, error] = std::from_chars(first, last, partition);
    if (error != std::errc() || end != last) partition = -1;
    candidates.back().partition = partition;
    candidates.back().partition_count = count;
    if (partition < 0 || partition >= count) {
      return InternalError("work plan stream '" + stream.name + "': partition outside the " +
                           std::to_string(count) + " partitions the plan lists for its topic");
    }
  }
  return driver.SumStreams(plan.key, candidates, sink);
}

StatusOr<Checkpoint> DecodePlanModel(const std::string& bytes, const std::string& where,
                                     const ModelBundle& bundle, const std::string& whose) {
  VIPSD_ASSIGN_OR_RETURN(Checkpoint model, CheckpointStore::Decode(bytes, where));
  if (model.model_type != bundle.model->type() ||
      model.model_fingerprint != bundle.model_fingerprint) {
    return InvalidArgumentError(
        whose + " model (" + model.model_type + ", fingerprint " +
        model.model_fingerprint.substr(0, 12) + "…) is not this process's (" +
        bundle.model->type() + ", " + bundle.model_fingerprint.substr(0, 12) +
        "…): the processes of a job need one model configuration");
  }
  return model;
}

const WorkStream* FindStream(const WorkPlan& plan, const std::string& name) {
  const auto it = std::lower_bound(plan.streams.begin(), plan.streams.end(), name,
                                   [](const WorkStream& s, const std::string& n) { return s.name < n; });
  return it != plan.streams.end() && it->name == name ? &*it : nullptr;
}

}  // namespace vipsd::daemon
