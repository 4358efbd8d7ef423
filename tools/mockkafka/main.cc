// vipsd-mock-kafka: a Kafka cluster for tests and fault drills, hosted in its
// own process (librdkafka's mock brokers, connectors/kafka/mock_cluster.h),
// so that daemons can be killed and restarted against it and brokers can be
// taken down, slowed or made to fail requests while the daemon runs.
//
//   vipsd-mock-kafka [--brokers N] [--topic NAME:PARTITIONS]... [--bootstrap-file PATH]
//
// Prints "bootstrap HOST:PORT,..." on stdout (and writes the list to
// --bootstrap-file), then reads one command per line on stdin and answers
// each with one line, "ok ..." or "error ...":
//   topic NAME PARTITIONS          create a topic
//   down ID | up ID                take broker ID (1..N) down / bring it back
//   rtt ID MS                      add MS ms to every response of broker ID
//   leader TOPIC PARTITION ID      make broker ID the partition's leader
//                                  (the mock picks leaders at random when a
//                                  topic is created; a fault drill that takes
//                                  one broker down pins what it leads first)
//   errors API COUNT ERROR...      the next COUNT requests of API (produce,
//                                  fetch, list_offsets, metadata, offset_commit,
//                                  offset_fetch, find_coordinator, join_group,
//                                  heartbeat, leave_group, sync_group,
//                                  init_producer_id) fail with the librdkafka
//                                  error names given in turn (cycled), e.g.
//                                  NOT_LEADER_FOR_PARTITION, REQUEST_TIMED_OUT
//   clear API                      drop pending injected errors of API
//   committed GROUP TOPIC          the group's committed offsets:
//                                  "ok P=OFFSET ..." (-1: none)
//   watermarks TOPIC               "ok P=LOW:HIGH ..."
//   quit                           (or end of input) destroy the cluster, exit 0
// Exit status 2 for a bad command line, 1 when the cluster cannot start.
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>
#include <librdkafka/rdkafkacpp.h>

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "connectors/kafka/mock_cluster.h"
#include "core/base/log.h"

#ifndef VIPSD_VERSION
#define VIPSD_VERSION "unknown"
#endif

namespace {

using vipsd::connectors::MockCluster;

constexpr const char* kUsage =
    "vipsd-mock-kafka " VIPSD_VERSION ": a mock Kafka cluster in its own process\n"
    "\n"
    "Usage: vipsd-mock-kafka [--brokers N] [--topic NAME:PARTITIONS]... [--bootstrap-file PATH]\n"
    "\n"
    "Prints 'bootstrap LIST', then answers commands on stdin, one line each:\n"
    "  topic NAME PARTITIONS | down ID | up ID | rtt ID MS | leader TOPIC PARTITION ID |\n"
    "  errors API COUNT ERROR... | clear API | committed GROUP TOPIC |\n"
    "  watermarks TOPIC | quit\n"
    "API: produce fetch list_offsets metadata offset_commit offset_fetch\n"
    "     find_coordinator join_group heartbeat leave_group sync_group init_producer_id\n"
    "ERROR: a librdkafka error name without RD_KAFKA_RESP_ERR_, e.g.\n"
    "       NOT_LEADER_FOR_PARTITION, REQUEST_TIMED_OUT, NOT_COORDINATOR\n"
    "Limits of the mock (keep partitions well below 5 MiB): see TOOLCHAIN notes in\n"
    "connectors/kafka/mock_cluster.h.\n";

std::optional<int16_t> ApiKey(const std::string& name) {
  static const std::map<std::string, int16_t> keys = {
      {"produce", 0},          {"fetch", 1},           {"list_offsets", 2},
      {"metadata", 3},         {"offset_commit", 8},   {"offset_fetch", 9},
      {"find_coordinator", 10}, {"join_group", 11},    {"heartbeat", 12},
      {"leave_group", 13},     {"sync_group", 14},     {"init_producer_id", 22}};
  auto it = keys.find(name);
  if (it == keys.end()) return std::nullopt;
  return it->second;
}

std::optional<rd_kafka_resp_err_t> ErrorCode(const std::string& name) {
  const struct rd_kafka_err_desc* descs = nullptr;
  size_t count = 0;
  rd_kafka_get_err_descs(&descs, &count);
  for (size_t i = 0; i < count; ++i) {
    if (descs[i].name != nullptr && name == descs[i].name) return descs[i].code;
  }
  return std::nullopt;
}

// A consumer handle (never joins a group) for OffsetFetch and watermarks.
class Inspector {
 public:
  explicit Inspector(const std::string& bootstrap) : bootstrap_(bootstrap) {}

