#include "connectors/kafka/kafka_producer.h"

#include <librdkafka/rdkafkacpp.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <set>

#include "connectors/kafka/kafka_common.h"
#include "core/base/log.h"

namespace vipsd::connectors {
namespace {

using kafka_internal::ErrorDescription;
using kafka_internal::ErrorName;

constexpr std::string_view kComponent = "kafka-producer";
constexpr char kWhat[] = "kafka producer";
// How long to wait between polls of the handle for delivery reports (the
// poll returns as soon as a report is served).
constexpr std::chrono::milliseconds kPollSlice{100};

int RemainingMs(std::chrono::steady_clock::time_point deadline, std::chrono::milliseconds cap) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  return static_cast<int>(std::clamp<int64_t>(left.count(), 0, cap.count()));
}

void* BatchOpaque(uint64_t id) { return reinterpret_cast<void*>(static_cast<uintptr_t>(id)); }

}  // namespace

// A message to produce, pointing into caller-owned memory.
struct KafkaProducer::MessageView {
  std::string_view topic;
  std::string_view key;
  std::string_view value;
  std::span<const std::pair<std::string, std::string>> headers;
  int64_t timestamp_ms = 0;  // 0: librdkafka stamps the produce time
  int32_t partition = RdKafka::Topic::PARTITION_UA;
};

// Delivery bookkeeping of one ProduceAndWait call. Lives in batches_ until
// every message has its report (an expired batch may outlive its call).
struct KafkaProducer::Batch {
  size_t pending = 0;    // produced, no delivery report yet
  size_t delivered = 0;
  std::map<std::string, int64_t> failures;  // error name → count
  bool expired = false;  // its call has returned; reports are late
  int64_t last_offset = -1;  // highest offset delivered
};

class KafkaProducer::Callbacks : public kafka_internal::LogEventCb,
                                 public RdKafka::DeliveryReportCb {
 public:
  explicit Callbacks(KafkaProducer* producer)
      : LogEventCb(std::string(kComponent)), producer_(producer) {}

  void dr_cb(RdKafka::Message& message) override {
    producer_->OnDelivery(static_cast<uint64_t>(reinterpret_cast<uintptr_t>(message.msg_opaque())),
                          static_cast<int>(message.err()), message.offset());
  }

 protected:
  void OnError(RdKafka::ErrorCode code, bool fatal, const std::string& text) override {
    producer_->OnError(static_cast<int>(code), fatal, text);
  }

 private:
  KafkaProducer* producer_;
};

namespace {

StatusOr<std::unique_ptr<RdKafka::Conf>> BuildProducerConf(const KafkaProducerOptions& options) {
  if (options.bootstrap_servers.empty()) {
    return InvalidArgumentError("kafka producer: bootstrap_servers must not be empty");
  }
  if (options.message_timeout.count() <= 0 || options.message_timeout.count() > INT32_MAX) {
    return InvalidArgumentError("kafka producer: message_timeout must be in [1, 2147483647] ms");
  }
  const KafkaProducerOptions& o = options;
  std::unique_ptr<RdKafka::Conf> conf(RdKafka::Conf::create(RdKafka::Conf::CONF_GLOBAL));
  const kafka_internal::ManagedProperty managed[] = {
      {"bootstrap.servers", o.bootstrap_servers},
      {"client.id", o.client_id},
      {"enable.idempotence", "true"},
      {"acks", "all"},
      {"message.timeout.ms", std::to_string(o.message_timeout.count())},
  };
  VIPSD_RETURN_IF_ERROR(kafka_internal::ApplyProperties(*conf, kWhat, managed, o.properties));
  return conf;
}

}  // namespace

Status KafkaProducer::CheckOptions(const KafkaProducerOptions& options) {
  return BuildProducerConf(options).status();
}

namespace {

StatusOr<size_t> MaxMessageBytesOf(const RdKafka::Conf& conf) {
  std::string value;
  if (conf.get("message.max.bytes", value) != RdKafka::Conf::CONF_OK) {
    return InternalError("kafka producer: cannot read message.max.bytes");
  }
  char* end = nullptr;
  const unsigned long long bytes = std::strtoull(value.c_str(), &end, 10);
  if (end == value.c_str() || *end != '\0' || bytes == 0) {
    return InternalError("kafka producer: message.max.bytes is '" + value + "'");
  }
  return static_cast<size_t>(bytes);
}

}  // namespace

