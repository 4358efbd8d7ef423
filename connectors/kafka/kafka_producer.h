// KafkaProducer: the daemon's sink to Kafka — releases (chunked, manifest
// last), dead letters and alerts. An idempotent librdkafka producer
// (enable.idempotence=true, hence acks=all): librdkafka's internal retries
// never duplicate or reorder a message within a partition.
//
// Delivery contract. ProduceAndWait hands messages to librdkafka and polls
// the handle for their delivery reports. It returns OK only when EVERY
// message's delivery report arrived without error within the timeout.
// Otherwise it returns an error (UNAVAILABLE, or INVALID_ARGUMENT when a
// message can never be delivered as it is — MSG_SIZE_TOO_LARGE from the
// client or a broker, INVALID_MSG_SIZE, RECORD_LIST_TOO_LARGE, INVALID_MSG,
// INVALID_RECORD — so that the caller does not retry it) saying how many of the
// messages failed and with which librdkafka error names, and it withdraws
// (purges) the messages of the call that are still queued in the client, so
// that a later retry does not duplicate them. A message already in flight
// to a broker when the time ran out cannot be withdrawn and may still land
// (its late delivery report is only counted in stats()); a retry can
// therefore duplicate at most those. Consumers deduplicate releases by
// release id (ReleaseAssembler).
//
// PublishRelease implements docs/release_format.md "Chunking for Kafka"
// (core/release/release.h): every message has key = release_id; each .npy
// file is split by release::ChunkBytes(bytes, kDefaultChunkBytes) into
// messages with headers vipsd-release-id, vipsd-file, vipsd-chunk (0-based),
// vipsd-chunks; the manifest is one message with vipsd-release-id and
// vipsd-file = manifest.json. The manifest is produced only after every
// chunk's delivery report came back OK, so a manifest on the broker always
// follows all of its chunks; the release counts as published (OK) only when
// the manifest's own delivery report is OK.
//
// Privacy: message contents are never logged, counted or put into errors;
// errors name topics, counts and librdkafka error names. Releases and
// alerts are public; dead letters carry a private payload (see
// dead_letter.h) and go to a topic with the input topic's access control.
//
// Thread-safety: all methods may be called from any thread. ProduceAndWait
// and PublishRelease calls are serialised (one batch at a time: a batch's
// failure purges the client's queue, which must hold no other caller's
// messages); Close waits for a running call. stats() never blocks on Kafka.
//
// Lifecycle (librdkafka's rules): callback objects outlive the handle;
// Close(timeout) flushes, serves the queued delivery reports and reports the
// messages still without one, then destroys the handle. Close is idempotent; the destructor
// runs Close(0) if it was not called. Calls after Close are
// FAILED_PRECONDITION. A fatal librdkafka error (e.g. an idempotence
// sequence error) is sticky: every later call returns it; recreate the
// producer.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/base/status.h"
#include "core/base/thread_annotations.h"
#include "core/release/release.h"

namespace RdKafka {
class Producer;
}  // namespace RdKafka

namespace vipsd::connectors {

struct KafkaProducerOptions {
  std::string bootstrap_servers;  // required
  std::string client_id = "vipsd";
  // librdkafka message.timeout.ms: how long librdkafka keeps retrying one
  // message before failing it. > 0. Keep it above the longest outage the
  // producer should ride out within one ProduceAndWait timeout.
  std::chrono::milliseconds message_timeout{30000};
  // Extra librdkafka producer properties (e.g. compression.type,
  // linger.ms). Unknown names / bad values are INVALID_ARGUMENT naming the
  // property. Not allowed here (set by vipsd): bootstrap.servers, client.id,
  // enable.idempotence, acks, message.timeout.ms.
  std::map<std::string, std::string> properties;
};

struct OutMessage {
  std::string topic;
  std::string key;  // empty: no key (partitioner picks a partition)
  std::string value;
  std::vector<std::pair<std::string, std::string>> headers;
  // Message timestamp (CreateTime) in unix milliseconds; 0 = the produce time.
  int64_t timestamp_ms = 0;
  // Partition; -1 (RdKafka::Topic::PARTITION_UA) = the partitioner's choice.
  int32_t partition = -1;
};

struct KafkaProducerStats {
  int64_t messages_delivered = 0;   // delivery report OK within a call
  int64_t messages_failed = 0;      // failed, refused or timed out within a call
  int64_t late_delivery_reports = 0;  // reports that arrived after their call returned
  int64_t releases_published = 0;
  int64_t releases_failed = 0;
  // Errors by librdkafka error name (delivery failures, error events).
  std::map<std::string, int64_t> errors_by_kind;
};

class KafkaProducer {
 public:
  static StatusOr<std::unique_ptr<KafkaProducer>> Create(KafkaProducerOptions options);