  std::string Committed(const std::string& group, const std::string& topic) {
    std::string error;
    auto consumer = Consumer(group, &error);
    if (!consumer) return "error " + error;
    auto partitions = Partitions(consumer.get(), topic);
    if (partitions.empty()) return "error no partitions for topic " + topic;
    std::string out;
    const RdKafka::ErrorCode err = consumer->committed(partitions, 10000);
    if (err != RdKafka::ERR_NO_ERROR) {
      out = "error " + RdKafka::err2str(err);
    } else {
      out = "ok";
      for (auto* p : partitions) {
        out += " " + std::to_string(p->partition()) + "=" +
               std::to_string(p->offset() >= 0 ? p->offset() : -1);
      }
    }
    RdKafka::TopicPartition::destroy(partitions);
    consumer->close();
    return out;
  }

  std::string Watermarks(const std::string& topic) {
    std::string error;
    auto consumer = Consumer("vipsd-mock-kafka-inspector", &error);
    if (!consumer) return "error " + error;
    auto partitions = Partitions(consumer.get(), topic);
    if (partitions.empty()) return "error no partitions for topic " + topic;
    std::string out = "ok";
    for (auto* p : partitions) {
      int64_t low = -1, high = -1;
      const RdKafka::ErrorCode err =
          consumer->query_watermark_offsets(topic, p->partition(), &low, &high, 10000);
      if (err != RdKafka::ERR_NO_ERROR) {
        out = "error " + RdKafka::err2str(err);
        break;
      }
      out += " " + std::to_string(p->partition()) + "=" + std::to_string(low) + ":" +
             std::to_string(high);
    }
    RdKafka::TopicPartition::destroy(partitions);
    consumer->close();
    return out;
  }

 private:
  // A consumer of `group` that never subscribes (so it never joins).
  std::unique_ptr<RdKafka::KafkaConsumer> Consumer(const std::string& group, std::string* error) {
    std::unique_ptr<RdKafka::Conf> conf(RdKafka::Conf::create(RdKafka::Conf::CONF_GLOBAL));
    conf->set("bootstrap.servers", bootstrap_, *error);
    conf->set("group.id", group, *error);
    conf->set("log_level", "0", *error);
    return std::unique_ptr<RdKafka::KafkaConsumer>(RdKafka::KafkaConsumer::create(conf.get(), *error));
  }

  std::vector<RdKafka::TopicPartition*> Partitions(RdKafka::KafkaConsumer* consumer,
                                                   const std::string& topic) {
    std::vector<RdKafka::TopicPartition*> partitions;
    std::string error;
    std::unique_ptr<RdKafka::Topic> handle(RdKafka::Topic::create(consumer, topic, nullptr, error));
    if (!handle) return partitions;
    RdKafka::Metadata* metadata = nullptr;
    if (consumer->metadata(false, handle.get(), &metadata, 10000) != RdKafka::ERR_NO_ERROR) {
      return partitions;
    }
    std::unique_ptr<RdKafka::Metadata> owned(metadata);
    for (const auto* t : *metadata->topics()) {
      if (t->topic() != topic || t->err() != RdKafka::ERR_NO_ERROR) continue;
      for (const auto* p : *t->partitions()) {
        partitions.push_back(RdKafka::TopicPartition::create(topic, p->id()));
      }
    }
    return partitions;
  }

