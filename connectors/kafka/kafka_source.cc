#include "connectors/kafka/kafka_source.h"

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafkacpp.h>

#include <algorithm>
#include <set>
#include <string_view>
#include <thread>

#include "connectors/kafka/kafka_common.h"
#include "core/base/log.h"

namespace vipsd::connectors {
namespace {

using kafka_internal::ErrorDescription;
using kafka_internal::ErrorName;

constexpr std::string_view kComponent = "kafka-source";
constexpr std::chrono::seconds kLogThrottle{10};
constexpr char kWhat[] = "kafka source";
constexpr int kCloseCommitRetries = 8;
constexpr std::chrono::milliseconds kCloseCommitBackoff{250};
// Leaving the group before close(): how long to serve the revocation.
constexpr std::chrono::seconds kCloseLeaveTimeout{3};
// The first librdkafka release whose cooperative-sticky assignor survives
// being destroyed before its first assignment (confluentinc/librdkafka#4312,
// fixed by #4381 in 2.3.0); older ones abort the process in
// rd_kafka_sticky_assignor_state_destroy.
constexpr int kStickyDestroyFixedVersion = 0x020300ff;

bool NamesCooperativeSticky(const std::map<std::string, std::string>& properties) {
  const auto it = properties.find("partition.assignment.strategy");
  return it != properties.end() && it->second.find("cooperative-sticky") != std::string::npos;
}

bool IsAuthorizationError(RdKafka::ErrorCode code) {
  return code == RdKafka::ERR_TOPIC_AUTHORIZATION_FAILED ||
         code == RdKafka::ERR_GROUP_AUTHORIZATION_FAILED ||
         code == RdKafka::ERR_CLUSTER_AUTHORIZATION_FAILED;
}

// Owns a vector of TopicPartition* (librdkafka's C++ API hands out raw
// pointers that the caller must delete).
struct PartitionList {
  std::vector<RdKafka::TopicPartition*> items;
  PartitionList() = default;
  PartitionList(const PartitionList&) = delete;
  PartitionList& operator=(const PartitionList&) = delete;
  ~PartitionList() { RdKafka::TopicPartition::destroy(items); }
};

std::vector<TopicPartitionRef> Refs(const std::vector<RdKafka::TopicPartition*>& partitions) {
  std::vector<TopicPartitionRef> refs;
  refs.reserve(partitions.size());
  for (const RdKafka::TopicPartition* tp : partitions) {
    refs.push_back({tp->topic(), tp->partition()});
  }
  return refs;
}

std::string Describe(const TopicPartitionRef& ref) {
  return ref.topic + "[" + std::to_string(ref.partition) + "]";
}

}  // namespace

// All of librdkafka's callbacks for one source. They run on the ingest thread
// (rebalance, offset commit, error events are served by consume/close/
// commitSync) except log events, which librdkafka may emit from its own
// threads and which only touch vipsd::Log.
class KafkaSource::Callbacks : public kafka_internal::LogEventCb,
                               public RdKafka::RebalanceCb,
                               public RdKafka::OffsetCommitCb {
 public:
  explicit Callbacks(KafkaSource* source)
      : LogEventCb(std::string(kComponent)), source_(source) {}

  void rebalance_cb(RdKafka::KafkaConsumer* consumer, RdKafka::ErrorCode err,
                    std::vector<RdKafka::TopicPartition*>& partitions) override {
    source_->OnRebalance(consumer, static_cast<int>(err), partitions);
  }

  void offset_commit_cb(RdKafka::ErrorCode err,
                        std::vector<RdKafka::TopicPartition*>& offsets) override {
    // _NO_OFFSET: nothing was stored since the last commit.
    if (err == RdKafka::ERR_NO_ERROR || err == RdKafka::ERR__NO_OFFSET) {
      for (const RdKafka::TopicPartition* tp : offsets) {
        if (tp->err() != RdKafka::ERR_NO_ERROR) {
          source_->CountError("OFFSET_COMMIT:" + ErrorName(tp->err()),
                              "offset commit failed for " +
                                  Describe({tp->topic(), tp->partition()}) + ": " +
                                  ErrorDescription(tp->err()));
        }
      }
      return;
    }
    source_->CountError("OFFSET_COMMIT:" + ErrorName(err),
                        "offset commit failed: " + ErrorDescription(err));
  }

 protected:
  void OnError(RdKafka::ErrorCode code, bool fatal, const std::string& text) override {
    if (fatal) {
      source_->RecordFatal("fatal librdkafka error " + ErrorName(code) + ": " + text);
      return;
    }
    source_->CountError(ErrorName(code), ErrorName(code) + ": " + text);
  }

 private:
  KafkaSource* source_;
};

namespace {

// The options' own checks, then the librdkafka configuration they build.
StatusOr<std::unique_ptr<RdKafka::Conf>> BuildSourceConf(const KafkaSourceOptions& options) {
  if (options.bootstrap_servers.empty()) {
    return InvalidArgumentError("kafka source: bootstrap_servers must not be empty");
  }
  if (options.topics.empty()) {
    return InvalidArgumentError("kafka source: at least one topic is required");
  }
  std::set<std::string> distinct;
  for (const std::string& topic : options.topics) {
    if (topic.empty()) return InvalidArgumentError("kafka source: topic names must not be empty");
    if (!distinct.insert(topic).second) {
      return InvalidArgumentError("kafka source: topic " + topic + " is listed twice");
    }
  }
  if (options.group_id.empty()) {
    return InvalidArgumentError("kafka source: group_id must not be empty");
  }
  if (options.start_position != "earliest" && options.start_position != "latest") {
    return InvalidArgumentError("kafka source: start_position must be \"earliest\" or "
                                "\"latest\", got \"" + options.start_position + "\"");
  }
  if (options.max_record_bytes < 1) {
    return InvalidArgumentError("kafka source: max_record_bytes must be >= 1");
  }
  if (options.resume_clamp_timeout.count() < 0) {
    return InvalidArgumentError("kafka source: resume_clamp_timeout must be >= 0");
  }
  const KafkaSourceOptions& o = options;
  std::unique_ptr<RdKafka::Conf> conf(RdKafka::Conf::create(RdKafka::Conf::CONF_GLOBAL));
  const kafka_internal::ManagedProperty managed[] = {
      {"bootstrap.servers", o.bootstrap_servers},
      {"group.id", o.group_id},
      {"client.id", o.client_id},
      {"auto.offset.reset", o.start_position},
      {"enable.auto.offset.store", "false"},
      {"enable.partition.eof", "true"},
      // Every record in offset order as it is appended, committed or not:
      // under read_committed, a record appended after a transaction that
      // stays open would be readable only when it ends, so one record (the
      // open transaction's) would move others into a later slot. Records of
      // aborted transactions are input like any other (docs/privacy_accounting.md
      // §6a); the cut bound is the high watermark (KafkaLogObserver).
      {"isolation.level", "read_uncommitted"},
  };
  VIPSD_RETURN_IF_ERROR(kafka_internal::ApplyProperties(*conf, kWhat, managed, o.properties));
  return conf;
}

}  // namespace

Status KafkaSource::CheckOptions(const KafkaSourceOptions& options) {
  return BuildSourceConf(options).status();
}

StatusOr<std::unique_ptr<KafkaSource>> KafkaSource::Create(KafkaSourceOptions options) {
  VIPSD_ASSIGN_OR_RETURN(std::unique_ptr<RdKafka::Conf> conf, BuildSourceConf(options));
  std::unique_ptr<KafkaSource> source(new KafkaSource(std::move(options)));
  const KafkaSourceOptions& o = source->options_;
  std::string errstr;
  Callbacks* callbacks = source->callbacks_.get();
  if (conf->set("event_cb", static_cast<RdKafka::EventCb*>(callbacks), errstr) !=
          RdKafka::Conf::CONF_OK ||
      conf->set("rebalance_cb", static_cast<RdKafka::RebalanceCb*>(callbacks), errstr) !=
          RdKafka::Conf::CONF_OK ||
      conf->set("offset_commit_cb", static_cast<RdKafka::OffsetCommitCb*>(callbacks), errstr) !=
          RdKafka::Conf::CONF_OK) {
    return InternalError("kafka source: cannot install callbacks: " + errstr);
  }
  source->consumer_.reset(RdKafka::KafkaConsumer::create(conf.get(), errstr));
  if (source->consumer_ == nullptr) {
    return InvalidArgumentError("kafka source: cannot create consumer: " + errstr);
  }
  const RdKafka::ErrorCode err = source->consumer_->subscribe(o.topics);
  if (err != RdKafka::ERR_NO_ERROR) {
    const Status status =
        InvalidArgumentError("kafka source: cannot subscribe: " + ErrorDescription(err));
    (void)source->Close();
    return status;
  }
  std::string topic_list;
  for (const std::string& topic : o.topics) topic_list += (topic_list.empty() ? "" : ",") + topic;
  Log(LogLevel::kInfo, kComponent,
      "subscribed to " + topic_list + " as group " + o.group_id + " via " + o.bootstrap_servers);
  return source;
}

KafkaSource::KafkaSource(KafkaSourceOptions options)
    : options_(std::move(options)), callbacks_(std::make_unique<Callbacks>(this)) {}

KafkaSource::~KafkaSource() { (void)Close(); }

void KafkaSource::RecordFatal(const std::string& text) {
  Log(LogLevel::kError, kComponent, text);
  if (fatal_.ok()) {
    fatal_ = FailedPreconditionError("kafka source: " + text +
                                     " (the consumer must be recreated)");
  }
}

void KafkaSource::CountError(const std::string& kind, const std::string& log_text) {
  MutexLock lock(&stats_mutex_);
  ++stats_.errors_by_kind[kind];
  const auto now = std::chrono::steady_clock::now();
  auto [it, first] = log_throttle_.try_emplace(kind, now, 0);
  if (!first && now - it->second.first < kLogThrottle) {
    ++it->second.second;
    return;
  }
  std::string line = log_text;
  if (it->second.second > 0) {
    line += " (" + std::to_string(it->second.second) + " more " + kind + " since the last report)";
  }
  it->second = {now, 0};
  Log(LogLevel::kWarning, kComponent, line);
}

int64_t KafkaSource::ClampResumeOffset(const TopicPartitionRef& ref, int64_t offset) {
  int64_t low = 0;
  int64_t high = 0;
  const RdKafka::ErrorCode err = consumer_->query_watermark_offsets(
      ref.topic, ref.partition, &low, &high,
      static_cast<int>(std::min<int64_t>(options_.resume_clamp_timeout.count(), INT32_MAX)));
  if (err != RdKafka::ERR_NO_ERROR) {
    CountError(ErrorName(err), "cannot query watermarks of " + Describe(ref) +
                                   " to check resume offset " + std::to_string(offset) + ": " +
                                   ErrorDescription(err) +
                                   "; using it unchecked (out of range falls back to " +
                                   options_.start_position + ")");
    return offset;
  }
  if (offset < low) {
    Log(LogLevel::kWarning, kComponent,
        "resume offset " + std::to_string(offset) + " of " + Describe(ref) +
            " is below the low watermark " + std::to_string(low) +
            " (deleted by retention); starting at " + std::to_string(low));
    return low;
  }
  if (offset > high) {
    Log(LogLevel::kWarning, kComponent,
        "resume offset " + std::to_string(offset) + " of " + Describe(ref) +
            " is above the high watermark " + std::to_string(high) + "; starting at " +
            std::to_string(high));
    return high;
  }
  return offset;
}

void KafkaSource::RecordCommittedOffsets(RdKafka::KafkaConsumer* consumer,
                                         const std::vector<TopicPartitionRef>& refs) {
  if (refs.empty()) return;
  PartitionList query;
  for (const TopicPartitionRef& ref : refs) {
    query.items.push_back(RdKafka::TopicPartition::create(ref.topic, ref.partition));
  }
  const RdKafka::ErrorCode err = consumer->committed(
      query.items, static_cast<int>(options_.resume_clamp_timeout.count()));
  if (err != RdKafka::ERR_NO_ERROR) {
    // Not fatal: records re-read below the committed offsets are then
    // dead-lettered again (at-least-once, as before).
    CountError(ErrorName(err), "cannot read the group's committed offsets: " +
                                   ErrorDescription(err) +
                                   "; rejected records re-read may be dead-lettered again");
    return;
  }
  for (const RdKafka::TopicPartition* partition : query.items) {
    if (partition->err() != RdKafka::ERR_NO_ERROR || partition->offset() < 0) continue;
    committed_at_assign_[{partition->topic(), partition->partition()}] = partition->offset();
  }
}

void KafkaSource::OnRebalance(RdKafka::KafkaConsumer* consumer, int err_code,
                              std::vector<RdKafka::TopicPartition*>& partitions) {
  const auto err = static_cast<RdKafka::ErrorCode>(err_code);
  const bool cooperative = consumer->rebalance_protocol() == "COOPERATIVE";
  const std::vector<TopicPartitionRef> refs = Refs(partitions);
  {
    MutexLock lock(&stats_mutex_);
    ++stats_.rebalances;
  }
  if (err == RdKafka::ERR__ASSIGN_PARTITIONS && closed_) {
    // A rebalance that began before Close() left the group ends with an
    // assignment while Close() waits for the revocation: take nothing.
    // Assigned now, the partitions would have to be revoked inside close(),
    // where librdkafka 2.0 can hang for ever (see Close(); seen on Apache
    // Kafka 4.1 in the shared failover harness: a fenced process that never
    // exited). The group gives them to the members that stay.
    if (cooperative) {
      std::unique_ptr<RdKafka::Error> error(consumer->incremental_assign(partitions));
      std::unique_ptr<RdKafka::Error> undo(consumer->incremental_unassign(partitions));
    } else {
      (void)consumer->unassign();
    }
    Log(LogLevel::kInfo, kComponent,
        "declined " + std::to_string(refs.size()) + " partition(s) assigned while closing");
    return;
  }
  if (err == RdKafka::ERR__ASSIGN_PARTITIONS) {
    AssignPartitions(consumer, cooperative, partitions, refs);
    return;
  }

  if (err == RdKafka::ERR__REVOKE_PARTITIONS) {
    RevokePartitions(consumer, cooperative, partitions, refs);
    return;
  }

  // Any other error: librdkafka requires the assignment to be cleared.
  CountError(ErrorName(err), "rebalance error: " + ErrorDescription(err));
  if (cooperative) {
    PartitionList current;
    if (consumer->assignment(current.items) == RdKafka::ERR_NO_ERROR) {
      std::unique_ptr<RdKafka::Error> error(consumer->incremental_unassign(current.items));
    }
  } else {
    (void)consumer->unassign();
  }
  assignment_.clear();
  positions_.clear();
  {
    MutexLock lock(&stats_mutex_);
    stats_.assigned_now = 0;
  }
  UpdateLag();
}

void KafkaSource::AssignPartitions(RdKafka::KafkaConsumer* consumer, bool cooperative,
                                   std::vector<RdKafka::TopicPartition*>& partitions,
                                   const std::vector<TopicPartitionRef>& refs) {
  assigned_once_ = true;
  int64_t resumed = 0;
  // Where the group's committed offsets stand: a partition that resumes
  // below them re-reads records some member already pooled or
  // dead-lettered (SourceMessage::below_committed).
  if (options_.resume_offset) RecordCommittedOffsets(consumer, refs);
  if (options_.resume_offset) {
    for (size_t i = 0; i < partitions.size(); ++i) {
      const std::optional<int64_t> resume =
          options_.resume_offset(refs[i].topic, refs[i].partition);
      if (!resume.has_value()) continue;
      partitions[i]->set_offset(ClampResumeOffset(refs[i], std::max<int64_t>(*resume, 0)));
      ++resumed;
    }
  }
  RdKafka::ErrorCode assign_err = RdKafka::ERR_NO_ERROR;
  std::string assign_text;
  if (cooperative) {
    std::unique_ptr<RdKafka::Error> error(consumer->incremental_assign(partitions));
    if (error != nullptr) {
      assign_err = error->code();
      assign_text = error->str();
    }
  } else {
    assign_err = consumer->assign(partitions);
  }
  if (assign_err != RdKafka::ERR_NO_ERROR) {
    CountError(ErrorName(assign_err), "partition assignment failed: " +
                                          ErrorDescription(assign_err) + " " + assign_text);
    return;
  }
  if (!cooperative) assignment_.clear();
  assignment_.insert(refs.begin(), refs.end());
  // Re-apply the wanted pause state: librdkafka keeps a partition's pause
  // flag across unassign/assign, whatever was asked while it was away.
  {
    PartitionList pause_list, resume_list;
    for (const TopicPartitionRef& ref : refs) {
      (paused_.count(ref) ? pause_list : resume_list)
          .items.push_back(RdKafka::TopicPartition::create(ref.topic, ref.partition));
    }
    if (!pause_list.items.empty()) (void)consumer->pause(pause_list.items);
    if (!resume_list.items.empty()) (void)consumer->resume(resume_list.items);
  }
  {
    MutexLock lock(&stats_mutex_);
    stats_.partitions_assigned += static_cast<int64_t>(refs.size());
    stats_.resume_offsets_applied += resumed;
    stats_.assigned_now = static_cast<int64_t>(assignment_.size());
  }
  // A cooperative rebalance often ends with an empty incremental
  // assignment for members that keep what they had: nothing to report.
  if (!refs.empty()) {
    std::string names;
    for (const TopicPartitionRef& ref : refs) names += " " + Describe(ref);
    Log(LogLevel::kInfo, kComponent,
        std::string(cooperative ? "incrementally " : "") + "assigned " +
            std::to_string(refs.size()) + " partition(s):" + names);
    if (options_.on_assigned) options_.on_assigned(refs);
  }
  UpdateLag();
}

void KafkaSource::RevokePartitions(RdKafka::KafkaConsumer* consumer, bool cooperative,
                                   std::vector<RdKafka::TopicPartition*>& partitions,
                                   const std::vector<TopicPartitionRef>& refs) {
  const bool lost = consumer->assignment_lost();
  if (!lost) {
    (void)CommitStored("on revoke");
  } else {
    Log(LogLevel::kWarning, kComponent,
        "assignment lost (e.g. session timed out): stored offsets of the lost partitions "
        "are not committed; their records will be read again");
  }
  if (options_.on_revoked && !refs.empty()) options_.on_revoked(refs);
  RdKafka::ErrorCode unassign_err = RdKafka::ERR_NO_ERROR;
  if (cooperative) {
    // Only what the consumer holds: partitions declined while closing
    // (above) are still in the group's assignment, which a leave revokes
    // whole, but no longer in the consumer's; unassigning one of them
    // fails (_INVALID_ARG) and librdkafka 2.0 then never finishes the
    // rebalance, so close() waits for ever (seen on Apache Kafka 4.1 with
    // cooperative-sticky: a member that never exited after SIGTERM).
    std::vector<RdKafka::TopicPartition*> held;
    PartitionList current;
    if (consumer->assignment(current.items) == RdKafka::ERR_NO_ERROR) {
      const std::vector<TopicPartitionRef> now = Refs(current.items);
      const std::set<TopicPartitionRef> holding(now.begin(), now.end());
      for (RdKafka::TopicPartition* tp : partitions) {
        if (holding.count({tp->topic(), tp->partition()}) > 0) held.push_back(tp);
      }
    } else {
      held = partitions;
    }
    if (held.size() != partitions.size()) {
      Log(LogLevel::kInfo, kComponent,
          std::to_string(partitions.size() - held.size()) +
              " revoked partition(s) were no longer held by this consumer (declined while "
              "closing); unassigning the " + std::to_string(held.size()) + " it holds");
    }
    std::unique_ptr<RdKafka::Error> error(consumer->incremental_unassign(held));
    if (error != nullptr) unassign_err = error->code();
  } else {
    unassign_err = consumer->unassign();
  }
  if (unassign_err != RdKafka::ERR_NO_ERROR) {
    CountError(ErrorName(unassign_err),
               "partition revocation failed: " + ErrorDescription(unassign_err));
  }
  if (cooperative) {
    for (const TopicPartitionRef& ref : refs) assignment_.erase(ref);
  } else {
    assignment_.clear();
  }
  for (const TopicPartitionRef& ref : refs) {
    positions_.erase(ref);
    committed_at_assign_.erase(ref);
  }
  {
    MutexLock lock(&stats_mutex_);
    stats_.partitions_revoked += static_cast<int64_t>(refs.size());
    stats_.assigned_now = static_cast<int64_t>(assignment_.size());
  }
  if (!refs.empty()) {
    Log(LogLevel::kInfo, kComponent,
        std::string(lost ? "lost " : "revoked ") + std::to_string(refs.size()) +
            " partition(s)");
  }
  UpdateLag();
}

StatusOr<std::vector<SourceMessage>> KafkaSource::Poll(size_t max_messages,
                                                       std::chrono::milliseconds timeout) {
  if (closed_) return FailedPreconditionError("kafka source: Poll after Close");
  if (!fatal_.ok()) return fatal_;
  if (max_messages < 1) return InvalidArgumentError("kafka source: max_messages must be >= 1");
  std::vector<SourceMessage> out;
  const auto deadline = std::chrono::steady_clock::now() + std::max(timeout, decltype(timeout){0});
  std::map<std::string, int64_t> by_topic;
  int64_t oversize = 0;
  Status result;
  while (out.size() < max_messages) {
    // Wait only for the first message; then drain what is already fetched.
    int wait_ms = 0;
    if (out.empty()) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      wait_ms = static_cast<int>(std::clamp<int64_t>(left.count(), 0, INT32_MAX));
    }
    std::unique_ptr<RdKafka::Message> message(consumer_->consume(wait_ms));
    if (!fatal_.ok()) {
      result = fatal_;
      break;
    }
    const RdKafka::ErrorCode err = message->err();
    if (err == RdKafka::ERR_NO_ERROR) {
      SourceMessage m = ToSourceMessage(*message);
      if (m.oversize) ++oversize;
      if (const auto position = positions_.find({m.topic, m.partition});
          position != positions_.end() && m.offset > position->second) {
        NoteGap(position->first, position->second, m.offset);
      }
      positions_[{m.topic, m.partition}] = m.offset + 1;
      ++by_topic[m.topic];
      out.push_back(std::move(m));
      continue;
    }
    if (err == RdKafka::ERR__TIMED_OUT) break;
    if (err == RdKafka::ERR__PARTITION_EOF) {
      // Everything below this offset has been returned (control records and
      // compaction gaps included); the daemon's cut check relies on it.
      const TopicPartitionRef ref{message->topic_name(), message->partition()};
      int64_t& end = reached_end_[ref];
      end = std::max(end, message->offset());
      if (out.empty() && std::chrono::steady_clock::now() >= deadline) break;
      continue;
    }
    if (err == RdKafka::ERR__FATAL) {
      std::string text;
      const RdKafka::ErrorCode original = consumer_->fatal_error(text);
      RecordFatal("fatal librdkafka error " + ErrorName(original) + ": " + text);
      result = fatal_;
      break;
    }
    const std::string where =
        message->topic_name().empty() ? std::string() : " (topic " + message->topic_name() + ")";
    if (IsAuthorizationError(err)) {
      CountError(ErrorName(err), "not authorized" + where + ": " + ErrorDescription(err));
      result = FailedPreconditionError("kafka source: not authorized" + where + " for group " +
                                       options_.group_id + ": " + ErrorDescription(err));
      break;
    }
    // message->errstr() is librdkafka's text for the error (broker, topic,
    // partition); the message carries no record content.
    CountError(ErrorName(err), ErrorName(err) + where + ": " + message->errstr());
    if (out.empty() && std::chrono::steady_clock::now() >= deadline) break;
  }
  {
    MutexLock lock(&stats_mutex_);
    for (const auto& [topic, count] : by_topic) stats_.messages_by_topic[topic] += count;
    stats_.oversize_messages += oversize;
  }
  UpdateLag();
  if (!result.ok()) {
    // Messages already taken from librdkafka are not stored: their offsets
    // are not committed, so they are read again after the restart.
    return result;
  }
  return out;
}

