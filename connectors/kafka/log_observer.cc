#include "connectors/kafka/log_observer.h"

#include <librdkafka/rdkafkacpp.h>

#include "connectors/kafka/kafka_common.h"

namespace vipsd::connectors {
namespace {

using kafka_internal::ErrorDescription;

constexpr char kWhat[] = "kafka log observer";

}  // namespace

class KafkaLogObserver::Callbacks : public kafka_internal::LogEventCb {
 public:
  Callbacks() : LogEventCb("kafka-observer") {}
};

KafkaLogObserver::KafkaLogObserver(KafkaLogObserverOptions options)
    : options_(std::move(options)), callbacks_(std::make_unique<Callbacks>()) {}

KafkaLogObserver::~KafkaLogObserver() {
  topics_.clear();  // topic handles before the client handle
  handle_.reset();
}

StatusOr<std::unique_ptr<KafkaLogObserver>> KafkaLogObserver::Create(
    KafkaLogObserverOptions options) {
  if (options.bootstrap_servers.empty()) {
    return InvalidArgumentError("kafka log observer: bootstrap_servers must not be empty");
  }
  if (options.topics.empty()) {
    return InvalidArgumentError("kafka log observer: at least one topic is required");
  }
  std::unique_ptr<KafkaLogObserver> observer(new KafkaLogObserver(std::move(options)));
  const KafkaLogObserverOptions& o = observer->options_;
  std::unique_ptr<RdKafka::Conf> conf(RdKafka::Conf::create(RdKafka::Conf::CONF_GLOBAL));
  const kafka_internal::ManagedProperty managed[] = {
      {"bootstrap.servers", o.bootstrap_servers},
      {"client.id", o.client_id + "-observer"},
  };
  VIPSD_RETURN_IF_ERROR(kafka_internal::ApplyProperties(*conf, kWhat, managed, o.properties));
  std::string errstr;
  if (conf->set("event_cb", static_cast<RdKafka::EventCb*>(observer->callbacks_.get()), errstr) !=
      RdKafka::Conf::CONF_OK) {
    return InternalError("kafka log observer: cannot install callbacks: " + errstr);
  }
  observer->handle_.reset(RdKafka::Producer::create(conf.get(), errstr));
  if (observer->handle_ == nullptr) {
    return InvalidArgumentError("kafka log observer: cannot create client: " + errstr);
  }
  for (const std::string& name : o.topics) {
    std::unique_ptr<RdKafka::Topic> topic(
        RdKafka::Topic::create(observer->handle_.get(), name, nullptr, errstr));
    if (topic == nullptr) {
      return InvalidArgumentError("kafka log observer: topic " + name + ": " + errstr);
    }
    observer->topics_.push_back(std::move(topic));
  }
  return observer;
}

StatusOr<std::map<TopicPartitionRef, PartitionBounds>> KafkaLogObserver::Observe() {
  std::lock_guard<std::mutex> lock(mutex_);
  const int timeout_ms = static_cast<int>(options_.timeout.count());
  std::map<TopicPartitionRef, PartitionBounds> bounds;
  for (const auto& topic : topics_) {
    RdKafka::Metadata* raw = nullptr;
    const RdKafka::ErrorCode err = handle_->metadata(false, topic.get(), &raw, timeout_ms);
    std::unique_ptr<RdKafka::Metadata> metadata(raw);
    if (err != RdKafka::ERR_NO_ERROR) {
      return UnavailableError("kafka log observer: metadata of topic " + topic->name() + ": " +
                              ErrorDescription(err));
    }
    for (const RdKafka::TopicMetadata* t : *metadata->topics()) {
      if (t->topic() != topic->name()) continue;
      if (t->err() == RdKafka::ERR_UNKNOWN_TOPIC_OR_PART) continue;  // not created yet
      if (t->err() != RdKafka::ERR_NO_ERROR) {
        return UnavailableError("kafka log observer: metadata of topic " + t->topic() + ": " +
                                ErrorDescription(t->err()));
      }
      for (const RdKafka::PartitionMetadata* p : *t->partitions()) {
        PartitionBounds b;
        const RdKafka::ErrorCode w = handle_->query_watermark_offsets(
            t->topic(), p->id(), &b.low, &b.high, timeout_ms);
        if (w != RdKafka::ERR_NO_ERROR) {
          return UnavailableError("kafka log observer: watermarks of " + t->topic() + "[" +
                                  std::to_string(p->id()) + "]: " + ErrorDescription(w));
        }
        if (b.low < 0 || b.high < b.low) {
          return UnavailableError("kafka log observer: invalid watermarks of " + t->topic() +
                                  "[" + std::to_string(p->id()) + "]");
        }
        bounds[{t->topic(), p->id()}] = b;
      }
    }
  }
  return bounds;
}

}  // namespace vipsd::connectors
