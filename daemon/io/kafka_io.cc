#include "daemon/io/kafka_io.h"

#include <chrono>
#include <cmath>
#include <exception>
#include <set>
#include <thread>
#include <map>
#include <optional>

#include "connectors/file/release_file_sink.h"
#include "connectors/kafka/dead_letter.h"
#include "connectors/kafka/kafka_producer.h"
#include "connectors/kafka/kafka_source.h"
#include "connectors/kafka/log_observer.h"
#include "connectors/kafka/partition_reader.h"
#include "core/base/format.h"
#include "core/base/log.h"
#include "daemon/io/work_exchange.h"

namespace vipsd::daemon {
namespace {

KafkaErrorKind Classify(const std::string& name) {
  if (name == "_TRANSPORT" || name == "_ALL_BROKERS_DOWN" || name == "_RESOLVE" ||
      name == "_TIMED_OUT" || name == "REQUEST_TIMED_OUT") {
    return KafkaErrorKind::kTransport;
  }
  if (name.find("COMMIT") != std::string::npos) return KafkaErrorKind::kCommit;
  return KafkaErrorKind::kConsume;
}

// "topic:partition" back to its parts (topic names cannot hold ':').
std::optional<connectors::TopicPartitionRef> ParseStream(const std::string& stream) {
  const size_t colon = stream.rfind(':');
  if (colon == std::string::npos || colon == 0) return std::nullopt;
  try {
    size_t used = 0;
    const int partition = std::stoi(stream.substr(colon + 1), &used);
    if (used != stream.size() - colon - 1 || partition < 0) return std::nullopt;
    return connectors::TopicPartitionRef{stream.substr(0, colon), partition};
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// Every input partition's start and end, read now (a failure is counted as
// a consume error).
StatusOr<std::map<std::string, StreamBounds>> ObserveLogBounds(
    connectors::KafkaLogObserver& observer, Metrics* metrics) {
  auto observed = observer.Observe();
  if (!observed.ok()) {
    metrics->kafka_errors_total(KafkaErrorKind::kConsume).Increment();
    return observed.status();
  }
  std::map<std::string, StreamBounds> bounds;
  for (const auto& [ref, b] : *observed) {
    bounds[StreamName(ref.topic, ref.partition)] = {b.low, b.high};
  }
  return bounds;
}

class KafkaInput final : public InputSource {
 public:
  KafkaInput(std::unique_ptr<connectors::KafkaSource> source,
             std::unique_ptr<connectors::KafkaLogObserver> observer, Metrics* metrics)
      : source_(std::move(source)), observer_(std::move(observer)), metrics_(metrics) {}

  StatusOr<PollBatch> Poll(size_t max_records, std::chrono::milliseconds timeout) override {
    auto polled = source_->Poll(max_records, timeout);
    CountErrors();
    if (!polled.ok()) return polled.status();
    PollBatch batch;
    batch.records = std::move(*polled);
    for (const auto& [ref, end] : source_->TakeReachedEnds()) {
      batch.reached_end[StreamName(ref.topic, ref.partition)] = end;
    }
    batch.assignment.emplace();
    for (const auto& ref : source_->assignment()) {
      batch.assignment->insert(StreamName(ref.topic, ref.partition));
    }
    return batch;
  }

  Status MarkDone(const InputRecord& record) override {
    return source_->StoreOffset(record.topic, record.partition, record.offset);
  }
  Status Pause(const std::set<std::string>& streams) override {
    return source_->Pause(Refs(streams));
  }
  Status Resume(const std::set<std::string>& streams) override {
    return source_->Resume(Refs(streams));
  }
  Status Rewind(const std::string& stream, int64_t offset) override {
    const auto ref = ParseStream(stream);
    if (!ref.has_value()) return InvalidArgumentError("not a Kafka stream name: " + stream);
    return source_->Rewind(*ref, offset);
  }
  StatusOr<std::map<std::string, StreamBounds>> ObserveBounds(double) override {
    return ObserveLogBounds(*observer_, metrics_);
  }
  Status Commit() override { return source_->Commit(); }
  int64_t Lag() const override { return source_->Lag(); }
  Status Close() override { return source_->Close(); }

 private:
  static std::vector<connectors::TopicPartitionRef> Refs(const std::set<std::string>& streams) {
    std::vector<connectors::TopicPartitionRef> refs;
    for (const std::string& stream : streams) {
      if (auto ref = ParseStream(stream)) refs.push_back(*ref);
    }
    return refs;
  }

  void CountErrors() {
    const auto stats = source_->stats();
    for (const auto& [name, count] : stats.errors_by_kind) {
      int64_t& seen = errors_seen_[name];
      if (count > seen) {
        metrics_->kafka_errors_total(Classify(name)).Increment(static_cast<double>(count - seen));
        seen = count;
      }
    }
    for (const auto& [topic, count] : stats.lost_by_topic) {
      int64_t& seen = lost_seen_[topic];
      if (count > seen) {
        metrics_->records_lost_total(topic).Increment(static_cast<double>(count - seen));
        seen = count;
      }
    }
  }

  std::unique_ptr<connectors::KafkaSource> source_;
  std::unique_ptr<connectors::KafkaLogObserver> observer_;
  Metrics* metrics_;
  std::map<std::string, int64_t> errors_seen_;
  std::map<std::string, int64_t> lost_seen_;
};

// state.work_partitions: false. Reads no partition and never joins the
// input's consumer group (an unpolled member would hold partitions from the
// others); it observes the logs' bounds for the slot cuts only.
class KafkaObserverInput final : public InputSource {
 public:
  KafkaObserverInput(std::unique_ptr<connectors::KafkaLogObserver> observer, Metrics* metrics)
      : observer_(std::move(observer)), metrics_(metrics) {}

  StatusOr<PollBatch> Poll(size_t, std::chrono::milliseconds timeout) override {
    std::this_thread::sleep_for(std::min(timeout, std::chrono::milliseconds(100)));
    PollBatch batch;
    batch.assignment.emplace();  // holds nothing
    return batch;
  }
  Status MarkDone(const InputRecord&) override { return Status::Ok(); }
  Status Pause(const std::set<std::string>&) override { return Status::Ok(); }
  Status Resume(const std::set<std::string>&) override { return Status::Ok(); }
  StatusOr<std::map<std::string, StreamBounds>> ObserveBounds(double) override {
    return ObserveLogBounds(*observer_, metrics_);
  }
  Status Commit() override { return Status::Ok(); }
  int64_t Lag() const override { return 0; }
  Status Close() override { return Status::Ok(); }

 private:
  std::unique_ptr<connectors::KafkaLogObserver> observer_;
  Metrics* metrics_;
};

class DaemonOutput final : public OutputSink {
 public:
  DaemonOutput(const config::VipsdConfig& config,
               std::unique_ptr<connectors::KafkaProducer> producer,
               std::optional<connectors::ReleaseFileSink> file_sink)
      : release_topic_(config.sink_type == config::SinkType::kKafka ? config.release_topic : ""),
        dead_letter_topic_(config.dead_letter_topic),
        alert_topic_(config.alert_topic),
        timeout_(std::chrono::milliseconds(
            static_cast<int64_t>(config.publish_timeout_seconds * 1000))),
        producer_(std::move(producer)),
        file_sink_(std::move(file_sink)) {}

  Status PublishRelease(const release::Release& release, const release::EncodedRelease& encoded,
                        double publish_time) override {
    if (release_topic_.empty()) return file_sink_->Write(release);
    VIPSD_RETURN_IF_ERROR(producer_->PublishRelease(
        release_topic_, encoded, timeout_, static_cast<int64_t>(std::llround(publish_time * 1000))));
    if (file_sink_.has_value()) {
      // The mirror is a convenience copy: the release is already published.
      const Status mirrored = file_sink_->Write(release);
      if (!mirrored.ok()) {
        Log(LogLevel::kWarning, "daemon", "release mirror: " + mirrored.ToString());
      }
    }
    return Status::Ok();
  }

  Status PublishDeadLetter(const InputRecord& record, connectors::RejectReason reason) override {
    const connectors::OutMessage out = connectors::MakeDeadLetter(
        record, reason, dead_letter_topic_, producer_->max_message_bytes());
    return producer_->ProduceAndWait({&out, 1}, timeout_);
  }

  Status PublishAlert(const std::string& json) override {
    if (alert_topic_.empty()) return Status::Ok();
    connectors::OutMessage out;
    out.topic = alert_topic_;
    out.key = "vipsd-alert";
    out.value = json;
    return producer_->ProduceAndWait({&out, 1}, timeout_);
  }

  Status Close() override { return producer_->Close(timeout_); }

 private:
  std::string release_topic_;
  std::string dead_letter_topic_;
  std::string alert_topic_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<connectors::KafkaProducer> producer_;
  std::optional<connectors::ReleaseFileSink> file_sink_;
};

}  // namespace

namespace {

connectors::KafkaSourceOptions SourceOptions(const config::VipsdConfig& config,
                                             const std::string& bootstrap_servers) {
  connectors::KafkaSourceOptions options;
  options.bootstrap_servers = bootstrap_servers;
  options.topics = config.source_topics;
  options.group_id = config.group_id;
  options.client_id = config.kafka.client_id;
  options.start_position = config.start_position;
  options.max_record_bytes = static_cast<size_t>(config.max_record_bytes);
  options.properties = config.kafka.properties;
  for (const auto& [key, value] : config.kafka.consumer_properties) options.properties[key] = value;
  return options;
}

connectors::KafkaProducerOptions ProducerOptions(const config::VipsdConfig& config,
                                                 const std::string& bootstrap_servers) {
  connectors::KafkaProducerOptions options;
  options.bootstrap_servers = bootstrap_servers;
  options.client_id = config.kafka.client_id;
  options.message_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(config.publish_timeout_seconds * 1000));
  options.properties = config.kafka.properties;
  for (const auto& [key, value] : config.kafka.producer_properties) options.properties[key] = value;
  return options;
}

// A reader of a whole one-partition topic (ledger, work) with the kafka.*
// and consumer properties.
connectors::KafkaPartitionReaderOptions ReaderOptions(const config::VipsdConfig& config,
                                                      const std::string& bootstrap_servers,
                                                      const std::string& topic,
                                                      std::chrono::milliseconds timeout) {
  connectors::KafkaPartitionReaderOptions options;
  options.bootstrap_servers = bootstrap_servers;
  options.topic = topic;
  options.client_id = config.kafka.client_id;
  options.properties = config.kafka.properties;
  for (const auto& [key, value] : config.kafka.consumer_properties) options.properties[key] = value;
  options.timeout = timeout;
  return options;
}

// The configuration key a librdkafka property named in `message` came from
// (the client-specific map wins, as it does when the options are built).
std::string PropertyKey(const config::VipsdConfig& config, std::string_view message,
                        const std::map<std::string, std::string>& specific,
                        const std::string& specific_key) {
  // connectors::kafka_internal::SetProperty quotes the property name.
  auto named = [&](const std::string& name) {
    return message.find("'" + name + "'") != std::string_view::npos;
  };
  for (const auto& [name, value] : specific) {
    if (named(name)) return specific_key + "." + name;
  }
  for (const auto& [name, value] : config.kafka.properties) {
    if (named(name)) return "kafka.properties." + name;
  }
  return "kafka";
}

Status Located(const config::VipsdConfig& config, const std::string& key, const Status& status) {
  // The entry's own line, else its map's (property names contain dots).
  int line = config.line_of(key);
  for (const char* map : {"kafka.consumer_properties", "kafka.producer_properties",
                          "kafka.properties"}) {
    if (line == 0 && key.rfind(map, 0) == 0) line = config.line_of(map);
  }
  if (line == 0) line = config.line_of("kafka");
  return InvalidArgumentError(config::KeyWhere(config.file, line, key) +
                              std::string(status.message()));
}

}  // namespace

Status CheckKafkaClients(const config::VipsdConfig& config) {
  // The broker list is not contacted; a placeholder stands in for the
  // embedded cluster's, which exists only once the daemon runs.
  const std::string bootstrap =
      config.kafka.bootstrap_servers.empty() ? "localhost:9092" : config.kafka.bootstrap_servers;
  connectors::KafkaSourceOptions source_options = SourceOptions(config, bootstrap);
  // A federated aggregator reads no input topic; its consumer properties
  // still configure the work topic's reader, so they are checked with a
  // stand-in topic name.
  if (source_options.topics.empty() &&
      config.federation.role == config::FederationRole::kAggregator) {
    source_options.topics = {config.work_topic};
  }
  const Status source = connectors::KafkaSource::CheckOptions(source_options);
  if (!source.ok()) {
    return Located(config,
                   PropertyKey(config, source.message(), config.kafka.consumer_properties,
                               "kafka.consumer_properties"),
                   source);
  }
  const Status producer =
      connectors::KafkaProducer::CheckOptions(ProducerOptions(config, bootstrap));
  if (!producer.ok()) {
    return Located(config,
                   PropertyKey(config, producer.message(), config.kafka.producer_properties,
                               "kafka.producer_properties"),
                   producer);
  }
  return Status::Ok();
}

std::vector<std::string> KafkaClientWarnings(const config::VipsdConfig& config) {
  std::vector<std::string> warnings;
  const std::string bootstrap =
      config.kafka.bootstrap_servers.empty() ? "localhost:9092" : config.kafka.bootstrap_servers;
  const auto max_message_bytes =
      connectors::KafkaProducer::MaxMessageBytes(ProducerOptions(config, bootstrap));
  if (!max_message_bytes.ok()) return warnings;  // CheckKafkaClients reports it
  const size_t room = connectors::DeadLetterValueRoom(*max_message_bytes);
  if (static_cast<uint64_t>(config.max_record_bytes) > room) {
    warnings.push_back(
        config::KeyWhere(config, "source.max_record_bytes") + "warning: " + std::to_string(config.max_record_bytes) +
        " bytes is more than a dead letter can carry whole: the producer's message.max.bytes " +
        std::to_string(*max_message_bytes) + " leaves " + std::to_string(room) +
        " bytes for a record's key and value, so a rejected record above that is "
        "dead-lettered cut to it (header vipsd-payload-truncated); to keep them whole, raise "
        "kafka.producer_properties.message.max.bytes (and the dead-letter topic's "
        "max.message.bytes) or lower source.max_record_bytes");
  }
  return warnings;
}

namespace {

// Refuses a compacted input topic (a window read again after a restart or a
// takeover must be the window that was stepped); warns about a topic whose
// records the timestamp policy would dead-letter.
Status CheckInputTopicConfigs(connectors::KafkaLogObserver& observer,
                              const config::VipsdConfig& config) {
  auto described = observer.TopicConfigs();
  if (!described.ok()) {
    // librdkafka's mock cluster has no DescribeConfigs; a broker that
    // cannot answer now is asked again at the next start.
    Log(LogLevel::kInfo, "kafka",
        "the input topics' configuration could not be read, so cleanup.policy and "
        "message.timestamp.type were not checked: " + described.status().ToString());
    return Status::Ok();
  }
  for (const auto& [topic, configs] : *described) {
    const auto policy = configs.find("cleanup.policy");
    if (policy != configs.end() && policy->second.find("compact") != std::string::npos) {
      return FailedPreconditionError(
          config::KeyWhere(config, "source.topics") + "topic " + topic + " has cleanup.policy=" + policy->second +
          ": compaction removes records from a partition's past, so a window read again after "
          "a restart or a takeover would not be the window that was stepped; input topics "
          "need cleanup.policy=delete");
    }
    const auto type = configs.find("message.timestamp.type");
    if (config.source_timestamps == "log_append_time" && type != configs.end() &&
        type->second != "LogAppendTime") {
      Log(LogLevel::kWarning, "kafka",
          "topic " + topic + " has message.timestamp.type=" + type->second +
              ": under source.timestamps: log_append_time its records are dead-lettered as "
              "untrusted_timestamp; set the topic's message.timestamp.type=LogAppendTime");
    }
  }
  return Status::Ok();
}

}  // namespace

StatusOr<std::unique_ptr<InputSource>> NewKafkaInput(const config::VipsdConfig& config,
                                                     const std::string& bootstrap_servers,
                                                     ResumeOffsetFn resume, Metrics* metrics) {
  connectors::KafkaLogObserverOptions observer_options;
  observer_options.bootstrap_servers = bootstrap_servers;
  observer_options.topics = config.source_topics;
  observer_options.client_id = config.kafka.client_id;
  observer_options.properties = config.kafka.properties;
  VIPSD_ASSIGN_OR_RETURN(auto observer,
                         connectors::KafkaLogObserver::Create(std::move(observer_options)));
  VIPSD_RETURN_IF_ERROR(CheckInputTopicConfigs(*observer, config));
  if (!config.work_topic.empty() && !config.work_partitions) {
    return std::unique_ptr<InputSource>(new KafkaObserverInput(std::move(observer), metrics));
  }
  connectors::KafkaSourceOptions options = SourceOptions(config, bootstrap_servers);
  options.resume_offset = std::move(resume);
  options.on_assigned = [](const std::vector<connectors::TopicPartitionRef>& partitions) {
    Log(LogLevel::kInfo, "kafka", "partitions assigned: " + std::to_string(partitions.size()));
  };
  options.on_revoked = [](const std::vector<connectors::TopicPartitionRef>& partitions) {
    Log(LogLevel::kInfo, "kafka", "partitions revoked: " + std::to_string(partitions.size()));
  };
  VIPSD_ASSIGN_OR_RETURN(auto source, connectors::KafkaSource::Create(std::move(options)));
  return std::unique_ptr<InputSource>(
      new KafkaInput(std::move(source), std::move(observer), metrics));
}

StatusOr<std::unique_ptr<OutputSink>> NewDaemonOutput(const config::VipsdConfig& config,
                                                      const std::string& bootstrap_servers) {
  VIPSD_ASSIGN_OR_RETURN(auto producer, connectors::KafkaProducer::Create(
                                            ProducerOptions(config, bootstrap_servers)));
  // The topics' leaders now, during schedule.start_delay_seconds, so that
  // the first release (or dead letter, or alert) does not spend its slot's
  // deadline on a metadata lookup. A failure only costs that lookup later.
  for (const std::string* topic : {&config.release_topic, &config.dead_letter_topic,
                                   &config.alert_topic}) {
    if (topic->empty()) continue;
    const Status warmed = producer->WarmTopic(*topic, std::chrono::seconds(2));
    if (!warmed.ok()) {
      Log(LogLevel::kWarning, "kafka", "could not prefetch the metadata of " + *topic + ": " +
                                           warmed.ToString());
    }
  }
  std::optional<connectors::ReleaseFileSink> file_sink;
  const std::string& directory = config.sink_type == config::SinkType::kFile
                                     ? config.sink_directory
                                     : config.sink_mirror_directory;
  if (!directory.empty()) {
    VIPSD_ASSIGN_OR_RETURN(auto sink, connectors::ReleaseFileSink::Open(directory));
    file_sink.emplace(std::move(sink));
  }
  return std::unique_ptr<OutputSink>(new DaemonOutput(config, std::move(producer), std::move(file_sink)));
}

namespace {

constexpr char kKindHeader[] = "vipsd-ledger-kind";
constexpr char kEpochHeader[] = "vipsd-ledger-epoch";
constexpr char kOwnerHeader[] = "vipsd-ledger-owner";

// The ledger log on partition 0 of a one-partition topic: entries keyed by
// the job, value = the ledger bytes (empty for a claim), the kind, epoch and
// owner in headers (docs/ledger_format.md "Ledger topic").
class KafkaLedgerLog final : public LedgerLog {
 public:
  KafkaLedgerLog(std::string topic, std::unique_ptr<connectors::KafkaProducer> producer,
                 std::unique_ptr<connectors::KafkaPartitionReader> reader,
                 std::chrono::milliseconds timeout)
      : topic_(std::move(topic)),
        producer_(std::move(producer)),
        reader_(std::move(reader)),
        timeout_(timeout) {}
  ~KafkaLedgerLog() override { (void)producer_->Close(std::chrono::milliseconds(5000)); }

