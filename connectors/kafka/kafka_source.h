// KafkaSource: the daemon's record source — a Kafka consumer in a consumer
// group (classic group protocol; librdkafka 2.0.2) that hands raw messages to
// the ingest thread, which decodes them, pools or dead-letters each one and
// only then calls StoreOffset for it (docs/architecture.md, "The path of a record").
//
// Offsets. enable.auto.offset.store=false: an offset is stored only through
// StoreOffset(topic, partition, offset), which stores offset + 1 (the next
// record to read). Stored offsets are committed by librdkafka's auto-commit
// (auto.commit.interval.ms, default 5 s), by Commit(), on every revocation
// (rebalance callback) and by Close(). A record that was polled but never
// stored is therefore read again by whoever owns its partition next
// (at-least-once); the pool must tolerate that.
//
// Where consumption of a newly assigned partition starts:
//   1. resume_offset(topic, partition), if set and it returns a value: the
//      daemon rebuilds its pool from offsets kept in its own ledger. The
//      offset is clamped into [low, high] watermark, queried from the broker
//      in the rebalance callback (a blocking round trip, at most
//      resume_clamp_timeout per partition, done only on assignment): below
//      the low watermark (deleted by retention) consumption starts at the
//      oldest retained record, above the high watermark at the end of the
//      log. Each clamp is logged with both offsets. If the query fails the
//      offset is used unclamped and an out-of-range offset falls back to
//      auto.offset.reset (= start_position).
//   2. otherwise the group's committed offset, if any;
//   3. otherwise start_position: "earliest" or "latest" (auto.offset.reset).
// With resume offsets, the group's committed offsets are read at assignment
// too (one round trip, at most resume_clamp_timeout): a message re-read
// below its partition's committed offset is marked below_committed, so
// that the daemon does not dead-letter a rejected record a second time
// after every restart.
//
// Rebalances: one callback serves both protocols. EAGER (range, roundrobin)
// uses assign()/unassign() of the whole assignment; COOPERATIVE
// (partition.assignment.strategy=cooperative-sticky) incremental_assign()/
// incremental_unassign() of the partitions in the event. Before partitions
// are given up, stored offsets are committed synchronously (skipped when the
// assignment was lost: another member may own them already). on_assigned /
// on_revoked are then called with the (non-empty) partitions of the event.
// A real broker accepts that commit while the group prepares the rebalance;
// librdkafka 2.0.2's mock cluster refuses it (REBALANCE_IN_PROGRESS) for an
// EAGER member, so there the records stored since the last commit are read
// again by the next owner (still at-least-once). Close() retries a commit
// refused that way for up to 2 s.
// librdkafka before 2.3.0 (Debian 12 ships 2.0.2) aborts the process when a
// cooperative-sticky consumer is destroyed after joining and before its first
// assignment (confluentinc/librdkafka#4312): Close() then leaves the group and
// closes the consumer but keeps its handle until the process exits, with a
// warning.
//
// End of partition. enable.partition.eof is on: when the consumer reaches
// the end of a partition, Poll records the end offset (everything below it
// was returned) and TakeReachedEnds() hands those offsets to the caller.
//
// Errors. Poll returns messages only (end-of-partition events are kept for
// TakeReachedEnds). Transient
// errors — broker transport failures, all brokers down, unknown topic,
// failed commits, request timeouts — are counted in stats().errors_by_kind
// (key: librdkafka's error name, e.g. "_TRANSPORT") and logged (at most one
// line per kind per 10 s), and librdkafka keeps retrying. Poll returns an
// error only for what retrying cannot fix: a fatal librdkafka error
// (FAILED_PRECONDITION; sticky — every later Poll returns it, recreate the
// source) and authorization failures on the topic or group
// (FAILED_PRECONDITION naming the topic/group).
//
// Privacy: messages are private record content. This class never logs,
// counts or puts into an error anything derived from a key, header or
// payload; logs and errors name brokers, topics, partitions, offsets and
// librdkafka error codes only. Stream volume (messages per topic) and lag
// are public (README "Threat model"). librdkafka's own log lines (forwarded
// to vipsd::Log under component "kafka-source") carry no message content;
// setting the librdkafka `debug` property does not change that for the
// contexts vipsd is tested with, but keep it off in production.
//
// Oversize messages: a message whose key + value + header bytes exceed
// max_record_bytes is returned with oversize = true, an EMPTY payload and no
// headers (the bytes are not copied out of librdkafka's buffer, which is
// freed when Poll returns); its key is kept if the key alone fits in
// max_record_bytes (so the dead letter can name it). librdkafka itself still
// fetches the whole message: bound that with fetch.max.bytes /
// max.partition.fetch.bytes / receive.message.max.bytes if needed.
//
// Lag() = Σ over assigned partitions of max(0, high watermark − position),
// where position is the offset after the last message Poll returned from the
// partition. Both come from librdkafka's local cache (the high watermark is
// updated by every fetch response), so nothing blocks on the broker; Poll
// recomputes the value after each call and Lag() reads that number. It is
// therefore as stale as the last Poll plus the last fetch response
// (normally well under a second while Poll runs regularly). A partition
// from which nothing has been returned since its assignment, or whose high
// watermark is not known yet, contributes 0.
//
// Thread-safety: Poll, StoreOffset, Commit and Close must be called from one
// thread (the ingest thread); the assignment callbacks run on that thread,
// inside Poll/Commit/Close. Lag() and stats() may be called from any thread
// at any time, including concurrently with Poll and after Close.
//
// Lifecycle (librdkafka's rules): the callback objects are members that
// outlive the consumer handle; Close() commits stored offsets, close()s the
// consumer (leaving the group, which revokes and commits again) and only
// then destroys it. Close() is idempotent and also run by the destructor.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "connectors/source_message.h"
#include "core/base/status.h"
#include "core/base/thread_annotations.h"

