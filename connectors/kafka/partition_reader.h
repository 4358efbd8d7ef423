// KafkaPartitionReader: reads an offset range of one partition (no consumer
// group membership, no commits): for logs the daemon reads as a whole, such
// as the ledger topic (daemon/state/ledger_replica.h).
//
// Read(from, to) consumes from `from` (the partition stays assigned between
// calls unless Pause() unassigned it; a read that does not continue the
// previous one, or follows a Pause, assigns at `from`) until it has returned
// every message below `to` (or the timeout passes: UNAVAILABLE naming the
// topic, the offsets reached and wanted). Offsets with no message
// (transaction markers, compaction) are skipped. Bounds() is the partition's
// low and high watermark from the broker.
//
// Privacy: this class returns message content to its caller and logs only
// topic, partition, offsets and librdkafka error codes.
// Thread-safety: one thread at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/base/status.h"

namespace RdKafka {
class KafkaConsumer;
}  // namespace RdKafka

namespace vipsd::connectors {

struct KafkaPartitionReaderOptions {
  std::string bootstrap_servers;  // required
  std::string topic;              // required
  int32_t partition = 0;
  std::string client_id = "vipsd";
  // Extra librdkafka consumer properties (security settings). Managed here:
  // bootstrap.servers, client.id, group.id, enable.auto.commit,
  // enable.partition.eof.
  std::map<std::string, std::string> properties;
  std::chrono::milliseconds timeout{30000};  // per Read / Bounds call
};

struct ReadMessage {
  int64_t offset = 0;
  std::string key;
  std::string value;
  std::vector<std::pair<std::string, std::string>> headers;
};

class KafkaPartitionReader {
 public:
  static StatusOr<std::unique_ptr<KafkaPartitionReader>> Create(KafkaPartitionReaderOptions options);
  ~KafkaPartitionReader();
  KafkaPartitionReader(const KafkaPartitionReader&) = delete;
  KafkaPartitionReader& operator=(const KafkaPartitionReader&) = delete;

  // Low and high watermark.
  StatusOr<std::pair<int64_t, int64_t>> Bounds();
  // The same for another partition of the topic (nothing is assigned).
  StatusOr<std::pair<int64_t, int64_t>> BoundsOf(int32_t partition);
  // Every message with offset in [from, to).
  StatusOr<std::vector<ReadMessage>> Read(int64_t from, int64_t to);
  // Long poll: the messages at offsets ≥ `from` that are queued now or
  // arrive within `wait`. Blocks in the client (no watermark round trips,
  // no sleeping) until a first message arrives, then returns it with every
  // message already queued behind it; returns nothing when `wait` passes
  // first. Assigns at `from` unless the previous read ended there. An
  // offset below the log start is librdkafka's auto.offset.reset: callers
  // that care compare with Bounds() first.
  StatusOr<std::vector<ReadMessage>> ReadAvailable(int64_t from, std::chrono::milliseconds wait);
  // Partitions of the topic (metadata).
  StatusOr<int> PartitionCount();
  // Stops the client fetching the partition until the next Read or
  // ReadAvailable, which assigns it again where that read starts. For a log
  // read now and then (the ledger; the work topic while a step's sums are
  // computed): between reads the client sends no fetch requests, and a
  // watermark request or a read that follows does not wait behind an empty
  // fetch the broker holds (up to fetch.wait.max.ms). It unassigns: with
  // librdkafka 2.0.2 a resumed partition was fetched again only ~1 s later
  // (measured on the mock cluster). No-op when nothing is assigned.
  Status Pause();

  const KafkaPartitionReaderOptions& options() const { return options_; }

 private:
  class Callbacks;
  explicit KafkaPartitionReader(KafkaPartitionReaderOptions options);
  KafkaPartitionReaderOptions options_;
  std::unique_ptr<Callbacks> callbacks_;  // outlives the handle
  std::unique_ptr<RdKafka::KafkaConsumer> consumer_;
  // Assigns the partition at `from` unless consumption already stands there.
  Status AssignAt(int64_t from);
  int64_t position_ = -1;  // where the assigned partition's consumption stands; -1: unknown
  bool assigned_ = false;  // the partition is assigned (Pause unassigns it)
};

}  // namespace vipsd::connectors
