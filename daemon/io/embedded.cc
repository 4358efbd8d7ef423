#include "daemon/io/embedded.h"

#include <chrono>
#include <sstream>
#include <vector>

#include "connectors/file/file_util.h"
#include "connectors/kafka/kafka_producer.h"
#include "connectors/kafka/mock_cluster.h"
#include "core/base/log.h"

namespace vipsd::daemon {

EmbeddedKafka::~EmbeddedKafka() = default;

StatusOr<std::unique_ptr<EmbeddedKafka>> EmbeddedKafka::Start(const config::VipsdConfig& config) {
  std::unique_ptr<EmbeddedKafka> kafka(new EmbeddedKafka());
  VIPSD_ASSIGN_OR_RETURN(kafka->cluster_, connectors::MockCluster::Create(1));
  kafka->bootstrap_ = kafka->cluster_->bootstrap_servers();
  const int partitions = static_cast<int>(config.kafka.partitions);
  for (const auto& topic : config.source_topics) {
    VIPSD_RETURN_IF_ERROR(kafka->cluster_->CreateTopic(topic, partitions));
  }
  if (config.sink_type == config::SinkType::kKafka) {
    VIPSD_RETURN_IF_ERROR(kafka->cluster_->CreateTopic(config.release_topic, partitions));
  }
  VIPSD_RETURN_IF_ERROR(kafka->cluster_->CreateTopic(config.dead_letter_topic, 1));
  if (!config.ledger_topic.empty()) {
    VIPSD_RETURN_IF_ERROR(kafka->cluster_->CreateTopic(config.ledger_topic, 1));
  }
  if (!config.alert_topic.empty()) {
    VIPSD_RETURN_IF_ERROR(kafka->cluster_->CreateTopic(config.alert_topic, 1));
  }
  if (config.kafka.demo_corpus.empty()) return kafka;

  // Feed the demo corpus into the first input topic, one message per line.
  auto corpus = connectors::ReadRegularFile(config.kafka.demo_corpus, connectors::kMaxDataFileBytes);
  if (!corpus.ok()) {
    return Status(corpus.status().code(),
                  "the demo corpus " + std::string(corpus.status().message()));
  }
  std::istringstream in(std::move(*corpus));
  connectors::KafkaProducerOptions options;
  options.bootstrap_servers = kafka->bootstrap_;
  options.client_id = "vipsd-demo-feeder";
  VIPSD_ASSIGN_OR_RETURN(auto producer, connectors::KafkaProducer::Create(options));
  std::vector<connectors::OutMessage> batch;
  std::string line;
  auto flush = [&]() -> Status {
    if (batch.empty()) return Status::Ok();
    VIPSD_RETURN_IF_ERROR(producer->ProduceAndWait(batch, std::chrono::seconds(30)));
    kafka->demo_records_ += static_cast<int64_t>(batch.size());
    batch.clear();
    return Status::Ok();
  };
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    connectors::OutMessage message;
    message.topic = config.source_topics.front();
    message.key = "demo-" + std::to_string(kafka->demo_records_ + static_cast<int64_t>(batch.size()));
    message.value = std::move(line);
    batch.push_back(std::move(message));
    if (batch.size() == 1000) VIPSD_RETURN_IF_ERROR(flush());
  }
  VIPSD_RETURN_IF_ERROR(flush());
  VIPSD_RETURN_IF_ERROR(producer->Close(std::chrono::seconds(10)));
  return kafka;
}

}  // namespace vipsd::daemon