namespace RdKafka {
class KafkaConsumer;
class Message;
class TopicPartition;
}  // namespace RdKafka

namespace vipsd::connectors {

struct TopicPartitionRef {
  std::string topic;
  int32_t partition = 0;
  auto operator<=>(const TopicPartitionRef&) const = default;
};

struct KafkaSourceOptions {
  std::string bootstrap_servers;    // "host:port[,host:port...]", required
  std::vector<std::string> topics;  // ≥ 1, distinct, non-empty
  std::string group_id;             // required
  std::string client_id = "vipsd";
  // Where a partition with neither a resume offset nor a committed offset
  // starts: "earliest" or "latest" (also librdkafka's auto.offset.reset).
  std::string start_position = "earliest";
  // Larger messages come back oversize (see above). ≥ 1.
  size_t max_record_bytes = 1 << 20;
  // Extra librdkafka consumer properties, e.g. session.timeout.ms,
  // partition.assignment.strategy, enable.auto.commit. An unknown name or a
  // bad value is INVALID_ARGUMENT naming the property. The properties vipsd
  // sets itself cannot be given here: bootstrap.servers, group.id,
  // client.id, auto.offset.reset, enable.auto.offset.store,
  // enable.partition.eof.
  std::map<std::string, std::string> properties;
  // Consulted on the ingest thread when a partition is assigned (see above).
  std::function<std::optional<int64_t>(const std::string& topic, int32_t partition)>
      resume_offset;
  // Upper bound of the watermark query that clamps one resume offset.
  std::chrono::milliseconds resume_clamp_timeout{5000};
  // Called on the ingest thread after partitions were assigned / before
  // they are given up (after the commit). Optional.
  std::function<void(const std::vector<TopicPartitionRef>&)> on_assigned;
  std::function<void(const std::vector<TopicPartitionRef>&)> on_revoked;
};

// Counters since Create. Public by the threat model: stream volume and
// client health, nothing derived from message content.
struct KafkaSourceStats {
  std::map<std::string, int64_t> messages_by_topic;  // returned by Poll, incl. oversize
  int64_t oversize_messages = 0;
  // Transient errors by librdkafka error name, e.g. {"_TRANSPORT": 3};
  // failed offset commits (the commit callback's errors) as
  // "OFFSET_COMMIT:<name>", e.g. "OFFSET_COMMIT:_WAIT_COORD".
  std::map<std::string, int64_t> errors_by_kind;
  int64_t rebalances = 0;            // rebalance callbacks of any kind
  int64_t partitions_assigned = 0;   // cumulative, over all assign events
  int64_t partitions_revoked = 0;    // cumulative, incl. lost assignments
  int64_t assigned_now = 0;          // size of the current assignment
  int64_t resume_offsets_applied = 0;
  int64_t commits = 0;               // successful synchronous commits
  // Offsets that left the log (retention, or records deleted with the
  // admin API) before this consumer read them, by topic: the gap between
  // where it had read to and the log start it then read from.
  std::map<std::string, int64_t> lost_by_topic;
};

class KafkaSource {
 public:
  // Validates the options, creates the consumer and subscribes to the
  // topics (the group join itself happens during the first Polls).
  static StatusOr<std::unique_ptr<KafkaSource>> Create(KafkaSourceOptions options);

