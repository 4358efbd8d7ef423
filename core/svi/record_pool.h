// RecordPool: the privacy wall's record store (DESIGN.md 5). A bounded,
// in-memory set of decoded records from which every step Poisson-samples
// its batch. Records never leave it except as input to the E-step.
//
// Order and eviction. Records are kept in arrival order. Two rules remove
// them, and neither looks at record contents:
//   * capacity: when a record arrives and the pool holds `capacity` records,
//     the policy decides: kEvictOldest drops the oldest record (FIFO);
//     kRefuseNew leaves the pool unchanged and Add() returns false, so that
//     the caller stops consuming (back-pressure: the record stays in Kafka).
//   * residency (accounting mode "residency", max_residency_steps M ≥ 1):
//     every record counts the steps in which it was a sampling candidate —
//     the steps that ran while it was pooled, sampled or not. CompleteStep()
//     increments that count for every pooled record and evicts the records
//     whose count reached M. Hence no record is ever a candidate in more than
//     M steps, so each record's privacy loss is that of at most M
//     subsampled-Gaussian steps (core/privacy/residency_accountant.h).
//     A record re-read after a restart is added with the count it already
//     had (ArrivalHistory below), never with a fresh one.
//
// Origins. Each record carries its position in its input stream (stream
// index chosen by the caller, e.g. one per Kafka topic-partition, and the
// offset). Positions are stream volume, which the threat model treats as
// public; they let the daemon rebuild the pool after a restart by re-reading
// the input from LowestOffsets().
//
// What is private: the records. Sizes, eviction counts and offsets depend
// only on the stream's volume and the public schedule and may be exported.
//
// Thread-safety: not thread-safe; the daemon's step thread owns the pool.
// records() is stable until the next non-const call.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "core/base/status.h"
#include "core/model/model.h"

namespace vipsd::svi {

enum class EvictionPolicy { kEvictOldest, kRefuseNew };

struct PoolOptions {
  int64_t capacity = 100000;  // ≥ 1
  EvictionPolicy eviction = EvictionPolicy::kEvictOldest;
  int64_t max_residency_steps = 0;  // M ≥ 1 in residency mode; 0 = no limit
};

Status ValidatePoolOptions(const PoolOptions& options);

struct RecordOrigin {
  uint32_t stream = 0;
  int64_t offset = 0;
};

class RecordPool {
 public:
  static StatusOr<RecordPool> Create(const PoolOptions& options);

  // Adds a record that was already a candidate in `steps_present` earlier
  // steps (0 for a new record; ≥ M is refused: INVALID_ARGUMENT). When the
  // pool is full: kEvictOldest evicts the oldest record first; kRefuseNew
  // returns false and does not take the record.
  StatusOr<bool> Add(model::Record record, RecordOrigin origin, int64_t steps_present = 0);

  // The current candidates, oldest first.
  std::span<const model::Record> records() const {
    return {records_.data() + head_, records_.size() - head_};
  }
  int64_t size() const { return static_cast<int64_t>(records_.size() - head_); }
  bool full() const { return size() >= options_.capacity; }

  // After a step that ran with records() as candidates: every record's
  // count grows by one; records whose count reached M are evicted.
  // Returns the number evicted by residency.
  int64_t CompleteStep();

  // Changes capacity, policy or M (reload). Shrinking the capacity evicts
  // the oldest records now; lowering M evicts records whose count reached it.
  Status Reconfigure(const PoolOptions& options);

  // Lowest offset of a pooled record per stream (streams with no pooled
  // record are absent).
  std::map<uint32_t, int64_t> LowestOffsets() const;

  // Largest candidate count of any pooled record (0 if empty). Always < M in
  // residency mode between steps. For tests and instrumentation.
  int64_t MaxStepsPresent() const;

  // The count of the record at records()[index].
  int64_t steps_present(size_t index) const { return presence_[head_ + index]; }
  const RecordOrigin& origin(size_t index) const { return origins_[head_ + index]; }

  int64_t evicted_by_capacity() const { return evicted_capacity_; }
  int64_t evicted_by_residency() const { return evicted_residency_; }
  const PoolOptions& options() const { return options_; }

 private:
  explicit RecordPool(const PoolOptions& options) : options_(options) {}
  void EvictOldest(int64_t count);
  void Compact();
  // Adds `presence_increment` to every record's presence count, then evicts
  // (counting as residency evictions) the records whose count reached
  // max_residency_steps (none when it is 0). Returns how many were evicted.
  int64_t EvictAtResidencyLimit(int64_t presence_increment);

  PoolOptions options_;
  // Parallel arrays in arrival order; [0, head_) are evicted slots awaiting
  // compaction (so FIFO eviction is O(1) amortised).
  std::vector<model::Record> records_;
  std::vector<RecordOrigin> origins_;
  std::vector<int64_t> presence_;
  size_t head_ = 0;
  int64_t evicted_capacity_ = 0;
  int64_t evicted_residency_ = 0;
};

// ArrivalHistory: which records were pooled at which step, per stream, for
// the last `window` steps that ran — enough to tell, after a restart, in how
// many of the last M steps a re-read record was already a candidate.
//
// For each step s the daemon records, per stream, the highest offset pooled
// before s ran. Offsets within a stream are pooled in increasing order, so a
// record at offset o was pooled at step s iff o ≤ high(s). It may have been
// evicted earlier (capacity), so StepsPresent over-counts, never
// under-counts: a rebuilt record gets at most its remaining residency.
//
// Keys are stable stream names (e.g. "topic:partition"), as persisted in the
// ledger. Public: offsets and step numbers only.
class ArrivalHistory {
 public:
  explicit ArrivalHistory(int64_t window = 0) : window_(window) {}

  // Records step `step` (strictly greater than the last one recorded) with
  // the highest pooled offset per stream (streams absent here keep their
  // previous value). Forgets what is older than the window.
  Status RecordStep(int64_t step, const std::map<std::string, int64_t>& high_offsets);

  // Number of recorded steps in the window at which (stream, offset) was
  // pooled: in [0, window].
  int64_t StepsPresent(const std::string& stream, int64_t offset) const;

  int64_t window() const { return window_; }
  // Changes the window (reload of M); keeps what is recorded.
  void set_window(int64_t window) { window_ = window; }
  int64_t last_step() const { return last_step_; }

  // Versioned text form for the ledger; Deserialize refuses anything
  // malformed (DATA_LOSS-worthy for the caller).
  std::string Serialize() const;
  static StatusOr<ArrivalHistory> Deserialize(std::string_view text);

  bool operator==(const ArrivalHistory& other) const {
    return window_ == other.window_ && last_step_ == other.last_step_ &&
           changes_ == other.changes_;
  }

 private:
  void Prune();

  int64_t window_ = 0;
  int64_t last_step_ = 0;  // 0 = nothing recorded
  // Per stream: (first step with this high offset, high offset), increasing
  // in both. The entry before the window start is kept: it gives the value
  // at the window start.
  std::map<std::string, std::vector<std::pair<int64_t, int64_t>>> changes_;
};

}  // namespace vipsd::svi