  std::string Describe() const override { return "ledger topic " + topic_ + " partition 0"; }

  StatusOr<std::pair<int64_t, int64_t>> Bounds() override {
    if (!one_partition_checked_) {  // once: Bounds runs before every release
      VIPSD_ASSIGN_OR_RETURN(const int partitions, reader_->PartitionCount());
      if (partitions != 1) {
        return FailedPreconditionError(
            "state.ledger_topic " + topic_ + " has " + std::to_string(partitions) +
            " partitions; the ledger of record needs a topic with exactly one (its order "
            "decides which process owns the budget)");
      }
      one_partition_checked_ = true;
    }
    return reader_->Bounds();
  }

  StatusOr<std::vector<LedgerLogEntry>> Read(int64_t from, int64_t to) override {
    auto read = reader_->Read(from, to);
    // The ledger is read when a process claims, commits or checks it, not
    // continuously: between reads the client stops fetching, so that the
    // read-back of the next commit and the watermark check before a release
    // do not wait behind an empty fetch the broker holds (a failed pause
    // only leaves it fetching).
    (void)reader_->Pause();
    VIPSD_ASSIGN_OR_RETURN(auto messages, std::move(read));
    std::vector<LedgerLogEntry> entries;
    entries.reserve(messages.size());
    for (auto& m : messages) {
      LedgerLogEntry entry;
      entry.offset = m.offset;
      entry.key = std::move(m.key);
      std::string kind, epoch;
      for (auto& [name, value] : m.headers) {
        if (name == kKindHeader) kind = value;
        if (name == kEpochHeader) epoch = value;
        if (name == kOwnerHeader) entry.owner = value;
      }
      auto bad = [&](const std::string& what) {
        return DataLossError(Describe() + " offset " + std::to_string(m.offset) + ": " + what +
                             " (every message of a ledger topic must be a vipsd ledger entry)");
      };
      if (kind == "claim") {
        entry.kind = LedgerLogEntry::Kind::kClaim;
      } else if (kind == "state") {
        entry.kind = LedgerLogEntry::Kind::kState;
      } else {
        return bad("header " + std::string(kKindHeader) + " is not claim or state");
      }
      if (epoch.empty() || epoch.size() > 15 ||
          epoch.find_first_not_of("0123456789") != std::string::npos) {
        return bad("header " + std::string(kEpochHeader) + " is not a decimal counter");
      }
      entry.epoch = std::stoull(epoch);  // ≤ kMaxLedgerEpoch: 15 digits
      if (!IsLowerHex(entry.owner, 32)) {
        return bad("header " + std::string(kOwnerHeader) + " is not 32 lowercase hex");
      }
      entry.ledger = std::move(m.value);
      entries.push_back(std::move(entry));
    }
    return entries;
  }