StatusOr<size_t> KafkaProducer::MaxMessageBytes(const KafkaProducerOptions& options) {
  VIPSD_ASSIGN_OR_RETURN(std::unique_ptr<RdKafka::Conf> conf, BuildProducerConf(options));
  return MaxMessageBytesOf(*conf);
}

StatusOr<std::unique_ptr<KafkaProducer>> KafkaProducer::Create(KafkaProducerOptions options) {
  VIPSD_ASSIGN_OR_RETURN(std::unique_ptr<RdKafka::Conf> conf, BuildProducerConf(options));
  VIPSD_ASSIGN_OR_RETURN(const size_t max_message_bytes, MaxMessageBytesOf(*conf));
  std::unique_ptr<KafkaProducer> producer(new KafkaProducer(std::move(options)));
  producer->max_message_bytes_ = max_message_bytes;
  const KafkaProducerOptions& o = producer->options_;
  std::string errstr;
  Callbacks* callbacks = producer->callbacks_.get();
  if (conf->set("event_cb", static_cast<RdKafka::EventCb*>(callbacks), errstr) !=
          RdKafka::Conf::CONF_OK ||
      conf->set("dr_cb", static_cast<RdKafka::DeliveryReportCb*>(callbacks), errstr) !=
          RdKafka::Conf::CONF_OK) {
    return InternalError("kafka producer: cannot install callbacks: " + errstr);
  }
  producer->producer_.reset(RdKafka::Producer::create(conf.get(), errstr));
  if (producer->producer_ == nullptr) {
    return InvalidArgumentError("kafka producer: cannot create producer: " + errstr);
  }
  Log(LogLevel::kInfo, kComponent, "idempotent producer via " + o.bootstrap_servers);
  return producer;
}

KafkaProducer::KafkaProducer(KafkaProducerOptions options)
    : options_(std::move(options)), callbacks_(std::make_unique<Callbacks>(this)) {}

KafkaProducer::~KafkaProducer() { (void)Close(std::chrono::milliseconds(0)); }

void KafkaProducer::OnDelivery(uint64_t batch_id, int err_code, int64_t offset) {
  const auto err = static_cast<RdKafka::ErrorCode>(err_code);
  MutexLock lock(&state_mutex_);
  const auto it = batches_.find(batch_id);
  if (it == batches_.end()) return;  // cannot happen: batches live until their last report
  Batch& batch = *it->second;
  if (batch.pending > 0) --batch.pending;
  if (batch.expired) {
    // The call already reported these messages as not delivered.
    if (err == RdKafka::ERR_NO_ERROR) {
      ++stats_.late_delivery_reports;
      Log(LogLevel::kWarning, kComponent,
          "a message was delivered after its ProduceAndWait call had timed out");
    }
    if (batch.pending == 0) batches_.erase(it);
    return;
  }
  if (err == RdKafka::ERR_NO_ERROR) {
    ++batch.delivered;
    batch.last_offset = std::max(batch.last_offset, offset);
  } else {
    ++batch.failures[ErrorName(err)];
    ++stats_.errors_by_kind[ErrorName(err)];
  }
}

void KafkaProducer::OnError(int err_code, bool fatal, const std::string& text) {
  const auto err = static_cast<RdKafka::ErrorCode>(err_code);
  std::string description = ErrorName(err) + ": " + text;
  {
    MutexLock lock(&state_mutex_);
    ++stats_.errors_by_kind[ErrorName(err)];
    if (fatal && fatal_.ok()) {
      std::string fatal_text;
      if (producer_ != nullptr) {
        const RdKafka::ErrorCode original = producer_->fatal_error(fatal_text);
        description = ErrorName(original) + ": " + fatal_text;
      }
      fatal_ = FailedPreconditionError("kafka producer: fatal librdkafka error " + description +
                                       " (the producer must be recreated)");
    }
  }
  Log(fatal ? LogLevel::kError : LogLevel::kWarning, kComponent,
      (fatal ? "fatal error " : "error ") + description);
}

