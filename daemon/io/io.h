// The daemon's view of its inputs and outputs: small interfaces that the
// Kafka connectors implement in production (daemon/io/kafka_io.h), the file
// connectors implement for the offline run (daemon/io/file_io.h), and honest
// in-memory fakes implement in tests (docs/style.md "Tests": fakes before
// mocks).
//
// InputSource — records in log order per stream (a Kafka topic-partition, or
//   the one stream of a file), each with its offset. The daemon calls
//   MarkDone(record) only after the record is held behind the privacy wall or
//   confirmed on the dead-letter topic; only then may the source commit its
//   offset. ObserveBounds() reads the start and end of every stream's log:
//   the daemon calls it at each slot's public time and uses the ends as the
//   slot's cuts (core/svi/slot_windows.h).
// OutputSink  — releases, dead letters and alerts. Every call returns OK only
//   once the broker confirmed delivery (or the file is durable).
//
// Privacy: an InputRecord's key and payload are private record content. They
// may be forwarded unchanged to the dead-letter topic (the same trust domain
// as the input topic) and must never be logged, put in an error message or
// written to the daemon's disk. Errors from these interfaces carry no
// content.
//
// Thread-safety: the daemon calls Poll, MarkDone, Pause, Resume, Commit and
// Close from its ingest thread; ObserveBounds from its clock thread (or the
// step thread of an unpaced run) concurrently with them; Lag() from any
// thread. OutputSink is called from the step thread (releases, alerts) and
// the ingest thread (dead letters), so implementations must allow those two
// callers concurrently.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "connectors/decode/json_document.h"
#include "connectors/source_message.h"
#include "core/base/status.h"
#include "core/release/release.h"

namespace vipsd::daemon {

// One record in log order with its position (connectors/source_message.h):
// the same type the Kafka consumer fills, never copied field by field.
using InputRecord = connectors::SourceMessage;

// "topic:partition": the stream name used in the ledger and the pool.
std::string StreamName(const std::string& topic, int32_t partition);

struct PollBatch {
  std::vector<InputRecord> records;
  // Streams whose end of log the source reached in this poll, with the
  // offset after the last position it consumed (the log end it saw): every
  // record below it was returned (now or earlier), so a cut at or below it is
  // complete even when the last offsets hold no record (transaction markers,
  // compaction).
  std::map<std::string, int64_t> reached_end;
  // The streams assigned to this reader after the poll (a consumer group
  // member's share); nullopt: every stream (a file).
  std::optional<std::set<std::string>> assignment;
};

// The start (first retained offset) and end (next offset to be written) of
// one stream's log.
struct StreamBounds {
  int64_t start = 0;
  int64_t end = 0;
};

// Where to resume reading a partition after a restart (from the ledger), or
// nullopt to use the committed offset / start position.
using ResumeOffsetFn =
    std::function<std::optional<int64_t>(const std::string& topic, int32_t partition)>;

class InputSource {
 public:
  virtual ~InputSource() = default;
  virtual StatusOr<PollBatch> Poll(size_t max_records, std::chrono::milliseconds timeout) = 0;
  virtual Status MarkDone(const InputRecord& record) = 0;
  // Stops / restarts fetching the named streams (stream names as above).
  // Streams not assigned to this reader are ignored.
  virtual Status Pause(const std::set<std::string>& streams) = 0;
  virtual Status Resume(const std::set<std::string>& streams) = 0;
  // Reads `stream` again from `offset` (a shared-work process whose window
  // start went back: daemon/parts/ingest.h DropBelow); a stream not assigned to
  // this reader resumes there when it is assigned.
  virtual Status Rewind(const std::string& stream, int64_t offset) {
    (void)offset;
    return FailedPreconditionError("this input cannot read " + stream + " again");
  }
  // The bounds of every stream of the input, read now. `as_of` is the
  // public time the caller observes for (unix seconds): a real log ignores it
  // (the call is made at that time); a test log answers as of that time.
  virtual StatusOr<std::map<std::string, StreamBounds>> ObserveBounds(double as_of) = 0;
  // Commits what MarkDone stored (shutdown).
  virtual Status Commit() = 0;
  // Records on the assigned partitions not yet consumed (may be stale).
  virtual int64_t Lag() const = 0;
  virtual Status Close() = 0;
};

// Builds the input source once a process knows where each partition must
// resume (from its ledger). The function may be called on any thread.
using SourceFactory =
    std::function<StatusOr<std::unique_ptr<InputSource>>(ResumeOffsetFn resume)>;

class OutputSink {
 public:
  virtual ~OutputSink() = default;
  // `encoded` is EncodeRelease(release): sinks use whichever form they write.
  // `publish_time` (unix seconds) is the release's public deadline: sinks
  // that stamp messages use it instead of the wall clock.
  virtual Status PublishRelease(const release::Release& release,
                                const release::EncodedRelease& encoded,
                                double publish_time) = 0;
  // OK once delivered; INVALID_ARGUMENT when this dead letter can never be
  // delivered (the caller skips it rather than retrying for ever);
  // anything else is transient and retried.
  virtual Status PublishDeadLetter(const InputRecord& record,
                                   connectors::RejectReason reason) = 0;
  // `json` is a small public message (budget warning, halt).
  virtual Status PublishAlert(const std::string& json) = 0;
  // Flushes anything in flight (shutdown).
  virtual Status Close() = 0;
};

// The input of a process that holds no data (a federated aggregator): no
// stream, ever. Poll waits its timeout and returns nothing.
class NoInputSource final : public InputSource {
 public:
  StatusOr<PollBatch> Poll(size_t, std::chrono::milliseconds timeout) override;
  Status MarkDone(const InputRecord&) override { return Status::Ok(); }
  Status Pause(const std::set<std::string>&) override { return Status::Ok(); }
  Status Resume(const std::set<std::string>&) override { return Status::Ok(); }
  StatusOr<std::map<std::string, StreamBounds>> ObserveBounds(double) override {
    return std::map<std::string, StreamBounds>{};
  }
  Status Commit() override { return Status::Ok(); }
  int64_t Lag() const override { return 0; }
  Status Close() override { return Status::Ok(); }
};

}  // namespace vipsd::daemon