  // Everything Create checks before it creates the consumer — the options
  // and the librdkafka configuration they build (unknown properties,
  // invalid values, properties vipsd manages) — without creating a client
  // or connecting (`vipsd --check-config`).
  static Status CheckOptions(const KafkaSourceOptions& options);

  KafkaSource(const KafkaSource&) = delete;
  KafkaSource& operator=(const KafkaSource&) = delete;
  ~KafkaSource();

  // Returns up to max_messages (≥ 1) messages: waits up to `timeout` for the
  // first one, then takes what is already fetched without waiting. An empty
  // vector means none arrived in time. Errors: see the file comment;
  // FAILED_PRECONDITION after Close.
  StatusOr<std::vector<SourceMessage>> Poll(size_t max_messages,
                                            std::chrono::milliseconds timeout);

  // Marks `offset` of topic/partition as processed: stores offset + 1 for the
  // next commit. FAILED_PRECONDITION if the partition is not assigned to this
  // consumer any more (a rebalance took it between Poll and StoreOffset; the
  // new owner will read the record again, so this is benign for the daemon),
  // INVALID_ARGUMENT for a negative offset.
  Status StoreOffset(const std::string& topic, int32_t partition, int64_t offset);

  // Partitions whose end Poll reached since the last call, with the end
  // offset (the next offset to be written at that moment). Ingest thread.
  std::map<TopicPartitionRef, int64_t> TakeReachedEnds();

  // Stops / restarts fetching these partitions (librdkafka pause/resume;
  // prefetched messages of a paused partition are discarded and fetched
  // again after Resume). The wanted state is kept per partition, also for
  // partitions not assigned at the moment, and applied again at every
  // assignment: librdkafka keeps a partition's pause flag across a lost
  // and regained assignment, so a Resume that came while the partition was
  // away would otherwise leave it paused for ever (found by the
  // broker-fault harness: all brokers down past the session timeout).
  // Ingest thread.
  Status Pause(const std::vector<TopicPartitionRef>& partitions) { return SetPaused(partitions, true); }
  Status Resume(const std::vector<TopicPartitionRef>& partitions) {
    return SetPaused(partitions, false);
  }
  // Reads `partition` again from `offset`: a seek if it is assigned now
  // (messages fetched from the old position are not returned after it);
  // nothing otherwise (an assignment resumes where the resume_offset
  // callback says). Ingest thread.
  Status Rewind(const TopicPartitionRef& partition, int64_t offset);

