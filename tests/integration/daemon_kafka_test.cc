// The vipsd binary end to end against a real Kafka protocol peer
// (librdkafka's mock cluster, hosted by this test process so that it
// survives daemon restarts), with kcat as an independent client and the
// reference decoder (tools/decode_release.py) reading the release topic.
//
// Covers issue 4's checks: kcat in → releases out (decoded); malformed
// records dead-lettered with reasons while the daemon keeps running; SIGKILL
// mid-run and restart (t and ε continue, releases continue with higher
// steps, window rebuilt); the ceiling (halt exactly before the crossing
// step, no new budget after a restart); residency start-up refusal; a
// release larger than 1 MB round-tripping through the topic.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <librdkafka/rdkafkacpp.h>

#include "connectors/file/file_util.h"
#include "connectors/kafka/kafka_producer.h"
#include "connectors/kafka/mock_cluster.h"
#include "core/privacy/accounting/fixed_schedule.h"
#include "daemon/io/work_exchange.h"
#include "daemon/state/budget.h"
#include "daemon/state/ledger.h"

namespace vipsd {
namespace {

using namespace std::chrono_literals;

std::string Shell(const std::string& command, int* exit_code = nullptr) {
  FILE* pipe = popen(command.c_str(), "r");
  std::string out;
  if (pipe == nullptr) return out;
  char buffer[65536];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
  const int status = pclose(pipe);
  if (exit_code != nullptr) *exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

std::string Slurp(const std::string& path) {
  auto bytes = connectors::ReadWholeFile(path);
  return bytes.ok() ? *bytes : std::string();
}

bool WaitFor(const std::function<bool()>& condition, std::chrono::seconds deadline) {
  const auto until = std::chrono::steady_clock::now() + deadline;
  while (std::chrono::steady_clock::now() < until) {
    if (condition()) return true;
    std::this_thread::sleep_for(100ms);
  }
  return condition();
}

// One vipsd process with stderr (logs) and stdout captured to files.
class VipsdProcess {
 public:
  VipsdProcess(const std::string& config, const std::string& log,
               std::vector<std::string> args = {})
      : log_(log) {
    args.insert(args.begin(), {"vipsd", "--config", config});
    pid_ = fork();
    if (pid_ == 0) {
      FILE* out = std::freopen(log.c_str(), "a", stderr);
      (void)out;
      FILE* out2 = std::freopen((log + ".stdout").c_str(), "a", stdout);
      (void)out2;
      std::vector<char*> argv;
      for (auto& arg : args) argv.push_back(arg.data());
      argv.push_back(nullptr);
      execv(VIPSD_BINARY, argv.data());
      _exit(127);
    }
  }
  ~VipsdProcess() {
    if (pid_ > 0 && !exited_) Kill(SIGKILL);
  }
  void Kill(int signal) { ::kill(pid_, signal); }
  // Exit code, or -1 on timeout / signal.
  int Wait(std::chrono::seconds deadline) {
    const auto until = std::chrono::steady_clock::now() + deadline;
    while (std::chrono::steady_clock::now() < until) {
      int status = 0;
      const pid_t done = waitpid(pid_, &status, WNOHANG);
      if (done == pid_) {
        exited_ = true;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      std::this_thread::sleep_for(50ms);
    }
    return -1;
  }
  std::string Log() const { return Slurp(log_); }

 private:
  std::string log_;
  pid_t pid_ = -1;
  bool exited_ = false;
};

class DaemonKafkaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto cluster = connectors::MockCluster::Create(1);
    ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
    cluster_ = std::move(*cluster);
    bootstrap_ = cluster_->bootstrap_servers();
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = ::testing::TempDir() + "daemon_kafka_" + info->name() + "_" + std::to_string(getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    for (const char* topic : {"docs", "releases", "dead", "alerts"}) {
      ASSERT_TRUE(cluster_->CreateTopic(topic, std::string(topic) == "docs" ? 2 : 1).ok());
    }
    group_ = std::string("vipsd-it-") + info->name() + "-" + std::to_string(getpid());
  }

  void WriteVocabulary(int size) {
    std::ofstream vocab(dir_ + "/vocab.txt");
    const char* base[] = {"apple", "banana", "cherry", "date", "elder", "fig"};
    for (int i = 0; i < size; ++i) {
      if (i < 6) {
        vocab << base[i] << "\n";
      } else {
        // Distinct [a-z]+ terms.
        std::string term = "w";
        for (int x = i; x > 0; x /= 26) term += static_cast<char>('a' + x % 26);
        vocab << term << "\n";
      }
    }
  }

  // Federated holders' key files DIR/ID.key (vipsd federation-keygen) and
  // their public keys (hex) by id.
  std::map<std::string, std::string> MakeHolderKeys(const std::vector<std::string>& ids) {
    std::map<std::string, std::string> public_keys;
    for (const std::string& id : ids) {
      int code = 0;
      const std::string out = Shell(std::string(VIPSD_BINARY) + " federation-keygen --out " +
                                        dir_ + "/" + id + ".key 2>&1",
                                    &code);
      EXPECT_EQ(code, 0) << out;
      public_keys[id] = out.substr(0, 64);
    }
    return public_keys;
  }

  std::string WriteConfig(const std::string& privacy, const std::string& extra_schedule = "",
                          int topics = 2, const std::string& extra_sink = "") {
    std::ofstream yaml(dir_ + "/" + config_name_);
    yaml << "model:\n  type: lda\n  lda:\n    topics: " << topics
         << "\n    vocabulary: vocab.txt\n    alpha: 0.5\n    eta: 0.1\n    resample_length: 10\n"
         << "privacy:\n" << privacy
         << "schedule:\n  tau0: 1\n  kappa: 0.7\n  threads: 2\n  interval_seconds: "
         << interval_seconds_ << "\n"
         << "  start_delay_seconds: 0\n  on_overrun: catch_up\n"
         << (extra_schedule.find("window_steps") == std::string::npos
                 ? "  window_steps: 1000000000\n"
                 : "")
         << extra_schedule
         // A pool sized for the test's records: the default (100,000) makes
         // the worst-case step longer than the 0.2 s slot, which a start
         // refuses (daemon/setup/step_calibration.h).
         << "pool:\n  capacity: 10000\n"
         << "source:\n  type: kafka\n"
         << (input_topic_.empty() ? "" : "  topics: [" + input_topic_ + "]\n")
         << "  group_id: " << group_
         // The mock cluster stores the producer's timestamps (CreateTime):
         // it cannot append with LogAppendTime (TOOLCHAIN.md).
         << "\n" << (source_extra_.find("timestamps:") == std::string::npos
                        ? "  timestamps: create_time\n"
                        : "")
         << source_extra_
         << "sink:\n  type: kafka\n  topic: " << release_topic_ << "\n  publish_every: 1\n"
         << extra_sink
         << "dead_letter:\n  topic: dead\nalerts:\n  topic: alerts\n"
         << "kafka:\n  bootstrap_servers: \"" << bootstrap_ << "\"\n"
         << "  properties:\n    reconnect.backoff.max.ms: \"1000\"\n"
         << "  consumer_properties:\n    session.timeout.ms: \"6000\"\n"
         << "    heartbeat.interval.ms: \"500\"\n"
         << "state:\n  directory: " << state_directory_ << "\n" << state_extra_
         << "metrics:\n  listen: \"\"\n" << federation_;
    return dir_ + "/" + config_name_;
  }

  // Produces lines with kcat (an independent client), keyed by line number.
  void ProduceWithKcat(const std::vector<std::string>& lines) {
    std::string input;
    for (size_t i = 0; i < lines.size(); ++i) input += "k" + std::to_string(i) + "\t" + lines[i] + "\n";
    ASSERT_TRUE(connectors::WriteFileDurably(dir_ + "/input.txt", input, false, 0600).ok());
    int code = 0;
    const std::string out = Shell("kcat -P -b " + bootstrap_ + " -t " + input_topic_ + " -K '\t' -l " + dir_ +
                                      "/input.txt 2>&1",
                                  &code);
    ASSERT_EQ(code, 0) << out;
  }

  // Produces (key, line) pairs with kcat; an empty key is an empty key.
  void ProduceKeyedWithKcat(const std::vector<std::pair<std::string, std::string>>& records) {
    std::string input;
    for (const auto& [key, line] : records) input += key + "\t" + line + "\n";
    ASSERT_TRUE(connectors::WriteFileDurably(dir_ + "/input.txt", input, false, 0600).ok());
    int code = 0;
    const std::string out = Shell("kcat -P -b " + bootstrap_ + " -t " + input_topic_ +
                                      " -K '\t' -l " + dir_ + "/input.txt 2>&1",
                                  &code);
    ASSERT_EQ(code, 0) << out;
  }

  // Dumps a topic with kcat in the reference decoder's format.
  std::string DumpTopic(const std::string& topic) {
    const std::string path = dir_ + "/" + topic + ".dump";
    Shell("kcat -C -b " + bootstrap_ + " -t " + topic +
          " -o beginning -e -q -f 'vipsd-kcat %p %o %K %S\\n%k\\n%h\\n%s\\n' > " + path +
          " 2>/dev/null");
    return path;
  }

  // Release ids and steps decoded from the release topic by the reference decoder.
  std::vector<int64_t> ReleasedSteps(std::string* json_lines = nullptr) {
    const std::string dump = DumpTopic("releases");
    int code = 0;
    const std::string out = Shell("/usr/bin/python3 " + std::string(VIPSD_SOURCE_DIR) +
                                      "/tools/decode_release.py --kcat " + dump + " --json 2>&1",
                                  &code);
    if (json_lines != nullptr) *json_lines = out;
    std::vector<int64_t> steps;
    const std::regex step_re("\"step\": ([0-9]+)");
    for (auto it = std::sregex_iterator(out.begin(), out.end(), step_re);
         it != std::sregex_iterator(); ++it) {
      steps.push_back(std::stoll((*it)[1]));
    }
    return steps;
  }

  daemon::LedgerState Ledger() {
    auto state = daemon::Ledger::Decode(Slurp(dir_ + "/state/ledger"), "ledger");
    EXPECT_TRUE(state.ok()) << state.status().ToString();
    return state.ok() ? *state : daemon::LedgerState();
  }

  // The ledger in `directory` under the test directory; empty if there is
  // none (yet).
  daemon::LedgerState LedgerIn(const std::string& directory) {
    auto state = daemon::Ledger::Decode(Slurp(dir_ + "/" + directory + "/ledger"), directory);
    return state.ok() ? *state : daemon::LedgerState();
  }

  // The group's committed offsets, summed over the input partitions (an
  // OffsetFetch without joining the group).
  int64_t CommittedTotal() {
    std::string error;
    std::unique_ptr<RdKafka::Conf> conf(RdKafka::Conf::create(RdKafka::Conf::CONF_GLOBAL));
    conf->set("bootstrap.servers", bootstrap_, error);
    conf->set("group.id", group_, error);
    std::unique_ptr<RdKafka::KafkaConsumer> consumer(
        RdKafka::KafkaConsumer::create(conf.get(), error));
    if (!consumer) return -1;
    std::vector<RdKafka::TopicPartition*> partitions = {
        RdKafka::TopicPartition::create("docs", 0), RdKafka::TopicPartition::create("docs", 1)};
    int64_t total = -1;
    if (consumer->committed(partitions, 10000) == RdKafka::ERR_NO_ERROR) {
      total = 0;
      for (auto* partition : partitions) total += std::max<int64_t>(0, partition->offset());
    }
    RdKafka::TopicPartition::destroy(partitions);
    consumer->close();
    return total;
  }

  // The start of a shared-work comparison: six input partitions holding 240
  // records, the release, ledger and work topics, and one solo run of
  // `steps` steps mirrored to mirror-solo. The shared run that follows
  // releases to releases-shared in a consumer group of its own.
  void RunSoloBeforeSharing(int steps);

  static std::string Document(int i) {
    return std::string("{\"id\": ") + std::to_string(i) + ", \"text\": \"" +
           (i % 2 ? "apple banana apple cherry" : "date elder fig fig") + "\"}";
  }

  std::unique_ptr<connectors::MockCluster> cluster_;
  std::string bootstrap_;
  std::string dir_;
  std::string group_;
  // WriteConfig: the file, the state directory and extra state keys.
  std::string config_name_ = "vipsd.yaml";
  std::string state_directory_ = "state";
  std::string state_extra_;
  std::string source_extra_;  // extra source keys
  std::string interval_seconds_ = "0.2";
  std::string input_topic_ = "docs";  // "": no source.topics (a federated aggregator)
  std::string release_topic_ = "releases";
  std::string federation_;  // a federation section, appended as is
};

const char* kPrivate =
    "  noise_multiplier: 1.0\n  sampling_rate: 0.2\n  delta: 1.0e-5\n  epsilon_ceiling: 1000\n";

TEST_F(DaemonKafkaTest, KcatInReleasesOutDeadLettersAndKeepsRunning) {
  WriteVocabulary(6);
  std::vector<std::string> lines;
  for (int i = 0; i < 100; ++i) lines.push_back(Document(i));
  lines.push_back("{\"id\": 1, \"text\": 5}");
  lines.push_back("not json");
  lines.push_back("{\"id\": 2, \"text\": \"zebra\"}");
  ProduceWithKcat(lines);
  VipsdProcess vipsd(WriteConfig(kPrivate), dir_ + "/vipsd.log");
  ASSERT_TRUE(WaitFor([&] { return ReleasedSteps().size() >= 3; }, 60s)) << vipsd.Log();
  // Dead letters, with reasons and the original bytes, read by kcat.
  std::string dead;
  ASSERT_TRUE(WaitFor([&] {
    dead = Slurp(DumpTopic("dead"));
    return dead.find("invalid_json") != std::string::npos &&
           dead.find("bad_text") != std::string::npos;
  }, 30s)) << dead;
  EXPECT_NE(dead.find("vipsd-reason=bad_text"), std::string::npos) << dead;
  EXPECT_NE(dead.find("vipsd-reason=invalid_json"), std::string::npos);
  EXPECT_NE(dead.find("not json"), std::string::npos);
  // A well-formed document without a vocabulary word is a record, not a
  // dead letter.
  EXPECT_EQ(dead.find("zebra"), std::string::npos) << dead;
  // More records after the bad ones: still consumed, still stepping.
  ProduceWithKcat({Document(1000), Document(1001)});
  const size_t before = ReleasedSteps().size();
  ASSERT_TRUE(WaitFor([&] { return ReleasedSteps().size() >= before + 2; }, 30s));
  std::string decoded;
  const auto steps = ReleasedSteps(&decoded);
  for (size_t i = 1; i < steps.size(); ++i) EXPECT_GT(steps[i], steps[i - 1]);
  EXPECT_NE(decoded.find("\"is_private\": true"), std::string::npos) << decoded;
  EXPECT_NE(decoded.find("\"lambda\": {\"shape\": [2, 6]"), std::string::npos) << decoded;
  // Releases do not prove the two late records were read (every slot steps
  // anyway): wait until the periodic commit covers all 105 records.
  EXPECT_TRUE(WaitFor([&] { return CommittedTotal() == 105; }, 30s)) << CommittedTotal();
  vipsd.Kill(SIGTERM);
  EXPECT_EQ(vipsd.Wait(30s), 0) << vipsd.Log();
  // Every record — pooled or dead-lettered — was committed: 105 in all.
  EXPECT_EQ(CommittedTotal(), 105);
  // Log lines carry no record content.
  EXPECT_EQ(vipsd.Log().find("not json"), std::string::npos);
  EXPECT_EQ(vipsd.Log().find("zebra"), std::string::npos);
}

// What librdkafka's mock cluster does with timestamps: it stores the batch
// as the producer wrote it, so every message carries the producer's
// CreateTime (it cannot apply message.timestamp.type=LogAppendTime). Under
// the default source.timestamps: log_append_time no such message may decide
// a slot's cut: each is dead-lettered as untrusted_timestamp (and
// committed), none is pooled, and the daemon keeps running. Every other
// test on the mock cluster says create_time explicitly (WriteConfig).
TEST_F(DaemonKafkaTest, OnTheMockClusterProducerTimestampsAreDeadLetteredUnderLogAppendTime) {
  WriteVocabulary(6);
  std::vector<std::string> lines;
  for (int i = 0; i < 5; ++i) lines.push_back(Document(i));
  ProduceWithKcat(lines);
  source_extra_ = "  timestamps: log_append_time\n";
  VipsdProcess vipsd(WriteConfig(kPrivate), dir_ + "/vipsd.log");
  std::string dead;
  ASSERT_TRUE(WaitFor([&] {
    dead = Slurp(DumpTopic("dead"));
    size_t count = 0;
    for (size_t at = dead.find("vipsd-reason=untrusted_timestamp"); at != std::string::npos;
         at = dead.find("vipsd-reason=untrusted_timestamp", at + 1)) {
      ++count;
    }
    return count == 5;
  }, 60s)) << dead << vipsd.Log();
  EXPECT_TRUE(WaitFor([&] { return CommittedTotal() == 5; }, 30s)) << CommittedTotal();
  // Said once, with what to change.
  EXPECT_NE(vipsd.Log().find("with a producer's timestamp (CreateTime) was dead-lettered "
                             "(untrusted_timestamp)"),
            std::string::npos)
      << vipsd.Log();
  EXPECT_NE(vipsd.Log().find("message.timestamp.type=LogAppendTime"), std::string::npos);
  ASSERT_TRUE(WaitFor([&] { return ReleasedSteps().size() >= 2; }, 60s)) << vipsd.Log();
  vipsd.Kill(SIGTERM);
  EXPECT_EQ(vipsd.Wait(30s), 0) << vipsd.Log();
}

// privacy.unit: key end to end: the message key is the unit, a record
// without one is dead-lettered (missing_unit), and the ledger, the releases
// and the exit say what the budget protects.
TEST_F(DaemonKafkaTest, TheMessageKeyIsThePrivacyUnitEndToEnd) {
  WriteVocabulary(6);
  std::vector<std::pair<std::string, std::string>> records;
  for (int i = 0; i < 60; ++i) records.emplace_back("person-" + std::to_string(i % 6), Document(i));
  records.emplace_back("", Document(500));  // no unit id
  ProduceKeyedWithKcat(records);
  VipsdProcess vipsd(WriteConfig(std::string(kPrivate) + "  unit: key\n  max_records_per_unit: 3\n"),
                     dir_ + "/vipsd.log");
  ASSERT_TRUE(WaitFor([&] { return ReleasedSteps().size() >= 3; }, 60s)) << vipsd.Log();
  std::string dead;
  ASSERT_TRUE(WaitFor([&] {
    dead = Slurp(DumpTopic("dead"));
    return dead.find("vipsd-reason=missing_unit") != std::string::npos;
  }, 30s)) << dead << vipsd.Log();
  std::string decoded;
  ReleasedSteps(&decoded);
  EXPECT_NE(decoded.find("\"privacy_unit\": \"key\""), std::string::npos) << decoded;
  EXPECT_NE(decoded.find("\"max_records_per_unit\": 3"), std::string::npos) << decoded;
  EXPECT_TRUE(WaitFor([&] { return CommittedTotal() == 61; }, 30s))
      << CommittedTotal() << vipsd.Log();
  vipsd.Kill(SIGTERM);
  EXPECT_EQ(vipsd.Wait(30s), 0) << vipsd.Log();
  const daemon::LedgerState state = Ledger();
  EXPECT_EQ(state.unit, "key");
  EXPECT_EQ(state.max_records_per_unit, 3);
  // The unit ids never reach the log.
  EXPECT_EQ(vipsd.Log().find("person-"), std::string::npos);
}

TEST_F(DaemonKafkaTest, SigkillMidRunThenRestartContinuesBudgetAndSteps) {
  WriteVocabulary(6);
  std::vector<std::string> lines;
  for (int i = 0; i < 80; ++i) lines.push_back(Document(i));
  ProduceWithKcat(lines);
  const std::string config = WriteConfig(kPrivate);
  int64_t killed_next_step = 0;
  double killed_epsilon = 0;
  int64_t max_step_before = 0;
  {
    VipsdProcess vipsd(config, dir_ + "/vipsd1.log");
    ASSERT_TRUE(WaitFor([&] { return ReleasedSteps().size() >= 4; }, 60s)) << vipsd.Log();
    vipsd.Kill(SIGKILL);
    vipsd.Wait(10s);
    const daemon::LedgerState state = Ledger();
    killed_next_step = state.next_step;
    killed_epsilon = state.accountant
                         .GetEpsilon(1e-5, privacy::RdpConversion::kImproved,
                                     privacy::Adaptivity::kAdaptiveFilter)
                         ->epsilon;
    for (int64_t step : ReleasedSteps()) max_step_before = std::max(max_step_before, step);
    EXPECT_GE(killed_next_step, max_step_before + 1);  // ledger before release
  }
  VipsdProcess vipsd(config, dir_ + "/vipsd2.log");
  ASSERT_TRUE(WaitFor([&] {
    int64_t latest = 0;
    for (int64_t step : ReleasedSteps()) latest = std::max(latest, step);
    return latest >= killed_next_step + 2;
  }, 60s)) << vipsd.Log();
  vipsd.Kill(SIGTERM);
  EXPECT_EQ(vipsd.Wait(30s), 0);
  const daemon::LedgerState state = Ledger();
  EXPECT_GT(state.next_step, killed_next_step);
  const double epsilon = state.accountant
                             .GetEpsilon(1e-5, privacy::RdpConversion::kImproved,
                                         privacy::Adaptivity::kAdaptiveFilter)
                             ->epsilon;
  EXPECT_GT(epsilon, killed_epsilon);
  // The restarted daemon resumed at the ledger's t and rebuilt its window
  // from the topic (all 80 records, nothing lost).
  const std::string log = vipsd.Log();
  EXPECT_NE(log.find("next_step=" + std::to_string(killed_next_step)), std::string::npos) << log;
  EXPECT_NE(log.find("window=80"), std::string::npos) << log;
}

TEST_F(DaemonKafkaTest, HaltsBeforeTheCeilingAndARestartGrantsNoBudget) {
  WriteVocabulary(6);
  std::vector<std::string> lines;
  for (int i = 0; i < 40; ++i) lines.push_back(Document(i));
  ProduceWithKcat(lines);
  const std::string config = WriteConfig(
      "  noise_multiplier: 1.5\n  sampling_rate: 0.2\n  delta: 1.0e-5\n  epsilon_ceiling: 3.0\n"
      "  on_ceiling: exit\n");
  VipsdProcess first(config, dir_ + "/vipsd1.log");
  ASSERT_EQ(first.Wait(90s), 0) << first.Log();
  const daemon::LedgerState state = Ledger();
  // The default schedule of a new state directory is fixed: ε by the
  // fixed-schedule accountant, the same the planner uses.
  EXPECT_EQ(state.schedule, daemon::ScheduleKind::kFixed);
  const auto fixed = privacy::FixedScheduleAccountant::Create({0.2, 1.5});
  ASSERT_TRUE(fixed.ok());
  EXPECT_LE(fixed->Epsilon(state.accountant.steps(), 1e-5)->epsilon, 3.0);
  EXPECT_GT(fixed->Epsilon(state.accountant.steps() + 1, 1e-5)->epsilon, 3.0);
  EXPECT_GT(state.accountant.steps(), 1);
  EXPECT_NE(first.Log().find("epsilon ceiling reached"), std::string::npos);
  const std::string alerts = Slurp(DumpTopic("alerts"));
  EXPECT_NE(alerts.find("\"event\": \"halted\""), std::string::npos) << alerts;
  // Restart: halts at once, no step, the same ledger.
  VipsdProcess second(config, dir_ + "/vipsd2.log");
  ASSERT_EQ(second.Wait(60s), 0) << second.Log();
  const daemon::LedgerState after = Ledger();
  EXPECT_EQ(after.next_step, state.next_step);
  EXPECT_EQ(after.accountant, state.accountant);
}

TEST_F(DaemonKafkaTest, ResidencyStartUpRefusesAnUnaffordableWindow) {
  WriteVocabulary(6);
  VipsdProcess vipsd(WriteConfig("  noise_multiplier: 0.8\n  sampling_rate: 0.5\n  delta: 1.0e-5\n"
                                 "  epsilon_ceiling: 1.0\n  accounting: residency\n",
                                 "  window_steps: 1000\n"),
                     dir_ + "/vipsd.log");
  EXPECT_EQ(vipsd.Wait(30s), 2);
  EXPECT_NE(vipsd.Log().find("schedule.window_steps: a record that is a candidate in 1000 steps"),
            std::string::npos)
      << vipsd.Log();
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/state/ledger"));
}

TEST_F(DaemonKafkaTest, AReleaseLargerThanOneMegabyteRoundTripsThroughTheTopic) {
  WriteVocabulary(8000);  // K = 50, V = 8000: λ is 3.2 MB
  std::vector<std::string> lines;
  for (int i = 0; i < 20; ++i) lines.push_back(Document(i));
  ProduceWithKcat(lines);
  // Slots of 2 s: a worst-case step of this model (noise over K·V = 400,000
  // coordinates) does not fit in the usual 0.2 s, which a start refuses.
  interval_seconds_ = "2.0";
  VipsdProcess vipsd(WriteConfig(kPrivate, "  max_steps: 1\n", 50, "  mirror_directory: mirror\n"),
                     dir_ + "/vipsd.log");
  ASSERT_EQ(vipsd.Wait(90s), 0) << vipsd.Log();
  const std::string dump = DumpTopic("releases");
  int code = 0;
  const std::string out = Shell("/usr/bin/python3 " + std::string(VIPSD_SOURCE_DIR) +
                                    "/tools/decode_release.py --kcat " + dump +
                                    " --extract " + dir_ + "/extracted --json 2>&1",
                                &code);
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("\"lambda\": {\"shape\": [50, 8000]"), std::string::npos) << out;
  // More than one chunk went through Kafka, and the bytes equal the mirror's.
  const std::string from_topic = Slurp(dir_ + "/extracted/step-1/lambda.npy");
  const std::string mirrored = Slurp(dir_ + "/mirror/step-1/lambda.npy");
  EXPECT_GT(from_topic.size(), size_t{3200000});
  EXPECT_EQ(from_topic, mirrored);
  EXPECT_NE(Slurp(dump).find("vipsd-chunks=4"), std::string::npos);
}

// Issue 27: a malformed record of 1,000,000 bytes (under max_record_bytes)
// made a dead letter over the producer's message.max.bytes; its publication
// failed for ever, consumption stopped at it, and a restart stopped there
// again. Now the dead letter is cut to fit (and says so), consumption goes
// on, and a restart does not dead-letter the record a second time.
TEST_F(DaemonKafkaTest, APoisonRecordNeverStopsConsumptionAndIsDeadLetteredOnce) {
  WriteVocabulary(6);
  connectors::KafkaProducerOptions options;
  options.bootstrap_servers = bootstrap_;
  options.client_id = "poison-producer";
  options.properties["message.max.bytes"] = "2000000";
  auto producer = connectors::KafkaProducer::Create(options);
  ASSERT_TRUE(producer.ok()) << producer.status().ToString();
  std::vector<connectors::OutMessage> messages;
  auto add = [&](std::string value) {
    connectors::OutMessage m;
    m.topic = input_topic_;
    m.key = "k" + std::to_string(messages.size());
    m.partition = static_cast<int32_t>(messages.size() % 2);
    m.value = std::move(value);
    messages.push_back(std::move(m));
  };
  for (int i = 0; i < 30; ++i) add(Document(i));
  std::string poison = "{\"id\": 7, \"text\": \"";
  poison.resize(1000000, 'x');  // never closed: invalid_json
  add(poison);
  for (int i = 30; i < 60; ++i) add(Document(i));
  ASSERT_TRUE((*producer)->ProduceAndWait(messages, 30s).ok());
  (void)(*producer)->Close(5s);
  source_extra_ = "  max_record_bytes: 1048576\n";  // the old default: the record is not oversize
  const std::string config = WriteConfig(kPrivate);
  auto dead_letters = [&] {
    std::vector<std::string> found;
    std::istringstream dump(Slurp(DumpTopic("dead")));
    for (std::string line; std::getline(dump, line);) {
      if (line.rfind("vipsd-reason=", 0) == 0) found.push_back(line);
    }
    return found;
  };
  {
    VipsdProcess vipsd(config, dir_ + "/vipsd1.log");
    ASSERT_TRUE(WaitFor([&] { return CommittedTotal() == 61; }, 60s))
        << CommittedTotal() << "\n" << vipsd.Log();
    ASSERT_TRUE(WaitFor([&] { return ReleasedSteps().size() >= 2; }, 60s)) << vipsd.Log();
    vipsd.Kill(SIGTERM);
    EXPECT_EQ(vipsd.Wait(30s), 0) << vipsd.Log();
    EXPECT_EQ(vipsd.Log().find("dead-letter publish failed"), std::string::npos) << vipsd.Log();
    EXPECT_EQ(vipsd.Log().find("xxxxxxxx"), std::string::npos);  // no content in logs
    // Said at start: such records are dead-lettered cut.
    EXPECT_NE(vipsd.Log().find("source.max_record_bytes: warning: 1048576 bytes is more than a "
                               "dead letter can carry whole"),
              std::string::npos)
        << vipsd.Log();
  }
  const std::vector<std::string> first = dead_letters();
  ASSERT_EQ(first.size(), 1u);
  EXPECT_NE(first[0].find("vipsd-reason=invalid_json"), std::string::npos) << first[0];
  EXPECT_NE(first[0].find("vipsd-payload-truncated=1000000"), std::string::npos) << first[0];
  // The copy is cut to what the producer can send, and starts as the record.
  const std::string dump = Slurp(dir_ + "/dead.dump");
  EXPECT_NE(dump.find("{\"id\": 7, \"text\": \"xxxx"), std::string::npos);
  EXPECT_LT(dump.size(), size_t{1000000});
  // A restart re-reads the window from its start, the poison record with it:
  // consumption goes on, and the record is not dead-lettered again.
  int64_t last_before = 0;
  for (int64_t step : ReleasedSteps()) last_before = std::max(last_before, step);
  VipsdProcess vipsd(config, dir_ + "/vipsd2.log");
  ASSERT_TRUE(WaitFor([&] {
    int64_t latest = 0;
    for (int64_t step : ReleasedSteps()) latest = std::max(latest, step);
    return latest >= last_before + 2;
  }, 60s)) << vipsd.Log();
  vipsd.Kill(SIGTERM);
  EXPECT_EQ(vipsd.Wait(30s), 0) << vipsd.Log();
  EXPECT_EQ(dead_letters().size(), 1u);
}

double LedgerEpsilon(const daemon::LedgerState& state) {
  return state.accountant
      .GetEpsilon(1e-5, privacy::RdpConversion::kImproved, privacy::Adaptivity::kAdaptiveFilter)
      ->epsilon;
}

TEST_F(DaemonKafkaTest, ALostStateDirectoryContinuesTheBudgetFromTheLedgerTopic) {
  // state.ledger_topic (issue 16): the budget of record survives the loss of
  // the machine's disk; a second process that takes the job over fences the
  // first, which then releases nothing more and exits with an error.
  ASSERT_TRUE(cluster_->CreateTopic("ledger", 1).ok());
  WriteVocabulary(6);
  std::vector<std::string> lines;
  for (int i = 0; i < 60; ++i) lines.push_back(Document(i));
  ProduceWithKcat(lines);
  state_extra_ = "  ledger_topic: ledger\n  ledger_key: job-1\n";
  const std::string privacy = std::string(kPrivate) + "  schedule: adaptive\n";
  const std::string config = WriteConfig(privacy);
  int64_t first_next_step = 0;
  double first_epsilon = 0;
  {
    VipsdProcess vipsd(config, dir_ + "/vipsd1.log");
    ASSERT_TRUE(WaitFor([&] { return ReleasedSteps().size() >= 3; }, 60s)) << vipsd.Log();
    vipsd.Kill(SIGTERM);
    ASSERT_EQ(vipsd.Wait(30s), 0) << vipsd.Log();
    first_next_step = Ledger().next_step;
    first_epsilon = LedgerEpsilon(Ledger());
  }
  // The disk is gone: a new, empty state directory.
  std::filesystem::remove_all(dir_ + "/state");
  VipsdProcess second(config, dir_ + "/vipsd2.log");
  ASSERT_TRUE(WaitFor([&] { return std::filesystem::exists(dir_ + "/state/ledger") &&
                                   Ledger().next_step > first_next_step + 1; },
                      60s))
      << second.Log();
  EXPECT_GT(LedgerEpsilon(Ledger()), first_epsilon);  // never restarted from zero
  EXPECT_NE(second.Log().find("restored from ledger topic ledger partition 0"), std::string::npos)
      << second.Log();
  EXPECT_NE(second.Log().find("next_step=" + std::to_string(first_next_step)), std::string::npos)
      << second.Log();

  // A misconfigured process for the same job (another model: 3 topics)
  // refuses to start — before it claims, so the running owner is not fenced.
  state_directory_ = "state-bad";
  config_name_ = "vipsd-bad.yaml";
  const std::string saved_group = group_;
  group_ += "-bad";
  const std::string config_bad = WriteConfig(privacy, "", /*topics=*/3);
  group_ = saved_group;
  {
    VipsdProcess bad(config_bad, dir_ + "/vipsd-bad.log");
    EXPECT_EQ(bad.Wait(60s), 1) << bad.Log();
    EXPECT_NE(bad.Log().find("different model"), std::string::npos) << bad.Log();
  }
  const int64_t before_bad = Ledger().next_step;
  ASSERT_TRUE(WaitFor([&] { return Ledger().next_step > before_bad + 1; }, 30s)) << second.Log();
  EXPECT_EQ(second.Log().find("fenced"), std::string::npos) << second.Log();

  // A third process (its own state directory and consumer group, the same
  // job) takes over: the second is fenced at its next commit and exits 1.
  state_directory_ = "state3";
  config_name_ = "vipsd3.yaml";
  group_ += "-3";
  const std::string config3 = WriteConfig(privacy);
  VipsdProcess third(config3, dir_ + "/vipsd3.log");
  EXPECT_EQ(second.Wait(60s), 1) << second.Log();
  EXPECT_NE(second.Log().find("fenced"), std::string::npos) << second.Log();
  const int64_t second_next_step = Ledger().next_step;  // its last local commit
  ASSERT_TRUE(WaitFor([&] { return LedgerIn("state3").next_step > second_next_step + 1; }, 60s))
      << third.Log();
  EXPECT_GE(LedgerEpsilon(LedgerIn("state3")), LedgerEpsilon(Ledger()) - 1e-12);
  third.Kill(SIGTERM);
  EXPECT_EQ(third.Wait(30s), 0) << third.Log();
  // Every step number was released at most once and in order: the fenced
  // process released nothing after the takeover.
  const auto steps = ReleasedSteps();
  for (size_t i = 1; i < steps.size(); ++i) EXPECT_GT(steps[i], steps[i - 1]);

  // The fenced second directory takes the job again: its ledger is behind
  // the record, so its checkpoint (which may hold a step the record does not
  // charge) is not resumed and is moved aside — left in place it would make
  // the start after a crash refuse the directory (a checkpoint beside a
  // ledger it does not belong to).
  ASSERT_TRUE(std::filesystem::exists(dir_ + "/state/checkpoint"));
  state_directory_ = "state";
  config_name_ = "vipsd4.yaml";
  group_ += "-4";
  const std::string config4 = WriteConfig(privacy);
  {
    VipsdProcess fourth(config4, dir_ + "/vipsd4.log");
    ASSERT_TRUE(WaitFor([&] { return std::filesystem::exists(dir_ + "/state/checkpoint.discarded"); },
                        60s))
        << fourth.Log();
    ASSERT_TRUE(WaitFor([&] { return fourth.Log().find("step=") != std::string::npos; }, 60s))
        << fourth.Log();
    EXPECT_NE(fourth.Log().find("the model restarts from its prior"), std::string::npos)
        << fourth.Log();
    fourth.Kill(SIGKILL);
    fourth.Wait(30s);
  }
  const int64_t fourth_next_step = Ledger().next_step;
  VipsdProcess fifth(config4, dir_ + "/vipsd5.log");
  ASSERT_TRUE(WaitFor([&] { return Ledger().next_step > fourth_next_step + 1; }, 60s))
      << fifth.Log();
  fifth.Kill(SIGTERM);
  EXPECT_EQ(fifth.Wait(30s), 0) << fifth.Log();
}

TEST_F(DaemonKafkaTest, AStandbyTakesOverFromAPausedDaemonWhichIsThenFenced) {
  // state.standby_takeover_seconds (issue 16): one active daemon, one hot
  // standby on another "machine" (state directory, consumer group). The
  // active one is paused (SIGSTOP: a stalled coordinator); the standby takes
  // over after 2 s of ledger silence and continues the budget; the paused one,
  // resumed, is fenced at its next commit and exits 1.
  ASSERT_TRUE(cluster_->CreateTopic("ledger", 1).ok());
  WriteVocabulary(6);
  std::vector<std::string> lines;
  for (int i = 0; i < 60; ++i) lines.push_back(Document(i));
  ProduceWithKcat(lines);
  const std::string privacy = std::string(kPrivate) + "  schedule: adaptive\n";
  state_extra_ = "  ledger_topic: ledger\n  ledger_key: job-2\n";
  const std::string config_a = WriteConfig(privacy);
  state_directory_ = "state-b";
  config_name_ = "vipsd-b.yaml";
  group_ += "-b";
  state_extra_ += "  standby_takeover_seconds: 2\n";
  const std::string config_b = WriteConfig(privacy);

  VipsdProcess active(config_a, dir_ + "/vipsd-a.log");
  ASSERT_TRUE(WaitFor([&] { return ReleasedSteps().size() >= 2; }, 60s)) << active.Log();
  VipsdProcess standby(config_b, dir_ + "/vipsd-b.log");
  std::this_thread::sleep_for(4s);
  // A healthy active daemon commits every slot: the standby stays idle.
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/state-b/ledger")) << standby.Log();
  EXPECT_NE(standby.Log().find("standby for job 'job-2'"), std::string::npos) << standby.Log();

  active.Kill(SIGSTOP);
  const int64_t paused_next_step = LedgerIn("state").next_step;
  ASSERT_TRUE(WaitFor([&] { return LedgerIn("state-b").next_step > paused_next_step + 2; }, 60s))
      << standby.Log();
  EXPECT_NE(standby.Log().find("taking over"), std::string::npos) << standby.Log();
  EXPECT_GE(LedgerEpsilon(LedgerIn("state-b")), LedgerEpsilon(LedgerIn("state")));

  active.Kill(SIGCONT);
  EXPECT_EQ(active.Wait(60s), 1) << active.Log();
  EXPECT_NE(active.Log().find("fenced"), std::string::npos) << active.Log();
  const int64_t before_stop = LedgerIn("state-b").next_step;
  ASSERT_TRUE(WaitFor([&] { return LedgerIn("state-b").next_step > before_stop + 1; }, 30s));
  standby.Kill(SIGTERM);
  EXPECT_EQ(standby.Wait(30s), 0) << standby.Log();

  // Every released step was charged by the ledger of record, and no step
  // number was released twice (by the two processes).
  const daemon::LedgerState record = LedgerIn("state-b");
  std::vector<int64_t> steps = ReleasedSteps();
  ASSERT_FALSE(steps.empty());
  std::sort(steps.begin(), steps.end());
  EXPECT_EQ(std::adjacent_find(steps.begin(), steps.end()), steps.end()) << "a step released twice";
  EXPECT_LT(steps.back(), record.next_step);
}

TEST_F(DaemonKafkaTest, ALedgerTopicThatCannotDecideOwnershipIsRefused) {
  // More than one partition (no total order), or a message that is not a
  // ledger entry (start-up does not skip what it cannot read): the daemon
  // refuses to start, naming the topic (and the offset).
  ASSERT_TRUE(cluster_->CreateTopic("ledger2", 2).ok());
  ASSERT_TRUE(cluster_->CreateTopic("ledger1", 1).ok());
  WriteVocabulary(6);
  state_extra_ = "  ledger_topic: ledger2\n";
  {
    VipsdProcess vipsd(WriteConfig(kPrivate), dir_ + "/vipsd-2p.log");
    EXPECT_EQ(vipsd.Wait(60s), 1) << vipsd.Log();
    EXPECT_NE(vipsd.Log().find("ledger2 has 2 partitions"), std::string::npos) << vipsd.Log();
  }
  ASSERT_TRUE(connectors::WriteFileDurably(dir_ + "/junk.txt", "job\tnot a ledger\n", false, 0600)
                  .ok());
  int code = 0;
  const std::string out = Shell("kcat -P -b " + bootstrap_ + " -t ledger1 -K '\t' -l " + dir_ +
                                    "/junk.txt 2>&1",
                                &code);
  ASSERT_EQ(code, 0) << out;
  state_extra_ = "  ledger_topic: ledger1\n";
  state_directory_ = "state-junk";
  VipsdProcess vipsd(WriteConfig(kPrivate), dir_ + "/vipsd-junk.log");
  EXPECT_EQ(vipsd.Wait(60s), 1) << vipsd.Log();
  EXPECT_NE(vipsd.Log().find("ledger topic ledger1 partition 0 offset 0"), std::string::npos)
      << vipsd.Log();
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/state-junk/ledger"));
  // A work topic needs its two partitions (plans, partial sums).
  ASSERT_TRUE(cluster_->CreateTopic("ledger3", 1).ok());
  ASSERT_TRUE(cluster_->CreateTopic("work1", 1).ok());
  state_extra_ = "  ledger_topic: ledger3\n  work_topic: work1\n";
  state_directory_ = "state-work1";
  VipsdProcess one(WriteConfig(kPrivate), dir_ + "/vipsd-work1.log");
  EXPECT_EQ(one.Wait(60s), 1) << one.Log();
  EXPECT_NE(one.Log().find("work1 has 1 partition(s); the work topic needs exactly two"),
            std::string::npos)
      << one.Log();
}


// The files of release step-N in a mirror directory (its arrays' bytes).
std::string ReleaseArrays(const std::string& directory, int64_t step) {
  std::string bytes;
  const std::string release = directory + "/step-" + std::to_string(step);
  if (!std::filesystem::is_directory(release)) return "";
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(release)) {
    if (entry.path().extension() == ".npy") files.push_back(entry.path().string());
  }
  std::sort(files.begin(), files.end());
  for (const auto& file : files) bytes += file.substr(release.size()) + "\n" + Slurp(file);
  return bytes;
}

std::string ManifestEpsilon(const std::string& directory, int64_t step) {
  const std::string manifest =
      Slurp(directory + "/step-" + std::to_string(step) + "/manifest.json");
  std::smatch match;
  const std::regex epsilon_re("\"epsilon_spent\": ([0-9.eE+-]+)");
  return std::regex_search(manifest, match, epsilon_re) ? match[1].str() : "";
}

// The shared-work comparisons' privacy and schedule sections: fixed-seed
// noise, so that solo and shared runs can be compared byte for byte, and a
// window longer than the run.
std::string SharedPrivacy() {
  return std::string(kPrivate) + "  noise: fixed_seed\n  noise_seed: 7\n";
}
std::string SharedSchedule(int steps) {
  return "  window_steps: 1000000000\n  max_steps: " + std::to_string(steps) + "\n";
}

void DaemonKafkaTest::RunSoloBeforeSharing(int steps) {
  ASSERT_TRUE(cluster_->CreateTopic("docs6", 6).ok());
  for (const char* topic : {"releases-shared", "ledger"}) {
    ASSERT_TRUE(cluster_->CreateTopic(topic, 1).ok());
  }
  ASSERT_TRUE(cluster_->CreateTopic("work", 2).ok());  // plans, partial sums
  input_topic_ = "docs6";
  WriteVocabulary(6);
  std::vector<std::string> lines;
  for (int i = 0; i < 240; ++i) lines.push_back(Document(i));
  ProduceWithKcat(lines);
  state_directory_ = "state-solo";
  const std::string config =
      WriteConfig(SharedPrivacy(), SharedSchedule(steps), 2, "  mirror_directory: mirror-solo\n");
  VipsdProcess solo(config, dir_ + "/vipsd-solo.log", {"--insecure-fixed-seed-noise"});
  ASSERT_EQ(solo.Wait(120s), 0) << solo.Log();
  release_topic_ = "releases-shared";
  group_ += "-shared";
}

// A step that overran its deadline has no release of its own (its outputs
// left with the next slot's, as the next step's model), so two runs are
// compared at every step both released, the last one included: arrays and
// epsilon byte for byte, at half the steps or more.
void ExpectSameReleases(const std::string& solo_mirror, const std::string& shared_mirror,
                        int64_t steps) {
  int64_t common = 0;
  for (int64_t step = 1; step <= steps; ++step) {
    const std::string solo = ReleaseArrays(solo_mirror, step);
    const std::string shared = ReleaseArrays(shared_mirror, step);
    if (step == steps) {
      ASSERT_FALSE(solo.empty()) << "no solo release of the last step";
      ASSERT_FALSE(shared.empty()) << "no shared release of the last step";
    }
    if (solo.empty() || shared.empty()) continue;
    ++common;
    EXPECT_EQ(shared, solo) << "step " << step;
    EXPECT_EQ(ManifestEpsilon(shared_mirror, step), ManifestEpsilon(solo_mirror, step))
        << "step " << step;
  }
  EXPECT_GE(common, steps / 2);
}

TEST_F(DaemonKafkaTest, ThreeProcessesSharingTheWorkReleaseBitForBitWhatOneProcessReleases) {
  // state.work_topic (issue 16). The same stream (6 partitions, all records
  // there before the start, window: all) and the same fixed-seed noise: one
  // process alone, then a coordinator with two workers that take partitions
  // from it through the consumer group mid-run. Every step both runs
  // released has the same arrays and epsilon, byte for byte; the workers'
  // partial sums were merged into steps.
  constexpr int kSteps = 10;
  const std::string privacy = SharedPrivacy();
  const std::string schedule = SharedSchedule(kSteps);
  const std::vector<std::string> flag = {"--insecure-fixed-seed-noise"};
  RunSoloBeforeSharing(kSteps);
  if (HasFatalFailure()) return;
  const std::string shared_state = "  ledger_topic: ledger\n  work_topic: work\n";
  std::vector<std::unique_ptr<VipsdProcess>> workers;
  for (const char* name : {"w1", "w2"}) {
    state_directory_ = std::string("state-") + name;
    config_name_ = std::string("vipsd-") + name + ".yaml";
    state_extra_ = shared_state + "  standby_takeover_seconds: 120\n";
    workers.push_back(std::make_unique<VipsdProcess>(
        WriteConfig(privacy, schedule), dir_ + "/vipsd-" + name + ".log",
        std::vector<std::string>{"--insecure-fixed-seed-noise", "--instance-id", name}));
  }
  // A process configured for another model (3 topics instead of 2) must
  // not hold partitions it cannot sum: it refuses the first plan and exits
  // with 2 (a configuration error: systemd does not restart it).
  state_directory_ = "state-bad";
  config_name_ = "vipsd-bad.yaml";
  state_extra_ = shared_state + "  standby_takeover_seconds: 120\n";
  VipsdProcess misconfigured(WriteConfig(privacy, schedule, 3), dir_ + "/vipsd-bad.log", flag);
  state_directory_ = "state-coordinator";
  config_name_ = "vipsd-coordinator.yaml";
  state_extra_ = shared_state;
  // Slots 1 s apart, so that the workers' group joins (3 s each on the
  // mock) land mid-run.
  interval_seconds_ = "1.0";
  const std::string config = WriteConfig(
      privacy, schedule + "  release_delay_seconds: 0.5\n", 2,
      "  mirror_directory: mirror-shared\n");
  VipsdProcess coordinator(config, dir_ + "/vipsd-coordinator.log", flag);
  ASSERT_EQ(coordinator.Wait(180s), 0) << coordinator.Log();
  for (auto& worker : workers) {
    worker->Kill(SIGTERM);
    EXPECT_EQ(worker->Wait(60s), 0) << worker->Log();
  }
  for (auto& worker : workers) {
    EXPECT_NE(worker->Log().find("working for job"), std::string::npos) << worker->Log();
  }
  EXPECT_EQ(misconfigured.Wait(30s), 2) << misconfigured.Log();
  EXPECT_NE(misconfigured.Log().find("cannot follow the coordinator's plans"), std::string::npos)
      << misconfigured.Log();
  EXPECT_EQ(misconfigured.Log().find("partitions assigned"), std::string::npos)
      << misconfigured.Log();

  ExpectSameReleases(dir_ + "/mirror-solo", dir_ + "/mirror-shared", kSteps);
  // Some step merged partial sums that other processes computed.
  const std::string log = coordinator.Log();
  const std::regex partials_re("partials=([0-9]+)\\+([0-9]+)");
  int64_t remote = 0;
  for (auto it = std::sregex_iterator(log.begin(), log.end(), partials_re);
       it != std::sregex_iterator(); ++it) {
    remote += std::stoll((*it)[2]);
  }
  EXPECT_GT(remote, 0) << log;
  EXPECT_EQ(LedgerIn("state-coordinator").next_step, kSteps + 1);
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/state-w1/ledger"));
}

TEST_F(DaemonKafkaTest, ACoordinatorThatReadsNoPartitionReleasesBitForBitWhatOneProcessReleases) {
  // Issue 30, state.work_partitions: false. The coordinator never joins the
  // input's consumer group: one worker holds all six partitions and sends
  // ONE partial a step, their sums pre-summed. Every step both runs released
  // is byte for byte one process's.
  constexpr int kSteps = 6;
  const std::string privacy = SharedPrivacy();
  const std::string schedule = SharedSchedule(kSteps);
  const std::vector<std::string> flag = {"--insecure-fixed-seed-noise"};
  RunSoloBeforeSharing(kSteps);
  if (HasFatalFailure()) return;
  const std::string shared_state = "  ledger_topic: ledger\n  work_topic: work\n";
  state_directory_ = "state-w1";
  config_name_ = "vipsd-w1.yaml";
  state_extra_ = shared_state + "  standby_takeover_seconds: 120\n";
  VipsdProcess worker(WriteConfig(privacy, schedule), dir_ + "/vipsd-w1.log",
                      std::vector<std::string>{"--insecure-fixed-seed-noise", "--instance-id", "w1"});
  state_directory_ = "state-coordinator";
  config_name_ = "vipsd-coordinator.yaml";
  state_extra_ = shared_state + "  work_partitions: false\n";
  interval_seconds_ = "1.0";
  VipsdProcess coordinator(
      WriteConfig(privacy, schedule + "  release_delay_seconds: 0.5\n", 2,
                  "  mirror_directory: mirror-shared\n"),
      dir_ + "/vipsd-coordinator.log", flag);
  ASSERT_EQ(coordinator.Wait(180s), 0) << coordinator.Log();
  worker.Kill(SIGTERM);
  EXPECT_EQ(worker.Wait(60s), 0) << worker.Log();
  EXPECT_EQ(coordinator.Log().find("partitions assigned"), std::string::npos) << coordinator.Log();

  ExpectSameReleases(dir_ + "/mirror-solo", dir_ + "/mirror-shared", kSteps);
  // Every step: nothing summed by the coordinator, one partial from the
  // worker (its six partitions pre-summed).
  const std::string log = coordinator.Log();
  const std::regex partials_re("partials=([0-9]+)\\+([0-9]+)");
  int steps_seen = 0;
  for (auto it = std::sregex_iterator(log.begin(), log.end(), partials_re);
       it != std::sregex_iterator(); ++it) {
    ++steps_seen;
    EXPECT_EQ((*it)[1], "0") << log;
    EXPECT_EQ((*it)[2], "1") << log;
  }
  EXPECT_EQ(steps_seen, kSteps) << log;
}

// ---- Federated mode (issue 31) ---------------------------------------------

// Every message on partition `partition` of `topic`, from its start.
std::vector<std::string> ReadPartition(const std::string& bootstrap, const std::string& topic,
                                       int32_t partition) {
  std::string error;
  std::unique_ptr<RdKafka::Conf> conf(RdKafka::Conf::create(RdKafka::Conf::CONF_GLOBAL));
  conf->set("bootstrap.servers", bootstrap, error);
  conf->set("group.id", "federation-test-reader", error);
  conf->set("enable.partition.eof", "true", error);
  conf->set("enable.auto.commit", "false", error);
  std::unique_ptr<RdKafka::KafkaConsumer> consumer(
      RdKafka::KafkaConsumer::create(conf.get(), error));
  std::vector<std::string> out;
  if (!consumer) return out;
  std::vector<RdKafka::TopicPartition*> assignment = {
      RdKafka::TopicPartition::create(topic, partition, RdKafka::Topic::OFFSET_BEGINNING)};
  consumer->assign(assignment);
  RdKafka::TopicPartition::destroy(assignment);
  const auto until = std::chrono::steady_clock::now() + 30s;
  while (std::chrono::steady_clock::now() < until) {
    std::unique_ptr<RdKafka::Message> message(consumer->consume(500));
    if (message->err() == RdKafka::ERR__PARTITION_EOF) break;
    if (message->err() != RdKafka::ERR_NO_ERROR) continue;
    out.emplace_back(static_cast<const char*>(message->payload()), message->len());
  }
  consumer->close();
  return out;
}

TEST_F(DaemonKafkaTest, ThreeHoldersAndAnAggregatorAsSeparateProcesses) {
  // Issue 31: three data holders, each reading only its own topic, and an
  // aggregator that holds no data. Every round the holders' masked shares
  // sum to a release; one holder is killed mid-run: the round that misses
  // its share is abandoned and charged, and the next rounds run with the
  // other two (shares re-planned for n = 2). A fourth process configured
  // with a key that is not the roster's is refused before it reads.
  constexpr int kSteps = 12;
  WriteVocabulary(6);
  for (const char* topic : {"h1docs", "h2docs", "h3docs"}) {
    ASSERT_TRUE(cluster_->CreateTopic(topic, 2).ok());
  }
  ASSERT_TRUE(cluster_->CreateTopic("fedwork", 2).ok());  // plans, shares
  ASSERT_TRUE(cluster_->CreateTopic("fedledger", 1).ok());
  ASSERT_TRUE(cluster_->CreateTopic("releases-fed", 1).ok());
  const std::vector<std::string> ids = {"h1", "h2", "h3"};
  const std::map<std::string, std::string> public_keys = MakeHolderKeys(ids);
  if (HasFailure()) return;
  for (const std::string& id : ids) {
    EXPECT_EQ(std::filesystem::status(dir_ + "/" + id + ".key").permissions() &
                  std::filesystem::perms::all,
              std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  }
  // An existing key is never overwritten.
  int keygen_again = 0;
  Shell(std::string(VIPSD_BINARY) + " federation-keygen --out " + dir_ + "/h1.key 2>&1",
        &keygen_again);
  EXPECT_EQ(keygen_again, 2);
  // Each holder's records on its own topic (split by article).
  for (size_t h = 0; h < ids.size(); ++h) {
    input_topic_ = ids[h] + "docs";
    std::vector<std::string> lines;
    for (int i = static_cast<int>(h); i < 240; i += 3) lines.push_back(Document(i));
    ProduceWithKcat(lines);
    if (HasFatalFailure()) return;
  }
  std::string roster = "  holders:\n";
  for (const auto& [id, key] : public_keys) roster += "    " + id + ": " + key + "\n";
  const std::string privacy = std::string(kPrivate);
  const std::string schedule = "  window_steps: 1000000000\n";
  interval_seconds_ = "2.0";
  release_topic_ = "releases-fed";
  const std::string base_group = group_;
  std::map<std::string, std::unique_ptr<VipsdProcess>> holders;
  auto holder_config = [&](const std::string& id, const std::string& key_file,
                           const std::string& name = "") {
    input_topic_ = id + "docs";
    group_ = base_group + "-" + id;
    state_directory_ = "state-" + (name.empty() ? id : name);
    config_name_ = "vipsd-" + (name.empty() ? id : name) + ".yaml";
    state_extra_ = "  ledger_key: fedjob\n  work_topic: fedwork\n";
    federation_ = "federation:\n  role: holder\n  holder_id: " + id +
                  "\n  secret_key: {file: " + key_file +
                  "}\n  tolerated_holders: 1\n  round_timeout_seconds: 5\n"
                  "  share_delay_seconds: 1.5\n" + roster;
    return WriteConfig(privacy, schedule);
  };
  // The aggregator first (no input, the job's ledger, the releases): it
  // plans no round, and charges nothing, until more than t holders joined.
  input_topic_ = "";
  group_ = base_group + "-aggregator";
  state_directory_ = "state-aggregator";
  config_name_ = "vipsd-aggregator.yaml";
  state_extra_ = "  ledger_topic: fedledger\n  ledger_key: fedjob\n  work_topic: fedwork\n";
  federation_ = "federation:\n  role: aggregator\n  tolerated_holders: 1\n"
                "  round_timeout_seconds: 5\n" + roster;
  const std::string config =
      WriteConfig(privacy, schedule + "  release_delay_seconds: 1.8\n  max_steps: " +
                               std::to_string(kSteps) + "\n",
                  2, "  mirror_directory: mirror-fed\n");
  VipsdProcess aggregator(config, dir_ + "/vipsd-aggregator.log");
  ASSERT_TRUE(WaitFor(
      [&] { return aggregator.Log().find("no round: 0 holder(s) ready") != std::string::npos; },
      60s))
      << aggregator.Log();
  for (const std::string& id : ids) {
    holders[id] = std::make_unique<VipsdProcess>(holder_config(id, id + ".key"),
                                                 dir_ + "/vipsd-" + id + ".log");
  }
  // A process that claims to be h1 with another key: refused, exit 2.
  int code = 0;
  Shell(std::string(VIPSD_BINARY) + " federation-keygen --out " + dir_ + "/impostor.key", &code);
  ASSERT_EQ(code, 0);
  VipsdProcess impostor(holder_config("h1", "impostor.key", "impostor"),
                        dir_ + "/vipsd-impostor.log");
  EXPECT_EQ(impostor.Wait(60s), 2) << impostor.Log();
  EXPECT_NE(impostor.Log().find("unknown key"), std::string::npos) << impostor.Log();

  // h3 stops for good once three rounds have run.
  ASSERT_TRUE(WaitFor([&] { return aggregator.Log().find("step=3 slot=") != std::string::npos; },
                      120s))
      << aggregator.Log() << holders["h1"]->Log();
  holders["h3"]->Kill(SIGKILL);
  EXPECT_EQ(holders["h3"]->Wait(10s), -1);
  ASSERT_EQ(aggregator.Wait(240s), 0) << aggregator.Log();
  for (const char* id : {"h1", "h2"}) {
    holders[id]->Kill(SIGTERM);
    EXPECT_EQ(holders[id]->Wait(60s), 0) << holders[id]->Log();
  }
  const std::string log = aggregator.Log();
  // The round that missed h3's share was abandoned, and charged.
  EXPECT_NE(log.find("abandoned (no share from h3"), std::string::npos) << log;
  // Before the holders joined: said once, not at every slot.
  const size_t unplanned = log.find("no round: 0 holder(s) ready");
  EXPECT_NE(unplanned, std::string::npos) << log;
  EXPECT_EQ(log.find("no round: 0 holder(s) ready", unplanned + 1), std::string::npos) << log;
  // The next rounds ran with the two holders left, their shares re-planned
  // for n = 2 (each holder says how many took part).
  EXPECT_NE(log.find("partials=0+2"), std::string::npos) << log;
  EXPECT_NE(holders["h1"]->Log().find("(2 participants, tolerated 1)"), std::string::npos);
  const daemon::LedgerState record = LedgerIn("state-aggregator");
  int64_t ran = 0;
  const std::regex step_re("msg=\"step=([0-9]+) slot=");
  for (auto it = std::sregex_iterator(log.begin(), log.end(), step_re);
       it != std::sregex_iterator(); ++it) {
    ++ran;
  }
  EXPECT_EQ(ran, kSteps) << log;
  int64_t released = 0;
  for (int64_t step = 1; step < record.next_step; ++step) {
    released += std::filesystem::exists(dir_ + "/mirror-fed/step-" + std::to_string(step)) ? 1 : 0;
  }
  // A step that overran its deadline leaves with the next slot's outputs.
  EXPECT_GE(released, kSteps / 2);
  EXPECT_GT(record.accountant.steps(), ran) << "an abandoned round is charged";
  EXPECT_EQ(record.accountant.steps(), record.next_step - 1);
  // Each holder's own ledger: the rounds it sent a share for, never more
  // than the aggregator charged; h1 took part in every round, h3 in the
  // first ones only.
  const daemon::LedgerState h1 = LedgerIn("state-h1");
  const daemon::LedgerState h3 = LedgerIn("state-h3");
  EXPECT_EQ(h1.next_step, record.next_step);
  EXPECT_EQ(h1.accountant.steps(), record.accountant.steps());
  EXPECT_LT(h3.accountant.steps(), h1.accountant.steps());
  EXPECT_GE(h3.accountant.steps(), 3);
  // One number: the same steps of the same (q, sigma) are the same epsilon
  // in the holder's ledger and in the aggregator's.
  auto holder_spent = daemon::LedgerSpent(h1, 1e-5);
  auto record_spent = daemon::LedgerSpent(record, 1e-5);
  ASSERT_TRUE(holder_spent.ok() && record_spent.ok());
  EXPECT_EQ(holder_spent->epsilon, record_spent->epsilon);
  EXPECT_EQ(holder_spent->accountant, record_spent->accountant);
  // `vipsd status` states it for a holder's directory as for the job's.
  auto status_epsilon = [&](const std::string& state) {
    const std::string out =
        Shell(std::string(VIPSD_BINARY) + " status --state " + dir_ + "/" + state);
    std::smatch match;
    const std::regex epsilon_re("epsilon_spent: +([0-9.]+)");
    return std::regex_search(out, match, epsilon_re) ? match[1].str() : out;
  };
  EXPECT_EQ(status_epsilon("state-h1"), status_epsilon("state-aggregator"));
  // What the aggregator saw of h1: masked words, uniform on 2^64 although
  // the values under them are small grid sums (their top bits would be all
  // zeros or all ones). Chi-square of the top 4 bits over 16 bins.
  std::array<int64_t, 16> bins{};
  int64_t words = 0;
  for (const std::string& bytes : ReadPartition(bootstrap_, "fedwork", 1)) {
    auto kind = daemon::WorkMessageKindOf(bytes);
    if (!kind.ok() || *kind != daemon::WorkMessageKind::kFederatedShare) continue;
    auto share = daemon::DecodeFederatedShare(bytes);
    ASSERT_TRUE(share.ok()) << share.status().ToString();
    if (share->holder != "h1" || share->kind != daemon::ShareKind::kShare) continue;
    for (uint64_t word : share->masked) {
      ++bins[word >> 60];
      ++words;
    }
  }
  ASSERT_GE(words, 100);
  double chi2 = 0;
  const double expected = static_cast<double>(words) / 16;
  for (int64_t n : bins) chi2 += (n - expected) * (n - expected) / expected;
  EXPECT_LT(chi2, 45) << words << " words";  // 15 df: p < 1e-4
}

TEST_F(DaemonKafkaTest, TwoFederatedJobsWithTheSameKeyFilesNeverShareAPad) {
  // Issue 49: two jobs with the same holders' key files and roster (new
  // topics, a new ledger_key, fresh state directories) both mask their
  // round 1. With pads bound only to the pair keys and the round, h1's two
  // masked messages would subtract to the difference of its two noised sums
  // (about 1e6 here); bound to the aggregator's run (and the holders'
  // incarnations), the difference is uniform on 2^64. A holder directory
  // of job A refuses job B's plans (exit 2).
  WriteVocabulary(6);
  const std::vector<std::string> ids = {"h1", "h2"};
  const std::map<std::string, std::string> public_keys = MakeHolderKeys(ids);
  if (HasFailure()) return;
  for (const std::string& id : ids) {
    ASSERT_TRUE(cluster_->CreateTopic(id + "docs", 1).ok());
    input_topic_ = id + "docs";
    std::vector<std::string> lines;
    for (int i = id == "h1" ? 0 : 1; i < 120; i += 2) lines.push_back(Document(i));
    ProduceWithKcat(lines);
    if (HasFatalFailure()) return;
  }
  std::string roster = "  holders:\n";
  for (const auto& [id, key] : public_keys) roster += "    " + id + ": " + key + "\n";
  const std::string privacy = std::string(kPrivate);
  const std::string schedule = "  window_steps: 1000000000\n";
  interval_seconds_ = "2.0";
  const std::string base_group = group_;
  auto holder_config = [&](const std::string& job, const std::string& id,
                           const std::string& state) {
    input_topic_ = id + "docs";
    group_ = base_group + "-" + job + "-" + id;
    state_directory_ = state;
    config_name_ = "vipsd-" + job + "-" + id + ".yaml";
    state_extra_ = "  ledger_key: " + job + "\n  work_topic: work-" + job + "\n";
    federation_ = "federation:\n  role: holder\n  holder_id: " + id + "\n  secret_key: {file: " +
                  id + ".key}\n  tolerated_holders: 1\n  round_timeout_seconds: 5\n"
                  "  share_delay_seconds: 1.5\n" + roster;
    return WriteConfig(privacy, schedule);
  };
  // One job to its 2nd round: h1's masked words of round 1.
  auto run_job = [&](const std::string& job) -> std::vector<uint64_t> {
    EXPECT_TRUE(cluster_->CreateTopic("work-" + job, 2).ok());
    EXPECT_TRUE(cluster_->CreateTopic("ledger-" + job, 1).ok());
    EXPECT_TRUE(cluster_->CreateTopic("releases-" + job, 1).ok());
    input_topic_ = "";
    group_ = base_group + "-" + job + "-aggregator";
    state_directory_ = "state-" + job + "-aggregator";
    config_name_ = "vipsd-" + job + "-aggregator.yaml";
    release_topic_ = "releases-" + job;
    state_extra_ = "  ledger_topic: ledger-" + job + "\n  ledger_key: " + job +
                   "\n  work_topic: work-" + job + "\n";
    federation_ = "federation:\n  role: aggregator\n  tolerated_holders: 1\n"
                  "  round_timeout_seconds: 5\n" + roster;
    VipsdProcess aggregator(
        WriteConfig(privacy, schedule + "  release_delay_seconds: 1.8\n  max_steps: 2\n"),
        dir_ + "/vipsd-" + job + "-aggregator.log");
    std::vector<std::unique_ptr<VipsdProcess>> holders;
    for (const std::string& id : ids) {
      holders.push_back(std::make_unique<VipsdProcess>(
          holder_config(job, id, "state-" + job + "-" + id),
          dir_ + "/vipsd-" + job + "-" + id + ".log"));
    }
    EXPECT_EQ(aggregator.Wait(180s), 0) << aggregator.Log();
    for (auto& holder : holders) {
      holder->Kill(SIGTERM);
      EXPECT_EQ(holder->Wait(60s), 0) << holder->Log();
    }
    for (const std::string& bytes : ReadPartition(bootstrap_, "work-" + job, 1)) {
      auto kind = daemon::WorkMessageKindOf(bytes);
      if (!kind.ok() || *kind != daemon::WorkMessageKind::kFederatedShare) continue;
      auto share = daemon::DecodeFederatedShare(bytes);
      if (share.ok() && share->holder == "h1" && share->step == 1 &&
          share->kind == daemon::ShareKind::kShare) {
        return share->masked;
      }
    }
    return {};
  };
  const std::vector<uint64_t> a = run_job("joba");
  const std::vector<uint64_t> b = run_job("jobb");
  ASSERT_FALSE(a.empty());
  ASSERT_EQ(a.size(), b.size());
  size_t small = 0;
  for (size_t c = 0; c < a.size(); ++c) {
    const int64_t difference = static_cast<int64_t>(a[c] - b[c]);
    small += difference > -(int64_t{1} << 40) && difference < (int64_t{1} << 40);
  }
  // Uniform: each word below 2^40 in size with probability 2^-23.
  EXPECT_EQ(small, 0u) << "of " << a.size() << " words: the two jobs' pads coincide";
  // Job A's holder directory does not serve job B.
  VipsdProcess stray(holder_config("jobb", "h1", "state-joba-h1"), dir_ + "/vipsd-stray.log");
  input_topic_ = "";
  group_ = base_group + "-jobb-aggregator-again";
  state_directory_ = "state-jobb-aggregator";
  config_name_ = "vipsd-jobb-aggregator.yaml";
  release_topic_ = "releases-jobb";
  state_extra_ = "  ledger_topic: ledger-jobb\n  ledger_key: jobb\n  work_topic: work-jobb\n";
  federation_ = "federation:\n  role: aggregator\n  tolerated_holders: 0\n"
                "  round_timeout_seconds: 5\n" + roster;
  VipsdProcess aggregator(
      WriteConfig(privacy, schedule + "  release_delay_seconds: 1.8\n  max_steps: 1\n"),
      dir_ + "/vipsd-jobb-aggregator-again.log");
  EXPECT_EQ(stray.Wait(120s), 2) << stray.Log();
  EXPECT_NE(stray.Log().find("serves the aggregator run"), std::string::npos) << stray.Log();
  aggregator.Kill(SIGTERM);
  aggregator.Wait(60s);
}

// The doubles of a little-endian float64 .npy file (version 1 or 2 header).
std::vector<double> NpyDoubles(const std::string& path) {
  const std::string bytes = Slurp(path);
  std::vector<double> out;
  if (bytes.size() < 12 || bytes.compare(0, 6, "\x93NUMPY") != 0) return out;
  const bool v1 = bytes[6] == 1;
  size_t header = v1 ? static_cast<unsigned char>(bytes[8]) |
                           (static_cast<size_t>(static_cast<unsigned char>(bytes[9])) << 8)
                     : 0;
  size_t start = 10 + header;
  if (!v1) {
    header = 0;
    for (int b = 0; b < 4; ++b) header |= static_cast<size_t>(static_cast<unsigned char>(bytes[8 + b])) << (8 * b);
    start = 12 + header;
  }
  if (bytes.find("<f8", 8) == std::string::npos || start > bytes.size()) return out;
  out.resize((bytes.size() - start) / 8);
  std::memcpy(out.data(), bytes.data() + start, out.size() * 8);
  return out;
}

TEST_F(DaemonKafkaTest, JoinsAreCheckedBeforeAnyChargeAndARestartedHolderCostsAtMostOneRound) {
  // Issue 49: a holder of other settings used to be named, decline round 1
  // and exit after the aggregator had charged it; a restarted holder was
  // named before its input was assigned and cost several charged rounds.
  // Now a join carries the holder's terms (refused with the key named,
  // nothing charged) and leaves only once its partitions are assigned.
  constexpr int kSteps = 8;
  WriteVocabulary(6);
  const std::vector<std::string> ids = {"h1", "h2", "h3"};
  for (const std::string& id : ids) ASSERT_TRUE(cluster_->CreateTopic(id + "docs", 1).ok());
  ASSERT_TRUE(cluster_->CreateTopic("joinwork", 2).ok());
  ASSERT_TRUE(cluster_->CreateTopic("joinledger", 1).ok());
  ASSERT_TRUE(cluster_->CreateTopic("releases-join", 1).ok());
  const std::map<std::string, std::string> public_keys = MakeHolderKeys(ids);
  if (HasFailure()) return;
  for (const std::string& id : ids) {
    input_topic_ = id + "docs";
    std::vector<std::string> lines;
    for (int i = 0; i < 60; ++i) lines.push_back(Document(i));
    ProduceWithKcat(lines);
    if (HasFatalFailure()) return;
  }
  std::string roster = "  holders:\n";
  for (const auto& [id, key] : public_keys) roster += "    " + id + ": " + key + "\n";
  const std::string privacy = std::string(kPrivate);
  const std::string schedule = "  window_steps: 1000000000\n";
  interval_seconds_ = "2.0";
  release_topic_ = "releases-join";
  const std::string base_group = group_;
  auto holder_config = [&](const std::string& id) {
    input_topic_ = id + "docs";
    group_ = base_group + "-" + id;
    state_directory_ = "state-" + id;
    config_name_ = "vipsd-" + id + ".yaml";
    state_extra_ = "  ledger_key: joinjob\n  work_topic: joinwork\n";
    // h3 reads its records' timestamps otherwise than the job.
    source_extra_ = id == "h3" ? "  timestamps: log_append_time\n" : "";
    federation_ = "federation:\n  role: holder\n  holder_id: " + id +
                  "\n  secret_key: {file: " + id +
                  ".key}\n  tolerated_holders: 1\n  round_timeout_seconds: 5\n"
                  "  share_delay_seconds: 1.5\n" + roster;
    const std::string path = WriteConfig(privacy, schedule);
    source_extra_ = "";
    return path;
  };
  input_topic_ = "";
  group_ = base_group + "-aggregator";
  state_directory_ = "state-aggregator";
  config_name_ = "vipsd-aggregator.yaml";
  state_extra_ = "  ledger_topic: joinledger\n  ledger_key: joinjob\n  work_topic: joinwork\n";
  federation_ = "federation:\n  role: aggregator\n  tolerated_holders: 1\n"
                "  round_timeout_seconds: 5\n" + roster;
  VipsdProcess aggregator(
      WriteConfig(privacy, schedule + "  release_delay_seconds: 1.8\n  max_steps: " +
                               std::to_string(kSteps) + "\n"),
      dir_ + "/vipsd-aggregator.log");
  std::map<std::string, std::unique_ptr<VipsdProcess>> holders;
  for (const std::string& id : ids) {
    holders[id] = std::make_unique<VipsdProcess>(holder_config(id), dir_ + "/vipsd-" + id + ".log");
  }
  // h3: refused at its join (or, when a plan for the others reaches it
  // first, by the plan's terms), never planned; it names the key, exit 2.
  EXPECT_EQ(holders["h3"]->Wait(90s), 2) << holders["h3"]->Log();
  const std::string h3_log = holders["h3"]->Log();
  const bool refused_at_join =
      h3_log.find("refused this holder's join: source.timestamps: aggregator create_time, "
                  "holder log_append_time") != std::string::npos;
  const bool refused_by_plan =
      h3_log.find("cannot follow the aggregator's plans: source.timestamps: aggregator "
                  "create_time, this holder log_append_time") != std::string::npos;
  EXPECT_TRUE(refused_at_join || refused_by_plan) << h3_log;
  // h1 is killed once two rounds ran, and restarted on the same state
  // directory (its partition stays with the dead member until the session
  // times out).
  ASSERT_TRUE(WaitFor([&] { return aggregator.Log().find("step=2 slot=") != std::string::npos; },
                      120s))
      << aggregator.Log();
  // Two messages of an older vipsd's holder (VFS2), keyed by the job, on
  // the partition the holders' shares go to (1): the aggregator ignores
  // them and says so once.
  ASSERT_TRUE(connectors::WriteFileDurably(
                  dir_ + "/old.txt",
                  "joinjob\tVFS2 an older holder's join\njoinjob\tVFS2 its next one\n", false,
                  0600)
                  .ok());
  int kcat_code = 0;
  const std::string kcat_out = Shell("kcat -P -b " + bootstrap_ +
                                         " -t joinwork -p 1 -K '\t' -l " + dir_ + "/old.txt 2>&1",
                                     &kcat_code);
  ASSERT_EQ(kcat_code, 0) << kcat_out;
  holders["h1"]->Kill(SIGKILL);
  EXPECT_EQ(holders["h1"]->Wait(10s), -1);
  holders["h1"] = std::make_unique<VipsdProcess>(holder_config("h1"), dir_ + "/vipsd-h1b.log");
  ASSERT_EQ(aggregator.Wait(240s), 0) << aggregator.Log();
  for (const char* id : {"h1", "h2"}) {
    holders[id]->Kill(SIGTERM);
    EXPECT_EQ(holders[id]->Wait(60s), 0) << holders[id]->Log();
  }
  const std::string log = aggregator.Log();
  if (refused_at_join) {
    EXPECT_NE(log.find("holder 'h3' asked to join with other settings"), std::string::npos)
        << log;
  }
  EXPECT_EQ(log.find("h3 declined"), std::string::npos) << log;
  const std::string older = "a federated message of an older vipsd (VFP2/VFS2";
  const size_t old_message = log.find(older);
  EXPECT_NE(old_message, std::string::npos) << log;
  EXPECT_EQ(log.find(older, old_message + 1), std::string::npos) << "said once: " << log;
  EXPECT_NE(log.find("no round names its sender (said once per run)"), std::string::npos) << log;
  // The kill and the restart together cost at most one abandoned round.
  size_t abandoned = 0;
  for (size_t at = log.find("abandoned ("); at != std::string::npos;
       at = log.find("abandoned (", at + 1)) {
    ++abandoned;
  }
  EXPECT_LE(abandoned, 1u) << log;
  const daemon::LedgerState record = LedgerIn("state-aggregator");
  EXPECT_EQ(record.accountant.steps(), kSteps + static_cast<int64_t>(abandoned)) << log;
  // h3's data were never charged; h1's ledger (one directory over both of
  // its processes) holds every round it answered.
  EXPECT_EQ(LedgerIn("state-h3").accountant.steps(), 0);
  EXPECT_GE(LedgerIn("state-h1").accountant.steps(), kSteps - 3);
  EXPECT_NE(holders["h1"]->Log().find("share sent"), std::string::npos) << holders["h1"]->Log();
}

TEST_F(DaemonKafkaTest, FederatedReleasesMatchOneProcessOnTheUnionUpToTheNoise) {
  // Issue 31: the same records, once split across three holders (and an
  // aggregator), once in one process's topic. With q = 1 (every record in
  // every step) and a model whose E-step draws nothing (BLR), the two runs
  // differ only by their noise (the federated total's variance is n/(n - t)
  // times the central one) and by what that noise does to later steps. At a
  // small sigma the releases agree to a fraction of a percent, while a
  // holder's records missing or counted twice would move them by a third.
  // Timing: a round starts at its slot's cut (slot time + cut_grace_seconds,
  // 0.25 s), is charged (the accountant composes the new step count), and
  // ends when the holders' shares arrive, share_delay_seconds (2 s) after
  // its plan; its release deadline is 3.8 s after the slot time. That leaves
  // 1.5 s for the charge and the M-step. sigma is 0.5 and the data set 3,000
  // records, so that the noise is a small fraction of the sums while each
  // composition takes a fraction of a second. Before, with the default grace
  // (0.95 s here), a 3 s share delay and sigma = 0.05 on 300 records (the
  // same noise share; 3.5 s per composition), every other round missed its
  // deadline, and under ASan on CI only one step of six had a release in
  // both runs.
  constexpr int kSteps = 6;
  for (const char* topic : {"h1blr", "h2blr", "h3blr", "allblr"}) {
    ASSERT_TRUE(cluster_->CreateTopic(topic, 2).ok());
  }
  ASSERT_TRUE(cluster_->CreateTopic("fedwork", 2).ok());
  ASSERT_TRUE(cluster_->CreateTopic("fedledger", 1).ok());
  ASSERT_TRUE(cluster_->CreateTopic("releases-fed", 1).ok());
  std::vector<std::string> all;
  std::map<std::string, std::vector<std::string>> split;
  for (int i = 0; i < 3000; ++i) {
    // A fixed, separable data set with norms below 1.
    const double a = 0.5 * std::sin(0.37 * i), b = 0.5 * std::cos(0.11 * i), c = 0.3;
    const int y = a + 0.5 * b > 0 ? 1 : 0;
    std::ostringstream line;
    line << "{\"x\": [" << a << ", " << b << ", " << c << "], \"y\": " << y << "}";
    all.push_back(line.str());
    split["h" + std::to_string(1 + i % 3)].push_back(line.str());
  }
  input_topic_ = "allblr";
  ProduceWithKcat(all);
  for (const auto& [id, lines] : split) {
    input_topic_ = id + "blr";
    ProduceWithKcat(lines);
  }
  if (HasFatalFailure()) return;
  std::map<std::string, std::string> keys;
  for (const char* id : {"h1", "h2", "h3"}) {
    int code = 0;
    const std::string out = Shell(std::string(VIPSD_BINARY) + " federation-keygen --out " + dir_ +
                                      "/" + id + ".key 2>&1", &code);
    ASSERT_EQ(code, 0) << out;
    keys[id] = out.substr(0, 64);
  }
  // tolerated_holders 2 of 3: every round needs all three holders (with 1,
  // the aggregator plans a round as soon as two joined, and on a loaded
  // machine a slow third holder left round 1 a third of the records short:
  // CI failed so, 16 % off at step 2). The noise shares are then planned
  // for one honest holder: the federated total's variance is 3 times the
  // central one's, still a fraction of a percent of the releases.
  std::string roster = "  tolerated_holders: 2\n  round_timeout_seconds: 20\n  holders:\n";
  for (const auto& [id, key] : keys) roster += "    " + id + ": " + key + "\n";
  auto config = [&](const std::string& name, const std::string& topics, const std::string& group,
                    const std::string& state, const std::string& state_extra,
                    const std::string& mirror, const std::string& federation) {
    std::ofstream yaml(dir_ + "/" + name);
    yaml << "model:\n  type: blr\n  blr:\n    dimension: 3\n"
         << "privacy:\n  noise_multiplier: 0.5\n  sampling_rate: 1.0\n  delta: 1.0e-5\n"
         << "  epsilon_ceiling: 1000000\n"
         << "schedule:\n  interval_seconds: 4.0\n  release_delay_seconds: 3.8\n"
         << "  cut_grace_seconds: 0.25\n  start_delay_seconds: 0\n"
         << "  window_steps: 1000000000\n  on_overrun: catch_up\n"
         << (federation.find("aggregator") != std::string::npos || federation.empty()
                 ? "  max_steps: " + std::to_string(kSteps) + "\n"
                 : "")
         << "pool:\n  capacity: 10000\n"
         << "source:\n  type: kafka\n" << topics << "  group_id: " << group
         << "\n  timestamps: create_time\n"
         << "sink:\n  type: kafka\n  topic: releases-fed\n  publish_every: 1\n"
         << (mirror.empty() ? "" : "  mirror_directory: " + mirror + "\n")
         << "dead_letter:\n  topic: dead\n"
         << "kafka:\n  bootstrap_servers: \"" << bootstrap_ << "\"\n"
         << "  consumer_properties:\n    session.timeout.ms: \"6000\"\n"
         << "    heartbeat.interval.ms: \"500\"\n"
         << "state:\n  directory: " << state << "\n" << state_extra
         << "metrics:\n  listen: \"\"\n" << federation;
    return dir_ + "/" + name;
  };
  VipsdProcess solo(config("solo.yaml", "  topics: [allblr]\n", group_ + "-solo", "state-solo",
                           "", "mirror-solo", ""),
                    dir_ + "/vipsd-solo.log");
  std::vector<std::unique_ptr<VipsdProcess>> holders;
  for (const char* id : {"h1", "h2", "h3"}) {
    const std::string name(id);
    holders.push_back(std::make_unique<VipsdProcess>(
        config(name + ".yaml", "  topics: [" + name + "blr]\n", group_ + "-" + name,
               "state-" + name, "  ledger_key: fedjob\n  work_topic: fedwork\n", "",
               "federation:\n  role: holder\n  holder_id: " + name + "\n  secret_key: {file: " +
                   name + ".key}\n  share_delay_seconds: 2.0\n" + roster),
        dir_ + "/vipsd-" + name + ".log"));
  }
  VipsdProcess aggregator(
      config("aggregator.yaml", "", group_ + "-aggregator", "state-aggregator",
             "  ledger_topic: fedledger\n  ledger_key: fedjob\n  work_topic: fedwork\n",
             "mirror-fed", "federation:\n  role: aggregator\n" + roster),
      dir_ + "/vipsd-aggregator.log");
  ASSERT_EQ(solo.Wait(120s), 0) << solo.Log();
  ASSERT_EQ(aggregator.Wait(120s), 0) << aggregator.Log() << holders[0]->Log();
  for (auto& holder : holders) {
    holder->Kill(SIGTERM);
    EXPECT_EQ(holder->Wait(60s), 0) << holder->Log();
  }
  EXPECT_EQ(aggregator.Log().find("abandoned"), std::string::npos) << aggregator.Log();
  // Relative L2 distance of one released array of the two runs; -1 when a
  // run has no release of that step (a late step leaves with the next).
  auto distance = [&](int64_t step, const std::string& array, size_t size) {
    const std::string at = "/step-" + std::to_string(step) + "/" + array + ".npy";
    const std::vector<double> fed = NpyDoubles(dir_ + "/mirror-fed" + at);
    const std::vector<double> one = NpyDoubles(dir_ + "/mirror-solo" + at);
    if (fed.empty() || one.empty()) return -1.0;
    EXPECT_EQ(fed.size(), size);
    EXPECT_EQ(one.size(), size);
    double diff = 0, norm = 0;
    for (size_t i = 0; i < std::min(fed.size(), one.size()); ++i) {
      diff += (fed[i] - one[i]) * (fed[i] - one[i]);
      norm += one[i] * one[i];
    }
    return std::sqrt(diff / norm);
  };
  // Measured: 0.4 % to 1 % for both. A holder's records left
  // out would scale the posterior covariance by 3/2 (50 %).
  int64_t compared = 0;
  for (int64_t step = 1; step <= kSteps; ++step) {
    const double mean = distance(step, "mean", 3);
    const double covariance = distance(step, "covariance", 9);
    if (mean < 0 || covariance < 0) continue;
    EXPECT_LT(mean, 0.02) << "step " << step;
    EXPECT_LT(covariance, 0.02) << "step " << step;
    ++compared;
  }
  EXPECT_GE(compared, kSteps / 2);
}

}  // namespace
}  // namespace vipsd