  StatusOr<int64_t> Append(const LedgerLogEntry& entry) override {
    connectors::OutMessage message;
    message.topic = topic_;
    message.partition = 0;
    message.key = entry.key;
    message.value = entry.ledger;
    message.headers = {
        {kKindHeader, entry.kind == LedgerLogEntry::Kind::kClaim ? "claim" : "state"},
        {kEpochHeader, std::to_string(entry.epoch)},
        {kOwnerHeader, entry.owner}};
    int64_t offset = -1;
    VIPSD_RETURN_IF_ERROR(producer_->ProduceAndWait(std::span(&message, 1), timeout_, &offset));
    if (offset < 0) return UnavailableError(Describe() + ": the broker returned no offset");
    return offset;
  }

 private:
  std::string topic_;
  std::unique_ptr<connectors::KafkaProducer> producer_;
  std::unique_ptr<connectors::KafkaPartitionReader> reader_;
  std::chrono::milliseconds timeout_;
  bool one_partition_checked_ = false;
};

}  // namespace

connectors::KafkaProducerOptions WaitedAppendProducerOptions(
    const config::VipsdConfig& config, const std::string& bootstrap_servers) {
  connectors::KafkaProducerOptions options = ProducerOptions(config, bootstrap_servers);
  if (options.properties.count("linger.ms") == 0 &&
      options.properties.count("queue.buffering.max.ms") == 0) {
    options.properties["linger.ms"] = "0";
  }
  return options;
}

StatusOr<std::unique_ptr<LedgerReplica>> NewKafkaLedgerReplica(
    const config::VipsdConfig& config, const std::string& bootstrap_servers) {
  const auto timeout = std::chrono::milliseconds(
      static_cast<int64_t>(std::ceil(config.publish_timeout_seconds * 1000)));
  connectors::KafkaProducerOptions producer_options =
      WaitedAppendProducerOptions(config, bootstrap_servers);
  // A ledger is ~20 KB of hex floats (the RDP orders) that zstd shrinks
  // about 5x; the topic keeps every entry for the life of the job.
  if (producer_options.properties.count("compression.type") == 0 &&
      producer_options.properties.count("compression.codec") == 0) {
    producer_options.properties["compression.type"] = "zstd";
  }
  VIPSD_ASSIGN_OR_RETURN(auto producer,
                         connectors::KafkaProducer::Create(std::move(producer_options)));
  VIPSD_ASSIGN_OR_RETURN(auto reader,
                         connectors::KafkaPartitionReader::Create(ReaderOptions(
                             config, bootstrap_servers, config.ledger_topic, timeout)));
  return LedgerReplica::Create(
      std::make_unique<KafkaLedgerLog>(config.ledger_topic, std::move(producer), std::move(reader),
                                       timeout),
      config.ledger_key);
}

namespace {

// state.work_topic (daemon/io/work_exchange.h): plans on partition 0, partial
// sums on partition 1; a process reads the partition its role needs.
class KafkaWorkExchange final : public WorkExchange {
 public:
  KafkaWorkExchange(std::string topic, std::string job,
                    std::unique_ptr<connectors::KafkaProducer> producer,
                    std::unique_ptr<connectors::KafkaPartitionReader> reader,
                    std::chrono::milliseconds timeout, int64_t position)
      : topic_(std::move(topic)),
        job_(std::move(job)),
        producer_(std::move(producer)),
        reader_(std::move(reader)),
        timeout_(timeout),
        position_(position) {}
  ~KafkaWorkExchange() override { (void)producer_->Close(std::chrono::milliseconds(5000)); }

