// The daemon's view of its inputs and outputs: small interfaces that the
// Kafka connectors implement in production (daemon/kafka_io.h) and honest
// in-memory fakes implement in tests (STYLE.md "fakes before mocks").
//
// InputSource — records in stream order per (topic, partition). The daemon
//   calls MarkDone(record) only after the record is in the pool (behind the
//   privacy wall) or confirmed on the dead-letter topic; only then may the
//   source commit its offset.
// OutputSink  — releases, dead letters and alerts. Every call returns OK only
//   once the broker confirmed delivery (or the file is durable).
//
// Privacy: an InputRecord's key and payload are private record content. They
// may be forwarded unchanged to the dead-letter topic (the same trust domain
// as the input topic) and must never be logged, put in an error message or
// written to the daemon's disk. Errors from these interfaces carry no
// content.
//
// Thread-safety: the daemon calls InputSource from its ingest thread only,
// except Lag() which may be called from any thread; OutputSink from the step
// thread (releases, alerts) and the ingest thread (dead letters), so
// implementations must allow those two callers concurrently.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "connectors/decode/json_document.h"
#include "core/base/status.h"
#include "core/release/release.h"

namespace vipsd::daemon {

struct InputRecord {
  std::string topic;
  int32_t partition = 0;
  int64_t offset = 0;
  std::string key;      // private
  std::string payload;  // private; empty when oversize
  std::vector<std::pair<std::string, std::string>> headers;  // private; forwarded to dead letters
  bool oversize = false;
};

// "topic:partition": the stream name used in the ledger and the pool.
std::string StreamName(const std::string& topic, int32_t partition);

// Where to resume reading a partition after a restart (from the ledger), or
// nullopt to use the committed offset / start position.
using ResumeOffsetFn =
    std::function<std::optional<int64_t>(const std::string& topic, int32_t partition)>;

class InputSource {
 public:
  virtual ~InputSource() = default;
  virtual StatusOr<std::vector<InputRecord>> Poll(size_t max_records,
                                                  std::chrono::milliseconds timeout) = 0;
  virtual Status MarkDone(const InputRecord& record) = 0;
  // Commits what MarkDone stored (shutdown).
  virtual Status Commit() = 0;
  // Records on the assigned partitions not yet consumed (may be stale).
  virtual int64_t Lag() const = 0;
  virtual Status Close() = 0;
};

class OutputSink {
 public:
  virtual ~OutputSink() = default;
  // `encoded` is EncodeRelease(release): sinks use whichever form they write.
  virtual Status PublishRelease(const release::Release& release,
                                const release::EncodedRelease& encoded) = 0;
  virtual Status PublishDeadLetter(const InputRecord& record,
                                   connectors::RejectReason reason) = 0;
  // `json` is a small public message (budget warning, halt).
  virtual Status PublishAlert(const std::string& json) = 0;
  // Flushes anything in flight (shutdown).
  virtual Status Close() = 0;
};

}  // namespace vipsd::daemon