SourceMessage KafkaSource::ToSourceMessage(RdKafka::Message& message) const {
  SourceMessage m;
  m.topic = message.topic_name();
  m.partition = message.partition();
  m.offset = message.offset();
  const size_t key_bytes = message.key_len();
  size_t total = key_bytes + message.len();
  // Headers through the C API: it iterates without copying values.
  rd_kafka_headers_t* headers = nullptr;
  if (rd_kafka_message_headers(message.c_ptr(), &headers) != RD_KAFKA_RESP_ERR_NO_ERROR) {
    headers = nullptr;
  }
  const char* name = nullptr;
  const void* value = nullptr;
  size_t value_size = 0;
  for (size_t i = 0; headers != nullptr &&
                     rd_kafka_header_get_all(headers, i, &name, &value, &value_size) ==
                         RD_KAFKA_RESP_ERR_NO_ERROR;
       ++i) {
    total += std::string_view(name).size() + value_size;
  }
  m.oversize = total > options_.max_record_bytes;
  const RdKafka::MessageTimestamp stamp = message.timestamp();
  m.timestamp_ms = stamp.timestamp;
  m.timestamp_type =
      stamp.type == RdKafka::MessageTimestamp::MSG_TIMESTAMP_LOG_APPEND_TIME
          ? TimestampType::kLogAppendTime
      : stamp.type == RdKafka::MessageTimestamp::MSG_TIMESTAMP_CREATE_TIME
          ? TimestampType::kCreateTime
          : TimestampType::kNone;
  if (const auto committed = committed_at_assign_.find({m.topic, m.partition});
      committed != committed_at_assign_.end()) {
    m.below_committed = m.offset < committed->second;
  }
  if (key_bytes > 0 && key_bytes <= options_.max_record_bytes) {
    m.key.assign(static_cast<const char*>(message.key_pointer()), key_bytes);
  }
  if (!m.oversize) {
    if (message.len() > 0) {
      m.payload.assign(static_cast<const char*>(message.payload()), message.len());
    }
    for (size_t i = 0; headers != nullptr &&
                       rd_kafka_header_get_all(headers, i, &name, &value, &value_size) ==
                           RD_KAFKA_RESP_ERR_NO_ERROR;
         ++i) {
      m.headers.emplace_back(name, value == nullptr
                                       ? std::string()
                                       : std::string(static_cast<const char*>(value),
                                                     value_size));
    }
  }
  return m;
}

