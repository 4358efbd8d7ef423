// Ingest: the consumer side of the daemon — the INGEST thread, the staging
// area of records read but not yet in a step's window, and the mutex that
// guards it.
//
// The ingest thread polls the InputSource, drops re-delivered offsets,
// decodes each record with the model's decoder, sends malformed ones to the
// dead-letter sink, stages good ones per stream in offset order, and only
// then marks their offsets done (docs/architecture.md, "The path of a record"):
//   * a dead letter is delivered before its offset is marked (retried with
//     backoff until the sink confirms); a record re-read below the group's
//     committed offset was dead-lettered already and is not sent again; a
//     dead letter the sink refuses for good (INVALID_ARGUMENT) is counted,
//     logged once and skipped, so that no record can stop consumption;
//     dead-lettered offsets are committed at once;
//   * a stream the ledger does not know yet is acknowledged only once the
//     step thread has covered it (added it to the ledger and committed):
//     after a crash its records are read again (TakeCoverRequest, Cover);
//   * a stream read up to the cut the step thread gathers for (SetTargets)
//     is paused, so that later records do not crowd the window's;
//   * back-pressure: once the window's records staged here plus those in
//     the pool exceed pool.capacity by one, polling waits — an overflow is
//     then a count, never a guess about unread offsets.
//
// What decides which records a step sees is the cut rule of
// core/svi/slot_windows.h: the slot clock observes each stream's end, and
// the first staged record after the slot time (by its timestamp) lowers the
// stream's target to the cut (SetTargets). Ingest makes sure that
// everything below a cut has been read (Progress) and hands it over in
// offset order (Admit).
//
// Privacy: staged records are private; they leave only through Admit, into
// the step thread's RecordPool (core/svi/record_pool.h), the one pool every
// step path samples from. Counters (records pooled, rejected,
// offsets read) are stream volume.
//
// Thread-safety: Start/Stop/Join and every query may be called from any
// thread; the ingest thread is the only one that polls the source. State
// shared with the step thread is guarded by mutex_.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "connectors/decode/record_decoder.h"
#include "core/base/status.h"
#include "core/base/thread_annotations.h"
#include "core/model/model.h"
#include "core/svi/step_driver.h"
#include "daemon/io/io.h"
#include "daemon/io/metrics.h"
#include "daemon/parts/run_control.h"

namespace vipsd::daemon {

struct Staged {
  model::Record record;
  int64_t offset = 0;
  int64_t timestamp_ms = -1;  // the message's (stream timing, not content)
};

// Which message timestamps a paced run trusts to decide its slot cuts
// (source.timestamps); a message with any other is dead-lettered
// (untrusted_timestamp). kIgnore: an unpaced run (no cuts; a file has none).
enum class TimestampPolicy { kIgnore, kLogAppendTime, kAny };

// "No slot time": a target is the observed end itself.
inline constexpr int64_t kNoCutTime = std::numeric_limits<int64_t>::max();

// What the step thread (or a worker, for a plan) gathers for: every stream's
// observed end and the slot's cut rule. A stream's CUT is the offset of its
// first staged record at or above `floor` whose timestamp is after
// `cut_time_ms` (a record of a later slot), or `end` when there is none
// below it (core/svi/slot_windows.h).
struct SlotTargets {
  int64_t cut_time_ms = kNoCutTime;  // floor(t_k · 1000)
  struct Stream {
    int64_t end = 0;    // the log end observed at t_k + grace
    int64_t floor = 0;  // no cut below this (the previous cut, or end observed at t_{k−1} + grace)
  };
  std::map<std::string, Stream> streams;
  // Ends only: the cut is the end (an unpaced run; kNoCutTime).
  static SlotTargets AtEnds(const std::map<std::string, int64_t>& ends);
};

// Where reading stands against a slot's cuts.
struct WindowProgress {
  // Streams not yet read up to their cut, each with the offset read to.
  std::vector<std::pair<std::string, int64_t>> behind;
  // The window's records held here and in the pool (pool.capacity check).
  int64_t held = 0;
};

class Ingest {
 public:
  // `cover_every_stream`: a worker's records are the coordinator's to
  // account for (its plans name where every stream resumes), so no stream
  // waits to be covered.
  Ingest(const connectors::RecordDecoder* decoder, OutputSink* dead_letters, Metrics* metrics,
         RunControl* control, bool cover_every_stream);
  ~Ingest();
  Ingest(const Ingest&) = delete;
  Ingest& operator=(const Ingest&) = delete;