Status KafkaProducer::FatalStatus() const {
  MutexLock lock(&state_mutex_);
  return fatal_;
}

Status KafkaProducer::ProduceViews(std::span<const MessageView> messages,
                                   std::chrono::steady_clock::time_point deadline,
                                   int64_t* last_offset) {
  VIPSD_RETURN_IF_ERROR(FatalStatus());
  if (messages.empty()) return Status::Ok();
  std::set<std::string_view> topics;
  for (const MessageView& m : messages) topics.insert(m.topic);
  std::string topic_list;
  for (std::string_view topic : topics) {
    topic_list += (topic_list.empty() ? "" : ",") + std::string(topic);
  }

  uint64_t batch_id = 0;
  Batch* batch = nullptr;
  {
    MutexLock lock(&state_mutex_);
    batch_id = next_batch_id_++;
    batch = batches_.emplace(batch_id, std::make_unique<Batch>()).first->second.get();
  }
  size_t produced = 0;
  RdKafka::ErrorCode refused = RdKafka::ERR_NO_ERROR;
  for (const MessageView& m : messages) {
    RdKafka::ErrorCode err = RdKafka::ERR_NO_ERROR;
    {
      MutexLock lock(&state_mutex_);
      ++batch->pending;  // before produce: the report may be served by any poll
    }
    while (true) {
      RdKafka::Headers* headers = RdKafka::Headers::create();
      for (const auto& [name, value] : m.headers) headers->add(name, value.data(), value.size());
      // A non-null pointer with length 0 is an empty (not a null) value.
      err = producer_->produce(std::string(m.topic), m.partition,
                               RdKafka::Producer::RK_MSG_COPY, const_cast<char*>(m.value.data()),
                               m.value.size(), m.key.empty() ? nullptr : m.key.data(),
                               m.key.size(), m.timestamp_ms, headers, BatchOpaque(batch_id));
      if (err == RdKafka::ERR_NO_ERROR) break;  // headers now belong to librdkafka
      delete headers;
      if (err != RdKafka::ERR__QUEUE_FULL || std::chrono::steady_clock::now() >= deadline) break;
      producer_->poll(RemainingMs(deadline, std::chrono::milliseconds(10)));
    }
    if (err != RdKafka::ERR_NO_ERROR) {
      MutexLock lock(&state_mutex_);
      --batch->pending;
      refused = err;
      ++stats_.errors_by_kind[ErrorName(err)];
      break;  // do not send the rest of a batch that already failed
    }
    ++produced;
  }

  // Serve delivery reports until every produced message has one.
  while (true) {
    {
      MutexLock lock(&state_mutex_);
      if (batch->pending == 0 || !fatal_.ok()) break;
    }
    if (std::chrono::steady_clock::now() >= deadline) break;
    producer_->poll(RemainingMs(deadline, kPollSlice));
  }

  size_t timed_out = 0;
  Batch result;
  {
    MutexLock lock(&state_mutex_);
    timed_out = batch->pending;
    result.delivered = batch->delivered;
    result.failures = batch->failures;
    result.last_offset = batch->last_offset;
    stats_.messages_delivered += static_cast<int64_t>(batch->delivered);
    stats_.messages_failed += static_cast<int64_t>(messages.size() - batch->delivered);
    if (timed_out > 0) {
      batch->expired = true;  // erased by its last (late or purged) report
    } else {
      batches_.erase(batch_id);
    }
  }
  if (timed_out > 0) {
    // Withdraw what has not left the client yet so that a retry does not
    // duplicate it; the purged reports are served now (and ignored).
    const RdKafka::ErrorCode purge_err = producer_->purge(RdKafka::Producer::PURGE_QUEUE);
    if (purge_err != RdKafka::ERR_NO_ERROR) {
      Log(LogLevel::kWarning, kComponent, "purge after timeout: " + ErrorDescription(purge_err));
    }
    producer_->poll(0);
  }
  if (result.delivered == messages.size()) {
    if (last_offset != nullptr) *last_offset = result.last_offset;
    return Status::Ok();
  }

  const size_t not_sent = messages.size() - produced - (refused != RdKafka::ERR_NO_ERROR ? 1 : 0);
  std::string detail;
  auto add = [&detail](const std::string& part) { detail += (detail.empty() ? "" : "; ") + part; };
  if (refused != RdKafka::ERR_NO_ERROR) add("1 refused by the client: " + ErrorDescription(refused));
  for (const auto& [name, count] : result.failures) {
    add(std::to_string(count) + " failed with " + name);
  }
  if (timed_out > 0) {
    add(std::to_string(timed_out) + " without a delivery report in time (withdrawn unless "
        "already in flight)");
  }
  if (not_sent > 0) add(std::to_string(not_sent) + " not sent after the refusal");
  std::string message = "kafka producer: " + std::to_string(messages.size() - result.delivered) +
                        " of " + std::to_string(messages.size()) +
                        " message(s) to topic(s) " + topic_list + " not delivered: " + detail;
  if (const Status fatal = FatalStatus(); !fatal.ok()) message += "; " + fatal.message();
  // Errors about the message itself: sending it again can never succeed.
  bool permanent = false;
  for (const RdKafka::ErrorCode code :
       {RdKafka::ERR_MSG_SIZE_TOO_LARGE, RdKafka::ERR_INVALID_MSG_SIZE,
        RdKafka::ERR_RECORD_LIST_TOO_LARGE, RdKafka::ERR_INVALID_MSG,
        RdKafka::ERR_INVALID_RECORD}) {
    permanent = permanent || refused == code || result.failures.count(ErrorName(code)) > 0;
  }
  return permanent ? InvalidArgumentError(message) : UnavailableError(message);
}