void KafkaSource::NoteGap(const TopicPartitionRef& ref, int64_t position, int64_t offset) {
  // A gap in the offsets returned is normal for transaction markers,
  // aborted records (read_committed) and compaction; only the part below the
  // log start left before it was read. The log start is librdkafka's cached
  // one, updated by the fetch response that brought this message.
  int64_t low = RdKafka::Topic::OFFSET_INVALID;
  int64_t high = RdKafka::Topic::OFFSET_INVALID;
  if (consumer_->get_watermark_offsets(ref.topic, ref.partition, &low, &high) !=
          RdKafka::ERR_NO_ERROR ||
      low <= position) {
    return;
  }
  const int64_t lost = std::min(low, offset) - position;
  {
    MutexLock lock(&stats_mutex_);
    stats_.lost_by_topic[ref.topic] += lost;
  }
  // Offsets and counts are stream volume (public), nothing of a record.
  Log(LogLevel::kWarning, kComponent,
      Describe(ref) + ": offsets " + std::to_string(position) + " to " +
          std::to_string(position + lost - 1) + " (" + std::to_string(lost) +
          " record(s)) left the log (retention or deleted records) before they were read; "
          "reading goes on at offset " + std::to_string(offset) +
          " (vipsd_records_lost_total counts them)");
}

