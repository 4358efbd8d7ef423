#include "connectors/kafka/partition_reader.h"

#include <librdkafka/rdkafkacpp.h>

#include "connectors/kafka/kafka_common.h"

namespace vipsd::connectors {
namespace {

using kafka_internal::ErrorDescription;

constexpr char kWhat[] = "kafka partition reader";

// A consumed message's offset, key, value and headers.
ReadMessage ToReadMessage(RdKafka::Message& message) {
  ReadMessage m;
  m.offset = message.offset();
  if (message.key() != nullptr) m.key = *message.key();
  m.value.assign(static_cast<const char*>(message.payload()), message.len());
  if (RdKafka::Headers* headers = message.headers()) {
    for (const RdKafka::Headers::Header& h : headers->get_all()) {
      const char* value = static_cast<const char*>(h.value());
      m.headers.emplace_back(h.key(), value == nullptr ? std::string()
                                                       : std::string(value, h.value_size()));
    }
  }
  return m;
}

}  // namespace

class KafkaPartitionReader::Callbacks : public kafka_internal::LogEventCb {
 public:
  Callbacks() : LogEventCb("kafka-partition-reader") {}
};

KafkaPartitionReader::KafkaPartitionReader(KafkaPartitionReaderOptions options)
    : options_(std::move(options)), callbacks_(std::make_unique<Callbacks>()) {}

KafkaPartitionReader::~KafkaPartitionReader() {
  if (consumer_ != nullptr) (void)consumer_->close();
}

StatusOr<std::unique_ptr<KafkaPartitionReader>> KafkaPartitionReader::Create(
    KafkaPartitionReaderOptions options) {
  if (options.bootstrap_servers.empty() || options.topic.empty()) {
    return InvalidArgumentError(std::string(kWhat) + ": bootstrap servers and topic are required");
  }
  std::unique_ptr<KafkaPartitionReader> reader(new KafkaPartitionReader(std::move(options)));
  const KafkaPartitionReaderOptions& o = reader->options_;
  std::unique_ptr<RdKafka::Conf> conf(RdKafka::Conf::create(RdKafka::Conf::CONF_GLOBAL));
  std::string errstr;
  // A low-volume log read right after each append: do not let an empty
  // fetch wait the default 500 ms (properties may still override this).
  if (conf->set("fetch.wait.max.ms", "10", errstr) != RdKafka::Conf::CONF_OK) {
    return InternalError(std::string(kWhat) + ": " + errstr);
  }
  // The group id is required by the client; the reader never joins it
  // (assign only) and never commits.
  const kafka_internal::ManagedProperty managed[] = {
      {"bootstrap.servers", o.bootstrap_servers},
      {"client.id", o.client_id},
      {"group.id", "vipsd-partition-reader"},
      {"enable.auto.commit", "false"},
      {"enable.partition.eof", "true"},
      // A position that retention passed resumes at the oldest message
      // still held, not at the end: nothing still in the log is skipped.
      {"auto.offset.reset", "earliest"},
  };
  VIPSD_RETURN_IF_ERROR(kafka_internal::ApplyProperties(*conf, kWhat, managed, o.properties));
  if (conf->set("event_cb", static_cast<RdKafka::EventCb*>(reader->callbacks_.get()), errstr) !=
      RdKafka::Conf::CONF_OK) {
    return InternalError(std::string(kWhat) + ": cannot install callbacks: " + errstr);
  }
  reader->consumer_.reset(RdKafka::KafkaConsumer::create(conf.get(), errstr));
  if (reader->consumer_ == nullptr) {
    return InvalidArgumentError(std::string(kWhat) + ": cannot create consumer: " + errstr);
  }
  return reader;
}

StatusOr<int> KafkaPartitionReader::PartitionCount() {
  std::string errstr;
  std::unique_ptr<RdKafka::Topic> topic(
      RdKafka::Topic::create(consumer_.get(), options_.topic, nullptr, errstr));
  if (topic == nullptr) {
    return InvalidArgumentError(std::string(kWhat) + ": topic " + options_.topic + ": " + errstr);
  }
  RdKafka::Metadata* raw = nullptr;
  const RdKafka::ErrorCode err =
      consumer_->metadata(false, topic.get(), &raw, static_cast<int>(options_.timeout.count()));
  std::unique_ptr<RdKafka::Metadata> metadata(raw);
  if (err != RdKafka::ERR_NO_ERROR) {
    return UnavailableError(std::string(kWhat) + ": metadata of topic " + options_.topic + ": " +
                            ErrorDescription(err));
  }
  for (const RdKafka::TopicMetadata* t : *metadata->topics()) {
    if (t->topic() != options_.topic) continue;
    if (t->err() != RdKafka::ERR_NO_ERROR) {
      return UnavailableError(std::string(kWhat) + ": metadata of topic " + options_.topic + ": " +
                              ErrorDescription(t->err()));
    }
    return static_cast<int>(t->partitions()->size());
  }
  return UnavailableError(std::string(kWhat) + ": no metadata for topic " + options_.topic);
}

StatusOr<std::pair<int64_t, int64_t>> KafkaPartitionReader::Bounds() {
  return BoundsOf(options_.partition);
}

StatusOr<std::pair<int64_t, int64_t>> KafkaPartitionReader::BoundsOf(int32_t partition) {
  int64_t low = 0, high = 0;
  const RdKafka::ErrorCode err = consumer_->query_watermark_offsets(
      options_.topic, partition, &low, &high, static_cast<int>(options_.timeout.count()));
  if (err != RdKafka::ERR_NO_ERROR) {
    return UnavailableError(std::string(kWhat) + ": watermarks of " + options_.topic + "[" +
                            std::to_string(partition) + "]: " + ErrorDescription(err));
  }
  if (low < 0 || high < low) {
    return UnavailableError(std::string(kWhat) + ": invalid watermarks of " + options_.topic);
  }
  return std::make_pair(low, high);
}

StatusOr<std::vector<ReadMessage>> KafkaPartitionReader::Read(int64_t from, int64_t to) {
  std::vector<ReadMessage> out;
  if (to <= from) return out;
  VIPSD_RETURN_IF_ERROR(AssignAt(from));
  const auto deadline = std::chrono::steady_clock::now() + options_.timeout;
  int64_t next = from;  // every offset below it was seen (or holds no message)
  Status result = Status::Ok();
  while (next < to) {
    if (std::chrono::steady_clock::now() >= deadline) {
      result = UnavailableError(std::string(kWhat) + ": " + options_.topic + "[" +
                                std::to_string(options_.partition) + "] read to offset " +
                                std::to_string(next) + " of " + std::to_string(to) +
                                " within " + std::to_string(options_.timeout.count()) + " ms");
      break;
    }
    std::unique_ptr<RdKafka::Message> message(consumer_->consume(100));
    if (message == nullptr) continue;
    if (message->err() == RdKafka::ERR__TIMED_OUT) continue;
    if (message->err() == RdKafka::ERR__PARTITION_EOF) {
      // Everything below the reported end was returned.
      next = std::max(next, message->offset());
      continue;
    }
    if (message->err() != RdKafka::ERR_NO_ERROR) continue;  // transient: logged by the event callback
    if (message->topic_name() != options_.topic || message->partition() != options_.partition) {
      continue;
    }
    if (message->offset() < next) continue;
    next = message->offset() + 1;
    if (message->offset() >= to) {
      // Past the range: the next read must start here, not after it.
      position_ = -1;
      break;
    }
    out.push_back(ToReadMessage(*message));
  }
  if (!result.ok()) {
    position_ = -1;  // unknown: re-assign next time
    return result;
  }
  if (position_ != -1) position_ = next;
  return out;
}

Status KafkaPartitionReader::AssignAt(int64_t from) {
  // The partition stays assigned between calls, so that the client keeps
  // fetching and a read of what was just appended finds it queued; a read
  // from anywhere but where the last one ended (or after Pause) re-assigns
  // at `from`.
  if (position_ == from) return Status::Ok();
  std::unique_ptr<RdKafka::TopicPartition> start(
      RdKafka::TopicPartition::create(options_.topic, options_.partition, from));
  std::vector<RdKafka::TopicPartition*> assignment = {start.get()};
  const RdKafka::ErrorCode err = consumer_->assign(assignment);
  if (err != RdKafka::ERR_NO_ERROR) {
    position_ = -1;
    return UnavailableError(std::string(kWhat) + ": assign " + options_.topic + ": " +
                            ErrorDescription(err));
  }
  assigned_ = true;
  position_ = from;
  return Status::Ok();
}

Status KafkaPartitionReader::Pause() {
  if (!assigned_) return Status::Ok();
  const RdKafka::ErrorCode err = consumer_->unassign();
  assigned_ = false;
  position_ = -1;  // the next read assigns where it starts
  if (err != RdKafka::ERR_NO_ERROR) {
    return UnavailableError(std::string(kWhat) + ": unassign " + options_.topic + ": " +
                            ErrorDescription(err));
  }
  return Status::Ok();
}

StatusOr<std::vector<ReadMessage>> KafkaPartitionReader::ReadAvailable(
    int64_t from, std::chrono::milliseconds wait) {
  VIPSD_RETURN_IF_ERROR(AssignAt(from));
  const auto deadline = std::chrono::steady_clock::now() + wait;
  std::vector<ReadMessage> out;
  int64_t next = from;
  for (;;) {
    // Once a message arrived, only what is queued behind it.
    int timeout_ms = 0;
    if (out.empty()) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      timeout_ms = static_cast<int>(std::min<int64_t>(left.count(), 100));
    }
    std::unique_ptr<RdKafka::Message> message(consumer_->consume(timeout_ms));
    const bool nothing = message == nullptr || message->err() == RdKafka::ERR__TIMED_OUT ||
                         message->err() == RdKafka::ERR__PARTITION_EOF;
    if (nothing) {
      if (!out.empty()) break;
      continue;
    }
    if (message->err() != RdKafka::ERR_NO_ERROR) continue;  // transient: logged by the event callback
    if (message->topic_name() != options_.topic || message->partition() != options_.partition ||
        message->offset() < next) {
      continue;
    }
    next = message->offset() + 1;
    out.push_back(ToReadMessage(*message));
  }
  position_ = next;
  return out;
}

}  // namespace vipsd::connectors
