// KafkaLogObserver: reads where each partition of the input topics begins
// and ends (low and high watermark), on its own librdkafka handle — the
// daemon's clock thread calls it at each slot's public time to take the
// slot's cuts (core/svi/slot_windows.h), independently of the consumer group
// and of how far the consumer has read.
//
// The high watermark is the offset the next record appended to the
// partition will get: observing it at time t separates the records appended
// before t from those appended after. (With acks=all it is the last
// replicated offset, i.e. what consumers can read.)
//
// Privacy: only topic names, partition numbers and offsets (stream volume)
// pass through here; no message is read.
//
// Failure: Observe returns UNAVAILABLE naming the topic/partition and the
// librdkafka error when metadata or a watermark cannot be read within the
// timeout; the caller retries. A topic that does not exist (yet) has no
// partitions; that is not an error.
//
// Thread-safety: Observe may be called from several threads (calls are
// serialised inside). Create/destroy from one thread.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "connectors/kafka/kafka_source.h"
#include "core/base/status.h"
#include "core/base/thread_annotations.h"

namespace RdKafka {
class Producer;
class Topic;
}  // namespace RdKafka

namespace vipsd::connectors {

struct PartitionBounds {
  int64_t low = 0;   // first retained offset
  int64_t high = 0;  // next offset to be written
};

struct KafkaLogObserverOptions {
  std::string bootstrap_servers;    // required
  std::vector<std::string> topics;  // ≥ 1
  std::string client_id = "vipsd";
  // librdkafka properties shared by every client (security settings);
  // bootstrap.servers and client.id are set here.
  std::map<std::string, std::string> properties;
  std::chrono::milliseconds timeout{5000};  // per metadata / watermark request
};

class KafkaLogObserver {
 public:
  static StatusOr<std::unique_ptr<KafkaLogObserver>> Create(KafkaLogObserverOptions options);
  ~KafkaLogObserver();
  KafkaLogObserver(const KafkaLogObserver&) = delete;
  KafkaLogObserver& operator=(const KafkaLogObserver&) = delete;

  // Every partition of every topic, with its bounds now.
  StatusOr<std::map<TopicPartitionRef, PartitionBounds>> Observe() EXCLUDES(mutex_);

  // Each topic's configuration as the brokers state it (DescribeConfigs:
  // name -> value, e.g. "cleanup.policy" -> "delete"). A topic that does
  // not exist (yet) is left out. UNAVAILABLE when the brokers cannot answer
  // or do not support the request (librdkafka's mock cluster).
  StatusOr<std::map<std::string, std::map<std::string, std::string>>> TopicConfigs() EXCLUDES(mutex_);

 private:
  class Callbacks;
  explicit KafkaLogObserver(KafkaLogObserverOptions options);

  KafkaLogObserverOptions options_;
  std::unique_ptr<Callbacks> callbacks_;  // outlives the handle
  std::unique_ptr<RdKafka::Producer> handle_;
  std::vector<std::unique_ptr<RdKafka::Topic>> topics_;
  // Serialises the handle's requests (one metadata or watermark exchange
  // at a time); it guards no member: topics_ and handle_ are set in Create
  // and cleared in the destructor, with no call running.
  Mutex mutex_;
};

}  // namespace vipsd::connectors