void KafkaSource::UpdateLag() {
  if (consumer_ == nullptr) return;
  int64_t lag = 0;
  for (const TopicPartitionRef& ref : assignment_) {
    const auto position = positions_.find(ref);
    if (position == positions_.end()) continue;
    int64_t low = RdKafka::Topic::OFFSET_INVALID;
    int64_t high = RdKafka::Topic::OFFSET_INVALID;
    if (consumer_->get_watermark_offsets(ref.topic, ref.partition, &low, &high) !=
            RdKafka::ERR_NO_ERROR ||
        high < 0) {
      continue;
    }
    lag += std::max<int64_t>(0, high - position->second);
  }
  lag_.store(lag, std::memory_order_relaxed);
}

Status KafkaSource::StoreOffset(const std::string& topic, int32_t partition, int64_t offset) {
  if (closed_) return FailedPreconditionError("kafka source: StoreOffset after Close");
  if (offset < 0) {
    return InvalidArgumentError("kafka source: offset must be >= 0 for " +
                                Describe({topic, partition}));
  }
  if (assignment_.count({topic, partition}) == 0) {
    return FailedPreconditionError("kafka source: " + Describe({topic, partition}) +
                                   " is not assigned to this consumer (revoked by a "
                                   "rebalance); its new owner reads the record again");
  }
  PartitionList list;
  list.items.push_back(RdKafka::TopicPartition::create(topic, partition, offset + 1));
  RdKafka::ErrorCode err = consumer_->offsets_store(list.items);
  if (err == RdKafka::ERR_NO_ERROR) err = list.items[0]->err();
  if (err != RdKafka::ERR_NO_ERROR) {
    return FailedPreconditionError("kafka source: cannot store offset " +
                                   std::to_string(offset + 1) + " for " +
                                   Describe({topic, partition}) + ": " + ErrorDescription(err));
  }
  return Status::Ok();
}

