// TEST-ONLY honest in-memory fakes of the daemon's input and output
// (daemon/io/io.h), as docs/style.md "Tests" asks (fakes before mocks): FakeTopic is a
// partitioned log that outlives daemon instances, like Kafka's; FakeSource
// reads it as a consumer group member would (resume offsets, the group's
// committed offsets, pause/resume, end of partition), stamps each message
// as a broker with LogAppendTime would (its append time; or a producer's
// CreateTime stamp), and answers ObserveBounds(as_of) with the records
// appended up to `as_of` — or, like a real broker, with the log as it is
// at the call (AnswerAtCallTime);
// FakeSink records releases (checking the ledger-before-release order
// against the ledger file), dead letters and alerts, and fails on request.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "connectors/file/file_util.h"
#include "daemon/io/io.h"
#include "daemon/parts/run_control.h"
#include "daemon/state/ledger.h"

namespace vipsd::daemon {

// A topic that outlives daemon instances, like Kafka's log.
struct FakeTopic {
  struct Entry {
    std::string payload;
    double appended = 0;  // unix seconds
    std::string key;      // the message key ("" none)
    // Who stamped it: the broker at `appended` (LogAppendTime), or a
    // producer with `stamp` (CreateTime; unix seconds).
    connectors::TimestampType type = connectors::TimestampType::kLogAppendTime;
    double stamp = 0;
  };
  std::mutex mutex;
  std::map<int32_t, std::vector<Entry>> partitions;
  std::map<int32_t, int64_t> committed;  // next offset to read

  // Appends at `appended` (unix seconds; default: long ago). Append times
  // within a partition must not decrease.
  int64_t Append(int32_t partition, std::string payload, double appended = 1.0,
                 std::string key = "") {
    std::lock_guard<std::mutex> lock(mutex);
    auto& log = partitions[partition];
    log.push_back({std::move(payload), appended, std::move(key)});
    return static_cast<int64_t>(log.size()) - 1;
  }
  // Appends a message whose timestamp a producer chose (CreateTime).
  int64_t AppendStamped(int32_t partition, std::string payload, double appended, double stamp) {
    std::lock_guard<std::mutex> lock(mutex);
    auto& log = partitions[partition];
    log.push_back({std::move(payload), appended, "", connectors::TimestampType::kCreateTime,
                   stamp});
    return static_cast<int64_t>(log.size()) - 1;
  }
};

class FakeSource : public InputSource {
 public:
  // `assigned`: the partitions this reader holds (a consumer group member's
  // share, reported in every batch); nullopt: all of them (a file).
  FakeSource(std::shared_ptr<FakeTopic> topic, ResumeOffsetFn resume,
             std::optional<std::set<int32_t>> assigned = std::nullopt)
      : topic_(std::move(topic)), resume_(std::move(resume)), assigned_(std::move(assigned)) {}

