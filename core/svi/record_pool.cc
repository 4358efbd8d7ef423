#include "core/svi/record_pool.h"

#include <algorithm>
#include <string>

namespace vipsd::svi {

void RecordPool::Add(model::Record record, RecordOrigin origin) {
  Stream& stream = streams_[origin.stream];
  stream.records.push_back(std::move(record));
  stream.offsets.push_back(origin.offset);
  stream.presence.push_back(0);
  ++size_;
}

int64_t RecordPool::EvictBelow(const std::map<uint32_t, int64_t>& low) {
  int64_t evicted = 0;
  for (auto& [index, stream] : streams_) {
    const auto edge = low.find(index);
    if (edge == low.end()) continue;
    // Offsets increase within a stream: the evicted records are a prefix.
    const auto first_kept = static_cast<size_t>(
        std::lower_bound(stream.offsets.begin(), stream.offsets.end(), edge->second) -
        stream.offsets.begin());
    if (first_kept == 0) continue;
    const auto cut = static_cast<std::ptrdiff_t>(first_kept);
    stream.records.erase(stream.records.begin(), stream.records.begin() + cut);
    stream.offsets.erase(stream.offsets.begin(), stream.offsets.begin() + cut);
    stream.presence.erase(stream.presence.begin(), stream.presence.begin() + cut);
    if (stream.records.capacity() > 2 * stream.records.size() + 1024) {
      stream.records.shrink_to_fit();
      stream.offsets.shrink_to_fit();
      stream.presence.shrink_to_fit();
    }
    evicted += static_cast<int64_t>(first_kept);
  }
  std::erase_if(streams_, [](const auto& entry) { return entry.second.records.empty(); });
  size_ -= evicted;
  return evicted;
}

int64_t RecordPool::DropStream(uint32_t stream) {
  const auto it = streams_.find(stream);
  if (it == streams_.end()) return 0;
  const auto dropped = static_cast<int64_t>(it->second.records.size());
  streams_.erase(it);
  size_ -= dropped;
  return dropped;
}

StatusOr<StreamCandidates> RecordPool::CandidatesIn(uint32_t stream, const std::string& name,
                                                    int64_t low, int64_t high) const {
  StreamCandidates candidates;
  candidates.stream = name;
  const auto it = streams_.find(stream);
  if (it == streams_.end()) return candidates;
  const Stream& records = it->second;
  for (size_t i = 0; i < records.offsets.size(); ++i) {
    if (i > 0 && records.offsets[i] <= records.offsets[i - 1]) {
      return InternalError("record pool: stream " + name + " holds offset " +
                           std::to_string(records.offsets[i]) + " after " +
                           std::to_string(records.offsets[i - 1]));
    }
    if (records.offsets[i] < low || records.offsets[i] >= high) continue;
    candidates.records.push_back(&records.records[i]);
    candidates.offsets.push_back(records.offsets[i]);
  }
  return candidates;
}

StatusOr<std::vector<StreamCandidates>> RecordPool::Candidates(
    std::span<const std::string> stream_names) const {
  std::vector<StreamCandidates> streams;
  streams.reserve(streams_.size());
  for (const auto& [index, stream] : streams_) {
    if (index >= stream_names.size()) {
      return InvalidArgumentError("record pool: stream index " + std::to_string(index) +
                                  " has no name");
    }
    StreamCandidates& candidates = streams.emplace_back();
    candidates.stream = stream_names[index];
    candidates.records.reserve(stream.records.size());
    for (const model::Record& record : stream.records) candidates.records.push_back(&record);
    candidates.offsets = stream.offsets;
  }
  std::sort(streams.begin(), streams.end(), [](const StreamCandidates& a, const StreamCandidates& b) {
    return a.stream < b.stream;
  });
  return streams;
}

void RecordPool::ForEach(const Visitor& visit) const {
  for (const auto& [index, stream] : streams_) {
    for (size_t i = 0; i < stream.records.size(); ++i) {
      visit(stream.records[i], RecordOrigin{index, stream.offsets[i]}, stream.presence[i]);
    }
  }
}

Status RecordPool::CompleteStep() {
  for (auto& [index, stream] : streams_) {
    for (size_t i = 0; i < stream.presence.size(); ++i) {
      const int64_t count = ++stream.presence[i];
      if (max_candidate_steps_ > 0 && count > max_candidate_steps_) {
        return FailedPreconditionError(
            "record pool: the record at offset " + std::to_string(stream.offsets[i]) +
            " of stream #" + std::to_string(index) + " was a candidate in " +
            std::to_string(count) + " steps, more than the window of " +
            std::to_string(max_candidate_steps_));
      }
    }
  }
  return Status::Ok();
}

int64_t RecordPool::MaxStepsPresent() const {
  int64_t most = 0;
  for (const auto& [index, stream] : streams_) {
    for (int64_t count : stream.presence) most = std::max(most, count);
  }
  return most;
}

}  // namespace vipsd::svi