std::map<TopicPartitionRef, int64_t> KafkaSource::TakeReachedEnds() {
  std::map<TopicPartitionRef, int64_t> ends;
  ends.swap(reached_end_);
  return ends;
}

Status KafkaSource::SetPaused(const std::vector<TopicPartitionRef>& partitions, bool pause) {
  if (closed_) return FailedPreconditionError("kafka source: pause/resume after Close");
  PartitionList list;
  for (const TopicPartitionRef& ref : partitions) {
    if (pause) {
      paused_.insert(ref);
    } else {
      paused_.erase(ref);
    }
    if (assignment_.count(ref) == 0) continue;  // applied when it is assigned
    list.items.push_back(RdKafka::TopicPartition::create(ref.topic, ref.partition));
  }
  if (list.items.empty()) return Status::Ok();
  const RdKafka::ErrorCode err =
      pause ? consumer_->pause(list.items) : consumer_->resume(list.items);
  if (err != RdKafka::ERR_NO_ERROR) {
    return UnavailableError(std::string("kafka source: ") + (pause ? "pause" : "resume") +
                            " failed: " + ErrorDescription(err));
  }
  return Status::Ok();
}

Status KafkaSource::Rewind(const TopicPartitionRef& partition, int64_t offset) {
  if (closed_) return FailedPreconditionError("kafka source: rewind after Close");
  if (assignment_.count(partition) == 0) return Status::Ok();
  std::unique_ptr<RdKafka::TopicPartition> tp(
      RdKafka::TopicPartition::create(partition.topic, partition.partition, offset));
  const RdKafka::ErrorCode err = consumer_->seek(*tp, 5000);
  if (err != RdKafka::ERR_NO_ERROR) {
    return UnavailableError("kafka source: seek of " + Describe(partition) + " to offset " +
                            std::to_string(offset) + " failed: " + ErrorDescription(err));
  }
  positions_.erase(partition);
  return Status::Ok();
}

