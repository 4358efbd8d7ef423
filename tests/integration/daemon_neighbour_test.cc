// The neighbour-structure test against a real Kafka protocol peer (issue
// 11): the daemon (its real Kafka source, log observer and producer, run in
// this process so that a test hook can see each step's pool) on a stream D
// and, at the same time, on D + r — the same records produced at the same
// times into a second topic, plus one record r. Fixed-seed noise is enabled
// with the flag. For every slot, the pools the two daemons sampled from must
// differ by exactly {r} in exactly the slots whose window contains r's
// append time, and be equal everywhere else — although the daemon with r is
// slowed down by a slow E-step whenever r is in its pool.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "connectors/kafka/kafka_producer.h"
#include "connectors/kafka/mock_cluster.h"
#include "daemon/daemon.h"
#include "daemon/kafka_io.h"

namespace vipsd::daemon {
namespace {

using namespace std::chrono_literals;

constexpr double kInterval = 1.0;  // seconds per slot: wide margins on a busy machine
constexpr int kWindow = 2;
constexpr int kSlots = 6;
constexpr int kRecordsPerBatch = 3;
constexpr int kRecordR = 1000;  // the added record's id

double WallNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void SleepUntil(double unix_time) {
  const double left = unix_time - WallNow();
  if (left > 0) std::this_thread::sleep_for(std::chrono::duration<double>(left));
}

std::string Word(int id) {  // a distinct [a-z]+ term per record
  std::string word = "w";
  for (int x = id + 1; x > 0; x /= 26) word += static_cast<char>('a' + x % 26);
  return word;
}

struct PoolLog {
  std::mutex mutex;
  std::map<int64_t, std::set<int>> pools;  // slot -> record ids
};

TEST(DaemonNeighbourTest, OneAddedRecordChangesOnlyItsOwnWindowsOnARealBroker) {
  auto cluster = connectors::MockCluster::Create(1);
  ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
  const std::string bootstrap = (*cluster)->bootstrap_servers();
  const std::string dir = ::testing::TempDir() + "daemon_neighbour_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  {
    std::filesystem::create_directories(dir);
    std::ofstream vocab(dir + "/vocab.txt");
    for (int id = 0; id < 40; ++id) vocab << Word(id) << "\n";
    vocab << Word(kRecordR) << "\n";
  }
  for (const char* topic : {"d", "dr", "rel-d", "rel-dr", "dead", "warmup"}) {
    ASSERT_TRUE((*cluster)->CreateTopic(topic, 2).ok());
  }
  // Slot 0 is a few seconds away: time for both daemons to start and join.
  const double start = std::ceil(WallNow()) + 4;
  auto write_config = [&](const std::string& name) {
    const std::string path = dir + "/" + name + ".yaml";
    std::ofstream yaml(path);
    yaml.precision(17);
    yaml << "model:\n  type: lda\n  lda:\n    topics: 2\n    vocabulary: vocab.txt\n"
            "    alpha: 0.5\n    eta: 0.1\n    resample_length: 4\n"
            "privacy:\n  noise_multiplier: 1.0\n  sampling_rate: 0.5\n  delta: 1.0e-5\n"
            "  epsilon_ceiling: 1000\n  noise: fixed_seed\n  noise_seed: 7\n"
            "schedule:\n  tau0: 1\n  kappa: 0.7\n  threads: 1\n  start_delay_seconds: 0\n  interval_seconds: "
         << kInterval << "\n  window_steps: " << kWindow << "\n  start_time: " << start << "\n"
         << "source:\n  type: kafka\n  topics: [" << name << "]\n  group_id: nb-" << name << "-"
         << getpid() << "\n"
         << "sink:\n  type: kafka\n  topic: rel-" << name << "\n"
         << "dead_letter:\n  topic: dead\n"
         << "kafka:\n  bootstrap_servers: \"" << bootstrap << "\"\n"
         << "  properties:\n    reconnect.backoff.max.ms: \"1000\"\n"
         << "  consumer_properties:\n    session.timeout.ms: \"6000\"\n"
            "    heartbeat.interval.ms: \"500\"\n    fetch.wait.max.ms: \"100\"\n"
         << "state:\n  directory: state-" << name << "\nmetrics:\n  listen: \"\"\n";
    return path;
  };
  auto start_daemon = [&](const std::string& name, PoolLog* run, bool slow_with_r,
                          std::unique_ptr<Metrics>* metrics) -> std::unique_ptr<Daemon> {
    auto config = config::LoadConfigFile(write_config(name));
    EXPECT_TRUE(config.ok()) << config.status().ToString();
    MetricsOptions metrics_options;
    metrics_options.listen_address = "";
    metrics_options.version = "test";
    metrics_options.model_type = "lda";
    auto created = Metrics::Create(metrics_options);
    EXPECT_TRUE(created.ok());
    *metrics = std::move(created).value();
    Metrics* m = metrics->get();
    DaemonHooks hooks;
    hooks.before_step = [run, slow_with_r](int64_t, int64_t slot, const svi::RecordPool& pool,
                                           const std::vector<std::string>&) {
      std::set<int> ids;
      pool.ForEach([&](const model::Record& record, const svi::RecordOrigin&, int64_t) {
        // word id = record id (vocabulary order), r last.
        const int word = record.word_ids.at(0);
        ids.insert(word == 40 ? kRecordR : word);
      });
      {
        std::lock_guard<std::mutex> lock(run->mutex);
        run->pools[slot] = ids;
      }
      if (slow_with_r && ids.count(kRecordR) > 0) {
        std::this_thread::sleep_for(std::chrono::duration<double>(1.5 * kInterval));
      }
    };
    DaemonOptions options;
    options.allow_fixed_seed_noise = true;  // the flag, with the key
    auto output = NewDaemonOutput(*config, bootstrap);
    EXPECT_TRUE(output.ok()) << output.status().ToString();
    const config::VipsdConfig copy = *config;
    auto daemon = Daemon::Create(
        *config,
        [copy, bootstrap, m](ResumeOffsetFn resume) {
          return NewKafkaInput(copy, bootstrap, std::move(resume), m);
        },
        std::move(*output), m, std::move(hooks), options);
    EXPECT_TRUE(daemon.ok()) << daemon.status().ToString();
    return daemon.ok() ? std::move(*daemon) : nullptr;
  };
  PoolLog without, with;
  std::unique_ptr<Metrics> metrics_d, metrics_dr;
  std::unique_ptr<Daemon> daemon_d = start_daemon("d", &without, false, &metrics_d);
  std::unique_ptr<Daemon> daemon_dr = start_daemon("dr", &with, true, &metrics_dr);
  ASSERT_NE(daemon_d, nullptr);
  ASSERT_NE(daemon_dr, nullptr);
  Status result_d = Status::Ok(), result_dr = Status::Ok();
  std::thread thread_d([&] { result_d = daemon_d->Run(); });
  std::thread thread_dr([&] { result_dr = daemon_dr->Run(); });