  std::string Describe() const override {
    return "work topic " + topic_ + " partition " + std::to_string(reader_->options().partition);
  }

  StatusOr<int64_t> Append(const std::string& bytes) override {
    VIPSD_ASSIGN_OR_RETURN(const WorkMessageKind kind, WorkMessageKindOf(bytes));
    connectors::OutMessage message;
    message.topic = topic_;
    message.partition = OnPlanLog(kind) ? kWorkPlanPartition : kWorkPartialPartition;
    message.key = job_;
    message.value = bytes;
    int64_t offset = -1;
    VIPSD_RETURN_IF_ERROR(producer_->ProduceAndWait(std::span(&message, 1), timeout_, &offset));
    if (offset < 0) {
      return UnavailableError("work topic " + topic_ + ": the broker returned no offset");
    }
    return offset;
  }

  StatusOr<std::vector<std::pair<int64_t, std::string>>> Poll(
      std::chrono::milliseconds wait) override {
    using std::chrono::milliseconds;
    const auto until = std::chrono::steady_clock::now() + wait;
    std::vector<std::pair<int64_t, std::string>> out;
    auto keep = [&](std::vector<connectors::ReadMessage>& messages) {
      for (auto& m : messages) {
        if (m.key == job_) out.emplace_back(m.offset, std::move(m.value));
      }
    };
    for (;;) {
      // What the client fetched, or fetches meanwhile, first: a plan or a
      // partial returns as soon as it is there. The log's bounds are asked
      // only once nothing came: a watermark request waits behind the fetch
      // in flight on the same connection (up to fetch.wait.max.ms; ~10 ms
      // measured on the mock cluster), and was asked before every read.
      const auto left = std::chrono::duration_cast<milliseconds>(
          until - std::chrono::steady_clock::now());
      VIPSD_ASSIGN_OR_RETURN(auto messages,
                             reader_->ReadAvailable(position_, std::max(left, milliseconds(1))));
      if (!messages.empty()) {
        position_ = messages.back().offset + 1;
        keep(messages);
        if (!out.empty() || std::chrono::steady_clock::now() >= until) return out;
        continue;  // another job's messages: read on
      }
      // Nothing new: retention may have passed the position (a partial or
      // plan taken before it was read counts as read: the log start), and
      // what the log holds beyond it is read whole.
      VIPSD_ASSIGN_OR_RETURN(const auto bounds, reader_->Bounds());
      position_ = std::max(position_, bounds.first);
      if (bounds.second > position_) {
        VIPSD_ASSIGN_OR_RETURN(messages, reader_->Read(position_, bounds.second));
        position_ = bounds.second;
        keep(messages);
      }
      if (!out.empty() || std::chrono::steady_clock::now() >= until) return out;
    }
  }

