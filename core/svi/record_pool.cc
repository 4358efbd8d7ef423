#include "core/svi/record_pool.h"

#include <algorithm>
#include <sstream>
#include <utility>

namespace vipsd::svi {

Status ValidatePoolOptions(const PoolOptions& options) {
  if (options.capacity < 1) return InvalidArgumentError("pool capacity must be >= 1");
  if (options.max_residency_steps < 0) {
    return InvalidArgumentError("max_residency_steps must be >= 0 (0 = no residency limit)");
  }
  return Status::Ok();
}

StatusOr<RecordPool> RecordPool::Create(const PoolOptions& options) {
  VIPSD_RETURN_IF_ERROR(ValidatePoolOptions(options));
  return RecordPool(options);
}

StatusOr<bool> RecordPool::Add(model::Record record, RecordOrigin origin,
                               int64_t steps_present) {
  const int64_t limit = options_.max_residency_steps;
  if (steps_present < 0 || (limit > 0 && steps_present >= limit)) {
    return InvalidArgumentError("a record's candidate count must be in [0, M)");
  }
  if (full()) {
    if (options_.eviction == EvictionPolicy::kRefuseNew) return false;
    EvictOldest(size() - options_.capacity + 1);
  }
  records_.push_back(std::move(record));
  origins_.push_back(origin);
  presence_.push_back(steps_present);
  return true;
}

void RecordPool::EvictOldest(int64_t count) {
  for (int64_t i = 0; i < count && head_ < records_.size(); ++i) {
    records_[head_] = model::Record{};  // release the memory now
    ++head_;
    ++evicted_capacity_;
  }
  if (head_ > records_.size() / 2) Compact();
}

void RecordPool::Compact() {
  records_.erase(records_.begin(), records_.begin() + static_cast<std::ptrdiff_t>(head_));
  origins_.erase(origins_.begin(), origins_.begin() + static_cast<std::ptrdiff_t>(head_));
  presence_.erase(presence_.begin(), presence_.begin() + static_cast<std::ptrdiff_t>(head_));
  head_ = 0;
}

int64_t RecordPool::EvictAtResidencyLimit(int64_t presence_increment) {
  Compact();
  const int64_t limit = options_.max_residency_steps;
  size_t kept = 0;
  int64_t evicted = 0;
  for (size_t i = 0; i < records_.size(); ++i) {
    presence_[i] += presence_increment;
    if (limit > 0 && presence_[i] >= limit) {
      ++evicted;
      continue;
    }
    if (kept != i) {
      records_[kept] = std::move(records_[i]);
      origins_[kept] = origins_[i];
      presence_[kept] = presence_[i];
    }
    ++kept;
  }
  records_.resize(kept);
  origins_.resize(kept);
  presence_.resize(kept);
  evicted_residency_ += evicted;
  return evicted;
}

int64_t RecordPool::CompleteStep() { return EvictAtResidencyLimit(1); }

Status RecordPool::Reconfigure(const PoolOptions& options) {
  VIPSD_RETURN_IF_ERROR(ValidatePoolOptions(options));
  options_ = options;
  if (size() > options_.capacity) EvictOldest(size() - options_.capacity);
  // A lowered residency limit applies at once to the records already present.
  if (options_.max_residency_steps > 0) EvictAtResidencyLimit(0);
  return Status::Ok();
}

std::map<uint32_t, int64_t> RecordPool::LowestOffsets() const {
  std::map<uint32_t, int64_t> lowest;
  for (size_t i = head_; i < origins_.size(); ++i) {
    auto [it, inserted] = lowest.emplace(origins_[i].stream, origins_[i].offset);
    if (!inserted) it->second = std::min(it->second, origins_[i].offset);
  }
  return lowest;
}

int64_t RecordPool::MaxStepsPresent() const {
  int64_t most = 0;
  for (size_t i = head_; i < presence_.size(); ++i) most = std::max(most, presence_[i]);
  return most;
}

// ---------------------------------------------------------------------------

Status ArrivalHistory::RecordStep(int64_t step,
                                  const std::map<std::string, int64_t>& high_offsets) {
  if (step <= last_step_) {
    return InvalidArgumentError("arrival history: step " + std::to_string(step) +
                                " is not after the last recorded step " +
                                std::to_string(last_step_));
  }
  for (const auto& [stream, high] : high_offsets) {
    auto& entries = changes_[stream];
    if (!entries.empty() && high < entries.back().second) {
      return InvalidArgumentError("arrival history: the highest pooled offset of stream " +
                                  stream + " went backwards");
    }
    if (entries.empty() || high > entries.back().second) entries.emplace_back(step, high);
  }
  last_step_ = step;
  Prune();
  return Status::Ok();
}

void ArrivalHistory::Prune() {
  if (window_ <= 0 || last_step_ == 0) return;
  const int64_t window_start = last_step_ - window_ + 1;
  for (auto& [stream, entries] : changes_) {
    // Keep the last entry at or before the window start; drop older ones.
    size_t first_kept = 0;
    while (first_kept + 1 < entries.size() && entries[first_kept + 1].first <= window_start) {
      ++first_kept;
    }
    entries.erase(entries.begin(), entries.begin() + static_cast<std::ptrdiff_t>(first_kept));
  }
}

int64_t ArrivalHistory::StepsPresent(const std::string& stream, int64_t offset) const {
  if (last_step_ == 0 || window_ <= 0) return 0;
  const auto it = changes_.find(stream);
  if (it == changes_.end()) return 0;
  const auto& entries = it->second;
  // First change whose high offset covers `offset`; every later step covers
  // it too (high offsets only grow).
  const auto covering = std::find_if(entries.begin(), entries.end(),
                                     [&](const auto& entry) { return entry.second >= offset; });
  if (covering == entries.end()) return 0;
  const int64_t window_start = std::max<int64_t>(1, last_step_ - window_ + 1);
  const int64_t first = std::max(covering->first, window_start);
  return std::max<int64_t>(0, last_step_ - first + 1);
}

std::string ArrivalHistory::Serialize() const {
  std::ostringstream out;
  out << "arrival-history 1\nwindow " << window_ << "\nlast_step " << last_step_ << "\n";
  for (const auto& [stream, entries] : changes_) {
    out << "stream " << stream << " " << entries.size();
    for (const auto& [step, high] : entries) out << " " << step << " " << high;
    out << "\n";
  }
  out << "end\n";
  return out.str();
}

StatusOr<ArrivalHistory> ArrivalHistory::Deserialize(std::string_view text) {
  std::istringstream in{std::string(text)};
  std::string word;
  int version = 0;
  ArrivalHistory history;
  auto bad = [](const std::string& what) {
    return DataLossError("arrival history: " + what);
  };
  if (!(in >> word >> version) || word != "arrival-history" || version != 1) {
    return bad("bad header");
  }
  if (!(in >> word >> history.window_) || word != "window" || history.window_ < 0) {
    return bad("bad window line");
  }
  if (!(in >> word >> history.last_step_) || word != "last_step" || history.last_step_ < 0) {
    return bad("bad last_step line");
  }
  for (;;) {
    if (!(in >> word)) return bad("missing end line");
    if (word == "end") break;
    std::string stream;
    size_t count = 0;
    if (word != "stream" || !(in >> stream >> count) || count == 0 || count > (1u << 24)) {
      return bad("bad stream line");
    }
    auto& entries = history.changes_[stream];
    if (!entries.empty()) return bad("stream " + stream + " listed twice");
    for (size_t i = 0; i < count; ++i) {
      int64_t step = 0, high = 0;
      if (!(in >> step >> high) || step < 1 || step > history.last_step_) {
        return bad("bad entry for stream " + stream);
      }
      if (!entries.empty() && (step <= entries.back().first || high <= entries.back().second)) {
        return bad("entries of stream " + stream + " are not increasing");
      }
      entries.emplace_back(step, high);
    }
  }
  if (in >> word) return bad("trailing data after end");
  return history;
}

}  // namespace vipsd::svi