  std::string bootstrap_;
};

std::string Run(MockCluster& cluster, Inspector& inspector, const std::string& line, bool* quit) {
  std::istringstream in(line);
  std::string command;
  in >> command;
  auto status_line = [](const vipsd::Status& status) {
    return status.ok() ? std::string("ok") : "error " + std::string(status.message());
  };
  auto mock_line = [](rd_kafka_resp_err_t err) {
    return err == RD_KAFKA_RESP_ERR_NO_ERROR ? std::string("ok")
                                             : "error " + std::string(rd_kafka_err2str(err));
  };
  if (command.empty()) return "error empty command";
  if (command == "quit") {
    *quit = true;
    return "ok";
  }
  if (command == "topic") {
    std::string name;
    int partitions = 0;
    if (!(in >> name >> partitions)) return "error usage: topic NAME PARTITIONS";
    return status_line(cluster.CreateTopic(name, partitions));
  }
  if (command == "down" || command == "up") {
    int id = 0;
    if (!(in >> id)) return "error usage: " + command + " ID";
    return status_line(command == "down" ? cluster.SetBrokerDown(id) : cluster.SetBrokerUp(id));
  }
  if (command == "rtt") {
    int id = 0, ms = 0;
    if (!(in >> id >> ms) || id < 1 || id > cluster.broker_count() || ms < 0) {
      return "error usage: rtt ID MS";
    }
    return mock_line(rd_kafka_mock_broker_set_rtt(cluster.mock_handle(), id, ms));
  }
  if (command == "leader") {
    std::string topic;
    int partition = -1, id = 0;
    if (!(in >> topic >> partition >> id) || partition < 0 || id < 1 ||
        id > cluster.broker_count()) {
      return "error usage: leader TOPIC PARTITION ID (ID in 1.." +
             std::to_string(cluster.broker_count()) + ")";
    }
    return mock_line(
        rd_kafka_mock_partition_set_leader(cluster.mock_handle(), topic.c_str(), partition, id));
  }
  if (command == "errors" || command == "clear") {
    std::string api;
    in >> api;
    const auto key = ApiKey(api);
    if (!key.has_value()) return "error unknown API '" + api + "'";
    if (command == "clear") {
      rd_kafka_mock_clear_request_errors(cluster.mock_handle(), *key);
      return "ok";
    }
    size_t count = 0;
    if (!(in >> count) || count == 0 || count > 100000) return "error COUNT must be 1..100000";
    std::vector<rd_kafka_resp_err_t> names;
    for (std::string name; in >> name;) {
      const auto code = ErrorCode(name);
      if (!code.has_value()) return "error unknown error name '" + name + "'";
      names.push_back(*code);
    }
    if (names.empty()) return "error give at least one error name";
    std::vector<rd_kafka_resp_err_t> errors(count);
    for (size_t i = 0; i < count; ++i) errors[i] = names[i % names.size()];
    rd_kafka_mock_push_request_errors_array(cluster.mock_handle(), *key, count, errors.data());
    return "ok";
  }
  if (command == "committed") {
    std::string group, topic;
    if (!(in >> group >> topic)) return "error usage: committed GROUP TOPIC";
    return inspector.Committed(group, topic);
  }
  if (command == "watermarks") {
    std::string topic;
    if (!(in >> topic)) return "error usage: watermarks TOPIC";
    return inspector.Watermarks(topic);
  }
  return "error unknown command '" + command + "'";
}

}  // namespace

int main(int argc, char** argv) {
  int brokers = 1;
  std::vector<std::pair<std::string, int>> topics;
  std::string bootstrap_file;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::cout << kUsage;
      return 0;
    } else if (arg == "--version") {
      std::cout << "vipsd-mock-kafka " VIPSD_VERSION "\n";
      return 0;
    } else if (arg == "--brokers" && i + 1 < argc) {
      brokers = std::atoi(argv[++i]);
    } else if (arg == "--bootstrap-file" && i + 1 < argc) {
      bootstrap_file = argv[++i];
    } else if (arg == "--topic" && i + 1 < argc) {
      const std::string spec = argv[++i];
      const size_t colon = spec.rfind(':');
      const int partitions = colon == std::string::npos ? 0 : std::atoi(spec.c_str() + colon + 1);
      if (colon == std::string::npos || colon == 0 || partitions < 1) {
        std::cerr << "vipsd-mock-kafka: --topic wants NAME:PARTITIONS, got '" << spec << "'\n";
        return 2;
      }
      topics.emplace_back(spec.substr(0, colon), partitions);
    } else {
      std::cerr << "vipsd-mock-kafka: unknown argument '" << arg << "'; see --help\n";
      return 2;
    }
  }
  if (brokers < 1 || brokers > 16) {
    std::cerr << "vipsd-mock-kafka: --brokers must be 1..16\n";
    return 2;
  }
  vipsd::SetMinLogLevel(vipsd::LogLevel::kWarning);
  auto cluster = MockCluster::Create(brokers);
  if (!cluster.ok()) {
    std::cerr << "vipsd-mock-kafka: " << cluster.status().message() << "\n";
    return 1;
  }
  for (const auto& [name, partitions] : topics) {
    const vipsd::Status created = (*cluster)->CreateTopic(name, partitions);
    if (!created.ok()) {
      std::cerr << "vipsd-mock-kafka: " << created.message() << "\n";
      return 1;
    }
  }
  const std::string& bootstrap = (*cluster)->bootstrap_servers();
  if (!bootstrap_file.empty()) {
    std::ofstream out(bootstrap_file + ".tmp");
    out << bootstrap << "\n";
    out.close();
    if (!out || std::rename((bootstrap_file + ".tmp").c_str(), bootstrap_file.c_str()) != 0) {
      std::cerr << "vipsd-mock-kafka: cannot write " << bootstrap_file << "\n";
      return 1;
    }
  }
  std::cout << "bootstrap " << bootstrap << std::endl;
  Inspector inspector(bootstrap);
  bool quit = false;
  for (std::string line; !quit && std::getline(std::cin, line);) {
    std::cout << Run(**cluster, inspector, line, &quit) << std::endl;
  }
  return 0;
}
