// The streaming daemon against honest in-memory fakes of its input and
// output (daemon/io.h): schedule, dead letters, ledger-before-release,
// ceiling, restart, residency and reload. The Kafka path is covered by
// tests/integration (real librdkafka against its mock cluster).
#include "daemon/daemon.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "connectors/file/file_util.h"
#include "daemon/ledger.h"

namespace vipsd::daemon {
namespace {

using namespace std::chrono_literals;

const char* kSecret = "zzsecretmarkerzz";

// A topic that outlives daemon instances, like Kafka's log.
struct FakeTopic {
  std::mutex mutex;
  std::map<int32_t, std::vector<std::string>> partitions;
  std::map<int32_t, int64_t> committed;  // next offset to read

  void Append(int32_t partition, std::string payload) {
    std::lock_guard<std::mutex> lock(mutex);
    partitions[partition].push_back(std::move(payload));
  }
};

class FakeSource : public InputSource {
 public:
  FakeSource(std::shared_ptr<FakeTopic> topic, ResumeOffsetFn resume) : topic_(std::move(topic)) {
    std::lock_guard<std::mutex> lock(topic_->mutex);
    for (const auto& [partition, records] : topic_->partitions) {
      const auto at = resume("docs", partition);
      position_[partition] = at ? *at : topic_->committed[partition];
    }
  }

  StatusOr<std::vector<InputRecord>> Poll(size_t max_records,
                                          std::chrono::milliseconds timeout) override {
    std::vector<InputRecord> out;
    {
      std::lock_guard<std::mutex> lock(topic_->mutex);
      for (auto& [partition, records] : topic_->partitions) {
        int64_t& at = position_[partition];
        while (at < static_cast<int64_t>(records.size()) && out.size() < max_records) {
          InputRecord record;
          record.topic = "docs";
          record.partition = partition;
          record.offset = at;
          record.payload = records[static_cast<size_t>(at)];
          record.oversize = record.payload.size() > 4000;
          if (record.oversize) record.payload.clear();
          out.push_back(std::move(record));
          ++at;
        }
      }
    }
    if (out.empty()) std::this_thread::sleep_for(std::min(timeout, std::chrono::milliseconds(10)));
    return out;
  }

  Status MarkDone(const InputRecord& record) override {
    std::lock_guard<std::mutex> lock(topic_->mutex);
    int64_t& committed = topic_->committed[record.partition];
    committed = std::max(committed, record.offset + 1);
    return Status::Ok();
  }
  Status Commit() override { return Status::Ok(); }
  int64_t Lag() const override { return 0; }
  Status Close() override { return Status::Ok(); }