  // The stream: a batch in the middle of every slot interval. Both topics'
  // messages of a batch go in one produce call, so that D and D + r are
  // appended at the same moments. Records of batch b >= 0 are appended in
  // (t_b, t_{b+1}] and belong to slots b+1 .. b+kWindow; batch -1 comes
  // before slot 0, which no daemon observes, so it joins slot 1 like batch
  // 0. r joins the batch of interval 2, i.e. slots 3 and 4.
  connectors::KafkaProducerOptions producer_options;
  producer_options.bootstrap_servers = bootstrap;
  producer_options.properties = {{"linger.ms", "0"}};
  auto producer = connectors::KafkaProducer::Create(producer_options);
  ASSERT_TRUE(producer.ok());
  // The idempotent producer's first delivery bootstraps its producer id
  // (about a second on the mock): done here, outside the stream.
  ASSERT_TRUE((*producer)->ProduceAndWait({{{"warmup", "w", "w", {}}}}, 10s).ok());
  int next_id = 0;
  for (int batch = -1; batch < kSlots; ++batch) {
    SleepUntil(start + (batch + 0.5) * kInterval);
    std::vector<connectors::OutMessage> messages;
    for (int i = 0; i < kRecordsPerBatch; ++i, ++next_id) {
      const std::string doc = "{\"id\": " + std::to_string(next_id) + ", \"text\": \"" +
                              Word(next_id) + " " + Word(next_id) + "\"}";
      messages.push_back({"d", "k" + std::to_string(next_id), doc, {}});
      messages.push_back({"dr", "k" + std::to_string(next_id), doc, {}});
    }
    if (batch == 2) {
      messages.push_back({"dr", "r", "{\"id\": \"r\", \"text\": \"" + Word(kRecordR) + "\"}", {}});
    }
    ASSERT_TRUE((*producer)->ProduceAndWait(messages, 10s).ok());
  }
  ASSERT_TRUE((*producer)->Close(5s).ok());
  const auto until = std::chrono::steady_clock::now() + 60s;
  while (std::chrono::steady_clock::now() < until &&
         (daemon_d->status().last_slot < kSlots || daemon_dr->status().last_slot < kSlots)) {
    std::this_thread::sleep_for(50ms);
  }
  daemon_d->RequestStop();
  daemon_dr->RequestStop();
  thread_d.join();
  thread_dr.join();
  EXPECT_TRUE(result_d.ok()) << result_d.ToString();
  EXPECT_TRUE(result_dr.ok()) << result_dr.ToString();

  for (int64_t slot = 1; slot <= kSlots; ++slot) {
    ASSERT_TRUE(without.pools.count(slot)) << "slot " << slot;
    ASSERT_TRUE(with.pools.count(slot)) << "slot " << slot;
    std::set<int> expected = without.pools.at(slot);
    if (slot == 3 || slot == 4) expected.insert(kRecordR);
    EXPECT_EQ(with.pools.at(slot), expected) << "slot " << slot;
    // The window holds exactly the batches of the last kWindow intervals.
    std::set<int> window;
    for (int64_t batch = -1; batch < kSlots; ++batch) {
      const int64_t interval = std::max<int64_t>(batch, 0);  // batch -1 joins slot 1
      if (interval < slot - kWindow || interval >= slot) continue;
      for (int i = 0; i < kRecordsPerBatch; ++i) {
        window.insert(static_cast<int>((batch + 1) * kRecordsPerBatch + i));
      }
    }
    EXPECT_EQ(without.pools.at(slot), window) << "slot " << slot;
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace vipsd::daemon