  StatusOr<PollBatch> Poll(size_t max_records, std::chrono::milliseconds timeout) override {
    PollBatch batch;
    {
      std::lock_guard<std::mutex> lock(topic_->mutex);
      for (auto& [partition, log] : topic_->partitions) {
        if (assigned_.has_value() && assigned_->count(partition) == 0) continue;
        const std::string stream = StreamName("docs", partition);
        if (paused_.count(stream) > 0) continue;
        if (!position_.count(partition)) {
          const auto at = resume_("docs", partition);
          position_[partition] = at ? *at : topic_->committed[partition];
          // As KafkaSource: the group's committed offset at assignment.
          if (at) committed_at_start_[partition] = topic_->committed[partition];
        }
        int64_t& at = position_[partition];
        while (at < static_cast<int64_t>(log.size()) && batch.records.size() < max_records) {
          InputRecord record;
          record.topic = "docs";
          record.partition = partition;
          record.offset = at;
          record.payload = log[static_cast<size_t>(at)].payload;
          record.key = log[static_cast<size_t>(at)].key;
          // As a broker: the append time in milliseconds (LogAppendTime),
          // or the producer's stamp.
          const FakeTopic::Entry& entry = log[static_cast<size_t>(at)];
          record.timestamp_type = entry.type;
          record.timestamp_ms = static_cast<int64_t>(std::floor(
              (entry.type == connectors::TimestampType::kCreateTime ? entry.stamp
                                                                     : entry.appended) *
              1000));
          record.oversize = record.payload.size() > 4000;
          record.below_committed = committed_at_start_.count(partition) > 0 &&
                                   at < committed_at_start_[partition];
          if (record.oversize) record.payload.clear();
          batch.records.push_back(std::move(record));
          ++at;
        }
        if (at == static_cast<int64_t>(log.size())) batch.reached_end[stream] = at;
      }
    }
    if (assigned_.has_value()) {
      batch.assignment.emplace();
      for (int32_t partition : *assigned_) batch.assignment->insert(StreamName("docs", partition));
    }
    if (batch.records.empty()) {
      std::this_thread::sleep_for(std::min(timeout, std::chrono::milliseconds(5)));
    }
    return batch;
  }

  Status MarkDone(const InputRecord& record) override {
    std::lock_guard<std::mutex> lock(topic_->mutex);
    int64_t& committed = topic_->committed[record.partition];
    committed = std::max(committed, record.offset + 1);
    return Status::Ok();
  }
  Status Pause(const std::set<std::string>& streams) override {
    paused_.insert(streams.begin(), streams.end());
    return Status::Ok();
  }
  Status Resume(const std::set<std::string>& streams) override {
    for (const auto& stream : streams) paused_.erase(stream);
    return Status::Ok();
  }
  // As KafkaSource: a seek of an assigned partition; one not assigned yet
  // starts where the resume callback says.
  Status Rewind(const std::string& stream, int64_t offset) override {
    std::lock_guard<std::mutex> lock(topic_->mutex);
    for (auto& [partition, at] : position_) {
      if (StreamName("docs", partition) == stream) at = offset;
    }
    return Status::Ok();
  }
  // Answer ObserveBounds with the log as it is at the call (a real broker),
  // not as of the public time asked for.
  void AnswerAtCallTime() { at_call_time_ = true; }
  // Called at the start of every ObserveBounds with its `as_of` (a test
  // makes a read slow, and appends meanwhile).
  void BeforeObserve(std::function<void(double)> hook) { before_observe_ = std::move(hook); }

  StatusOr<std::map<std::string, StreamBounds>> ObserveBounds(double as_of) override {
    if (before_observe_) before_observe_(as_of);
    if (at_call_time_) as_of = std::numeric_limits<double>::infinity();
    std::lock_guard<std::mutex> lock(topic_->mutex);
    std::map<std::string, StreamBounds> bounds;
    for (const auto& [partition, log] : topic_->partitions) {
      const auto end = std::upper_bound(log.begin(), log.end(), as_of,
                                        [](double t, const FakeTopic::Entry& e) {
                                          return t < e.appended;
                                        });
      bounds[StreamName("docs", partition)] = {0, end - log.begin()};
    }
    return bounds;
  }
  Status Commit() override { return Status::Ok(); }
  int64_t Lag() const override { return 0; }
  Status Close() override { return Status::Ok(); }