  int64_t read_position() const override { return position_; }

  // Between steps' reads the client sends no idle fetches (~100 a second
  // with the reader's 10 ms fetch wait), and the next Poll does not wait
  // behind an empty fetch the broker holds.
  void Rest() override { (void)reader_->Pause(); }

  StatusOr<bool> HoldsPlan(int64_t offset) override {
    VIPSD_ASSIGN_OR_RETURN(const auto bounds, reader_->BoundsOf(kWorkPlanPartition));
    return offset >= bounds.first && offset < bounds.second;
  }

  StatusOr<std::string> ReadAt(int64_t offset) override {
    VIPSD_ASSIGN_OR_RETURN(const auto bounds, reader_->Bounds());
    if (offset < bounds.first || offset >= bounds.second) {
      return NotFoundError(Describe() + " no longer holds offset " + std::to_string(offset));
    }
    VIPSD_ASSIGN_OR_RETURN(auto messages, reader_->Read(offset, offset + 1));
    for (auto& m : messages) {
      if (m.offset == offset) return std::move(m.value);
    }
    return NotFoundError(Describe() + " holds no message at offset " + std::to_string(offset));
  }

 private:
  std::string topic_;
  std::string job_;
  std::unique_ptr<connectors::KafkaProducer> producer_;
  std::unique_ptr<connectors::KafkaPartitionReader> reader_;
  std::chrono::milliseconds timeout_;
  int64_t position_;
};

}  // namespace

StatusOr<std::unique_ptr<WorkExchange>> NewKafkaWorkExchange(
    const config::VipsdConfig& config, const std::string& bootstrap_servers, WorkRole role) {
  const auto timeout = std::chrono::milliseconds(
      static_cast<int64_t>(std::ceil(config.publish_timeout_seconds * 1000)));
  connectors::KafkaProducerOptions producer_options =
      WaitedAppendProducerOptions(config, bootstrap_servers);
  // A plan carries the model and a partial sum can be dense (4 MB at
  // K·V = 500,000): larger than librdkafka's 1 MB default. The topic needs
  // max.message.bytes to match on a real broker (README "Several instances").
  if (producer_options.properties.count("message.max.bytes") == 0) {
    producer_options.properties["message.max.bytes"] = std::to_string(kWorkMessageMaxBytes);
  }
  VIPSD_ASSIGN_OR_RETURN(auto producer,
                         connectors::KafkaProducer::Create(std::move(producer_options)));
  connectors::KafkaPartitionReaderOptions reader_options =
      ReaderOptions(config, bootstrap_servers, config.work_topic, timeout);
  // A worker reads the plans, the coordinator the partial sums: no process
  // reads what it does not need (a worker would otherwise read every
  // partition's partial of every step).
  reader_options.partition =
      role == WorkRole::kCoordinator ? kWorkPartialPartition : kWorkPlanPartition;
  if (reader_options.properties.count("fetch.max.bytes") == 0) {
    reader_options.properties["fetch.max.bytes"] = std::to_string(kWorkMessageMaxBytes);
  }
  VIPSD_ASSIGN_OR_RETURN(auto reader,
                         connectors::KafkaPartitionReader::Create(std::move(reader_options)));
  VIPSD_ASSIGN_OR_RETURN(const int partitions, reader->PartitionCount());
  if (partitions != 2) {
    return FailedPreconditionError("state.work_topic " + config.work_topic + " has " +
                                   std::to_string(partitions) +
                                   " partition(s); the work topic needs exactly two (0: plans, "
                                   "1: partial sums)");
  }
  VIPSD_ASSIGN_OR_RETURN(const auto bounds, reader->Bounds());
  // The producer learns the topic's leaders now, not at its first append: a
  // federated plan states when it was issued, and its holders' shares leave
  // at that time plus their delay (daemon/step/holder.h).
  // Not fatal: without it the first append pays the lookup.
  if (const Status warmed = producer->WarmTopic(config.work_topic, timeout); !warmed.ok()) {
    Log(LogLevel::kWarning, "kafka", "work topic " + config.work_topic +
                                         ": its leaders could not be looked up ahead: " +
                                         warmed.ToString());
  }
  return std::unique_ptr<WorkExchange>(new KafkaWorkExchange(
      config.work_topic, config.ledger_key, std::move(producer), std::move(reader), timeout,
      bounds.second));
}

}  // namespace vipsd::daemon
