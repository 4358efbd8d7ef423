// RecordPool: the privacy wall's record store (docs/architecture.md). The decoded
// records that are candidates of the next step, in memory only; every step
// Poisson-samples its batch from records(). Records never leave it except as
// input to the E-step.
//
// Which records are here is decided outside, per record, by the step's
// window (svi/slot_windows.h): the daemon adds a record when its slot's cut
// passes it and evicts it (EvictBelow) when the window's lower edge passes
// it. No rule here looks at record contents, at how many records there are,
// or at arrival order across streams: there is deliberately no capacity
// eviction (a count-based rule would make one record's presence change
// another's membership — add/remove adjacency would become substitution).
// The daemon bounds memory by refusing to step when a window does not fit
// (pool.capacity), never by dropping a candidate.
//
// Candidate counts. Every record counts the steps that ran while it was
// pooled (CompleteStep). With a window of M slots no record can exceed M
// (slot_windows.h proves it); the pool checks it anyway, as a second line of
// defence: CompleteStep fails if any record reached more than
// max_candidate_steps, and the daemon then stops stepping.
//
// Origins: each record carries (stream index, offset) — stream volume,
// public — so that the daemon can evict by window and rebuild after a
// restart.
//
// What is private: the records. Sizes and offsets are stream volume.
// Thread-safety: not thread-safe; the daemon's step thread owns the pool.
// records() is stable until the next non-const call.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include "core/base/status.h"
#include "core/model/model.h"

namespace vipsd::svi {

struct RecordOrigin {
  uint32_t stream = 0;
  int64_t offset = 0;
};

class RecordPool {
 public:
  // max_candidate_steps: M ≥ 1, or 0 for no limit (window "all").
  explicit RecordPool(int64_t max_candidate_steps = 0)
      : max_candidate_steps_(max_candidate_steps) {}

  void Add(model::Record record, RecordOrigin origin);

  // Removes every record whose offset is below `low[stream]` (streams
  // without an entry keep all their records). Returns how many were removed.
  int64_t EvictBelow(const std::map<uint32_t, int64_t>& low);

  std::span<const model::Record> records() const { return records_; }
  int64_t size() const { return static_cast<int64_t>(records_.size()); }
  const RecordOrigin& origin(size_t index) const { return origins_[index]; }
  std::span<const RecordOrigin> origins() const { return origins_; }
  int64_t steps_present(size_t index) const { return presence_[index]; }

  // After a step that ran with records() as candidates: every record's count
  // grows by one. FAILED_PRECONDITION (naming the stream index and offset) if
  // a record exceeds max_candidate_steps — the window rule was broken.
  Status CompleteStep();

  void set_max_candidate_steps(int64_t steps) { max_candidate_steps_ = steps; }
  int64_t MaxStepsPresent() const;

 private:
  int64_t max_candidate_steps_ = 0;
  std::vector<model::Record> records_;
  std::vector<RecordOrigin> origins_;
  std::vector<int64_t> presence_;
};

}  // namespace vipsd::svi
