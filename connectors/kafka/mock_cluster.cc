#include "connectors/kafka/mock_cluster.h"

// rdkafka_mock.h must come after rdkafka.h.
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#include <string_view>

#include "connectors/kafka/kafka_common.h"
#include "core/base/log.h"

namespace vipsd::connectors {
namespace {

constexpr std::string_view kComponent = "kafka-mock";
constexpr int kMaxBrokers = 16;
constexpr int kMaxPartitions = 1000;

void ForwardLog(const rd_kafka_t* /*handle*/, int level, const char* facility, const char* line) {
  Log(kafka_internal::LogLevelFromSyslog(level), kComponent,
      std::string(facility) + ": " + line);
}

std::string MockErrorText(rd_kafka_resp_err_t err) {
  return std::string(rd_kafka_err2name(err)) + " (" + rd_kafka_err2str(err) + ")";
}

}  // namespace

StatusOr<std::unique_ptr<MockCluster>> MockCluster::Create(int brokers) {
  if (brokers < 1 || brokers > kMaxBrokers) {
    return InvalidArgumentError("mock Kafka cluster: brokers must be in [1, " +
                                std::to_string(kMaxBrokers) + "], got " +
                                std::to_string(brokers));
  }
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  rd_kafka_conf_set_log_cb(conf, ForwardLog);
  char errstr[512];
  // The handle only hosts the mock brokers' threads; it never connects
  // anywhere, so quieten its "no bootstrap.servers" configuration warning.
  if (rd_kafka_conf_set(conf, "log_level", "3", errstr, sizeof(errstr)) != RD_KAFKA_CONF_OK ||
      rd_kafka_conf_set(conf, "client.id", "vipsd-mock-cluster", errstr, sizeof(errstr)) !=
          RD_KAFKA_CONF_OK) {
    rd_kafka_conf_destroy(conf);
    return InternalError(std::string("mock Kafka cluster: configuration failed: ") + errstr);
  }
  // rd_kafka_new takes ownership of conf on success only.
  rd_kafka_t* handle = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
  if (handle == nullptr) {
    rd_kafka_conf_destroy(conf);
    return UnavailableError(std::string("mock Kafka cluster: cannot create handle: ") + errstr);
  }
  rd_kafka_mock_cluster_t* cluster = rd_kafka_mock_cluster_new(handle, brokers);
  if (cluster == nullptr) {
    rd_kafka_destroy(handle);
    return UnavailableError("mock Kafka cluster: cannot start " + std::to_string(brokers) +
                            " mock brokers");
  }
  return std::unique_ptr<MockCluster>(new MockCluster(handle, cluster, brokers));
}

MockCluster::MockCluster(rd_kafka_t* handle, rd_kafka_mock_cluster_t* cluster, int broker_count)
    : handle_(handle),
      cluster_(cluster),
      broker_count_(broker_count),
      bootstrap_servers_(rd_kafka_mock_cluster_bootstraps(cluster)) {
  Log(LogLevel::kInfo, kComponent,
      "mock Kafka cluster with " + std::to_string(broker_count) + " broker(s) at " +
          bootstrap_servers_);
}

MockCluster::~MockCluster() {
  rd_kafka_mock_cluster_destroy(cluster_);
  rd_kafka_destroy(handle_);
}

Status MockCluster::CreateTopic(const std::string& name, int partitions,
                                int replication_factor) {
  // Kafka's topic name rule: 1-249 characters of [a-zA-Z0-9._-].
  const bool valid_name =
      !name.empty() && name.size() <= 249 && name != "." && name != ".." &&
      name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") ==
          std::string::npos;
  if (!valid_name) {
    return InvalidArgumentError("mock Kafka cluster: topic name must be 1-249 characters of "
                                "[a-zA-Z0-9._-]");
  }
  if (partitions < 1 || partitions > kMaxPartitions) {
    return InvalidArgumentError("mock Kafka cluster: topic " + name +
                                ": partitions must be in [1, " +
                                std::to_string(kMaxPartitions) + "]");
  }
  if (replication_factor < 1 || replication_factor > broker_count_) {
    return InvalidArgumentError("mock Kafka cluster: topic " + name +
                                ": replication_factor must be in [1, " +
                                std::to_string(broker_count_) + "]");
  }
  const rd_kafka_resp_err_t err =
      rd_kafka_mock_topic_create(cluster_, name.c_str(), partitions, replication_factor);
  if (err == RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS) {
    return InvalidArgumentError("mock Kafka cluster: topic " + name + " already exists");
  }
  if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
    return InternalError("mock Kafka cluster: cannot create topic " + name + ": " +
                         MockErrorText(err));
  }
  return Status::Ok();
}

Status MockCluster::SetBrokerDown(int32_t id) {
  if (id < 1 || id > broker_count_) {
    return InvalidArgumentError("mock Kafka cluster: broker id must be in [1, " +
                                std::to_string(broker_count_) + "], got " + std::to_string(id));
  }
  const rd_kafka_resp_err_t err = rd_kafka_mock_broker_set_down(cluster_, id);
  if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
    return InternalError("mock Kafka cluster: cannot take broker " + std::to_string(id) +
                         " down: " + MockErrorText(err));
  }
  return Status::Ok();
}

Status MockCluster::SetBrokerUp(int32_t id) {
  if (id < 1 || id > broker_count_) {
    return InvalidArgumentError("mock Kafka cluster: broker id must be in [1, " +
                                std::to_string(broker_count_) + "], got " + std::to_string(id));
  }
  const rd_kafka_resp_err_t err = rd_kafka_mock_broker_set_up(cluster_, id);
  if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
    return InternalError("mock Kafka cluster: cannot bring broker " + std::to_string(id) +
                         " up: " + MockErrorText(err));
  }
  return Status::Ok();
}

}  // namespace vipsd::connectors