  // Takes the source and starts the ingest thread.
  void Start(std::unique_ptr<InputSource> source) EXCLUDES(mutex_);
  // Asks the ingest thread to stop (any thread); Join waits for it.
  void Stop() EXCLUDES(mutex_);
  void Join();
  bool started() const { return source_ != nullptr; }
  // The source, for the slot clock's observations (ObserveBounds may be
  // called concurrently with the ingest thread); null before Start.
  InputSource* source() const { return source_.get(); }
  // Commits the offsets marked done and closes the source (after Join).
  void Close();

  // A fatal ingest failure (the ingest thread stopped), if any.
  std::optional<Status> error() const EXCLUDES(mutex_);
  // Records a fatal failure on the ingest side and stops (a worker whose
  // partial sum fails).
  void Fail(const Status& error) EXCLUDES(mutex_);

  // Resume offsets: where each stream is read from after a restart (the
  // ledger's window starts; a worker's plan's). Consulted by the source
  // factory when a partition is assigned (any thread).
  void SetResumeOffsets(std::map<std::string, int64_t> offsets, bool covered) EXCLUDES(mutex_);
  void SetResumeOffset(const std::string& stream, int64_t offset) EXCLUDES(mutex_);
  std::optional<int64_t> ResumeOffset(const std::string& topic, int32_t partition) const
      EXCLUDES(mutex_);

  // New streams the ingest thread read before the ledger knew them: true
  // once per request; Cover() then releases their records.
  bool TakeCoverRequest() EXCLUDES(mutex_);
  void Cover(const std::vector<std::string>& streams) EXCLUDES(mutex_);
  // Asks again later (the ledger could not be committed now).
  void RequestCover() EXCLUDES(mutex_);

  void SetCapacity(int64_t capacity) EXCLUDES(mutex_);
  // Before Start: which timestamps this run trusts (default kIgnore).
  void SetTimestampPolicy(TimestampPolicy policy) EXCLUDES(mutex_);
  // What the step thread gathers for (the other streams: nothing). Each
  // stream's target starts at its end and drops to its cut as soon as the
  // record that decides it is staged.
  void SetTargets(const SlotTargets& targets) EXCLUDES(mutex_);
  // How far reading stands against `ends` (stream → end), each lowered to
  // the stream's target; `window_start(stream)` is where the stream's window
  // begins (nothing below it is needed). A stream is complete once read up
  // to that.
  WindowProgress Progress(const std::map<std::string, int64_t>& ends,
                          const std::function<int64_t(const std::string&)>& window_start)
      EXCLUDES(mutex_);
  // The cuts: each of `ends` lowered to its stream's target (final once
  // Progress reports none behind).
  std::map<std::string, int64_t> Cuts(const std::map<std::string, int64_t>& ends)
      EXCLUDES(mutex_);
  // Takes the staged records below each stream's cut, by stream id.
  std::vector<std::pair<uint32_t, std::deque<Staged>>> Admit(
      const std::map<std::string, int64_t>& cuts) EXCLUDES(mutex_);
  // The pool's size after the step thread changed it (back-pressure).
  void SetPoolSize(int64_t size) EXCLUDES(mutex_);
  // The window moved: staged records below `low` (by stream name) leave,
  // and no cut is known any more.
  void AdvanceTo(const std::map<std::string, int64_t>& low) EXCLUDES(mutex_);

  // Stream ids (the pool's stream index) and names.
  uint32_t StreamId(const std::string& stream) EXCLUDES(mutex_);
  std::vector<std::string> StreamNames() const EXCLUDES(mutex_);

  // Shared work: whether this process read `stream` up to its target (its
  // cut; SetTargets), holds it now, or cannot complete it (its window fills
  // pool.capacity).
  bool Complete(const std::string& stream) EXCLUDES(mutex_);
  // The stream's target (its cut once Complete).
  int64_t Target(const std::string& stream) EXCLUDES(mutex_);
  bool Assigned(const std::string& stream) const EXCLUDES(mutex_);
  // The source reported which partitions it holds (a Kafka consumer, once
  // the group assigned it some); until then Assigned says true of every
  // stream, as for a file.
  bool AssignmentReported() const EXCLUDES(mutex_);
  bool Overflowing(const std::string& stream) EXCLUDES(mutex_);
  // Worker: drops staged records of `stream` below `low` (never a candidate
  // again). A `low` below an earlier one whose records were read and dropped
  // (the window start went back: the plans of a coordinator that was then
  // fenced ran ahead of the record, and the owner of record plans from
  // there) reads the stream again from `low`: its staged records are
  // dropped, and the ingest thread seeks the source there (records fetched
  // before the seek are discarded), so that a window is never summed with
  // records missing; true then (the caller's pool drops the stream too).
  bool DropBelow(const std::string& stream, int64_t low) EXCLUDES(mutex_);