 private:
  std::shared_ptr<FakeTopic> topic_;
  std::map<int32_t, int64_t> position_;
};

struct SinkLog {
  std::mutex mutex;
  std::vector<release::EncodedRelease> releases;
  std::vector<std::pair<InputRecord, connectors::RejectReason>> dead_letters;
  std::vector<std::string> alerts;
  int fail_next_dead_letters = 0;
  int fail_next_releases = 0;
  std::string ledger_path;
  std::vector<std::string> ledger_violations;
};

class FakeSink : public OutputSink {
 public:
  explicit FakeSink(std::shared_ptr<SinkLog> log) : log_(std::move(log)) {}
  Status PublishRelease(const release::Release&, const release::EncodedRelease& release) override {
    std::lock_guard<std::mutex> lock(log_->mutex);
    // Ledger before release: the committed ledger must already cover it.
    auto bytes = connectors::ReadWholeFile(log_->ledger_path);
    auto ledger = bytes.ok() ? Ledger::Decode(*bytes, "ledger") : StatusOr<LedgerState>(bytes.status());
    const int64_t step = std::stoll(release.release_id.substr(5));
    if (!ledger.ok() || ledger->next_step <= step) {
      log_->ledger_violations.push_back(release.release_id);
    }
    if (log_->fail_next_releases > 0) {
      --log_->fail_next_releases;
      return UnavailableError("release topic unreachable (fake)");
    }
    log_->releases.push_back(release);
    return Status::Ok();
  }
  Status PublishDeadLetter(const InputRecord& record, connectors::RejectReason reason) override {
    std::lock_guard<std::mutex> lock(log_->mutex);
    if (log_->fail_next_dead_letters > 0) {
      --log_->fail_next_dead_letters;
      return UnavailableError("broker down (fake)");
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

struct Options {
  double sigma = 1.0;
  double q = 0.5;
  double ceiling = 1000;
  std::string accounting = "global";
  int64_t residency = 0;
  std::string on_ceiling = "halt";
  int64_t max_steps = 0;
  int64_t publish_every = 1;
  std::string extra_schedule;
  std::string extra_top;  // appended as top-level YAML (e.g. a pool section)
  std::string model = "lda";
};

std::string WriteConfig(const std::string& dir, const Options& o) {
  std::ofstream(dir + "/vocab.txt") << "apple\nbanana\ncherry\ndate\nelder\nfig\n";
  std::ostringstream yaml;
  if (o.model == "lda") {
    yaml << "model:\n  type: lda\n  lda:\n    topics: 2\n    vocabulary: vocab.txt\n"
            "    alpha: 0.5\n    eta: 0.1\n    resample_length: 10\n";
  } else {
    yaml << "model:\n  type: blr\n  blr:\n    dimension: 2\n    norm_rule: rescale\n";
  }
  yaml << "privacy:\n  noise_multiplier: " << o.sigma << "\n  sampling_rate: " << o.q << "\n";
  if (o.sigma > 0) {
    yaml << "  delta: 1.0e-5\n  epsilon_ceiling: " << o.ceiling << "\n  on_ceiling: " << o.on_ceiling
         << "\n  accounting: " << o.accounting << "\n  warn_at: [0.5]\n";
    if (o.residency > 0) yaml << "  residency_steps: " << o.residency << "\n";
  }
  yaml << "schedule:\n  tau0: 1\n  kappa: 0.7\n  threads: 2\n  interval_seconds: 0.02\n"
       << "  max_steps: " << o.max_steps << "\n" << o.extra_schedule
       << "source:\n  type: kafka\n  topics: [docs]\n"
          "sink:\n  type: kafka\n  topic: releases\n  publish_every: " << o.publish_every << "\n"
       << "dead_letter:\n  topic: dead\nalerts:\n  topic: alerts\n"
          "kafka:\n  bootstrap_servers: unused:9092\n"
          "state:\n  directory: state\nmetrics:\n  listen: \"\"\n"
       << o.extra_top;
  std::ofstream(dir + "/vipsd.yaml") << yaml.str();
  return dir + "/vipsd.yaml";
}

std::string FreshDir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "daemon_test_" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

std::string Document(int i) {
  return std::string("{\"id\": ") + std::to_string(i) + ", \"text\": \"" +
         (i % 2 ? "apple banana apple cherry" : "date elder fig fig") + "\"}";
}

struct Harness {
  std::string dir;
  std::shared_ptr<FakeTopic> topic = std::make_shared<FakeTopic>();
  std::shared_ptr<SinkLog> sink = std::make_shared<SinkLog>();
  std::unique_ptr<Metrics> metrics;

  explicit Harness(const std::string& name) : dir(FreshDir(name)) {
    sink->ledger_path = dir + "/state/ledger";
    MetricsOptions options;
    options.listen_address = "";
    options.version = "test";
    options.model_type = "lda";
    auto created = Metrics::Create(options);
    EXPECT_TRUE(created.ok());
    metrics = std::move(created).value();
  }

  StatusOr<std::unique_ptr<Daemon>> Make(const std::string& config_path, DaemonHooks hooks = {}) {
    auto config = config::LoadConfigFile(config_path);
    if (!config.ok()) return config.status();
    auto topic_copy = topic;
    return Daemon::Create(
        *config,
        [topic_copy](ResumeOffsetFn resume) -> StatusOr<std::unique_ptr<InputSource>> {
          return std::unique_ptr<InputSource>(new FakeSource(topic_copy, std::move(resume)));
        },
        std::make_unique<FakeSink>(sink), metrics.get(), std::move(hooks));
  }
};

// Runs the daemon until `done(status)` or the deadline; stops it; returns Run's status.
Status RunUntil(Daemon& daemon, const std::function<bool(const DaemonStatus&)>& done,
                std::chrono::milliseconds deadline = 20s) {
  Status result = Status::Ok();
  std::thread runner([&] { result = daemon.Run(); });
  const auto until = std::chrono::steady_clock::now() + deadline;
  while (std::chrono::steady_clock::now() < until && !done(daemon.status())) {
    std::this_thread::sleep_for(5ms);
  }
  daemon.RequestStop();
  runner.join();
  return result;
}

TEST(DaemonTest, StepsOnScheduleDeadLettersMalformedRecordsAndCommitsBeforeReleasing) {
  Harness h("basic");
  for (int i = 0; i < 60; ++i) h.topic->Append(i % 2, Document(i));
  h.topic->Append(0, std::string("{\"id\": \"") + kSecret + "\", \"text\": 5}");
  h.topic->Append(1, std::string("not json ") + kSecret);
  h.topic->Append(1, "{\"id\": 7, \"text\": \"zebra quagga\"}");  // no vocabulary word
  h.topic->Append(0, std::string(5000, 'x'));                    // oversize
  auto daemon = h.Make(WriteConfig(h.dir, {}));
  ASSERT_TRUE(daemon.ok()) << daemon.status().ToString();
  ASSERT_TRUE(RunUntil(**daemon, [](const DaemonStatus& s) { return s.steps_run >= 5; }).ok());
  const DaemonStatus status = (*daemon)->status();
  EXPECT_GE(status.steps_run, 5);
  EXPECT_EQ(status.pool_records, 60);
  std::lock_guard<std::mutex> lock(h.sink->mutex);
  EXPECT_TRUE(h.sink->ledger_violations.empty());
  ASSERT_GE(h.sink->releases.size(), 5u);
  for (size_t i = 0; i < h.sink->releases.size(); ++i) {
    EXPECT_EQ(h.sink->releases[i].release_id, "step-" + std::to_string(i + 1));
    for (const auto& file : h.sink->releases[i].files) {
      if (file.name == "manifest.json") {
        EXPECT_EQ(file.bytes.find(kSecret), std::string::npos);
        EXPECT_EQ(file.bytes.find("batch"), std::string::npos);
      }
    }
  }
  std::multiset<connectors::RejectReason> reasons;
  for (const auto& [record, reason] : h.sink->dead_letters) reasons.insert(reason);
  EXPECT_EQ(reasons, (std::multiset<connectors::RejectReason>{
                         connectors::RejectReason::kBadText, connectors::RejectReason::kInvalidJson,
                         connectors::RejectReason::kEmptyDocument,
                         connectors::RejectReason::kRecordTooLarge}));
  // Every offset, pooled or dead-lettered, was acknowledged.
  EXPECT_EQ(h.topic->committed[0], 32);
  EXPECT_EQ(h.topic->committed[1], 32);
  EXPECT_EQ(h.metrics->records_rejected_total(connectors::RejectReason::kInvalidJson).Value(), 1);
  EXPECT_EQ(h.metrics->dead_letters_published_total().Value(), 4);
  EXPECT_EQ(h.metrics->releases_published_total().Value(),
            static_cast<double>(h.sink->releases.size()));
  const std::string exposition = h.metrics->SerializeText();
  EXPECT_EQ(exposition.find(kSecret), std::string::npos);
}

TEST(DaemonTest, ADeadLetterIsRetriedUntilDeliveredAndOnlyThenAcknowledged) {
  Harness h("dead_letter_retry");
  h.topic->Append(0, "not json");
  h.topic->Append(0, Document(1));
  h.sink->fail_next_dead_letters = 3;
  auto daemon = h.Make(WriteConfig(h.dir, {}));
  ASSERT_TRUE(daemon.ok());
  ASSERT_TRUE(RunUntil(**daemon, [&](const DaemonStatus&) {
                std::lock_guard<std::mutex> lock(h.sink->mutex);
                return !h.sink->dead_letters.empty() && h.topic->committed[0] == 2;
              }).ok());
  std::lock_guard<std::mutex> lock(h.sink->mutex);
  ASSERT_EQ(h.sink->dead_letters.size(), 1u);
  EXPECT_EQ(h.sink->dead_letters[0].first.offset, 0);
  EXPECT_EQ(h.sink->dead_letters[0].first.payload, "not json");  // forwarded unchanged
  EXPECT_EQ(h.topic->committed[0], 2);
  EXPECT_GE(h.metrics->kafka_errors_total(KafkaErrorKind::kProduce).Value(), 3);
}

TEST(DaemonTest, HaltsExactlyBeforeTheCeilingAndARestartGrantsNothing) {
  Harness h("ceiling");
  for (int i = 0; i < 40; ++i) h.topic->Append(0, Document(i));
  Options options;
  options.ceiling = 3.0;
  options.q = 0.2;
  options.sigma = 1.5;
  options.publish_every = 1000;  // only the final release on halt
  const std::string config = WriteConfig(h.dir, options);
  auto daemon = h.Make(config);
  ASSERT_TRUE(daemon.ok());
  ASSERT_TRUE(RunUntil(**daemon, [](const DaemonStatus& s) { return s.halted; }).ok());
  const DaemonStatus halted = (*daemon)->status();
  ASSERT_TRUE(halted.halted);
  daemon->reset();
  // The ledger holds exactly the steps that ran; one more would cross 3.0.
  auto bytes = connectors::ReadWholeFile(h.dir + "/state/ledger");
  ASSERT_TRUE(bytes.ok());
  auto state = Ledger::Decode(*bytes, "ledger");
  ASSERT_TRUE(state.ok());
  const int64_t steps = state->accountant.steps();
  EXPECT_EQ(steps, halted.next_step - 1);
  auto spent = state->accountant.GetEpsilon(1e-5, privacy::RdpConversion::kImproved,
                                            privacy::Adaptivity::kAdaptiveFilter);
  EXPECT_GT(steps, 1);
  auto next = state->accountant.EpsilonIfComposed(0.2, 1.5, 1, 1e-5,
                                                  privacy::RdpConversion::kImproved,
                                                  privacy::Adaptivity::kAdaptiveFilter);
  EXPECT_LE(spent->epsilon, 3.0);
  EXPECT_GT(next->epsilon, 3.0);
  {
    std::lock_guard<std::mutex> lock(h.sink->mutex);
    ASSERT_EQ(h.sink->releases.size(), 1u);  // the final release
    EXPECT_EQ(h.sink->releases[0].release_id, "step-" + std::to_string(steps));
    ASSERT_FALSE(h.sink->alerts.empty());
    EXPECT_NE(h.sink->alerts.back().find("\"event\": \"halted\""), std::string::npos);
    EXPECT_NE(h.sink->alerts.front().find("\"event\": \"budget_warning\""), std::string::npos);
  }
  // A restart does not grant new budget: it halts again without a step.
  auto again = h.Make(config);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  ASSERT_TRUE(RunUntil(**again, [](const DaemonStatus& s) { return s.halted; }).ok());
  EXPECT_EQ((*again)->status().steps_run, 0);
  EXPECT_EQ((*again)->status().next_step, halted.next_step);
  EXPECT_GE((*again)->status().epsilon_spent, halted.epsilon_spent);
  EXPECT_EQ(h.metrics->privacy_halted().Value(), 1);
}

TEST(DaemonTest, AnUndeliveredReleaseIsRetriedWithoutSpendingBudget) {
  Harness h("release_retry");
  for (int i = 0; i < 40; ++i) h.topic->Append(0, Document(i));
  h.sink->fail_next_releases = 2;  // the halt's final release, then the first retry
  Options options;
  options.ceiling = 3.0;
  options.q = 0.2;
  options.sigma = 1.5;
  options.publish_every = 1000;  // only the final release on halt
  auto daemon = h.Make(WriteConfig(h.dir, options));
  ASSERT_TRUE(daemon.ok());
  ASSERT_TRUE(RunUntil(**daemon, [&](const DaemonStatus& s) {
                return s.halted && h.metrics->releases_published_total().Value() >= 1;
              }).ok());
  const DaemonStatus status = (*daemon)->status();
  EXPECT_EQ(h.metrics->releases_failed_total().Value(), 2);
  EXPECT_EQ(h.metrics->release_pending().Value(), 0);
  std::lock_guard<std::mutex> lock(h.sink->mutex);
  ASSERT_EQ(h.sink->releases.size(), 1u);  // the refused attempts are not kept
  EXPECT_EQ(h.sink->releases[0].release_id, "step-" + std::to_string(status.next_step - 1));
  EXPECT_TRUE(h.sink->ledger_violations.empty());
  // The retries charged nothing: the ledger still holds exactly the steps run.
  auto bytes = connectors::ReadWholeFile(h.dir + "/state/ledger");
  ASSERT_TRUE(bytes.ok());
  auto state = Ledger::Decode(*bytes, "ledger");
  ASSERT_TRUE(state.ok());
  EXPECT_EQ(state->accountant.steps(), status.next_step - 1);
}

TEST(DaemonTest, ExitActionStopsRunByItself) {
  Harness h("exit");
  for (int i = 0; i < 10; ++i) h.topic->Append(0, Document(i));
  Options options;
  options.ceiling = 2.0;
  options.on_ceiling = "exit";
  auto daemon = h.Make(WriteConfig(h.dir, options));
  ASSERT_TRUE(daemon.ok());
  Status result = Status::Ok();
  std::thread runner([&] { result = (*daemon)->Run(); });
  runner.join();  // returns without RequestStop
  EXPECT_TRUE(result.ok());
  EXPECT_TRUE((*daemon)->status().halted);
}

TEST(DaemonTest, RestartContinuesStepsBudgetModelAndRebuildsThePool) {
  Harness h("restart");
  for (int i = 0; i < 30; ++i) h.topic->Append(i % 3, Document(i));
  const std::string config = WriteConfig(h.dir, {});
  DaemonStatus first;
  {
    auto daemon = h.Make(config);
    ASSERT_TRUE(daemon.ok());
    ASSERT_TRUE(RunUntil(**daemon, [](const DaemonStatus& s) { return s.steps_run >= 4; }).ok());
    first = (*daemon)->status();
  }
  for (int i = 30; i < 45; ++i) h.topic->Append(i % 3, Document(i));
  int64_t first_pool_seen = -1;
  DaemonHooks hooks;
  hooks.before_step = [&](int64_t, const svi::RecordPool& pool) {
    if (first_pool_seen < 0) first_pool_seen = pool.size();
  };
  auto daemon = h.Make(config, hooks);
  ASSERT_TRUE(daemon.ok());
  ASSERT_TRUE(RunUntil(**daemon, [](const DaemonStatus& s) { return s.steps_run >= 3; }).ok());
  const DaemonStatus second = (*daemon)->status();
  EXPECT_EQ(second.next_step, first.next_step + second.steps_run);
  EXPECT_GT(second.epsilon_spent, first.epsilon_spent);
  EXPECT_EQ(first_pool_seen, 45);  // the 30 old records re-read plus the 15 new ones
  std::lock_guard<std::mutex> lock(h.sink->mutex);
  EXPECT_TRUE(h.sink->ledger_violations.empty());
  std::set<std::string> ids;
  for (const auto& release : h.sink->releases) EXPECT_TRUE(ids.insert(release.release_id).second);
}

TEST(DaemonTest, RebuildLookbackCapsHowFarARestartReReadsEachPartition) {
  // 3 partitions × 10 records, all pooled before the stop; no new records.
  // rebuild_lookback: 4 re-reads the last 4 of each partition, 0 none, and
  // "all" (the default, previous test) everything still pooled.
  for (const auto& [lookback, expected] :
       std::vector<std::pair<std::string, int64_t>>{{"4", 12}, {"0", 0}, {"all", 30}}) {
    Harness h("lookback_" + lookback);
    for (int i = 0; i < 30; ++i) h.topic->Append(i % 3, Document(i));
    Options options;
    options.extra_top = "pool:\n  capacity: 1000\n  rebuild_lookback: " + lookback + "\n";
    const std::string config = WriteConfig(h.dir, options);
    {
      auto daemon = h.Make(config);
      ASSERT_TRUE(daemon.ok()) << daemon.status().message();
      ASSERT_TRUE(RunUntil(**daemon, [](const DaemonStatus& s) {
                    return s.steps_run >= 2 && s.pool_records == 30;
                  }).ok());
    }
    std::atomic<int64_t> rebuilt{-1};
    DaemonHooks hooks;
    hooks.before_step = [&](int64_t, const svi::RecordPool& pool) {
      if (rebuilt < 0) rebuilt = pool.size();
    };
    auto daemon = h.Make(config, hooks);
    ASSERT_TRUE(daemon.ok());
    // A step with an empty pool still runs (min_pool_records is 0).
    ASSERT_TRUE(RunUntil(**daemon, [&](const DaemonStatus& s) {
                  return s.steps_run >= 1 && s.pool_records == expected;
                }).ok());
    EXPECT_EQ(rebuilt.load(), expected) << "rebuild_lookback " << lookback;
  }
}

TEST(DaemonTest, RecordsReadBeforeTheFirstStepAreReReadAfterACrash) {
  // No step runs (min_pool_records is out of reach), so no step ever commits
  // the ledger; the source has stored the offsets of everything it read.
  // The ledger must still hold resume offsets for every partition read, and
  // they must be no later than the first record of each: a crash here would
  // otherwise skip the records the pool held.
  Harness h("first_read");
  for (int i = 0; i < 30; ++i) h.topic->Append(i % 3, Document(i));
  Options options;
  options.extra_schedule = "  min_pool_records: 1000\n";
  const std::string config = WriteConfig(h.dir, options);
  std::optional<LedgerState> seen;
  {
    auto daemon = h.Make(config);
    ASSERT_TRUE(daemon.ok()) << daemon.status().message();
    ASSERT_TRUE(RunUntil(**daemon, [&](const DaemonStatus&) {
                  {
                    std::lock_guard<std::mutex> lock(h.topic->mutex);
                    for (int32_t p = 0; p < 3; ++p) {
                      if (h.topic->committed[p] < 10) return false;  // not all stored yet
                    }
                  }
                  // Every offset is stored: the ledger must cover the partitions now.
                  auto bytes = connectors::ReadWholeFile(h.dir + "/state/ledger");
                  if (bytes.ok()) seen = Ledger::Decode(*bytes, "ledger").value();
                  return true;
                }).ok());
    EXPECT_EQ((*daemon)->status().steps_run, 0);
  }
  ASSERT_TRUE(seen.has_value()) << "no ledger although offsets were stored";
  ASSERT_EQ(seen->resume_offsets.size(), 3u);
  for (const auto& [stream, offset] : seen->resume_offsets) EXPECT_EQ(offset, 0) << stream;
  EXPECT_EQ(seen->next_step, 1);
  // A restart (here after a clean stop, which does not commit the ledger
  // either) rebuilds the pool from those offsets, not from the source's.
  std::atomic<int64_t> rebuilt{-1};
  DaemonHooks hooks;
  hooks.before_step = [&](int64_t, const svi::RecordPool& pool) {
    if (rebuilt < 0) rebuilt = pool.size();
  };
  auto daemon = h.Make(WriteConfig(h.dir, {}), hooks);
  ASSERT_TRUE(daemon.ok());
  ASSERT_TRUE(RunUntil(**daemon, [](const DaemonStatus& s) { return s.steps_run >= 1; }).ok());
  EXPECT_EQ(rebuilt.load(), 30);
}

TEST(DaemonTest, ResidencyNoRecordIsACandidateInMoreThanMStepsAcrossARestart) {
  Harness h("residency");
  constexpr int64_t kM = 4;
  Options options;
  options.accounting = "residency";
  options.residency = kM;
  options.q = 0.1;
  options.ceiling = 5.0;
  const std::string config = WriteConfig(h.dir, options);
  std::map<std::pair<uint32_t, int64_t>, int64_t> candidate_steps;  // (stream, offset) → steps
  std::map<uint32_t, std::string> stream_names;
  int64_t violations = 0;
  auto observe = [&](int64_t, const svi::RecordPool& pool) {
    if (pool.MaxStepsPresent() >= kM) ++violations;
    for (size_t i = 0; i < static_cast<size_t>(pool.size()); ++i) {
      ++candidate_steps[{0, pool.origin(i).offset * 10 + pool.origin(i).stream}];
    }
  };
  std::thread feeder;
  for (int run = 0; run < 2; ++run) {
    for (int i = 0; i < 20; ++i) h.topic->Append(0, Document(run * 100 + i));
    DaemonHooks hooks;
    hooks.before_step = observe;
    auto daemon = h.Make(config, hooks);
    ASSERT_TRUE(daemon.ok()) << daemon.status().ToString();
    ASSERT_TRUE(RunUntil(**daemon, [](const DaemonStatus& s) { return s.steps_run >= 3; }).ok());
  }
  EXPECT_EQ(violations, 0);
  ASSERT_FALSE(candidate_steps.empty());
  for (const auto& [key, steps] : candidate_steps) {
    EXPECT_LE(steps, kM) << "offset " << key.second / 10;
  }
  // Records of the first batch were candidates in exactly M steps overall.
  EXPECT_EQ(candidate_steps.at({0, 0}), kM);
}

TEST(DaemonTest, ResidencyStartUpRefusesAnUnaffordableM) {
  Harness h("residency_refused");
  Options options;
  options.accounting = "residency";
  options.residency = 10000;
  options.q = 0.5;
  options.ceiling = 1.0;
  auto daemon = h.Make(WriteConfig(h.dir, options));
  ASSERT_FALSE(daemon.ok());
  EXPECT_NE(daemon.status().message().find("privacy.residency_steps: a record present for 10000 "
                                           "steps"),
            std::string::npos)
      << daemon.status().message();
}

TEST(DaemonTest, ReloadAppliesLiveChangesAndABadReloadKeepsTheOldConfig) {
  Harness h("reload");
  for (int i = 0; i < 20; ++i) h.topic->Append(0, Document(i));
  const std::string path = WriteConfig(h.dir, {});
  std::vector<double> sampling_rates;
  DaemonHooks hooks;
  auto daemon = h.Make(path, hooks);
  ASSERT_TRUE(daemon.ok());
  Status result = Status::Ok();
  std::thread runner([&] { result = (*daemon)->Run(); });
  auto wait_steps = [&](int64_t n) {
    const auto until = std::chrono::steady_clock::now() + 10s;
    while ((*daemon)->status().steps_run < n && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(5ms);
    }
  };
  wait_steps(2);
  // A bad reload: a fixed key changed. The old configuration keeps running.
  std::string text = *connectors::ReadWholeFile(path);
  std::ofstream(path, std::ios::trunc) << std::string(text).replace(text.find("topics: 2"), 9,
                                                                     "topics: 3");
  (*daemon)->RequestReload();
  const auto until = std::chrono::steady_clock::now() + 5s;
  while (h.metrics->config_reloads_total(ReloadResult::kFailure).Value() < 1 &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(5ms);
  }
  EXPECT_EQ(h.metrics->config_last_reload_successful().Value(), 0);
  const int64_t before = (*daemon)->status().steps_run;
  wait_steps(before + 2);  // still stepping
  // A good reload: q changes live.
  std::ofstream(path, std::ios::trunc) << std::string(text).replace(
      text.find("sampling_rate: 0.5"), 18, "sampling_rate: 0.25");
  (*daemon)->RequestReload();
  const auto until2 = std::chrono::steady_clock::now() + 5s;
  while (h.metrics->config_reloads_total(ReloadResult::kSuccess).Value() < 1 &&
         std::chrono::steady_clock::now() < until2) {
    std::this_thread::sleep_for(5ms);
  }
  EXPECT_EQ(h.metrics->config_last_reload_successful().Value(), 1);
  EXPECT_EQ(h.metrics->sampling_rate().Value(), 0.25);
  wait_steps((*daemon)->status().steps_run + 1);
  (*daemon)->RequestStop();
  runner.join();
  EXPECT_TRUE(result.ok());
  std::lock_guard<std::mutex> lock(h.sink->mutex);
  ASSERT_FALSE(h.sink->releases.empty());
  const auto& manifest = h.sink->releases.back().files.back();
  EXPECT_NE(manifest.bytes.find("\"sampling_rate\": 0.25"), std::string::npos) << manifest.bytes;
}

TEST(DaemonTest, NoStepIsRunOrChargedUntilThePoolHoldsMinPoolRecords) {
  Harness h("min_pool");
  for (int i = 0; i < 20; ++i) h.topic->Append(0, Document(i));
  Options options;
  options.extra_schedule = "  min_pool_records: 50\n";
  auto daemon = h.Make(WriteConfig(h.dir, options));
  ASSERT_TRUE(daemon.ok()) << daemon.status().ToString();
  Status result = Status::Ok();
  std::thread runner([&] { result = (*daemon)->Run(); });
  std::this_thread::sleep_for(300ms);  // ≈ 15 scheduled intervals
  EXPECT_EQ((*daemon)->status().steps_run, 0);
  EXPECT_EQ((*daemon)->status().epsilon_spent, 0);
  {
    // The ledger holds the partition's resume offset, and no step.
    auto bytes = connectors::ReadWholeFile(h.dir + "/state/ledger");
    ASSERT_TRUE(bytes.ok());
    auto state = Ledger::Decode(*bytes, "ledger");
    ASSERT_TRUE(state.ok());
    EXPECT_EQ(state->next_step, 1);
    EXPECT_EQ(state->accountant.steps(), 0);
    EXPECT_EQ(state->resume_offsets.size(), 1u);
  }
  for (int i = 20; i < 60; ++i) h.topic->Append(0, Document(i));
  const auto until = std::chrono::steady_clock::now() + 10s;
  while ((*daemon)->status().steps_run < 2 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(5ms);
  }
  (*daemon)->RequestStop();
  runner.join();
  EXPECT_GE((*daemon)->status().steps_run, 2);
}

TEST(DaemonTest, LogisticRegressionRunsThroughTheSameDaemon) {
  Harness h("blr");
  for (int i = 0; i < 200; ++i) {
    const double x0 = (i % 7) / 7.0 - 0.5, x1 = (i % 5) / 5.0 - 0.4;
    h.topic->Append(i % 2, "{\"x\": [" + std::to_string(x0) + ", " + std::to_string(x1) +
                               "], \"y\": " + (x0 > 0 ? "1" : "0") + "}");
  }
  h.topic->Append(0, "{\"x\": [3, 4], \"y\": 1}");    // norm 5: rescaled, pooled
  h.topic->Append(0, "{\"x\": [0.1], \"y\": 1}");     // wrong dimension
  h.topic->Append(1, "{\"x\": [0.1, 0.2], \"y\": 2}"); // bad label
  Options options;
  options.model = "blr";
  auto daemon = h.Make(WriteConfig(h.dir, options));
  ASSERT_TRUE(daemon.ok()) << daemon.status().ToString();
  ASSERT_TRUE(RunUntil(**daemon, [](const DaemonStatus& s) { return s.steps_run >= 3; }).ok());
  EXPECT_EQ((*daemon)->status().pool_records, 201);
  std::lock_guard<std::mutex> lock(h.sink->mutex);
  EXPECT_TRUE(h.sink->ledger_violations.empty());
  ASSERT_GE(h.sink->releases.size(), 3u);
  std::set<std::string> files;
  for (const auto& file : h.sink->releases.back().files) files.insert(file.name);
  EXPECT_TRUE(files.count("mean.npy") && files.count("covariance.npy")) ;
  std::multiset<connectors::RejectReason> reasons;
  for (const auto& [record, reason] : h.sink->dead_letters) reasons.insert(reason);
  EXPECT_EQ(reasons, (std::multiset<connectors::RejectReason>{
                         connectors::RejectReason::kWrongDimension,
                         connectors::RejectReason::kBadLabel}));
}

TEST(DaemonTest, MissingLedgerNextToACheckpointIsRefused) {
  Harness h("missing_ledger");
  for (int i = 0; i < 10; ++i) h.topic->Append(0, Document(i));
  const std::string config = WriteConfig(h.dir, {});
  {
    auto daemon = h.Make(config);
    ASSERT_TRUE(daemon.ok());
    ASSERT_TRUE(RunUntil(**daemon, [](const DaemonStatus& s) { return s.steps_run >= 1; }).ok());
  }
  std::filesystem::remove(h.dir + "/state/ledger");
  auto daemon = h.Make(config);
  ASSERT_FALSE(daemon.ok());
  EXPECT_EQ(daemon.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(daemon.status().message().find("refusing to start from zero"), std::string::npos);
}

}  // namespace
}  // namespace vipsd::daemon