Status KafkaSource::CommitStored(const char* when) {
  const RdKafka::ErrorCode err = consumer_->commitSync();
  if (err == RdKafka::ERR_NO_ERROR || err == RdKafka::ERR__NO_OFFSET) {
    if (err == RdKafka::ERR_NO_ERROR) {
      MutexLock lock(&stats_mutex_);
      ++stats_.commits;
    }
    return Status::Ok();
  }
  // The offset-commit callback has counted and logged it already.
  return UnavailableError(std::string("kafka source: offset commit ") + when +
                          " failed: " + ErrorDescription(err));
}

Status KafkaSource::Commit() {
  if (closed_) return FailedPreconditionError("kafka source: Commit after Close");
  return CommitStored("");
}

Status KafkaSource::Close() {
  if (closed_) return Status::Ok();
  closed_ = true;
  if (consumer_ == nullptr) return Status::Ok();
  Status status = CommitStored("at close");
  // A group that is rebalancing (another member joining or leaving at the
  // same moment) may refuse the commit until the rebalance has progressed;
  // librdkafka completes the join/sync in its own thread, so wait a little.
  for (int attempt = 0; attempt < kCloseCommitRetries && !status.ok() &&
                        status.message().find("REBALANCE_IN_PROGRESS") != std::string::npos;
       ++attempt) {
    std::this_thread::sleep_for(kCloseCommitBackoff);
    status = CommitStored("at close");
  }
  if (!status.ok()) Log(LogLevel::kWarning, kComponent, status.message());
  // Leave the group first and serve the revocation from consume(), so that
  // close() finds nothing assigned: librdkafka (2.0 here) can hang for ever
  // in the unassign() of a revocation that close() itself raises during a
  // rebalance (confluentinc/librdkafka#4527, #4884; seen once in the shared
  // failover harness). Records consumed meanwhile are dropped unprocessed —
  // their offsets were never stored, so the group reads them again.
  const RdKafka::ErrorCode left = consumer_->unsubscribe();
  if (left == RdKafka::ERR_NO_ERROR) {
    const auto until = std::chrono::steady_clock::now() + kCloseLeaveTimeout;
    while (!assignment_.empty() && std::chrono::steady_clock::now() < until) {
      std::unique_ptr<RdKafka::Message> ignored(consumer_->consume(50));
    }
  }
  const RdKafka::ErrorCode err = consumer_->close();
  if (err != RdKafka::ERR_NO_ERROR) {
    Log(LogLevel::kWarning, kComponent, "consumer close: " + ErrorDescription(err));
    if (status.ok()) {
      status = UnavailableError("kafka source: consumer close failed: " + ErrorDescription(err));
    }
  }
  if (!assigned_once_ && NamesCooperativeSticky(options_.properties) &&
      RdKafka::version() < kStickyDestroyFixedVersion) {
    // Destroying this consumer would abort the process (see
    // kStickyDestroyFixedVersion): it may have joined the group, but no
    // assignment reached it. It has left the group and closed; its handle
    // and the callbacks its threads may still log through are left alive
    // until the process exits.
    Log(LogLevel::kWarning, kComponent,
        "consumer closed before its first assignment with cooperative-sticky: librdkafka " +
            RdKafka::version_str() +
            " would abort when destroying it (confluentinc/librdkafka#4312, fixed in 2.3.0), "
            "so its handle is kept until the process exits");
    (void)consumer_.release();
    (void)callbacks_.release();
  }
  consumer_.reset();
  assignment_.clear();
  positions_.clear();
  lag_.store(0, std::memory_order_relaxed);
  {
    MutexLock lock(&stats_mutex_);
    stats_.assigned_now = 0;
  }
  Log(LogLevel::kInfo, kComponent, "closed");
  return status;
}

KafkaSourceStats KafkaSource::stats() const {
  MutexLock lock(&stats_mutex_);
  return stats_;
}

}  // namespace vipsd::connectors