  // Commits the stored offsets of the current assignment synchronously.
  // Nothing stored since the last commit is OK. UNAVAILABLE with the
  // librdkafka error name if the commit failed (e.g. brokers down).
  Status Commit();

  // Commit() (an error is logged and returned after closing), close() and
  // destroy. Idempotent; later calls return OK.
  Status Close();

  // See the file comment. Thread-safe.
  int64_t Lag() const { return lag_.load(std::memory_order_relaxed); }
  // A copy of the counters. Thread-safe.
  KafkaSourceStats stats() const;

  // The current assignment (ingest thread only).
  const std::set<TopicPartitionRef>& assignment() const { return assignment_; }

 private:
  class Callbacks;
  explicit KafkaSource(KafkaSourceOptions options);

  // `err` is an RdKafka::ErrorCode (an unscoped enum that cannot be
  // forward-declared here).
  void OnRebalance(RdKafka::KafkaConsumer* consumer, int err,
                   std::vector<RdKafka::TopicPartition*>& partitions);
  // OnRebalance's two halves: an assignment (not while closing), with the
  // resume offsets set in `partitions`, and a revocation (lost or not).
  // `refs` names `partitions`.
  void AssignPartitions(RdKafka::KafkaConsumer* consumer, bool cooperative,
                        std::vector<RdKafka::TopicPartition*>& partitions,
                        const std::vector<TopicPartitionRef>& refs);
  void RevokePartitions(RdKafka::KafkaConsumer* consumer, bool cooperative,
                        std::vector<RdKafka::TopicPartition*>& partitions,
                        const std::vector<TopicPartitionRef>& refs);
  // Poll's copy of a message (not an error event) out of librdkafka's
  // buffer: an oversize one without payload or headers (see above).
  SourceMessage ToSourceMessage(RdKafka::Message& message) const;
  int64_t ClampResumeOffset(const TopicPartitionRef& ref, int64_t offset);
  void RecordCommittedOffsets(RdKafka::KafkaConsumer* consumer,
                              const std::vector<TopicPartitionRef>& refs);
  void UpdateLag();
  // A message at `offset` after the partition's position: counts and logs
  // the offsets below the log start that were never read.
  void NoteGap(const TopicPartitionRef& ref, int64_t position, int64_t offset);
  void CountError(const std::string& kind, const std::string& log_text);
  void RecordFatal(const std::string& text);
  Status CommitStored(const char* when);
  Status SetPaused(const std::vector<TopicPartitionRef>& partitions, bool pause);

  KafkaSourceOptions options_;
  // Declared before consumer_ so that they are destroyed after it.
  std::unique_ptr<Callbacks> callbacks_;
  std::unique_ptr<RdKafka::KafkaConsumer> consumer_;
  bool closed_ = false;
  // A rebalance callback assigned partitions (possibly none) at least once.
  bool assigned_once_ = false;
  Status fatal_;  // sticky
  std::set<TopicPartitionRef> assignment_;
  std::set<TopicPartitionRef> paused_;  // wanted pause state (Pause/Resume)
  // The group's committed offset of each assigned partition when it was
  // assigned with a resume offset (ingest thread only).
  std::map<TopicPartitionRef, int64_t> committed_at_assign_;
  // Offset after the last message returned, per partition (for Lag()).
  std::map<TopicPartitionRef, int64_t> positions_;
  // End offsets reached since the last TakeReachedEnds().
  std::map<TopicPartitionRef, int64_t> reached_end_;

  std::atomic<int64_t> lag_{0};
  mutable Mutex stats_mutex_;
  KafkaSourceStats stats_ GUARDED_BY(stats_mutex_);
  // Log throttling per error kind: last time a line was written, and how
  // many occurrences were not logged since then.
  std::map<std::string, std::pair<std::chrono::steady_clock::time_point, int64_t>> log_throttle_
      GUARDED_BY(stats_mutex_);
};

}  // namespace vipsd::connectors