Status KafkaProducer::ProduceAndWait(std::span<const OutMessage> messages,
                                     std::chrono::milliseconds timeout, int64_t* last_offset) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::max(timeout, std::chrono::milliseconds(0));
  ReaderMutexLock lifecycle(&lifecycle_mutex_);
  if (closed_) return FailedPreconditionError("kafka producer: ProduceAndWait after Close");
  MutexLock call(&call_mutex_);
  std::vector<MessageView> views;
  views.reserve(messages.size());
  for (const OutMessage& m : messages) {
    if (m.topic.empty()) return InvalidArgumentError("kafka producer: message without a topic");
    views.push_back({m.topic, m.key, m.value, m.headers, m.timestamp_ms, m.partition});
  }
  return ProduceViews(views, deadline, last_offset);
}

Status KafkaProducer::PublishRelease(const std::string& topic,
                                     const release::EncodedRelease& encoded,
                                     std::chrono::milliseconds timeout, int64_t timestamp_ms) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::max(timeout, std::chrono::milliseconds(0));
  const std::string& id = encoded.release_id;
  if (topic.empty()) return InvalidArgumentError("kafka producer: release topic is empty");
  if (id.empty() || id.size() > 128 ||
      !std::all_of(id.begin(), id.end(), [](char c) { return c > 0x20 && c < 0x7f; })) {
    return InvalidArgumentError("kafka producer: release id must be 1-128 printable characters");
  }
  if (encoded.files.size() < 2 ||
      encoded.files.back().name != release::kManifestFileName) {
    return InvalidArgumentError("kafka producer: release " + id +
                                " must hold at least one .npy file followed by manifest.json");
  }
  std::set<std::string_view> names;
  for (size_t i = 0; i + 1 < encoded.files.size(); ++i) {
    const std::string& name = encoded.files[i].name;
    if (!name.ends_with(".npy") || name.size() <= 4 || !names.insert(name).second) {
      return InvalidArgumentError("kafka producer: release " + id + ": file " + name +
                                  " is not a distinct <array>.npy");
    }
  }

  // Chunk headers: one vector per message, owned here for the call.
  std::vector<std::string> chunks;
  std::vector<std::vector<std::pair<std::string, std::string>>> chunk_headers;
  for (size_t i = 0; i + 1 < encoded.files.size(); ++i) {
    const release::ReleaseFile& file = encoded.files[i];
    std::vector<std::string> pieces = release::ChunkBytes(file.bytes, release::kDefaultChunkBytes);
    for (size_t c = 0; c < pieces.size(); ++c) {
      chunks.push_back(std::move(pieces[c]));
      chunk_headers.push_back({{"vipsd-release-id", id},
                               {"vipsd-file", file.name},
                               {"vipsd-chunk", std::to_string(c)},
                               {"vipsd-chunks", std::to_string(pieces.size())}});
    }
  }
  std::vector<MessageView> views;
  views.reserve(chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) {
    views.push_back({topic, id, chunks[i], chunk_headers[i], timestamp_ms});
  }
  const std::vector<std::pair<std::string, std::string>> manifest_headers = {
      {"vipsd-release-id", id}, {"vipsd-file", std::string(release::kManifestFileName)}};
  const MessageView manifest{topic, id, encoded.files.back().bytes, manifest_headers,
                             timestamp_ms};

  ReaderMutexLock lifecycle(&lifecycle_mutex_);
  if (closed_) return FailedPreconditionError("kafka producer: PublishRelease after Close");
  MutexLock call(&call_mutex_);
  Status status = ProduceViews(views, deadline);
  if (!status.ok()) {
    status = Status(status.code(), "release " + id + " not published (array chunks): " +
                                       status.message());
  } else {
    status = ProduceViews(std::span<const MessageView>(&manifest, 1), deadline);
    if (!status.ok()) {
      status = Status(status.code(), "release " + id + " not published (manifest): " +
                                         status.message());
    }
  }
  {
    MutexLock lock(&state_mutex_);
    ++(status.ok() ? stats_.releases_published : stats_.releases_failed);
  }
  if (status.ok()) {
    Log(LogLevel::kInfo, kComponent,
        "published release " + id + " to " + topic + " (" + std::to_string(chunks.size() + 1) +
            " messages)");
  }
  return status;
}

