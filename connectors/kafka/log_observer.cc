#include "connectors/kafka/log_observer.h"

#include <string_view>

#include <librdkafka/rdkafka.h>
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
      // Its high offset is the high watermark, as the source reads
      // (read_uncommitted, kafka_source.cc): under read_committed it would be
      // the last stable offset, held back by a transaction left open.
      {"isolation.level", "read_uncommitted"},
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
  MutexLock lock(&mutex_);
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

StatusOr<std::map<std::string, std::map<std::string, std::string>>>
KafkaLogObserver::TopicConfigs() {
  MutexLock lock(&mutex_);
  const int timeout_ms = static_cast<int>(options_.timeout.count());
  rd_kafka_t* rk = handle_->c_ptr();
  // DescribeConfigs goes to the controller. librdkafka's mock cluster (the
  // embedded demo's and the unit tests' peer; its cluster id starts with
  // "mockCluster") does not answer it, and a cluster whose metadata names
  // no controller would keep the request waiting for the whole timeout:
  // ask the metadata first.
  RdKafka::Metadata* raw = nullptr;
  const RdKafka::ErrorCode err = handle_->metadata(false, topics_.front().get(), &raw, timeout_ms);
  std::unique_ptr<RdKafka::Metadata> metadata(raw);
  if (err != RdKafka::ERR_NO_ERROR) {
    return UnavailableError("kafka log observer: metadata: " + ErrorDescription(err));
  }
  if (char* cluster = rd_kafka_clusterid(rk, 0); cluster != nullptr) {
    const bool mock = std::string_view(cluster).starts_with("mockCluster");
    rd_kafka_mem_free(rk, cluster);
    if (mock) {
      return UnavailableError(
          "kafka log observer: librdkafka's mock cluster does not answer DescribeConfigs");
    }
  }
  if (rd_kafka_controllerid(rk, 0) < 0) {
    return UnavailableError(
        "kafka log observer: the cluster names no controller to answer DescribeConfigs");
  }
  std::vector<rd_kafka_ConfigResource_t*> resources;
  for (const auto& topic : topics_) {
    resources.push_back(rd_kafka_ConfigResource_new(RD_KAFKA_RESOURCE_TOPIC, topic->name().c_str()));
  }
  rd_kafka_AdminOptions_t* admin = rd_kafka_AdminOptions_new(rk, RD_KAFKA_ADMIN_OP_DESCRIBECONFIGS);
  char errstr[512];
  (void)rd_kafka_AdminOptions_set_request_timeout(admin, timeout_ms, errstr, sizeof(errstr));
  rd_kafka_queue_t* queue = rd_kafka_queue_new(rk);
  rd_kafka_DescribeConfigs(rk, resources.data(), resources.size(), admin, queue);
  rd_kafka_event_t* event = rd_kafka_queue_poll(queue, timeout_ms + 1000);
  std::map<std::string, std::map<std::string, std::string>> out;
  Status status;
  if (event == nullptr) {
    status = UnavailableError("kafka log observer: no answer to DescribeConfigs within " +
                              std::to_string(timeout_ms + 1000) + " ms");
  } else if (rd_kafka_event_error(event) != RD_KAFKA_RESP_ERR_NO_ERROR) {
    status = UnavailableError(std::string("kafka log observer: DescribeConfigs: ") +
                              rd_kafka_event_error_string(event));
  } else {
    const rd_kafka_DescribeConfigs_result_t* result = rd_kafka_event_DescribeConfigs_result(event);
    size_t count = 0;
    const rd_kafka_ConfigResource_t** described =
        result == nullptr ? nullptr : rd_kafka_DescribeConfigs_result_resources(result, &count);
    for (size_t i = 0; i < count && status.ok(); ++i) {
      const rd_kafka_resp_err_t resource_err = rd_kafka_ConfigResource_error(described[i]);
      const std::string name = rd_kafka_ConfigResource_name(described[i]);
      if (resource_err == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART) continue;  // not created yet
      if (resource_err != RD_KAFKA_RESP_ERR_NO_ERROR) {
        const char* text = rd_kafka_ConfigResource_error_string(described[i]);
        status = UnavailableError("kafka log observer: configuration of topic " + name + ": " +
                                  (text != nullptr ? text : rd_kafka_err2str(resource_err)));
        break;
      }
      size_t entries = 0;
      const rd_kafka_ConfigEntry_t** configs = rd_kafka_ConfigResource_configs(described[i], &entries);
      std::map<std::string, std::string>& topic = out[name];
      for (size_t j = 0; j < entries; ++j) {
        const char* value = rd_kafka_ConfigEntry_value(configs[j]);
        topic[rd_kafka_ConfigEntry_name(configs[j])] = value != nullptr ? value : "";
      }
    }
  }
  if (event != nullptr) rd_kafka_event_destroy(event);
  rd_kafka_queue_destroy(queue);
  rd_kafka_AdminOptions_destroy(admin);
  for (rd_kafka_ConfigResource_t* resource : resources) rd_kafka_ConfigResource_destroy(resource);
  if (!status.ok()) return status;
  return out;
}

}  // namespace vipsd::connectors
