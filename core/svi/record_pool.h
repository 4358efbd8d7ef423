// RecordPool: the privacy wall's record store (docs/architecture.md). The decoded
// records that are candidates of the next step, in memory only, kept by
// stream (a Kafka partition, or the offline run's file) in offset order;
// every step Poisson-samples its batch from Candidates(). Records never
// leave it except as input to the E-step.
//
// Every step path samples from a RecordPool: one vipsd's step, a shared-work
// coordinator's and worker's own partitions, a federated holder's round.
// Which records are here is decided outside, per record, by the step's
// window (svi/slot_windows.h): one vipsd adds a record when its slot's cut
// passes it and evicts it (EvictBelow) when the window's lower edge passes
// it; a process that sums partitions for a plan (daemon/step/work_io.h)
// adds a partition's records below the plan's cut when it sums it and
// evicts below the plan's window start, or drops the partition when a plan
// reads it again from an earlier offset (DropStream). No rule here looks at record contents, at how many records there are,
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
// restart. Stream indices are the daemon's (Ingest::StreamId); their names
// are given to Candidates().
//
// What is private: the records. Sizes and offsets are stream volume.
// Thread-safety: not thread-safe; the daemon's step thread owns the pool.
// The record pointers Candidates() hands out stay valid until the next
// non-const call.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "core/base/status.h"
#include "core/model/model.h"

namespace vipsd::svi {

struct RecordOrigin {
  uint32_t stream = 0;
  int64_t offset = 0;
};

// One stream's candidates for a step: a Kafka partition's window, or the
// offline run's file. `offsets` are the records' offsets in the stream,
// strictly increasing; `stream` is its canonical name, the same in every
// process (the per-record randomness is keyed by it).
struct StreamCandidates {
  std::string stream;
  std::vector<const model::Record*> records;
  std::vector<int64_t> offsets;
  // Unit-level shared work (privacy/mechanisms/privacy_unit.h, home partition): when
  // partition_count > 0 this stream is partition `partition` of a topic
  // with partition_count partitions, and a unit's records here are
  // candidates only if it is the unit's home (UnitHomePartition of the
  // record's unit_hash). Public (the step's plan).
  int32_t partition = -1;
  int32_t partition_count = 0;
};

class RecordPool {
 public:
  // max_candidate_steps: M ≥ 1, or 0 for no limit (window "all").
  explicit RecordPool(int64_t max_candidate_steps = 0)
      : max_candidate_steps_(max_candidate_steps) {}

  // Appends a record to its stream. Within a stream, records must be added
  // in increasing offset order (the driver refuses a stream whose offsets
  // are not strictly increasing).
  void Add(model::Record record, RecordOrigin origin);

  // Removes every record whose offset is below `low[stream]` (streams
  // without an entry keep all their records). Returns how many were removed.
  int64_t EvictBelow(const std::map<uint32_t, int64_t>& low);

  // Removes every record of `stream` (read again from an earlier offset).
  // Returns how many were removed.
  int64_t DropStream(uint32_t stream);

  int64_t size() const { return size_; }

  // The step's candidates: each stream's records (stream_names[index]) in
  // offset order, the streams sorted by name (the order the driver adds
  // their partial sums in). INVALID_ARGUMENT for a stream index without a
  // name.
  StatusOr<std::vector<StreamCandidates>> Candidates(
      std::span<const std::string> stream_names) const;

  // One stream's candidates among offsets [low, high), named `name` (a
  // partition's window in a plan). INTERNAL if the stream's offsets are not
  // strictly increasing (added out of order).
  StatusOr<StreamCandidates> CandidatesIn(uint32_t stream, const std::string& name, int64_t low,
                                          int64_t high) const;

  // Every record with its origin and candidate count, stream by stream
  // (index order), each in offset order. For checks and tests.
  using Visitor = std::function<void(const model::Record& record, const RecordOrigin& origin,
                                     int64_t steps_present)>;
  void ForEach(const Visitor& visit) const;

  // After a step that ran with every pooled record as a candidate: every
  // record's count grows by one. FAILED_PRECONDITION (naming the stream
  // index and offset) if a record exceeds max_candidate_steps — the window
  // rule was broken.
  Status CompleteStep();

  void set_max_candidate_steps(int64_t steps) { max_candidate_steps_ = steps; }
  int64_t MaxStepsPresent() const;

 private:
  struct Stream {
    std::vector<model::Record> records;
    std::vector<int64_t> offsets;
    std::vector<int64_t> presence;
  };
  int64_t max_candidate_steps_ = 0;
  int64_t size_ = 0;
  std::map<uint32_t, Stream> streams_;
};

}  // namespace vipsd::svi