  // Everything Create checks before it creates the producer (options and
  // the librdkafka configuration), without a client or a connection.
  static Status CheckOptions(const KafkaProducerOptions& options);
  // The effective message.max.bytes of a producer with these options
  // (librdkafka's default unless a property sets it): the largest message
  // (key, value and headers with their framing) the client sends.
  static StatusOr<size_t> MaxMessageBytes(const KafkaProducerOptions& options);

  KafkaProducer(const KafkaProducer&) = delete;
  KafkaProducer& operator=(const KafkaProducer&) = delete;
  ~KafkaProducer();

  // See the file comment. An empty span is OK. A negative timeout is 0.
  // `last_offset`, if given, receives the highest offset the broker gave a
  // message of the call (when every message was delivered).
  Status ProduceAndWait(std::span<const OutMessage> messages, std::chrono::milliseconds timeout,
                        int64_t* last_offset = nullptr);

  // Publishes `release` (files: .npy files, then manifest.json last, as
  // release::EncodeRelease returns them) to `topic`, all within `timeout`.
  // INVALID_ARGUMENT for a malformed EncodedRelease; otherwise the
  // ProduceAndWait error of the chunk or manifest phase, naming the release.
  // `timestamp_ms` (unix ms, 0 = now) stamps every message of the release:
  // the daemon passes the release's public deadline, so that the messages'
  // timestamps do not reveal when its step finished.
  Status PublishRelease(const std::string& topic, const release::EncodedRelease& release,
                        std::chrono::milliseconds timeout, int64_t timestamp_ms = 0);

  // Fetches `topic`'s metadata (its partitions' leaders) now, so that the
  // first message produced to it later does not wait for that lookup.
  // UNAVAILABLE (the librdkafka error) if the metadata cannot be had within
  // `timeout`; nothing is produced either way.
  Status WarmTopic(const std::string& topic, std::chrono::milliseconds timeout);

  // flush(timeout), then the queued delivery reports are served: UNAVAILABLE
  // "N message(s) not delivered" if a produced message still has no report
  // (librdkafka's own requests and events are not counted), then the handle
  // is destroyed.
  Status Close(std::chrono::milliseconds timeout);

  KafkaProducerStats stats() const;
  size_t max_message_bytes() const { return max_message_bytes_; }

 private:
  class Callbacks;
  struct MessageView;
  struct Batch;
  explicit KafkaProducer(KafkaProducerOptions options);

  Status ProduceViews(std::span<const MessageView> messages,
                      std::chrono::steady_clock::time_point deadline,
                      int64_t* last_offset = nullptr)
      REQUIRES_SHARED(lifecycle_mutex_) REQUIRES(call_mutex_) EXCLUDES(state_mutex_);
  void OnDelivery(uint64_t batch_id, int err, int64_t offset) EXCLUDES(state_mutex_);
  void OnError(int err, bool fatal, const std::string& text) EXCLUDES(state_mutex_);
  Status FatalStatus() const EXCLUDES(state_mutex_);

  KafkaProducerOptions options_;
  size_t max_message_bytes_ = 0;  // message.max.bytes, read once at Create
  // Declared before producer_ so that it is destroyed after the handle.
  std::unique_ptr<Callbacks> callbacks_;
  std::unique_ptr<RdKafka::Producer> producer_;

  // Shared by ProduceAndWait/PublishRelease/WarmTopic (the first two also
  // hold call_mutex_), exclusive for Close: the handle is not destroyed
  // under a running call.
  SharedMutex lifecycle_mutex_;
  Mutex call_mutex_;  // serialises batches
  bool closed_ GUARDED_BY(lifecycle_mutex_) = false;

  mutable Mutex state_mutex_;
  uint64_t next_batch_id_ GUARDED_BY(state_mutex_) = 1;
  // Each Batch's fields too (reached through the pointers ProduceViews keeps).
  std::map<uint64_t, std::unique_ptr<Batch>> batches_ GUARDED_BY(state_mutex_);
  KafkaProducerStats stats_ GUARDED_BY(state_mutex_);
  Status fatal_ GUARDED_BY(state_mutex_);
};

}  // namespace vipsd::connectors
