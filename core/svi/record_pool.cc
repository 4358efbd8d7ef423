#include "core/svi/record_pool.h"

#include <algorithm>
#include <string>

namespace vipsd::svi {

void RecordPool::Add(model::Record record, RecordOrigin origin) {
  records_.push_back(std::move(record));
  origins_.push_back(origin);
  presence_.push_back(0);
}

int64_t RecordPool::EvictBelow(const std::map<uint32_t, int64_t>& low) {
  size_t kept = 0;
  for (size_t i = 0; i < records_.size(); ++i) {
    const auto it = low.find(origins_[i].stream);
    if (it != low.end() && origins_[i].offset < it->second) continue;
    if (kept != i) {
      records_[kept] = std::move(records_[i]);
      origins_[kept] = origins_[i];
      presence_[kept] = presence_[i];
    }
    ++kept;
  }
  const auto evicted = static_cast<int64_t>(records_.size() - kept);
  records_.resize(kept);
  origins_.resize(kept);
  presence_.resize(kept);
  if (records_.capacity() > 2 * records_.size() + 1024) {
    records_.shrink_to_fit();
    origins_.shrink_to_fit();
    presence_.shrink_to_fit();
  }
  return evicted;
}

Status RecordPool::CompleteStep() {
  for (size_t i = 0; i < presence_.size(); ++i) {
    ++presence_[i];
    if (max_candidate_steps_ > 0 && presence_[i] > max_candidate_steps_) {
      return FailedPreconditionError(
          "record pool: the record at offset " + std::to_string(origins_[i].offset) +
          " of stream #" + std::to_string(origins_[i].stream) + " was a candidate in " +
          std::to_string(presence_[i]) + " steps, more than the window of " +
          std::to_string(max_candidate_steps_));
    }
  }
  return Status::Ok();
}

int64_t RecordPool::MaxStepsPresent() const {
  int64_t most = 0;
  for (int64_t count : presence_) most = std::max(most, count);
  return most;
}

}  // namespace vipsd::svi