 private:
  std::shared_ptr<FakeTopic> topic_;
  ResumeOffsetFn resume_;
  std::map<int32_t, int64_t> position_;
  std::set<std::string> paused_;
  std::map<int32_t, int64_t> committed_at_start_;
  std::optional<std::set<int32_t>> assigned_;
  bool at_call_time_ = false;
  std::function<void(double)> before_observe_;
};

// A source that hands every call to `inner`; a test derives from it to
// change one behaviour (a late first poll, fetches that stall).
class ForwardingSource : public InputSource {
 public:
  explicit ForwardingSource(std::unique_ptr<InputSource> inner) : inner_(std::move(inner)) {}
  StatusOr<PollBatch> Poll(size_t max_records, std::chrono::milliseconds timeout) override {
    return inner_->Poll(max_records, timeout);
  }
  Status MarkDone(const InputRecord& record) override { return inner_->MarkDone(record); }
  Status Pause(const std::set<std::string>& s) override { return inner_->Pause(s); }
  Status Resume(const std::set<std::string>& s) override { return inner_->Resume(s); }
  Status Rewind(const std::string& stream, int64_t offset) override {
    return inner_->Rewind(stream, offset);
  }
  StatusOr<std::map<std::string, StreamBounds>> ObserveBounds(double as_of) override {
    return inner_->ObserveBounds(as_of);
  }
  Status Commit() override { return inner_->Commit(); }
  int64_t Lag() const override { return inner_->Lag(); }
  Status Close() override { return inner_->Close(); }

 private:
  std::unique_ptr<InputSource> inner_;
};

struct Published {
  release::EncodedRelease release;
  double publish_time = 0;  // the deadline the daemon passed
  double wall_time = 0;     // when the sink was called
};

struct SinkLog {
  std::mutex mutex;
  std::vector<Published> releases;
  std::vector<std::pair<InputRecord, connectors::RejectReason>> dead_letters;
  std::vector<std::string> alerts;
  int fail_next_dead_letters = 0;
  bool refuse_dead_letters = false;  // INVALID_ARGUMENT: can never be delivered
  int fail_next_releases = 0;
  // Every attempt, failed ones too (a failed publication may have been
  // delivered after all): release id, all file bytes, publish time.
  struct Attempt {
    std::string release_id;
    std::string bytes;
    double publish_time;
  };
  std::vector<Attempt> attempts;
  std::string ledger_path;
  std::vector<std::string> ledger_violations;
};

class FakeSink : public OutputSink {
 public:
  explicit FakeSink(std::shared_ptr<SinkLog> log) : log_(std::move(log)) {}
  Status PublishRelease(const release::Release&, const release::EncodedRelease& release,
                        double publish_time) override {
    std::lock_guard<std::mutex> lock(log_->mutex);
    // Ledger before release: the committed ledger must already cover it.
    auto bytes = connectors::ReadWholeFile(log_->ledger_path);
    auto ledger = bytes.ok() ? Ledger::Decode(*bytes, "ledger") : StatusOr<LedgerState>(bytes.status());
    const int64_t step = std::stoll(release.release_id.substr(5));
    if (!ledger.ok() || ledger->next_step <= step) {
      log_->ledger_violations.push_back(release.release_id);
    }
    std::string content;
    for (const auto& file : release.files) content += file.name + '\0' + file.bytes;
    log_->attempts.push_back({release.release_id, std::move(content), publish_time});
    if (log_->fail_next_releases > 0) {
      --log_->fail_next_releases;
      return UnavailableError("release topic unreachable (fake)");
    }
    log_->releases.push_back({release, publish_time, WallNow()});
    return Status::Ok();
  }
  Status PublishDeadLetter(const InputRecord& record, connectors::RejectReason reason) override {
    std::lock_guard<std::mutex> lock(log_->mutex);
    if (log_->fail_next_dead_letters > 0) {
      --log_->fail_next_dead_letters;
      return UnavailableError("broker down (fake)");
    }
    if (log_->refuse_dead_letters) {
      return InvalidArgumentError("1 refused by the client: MSG_SIZE_TOO_LARGE (fake)");
    }
    log_->dead_letters.emplace_back(record, reason);
    return Status::Ok();
  }
  Status PublishAlert(const std::string& json) override {
    std::lock_guard<std::mutex> lock(log_->mutex);
    log_->alerts.push_back(json);
    return Status::Ok();
  }
  Status Close() override { return Status::Ok(); }

 private:
  std::shared_ptr<SinkLog> log_;
};

}  // namespace vipsd::daemon