Status KafkaProducer::WarmTopic(const std::string& topic, std::chrono::milliseconds timeout) {
  ReaderMutexLock lifecycle(&lifecycle_mutex_);
  if (closed_) return FailedPreconditionError("the producer is closed");
  std::string errstr;
  std::unique_ptr<RdKafka::Topic> handle(
      RdKafka::Topic::create(producer_.get(), topic, nullptr, errstr));
  if (handle == nullptr) return InvalidArgumentError("topic " + topic + ": " + errstr);
  RdKafka::Metadata* metadata = nullptr;
  const RdKafka::ErrorCode err = producer_->metadata(
      false, handle.get(), &metadata, static_cast<int>(std::max<int64_t>(timeout.count(), 1)));
  std::unique_ptr<RdKafka::Metadata> owned(metadata);
  if (err != RdKafka::ERR_NO_ERROR) {
    return UnavailableError("metadata of " + topic + ": " + RdKafka::err2str(err));
  }
  return Status::Ok();
}

Status KafkaProducer::Close(std::chrono::milliseconds timeout) {
  WriterMutexLock lifecycle(&lifecycle_mutex_);
  if (closed_) return Status::Ok();
  closed_ = true;
  if (producer_ == nullptr) return Status::Ok();
  const int timeout_ms =
      static_cast<int>(std::clamp<int64_t>(timeout.count(), 0, INT32_MAX));
  (void)producer_->flush(timeout_ms);
  // Serve the delivery reports that are already queued, then count the
  // messages that still have none. outq_len() is not used: it also counts
  // librdkafka's own events and requests (a connection error on the reply
  // queue, the idempotent producer's InitProducerId), so a producer that
  // never produced could fail its Close by a race with its own connect.
  while (producer_->poll(0) > 0) {
  }
  size_t left = 0;
  {
    MutexLock lock(&state_mutex_);
    for (const auto& [id, batch] : batches_) left += batch->pending;
  }
  Status status;
  if (left > 0) {
    status = UnavailableError("kafka producer: " + std::to_string(left) +
                              " message(s) not delivered at close");
    Log(LogLevel::kWarning, kComponent, status.message());
  }
  producer_.reset();
  Log(LogLevel::kInfo, kComponent, "closed");
  return status;
}

KafkaProducerStats KafkaProducer::stats() const {
  MutexLock lock(&state_mutex_);
  return stats_;
}

}  // namespace vipsd::connectors