  int64_t records_pooled() const EXCLUDES(mutex_);
  int64_t records_rejected() const EXCLUDES(mutex_);

 private:
  void Loop() EXCLUDES(mutex_);
  Status IngestBatch(PollBatch& batch) EXCLUDES(mutex_);
  // Decodes every record of `records` not marked in `duplicate` into
  // `decoded` (its payload then freed), or lists it in `rejected` with its
  // reason (an untrusted timestamp under `policy`, oversize, undecodable).
  // Ingest thread only.
  void DecodeBatch(std::vector<InputRecord>& records, const std::vector<bool>& duplicate,
                   TimestampPolicy policy, std::vector<std::optional<model::Record>>* decoded,
                   std::vector<std::pair<size_t, connectors::RejectReason>>* rejected)
      EXCLUDES(mutex_);
  // Dead-letters rejected record `index` of `records`; false when stopping.
  bool DeadLetter(const InputRecord& record, connectors::RejectReason reason) EXCLUDES(mutex_);
  uint32_t StreamIdLocked(const std::string& stream) REQUIRES(mutex_);
  bool CompleteLocked(const std::string& stream) REQUIRES(mutex_);
  // Lowers stream `id`'s target to `staged`'s offset if it decides the cut.
  void LowerTargetLocked(uint32_t id, const Staged& staged) REQUIRES(mutex_);
  bool AssignedLocked(const std::string& stream) const REQUIRES(mutex_);
  // Waits for a notification or `timeout`; false when stopping.
  bool WaitLocked(MutexLock& lock, std::chrono::milliseconds timeout) REQUIRES(mutex_);

  const connectors::RecordDecoder* const decoder_;
  OutputSink* const dead_letters_;
  Metrics* const metrics_;
  RunControl* const control_;
  const bool cover_every_stream_;

  std::unique_ptr<InputSource> source_;  // set by Start, before the thread
  std::thread thread_;
  bool undeliverable_logged_ = false;  // ingest thread only
  bool untrusted_logged_ = false;      // ingest thread only

  mutable Mutex mutex_;
  std::condition_variable wake_;  // the ingest thread's waits
  bool stop_ GUARDED_BY(mutex_) = false;
  std::optional<Status> error_ GUARDED_BY(mutex_);
  std::map<std::string, uint32_t> stream_ids_ GUARDED_BY(mutex_);
  std::vector<std::string> stream_names_ GUARDED_BY(mutex_);  // by id
  std::vector<std::deque<Staged>> staging_ GUARDED_BY(mutex_);  // by id, by offset
  // Per stream id: every offset below has been read (returned or passed).
  std::vector<int64_t> next_unread_ GUARDED_BY(mutex_);
  // Per stream id: the highest `low` of DropBelow (−1: none); staged records
  // cover [kept_from_, next_unread_).
  std::vector<int64_t> kept_from_ GUARDED_BY(mutex_);
  // Streams to read again (DropBelow) and where from, until the ingest
  // thread has sought the source: their records polled before are dropped.
  std::map<uint32_t, int64_t> rewinds_ GUARDED_BY(mutex_);
  std::set<uint32_t> rewinding_ GUARDED_BY(mutex_);
  // Per stream id: the cut the step thread gathers for (kNoTarget until the
  // slot's cut is known). Staged records below it are window records.
  std::vector<int64_t> target_ GUARDED_BY(mutex_);
  // Per stream id: no cut below this offset (SlotTargets::Stream::floor).
  std::vector<int64_t> floor_ GUARDED_BY(mutex_);
  int64_t cut_time_ms_ GUARDED_BY(mutex_) = kNoCutTime;
  TimestampPolicy timestamp_policy_ GUARDED_BY(mutex_) = TimestampPolicy::kIgnore;
  int64_t staged_in_window_ GUARDED_BY(mutex_) = 0;
  int64_t pool_size_ GUARDED_BY(mutex_) = 0;
  int64_t capacity_ GUARDED_BY(mutex_) = 0;
  // Streams the ledger knows (their records may be acknowledged).
  std::set<std::string> covered_streams_ GUARDED_BY(mutex_);
  bool cover_requested_ GUARDED_BY(mutex_) = false;
  std::map<std::string, int64_t> resume_offsets_ GUARDED_BY(mutex_);
  // The streams the source has assigned (nullopt: all of them).
  std::optional<std::set<std::string>> assigned_ GUARDED_BY(mutex_);
  int64_t records_pooled_ GUARDED_BY(mutex_) = 0;
  int64_t records_rejected_ GUARDED_BY(mutex_) = 0;
};

}  // namespace vipsd::daemon
