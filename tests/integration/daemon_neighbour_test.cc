// The neighbour-structure test against a real Kafka protocol peer (issues
// 11 and 26): the daemon (its real Kafka source, log observer and producer,
// run in this process so that a test hook can see each step's pool) on a
// stream D and, at the same time, on D + r — the same records produced at
// the same times with the same timestamps into a second topic, plus one
// record r. Fixed-seed noise is enabled with the flag. For every slot, the
// pools the two daemons sampled from must differ by exactly {r} in exactly
// the slots whose window contains r's timestamp, be equal everywhere else,
// and hold exactly the records stamped in the window's intervals — although
// the daemon with r is slowed down whenever r is in its pool. The mock
// cluster keeps the producer's timestamps (CreateTime; it cannot stamp
// LogAppendTime), so the daemons run with source.timestamps: create_time
// and the producer stamps each record with the time it sends it at.
#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
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

// One record to produce: its id, its time in slot intervals after slot 0
// (it is sent, and stamped, at that time), and whether it goes to D + r only.
struct Planned {
  int id = 0;
  double position = 0;
  bool only_with_r = false;
};

struct PairSetup {
  double interval = 1.0;
  int window = 2;
  int slots = 6;
  std::vector<Planned> plan;  // by position
  // The slow daemon (the one with r) whenever r is in its pool: sleep for
  // this many intervals, or burn both cores for them.
  double slow_intervals = 1.5;
  bool burn = false;
  double cut_grace = -1;  // schedule.cut_grace_seconds; < 0: the default
};

struct PairResult {
  PoolLog without, with;
  double start = 0;  // slot 0's time
  // The premise the claim rests on, as this run's environment met it: every
  // record readable before its slot's cut was read (slot time + the grace).
  // Acknowledged is later than readable, so a batch acknowledged by then met
  // it. Otherwise its records may join the next slot in one daemon and not
  // the other — outside the claim, not a fault of the daemon.
  int late_batches = 0;
  double worst_lateness = 0;  // seconds past slot time + grace
};

// Runs the daemons on D and D + r over a mock cluster while a producer sends
// `setup.plan` in real time.
void RunPair(const PairSetup& setup, const std::string& tag, PairResult* result) {
  auto cluster = connectors::MockCluster::Create(1);
  ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
  const std::string bootstrap = (*cluster)->bootstrap_servers();
  const std::string dir =
      ::testing::TempDir() + "daemon_neighbour_" + tag + "_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  int words = 0;
  for (const Planned& planned : setup.plan) {
    if (planned.id != kRecordR) words = std::max(words, planned.id + 1);
  }
  {
    std::filesystem::create_directories(dir);
    std::ofstream vocab(dir + "/vocab.txt");
    for (int id = 0; id < words; ++id) vocab << Word(id) << "\n";
    vocab << Word(kRecordR) << "\n";
  }
  for (const char* topic : {"d", "dr", "rel-d", "rel-dr", "dead", "warmup"}) {
    ASSERT_TRUE((*cluster)->CreateTopic(topic, 2).ok());
  }
  // Slot 0 is a few seconds away: time for both daemons to start and join.
  const double start = std::ceil(WallNow()) + 4;
  result->start = start;
  auto write_config = [&](const std::string& name) {
    const std::string path = dir + "/" + name + ".yaml";
    std::ofstream yaml(path);
    yaml.precision(17);
    yaml << "model:\n  type: lda\n  lda:\n    topics: 2\n    vocabulary: vocab.txt\n"
            "    alpha: 0.5\n    eta: 0.1\n    resample_length: 4\n"
            "privacy:\n  noise_multiplier: 1.0\n  sampling_rate: 0.5\n  delta: 1.0e-5\n"
            "  epsilon_ceiling: 1000\n  noise: fixed_seed\n  noise_seed: 7\n"
            "schedule:\n  tau0: 1\n  kappa: 0.7\n  threads: 1\n  start_delay_seconds: 0\n  interval_seconds: "
         << setup.interval << "\n  window_steps: " << setup.window << "\n  start_time: " << start << "\n"
         << (setup.cut_grace >= 0 ? "  cut_grace_seconds: " + std::to_string(setup.cut_grace) + "\n"
                                  : std::string())
         << "source:\n  type: kafka\n  topics: [" << name << "]\n  group_id: nb-" << name << "-"
         << getpid() << "\n  timestamps: create_time\n"  // the mock keeps producers' stamps
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
    const int r_word = words;  // r's word is the vocabulary's last
    const double slow = setup.slow_intervals * setup.interval;
    const bool burn = setup.burn;
    hooks.before_step = [run, slow_with_r, r_word, slow, burn](
                            int64_t, int64_t slot, const svi::RecordPool& pool,
                            const std::vector<std::string>&) {
      std::set<int> ids;
      pool.ForEach([&](const model::Record& record, const svi::RecordOrigin&, int64_t) {
        // word id = record id (vocabulary order), r last.
        const int word = record.word_ids.at(0);
        ids.insert(word == r_word ? kRecordR : word);
      });
      {
        std::lock_guard<std::mutex> lock(run->mutex);
        run->pools[slot] = ids;
      }
      if (!slow_with_r || ids.count(kRecordR) == 0) return;
      if (!burn) {
        std::this_thread::sleep_for(std::chrono::duration<double>(slow));
        return;
      }
      // Both cores busy: this thread and one more.
      const auto until =
          std::chrono::steady_clock::now() + std::chrono::duration<double>(slow);
      auto spin = [until] {
        volatile double x = 0;
        while (std::chrono::steady_clock::now() < until) x = x + 1;
      };
      std::thread other(spin);
      spin();
      other.join();
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
  double grace = 0;
  {
    auto config = config::LoadConfigFile(write_config("d"));
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    grace = config->cut_grace_seconds;
  }
  std::unique_ptr<Metrics> metrics_d, metrics_dr;
  std::unique_ptr<Daemon> daemon_d = start_daemon("d", &result->without, false, &metrics_d);
  std::unique_ptr<Daemon> daemon_dr = start_daemon("dr", &result->with, true, &metrics_dr);
  ASSERT_NE(daemon_d, nullptr);
  ASSERT_NE(daemon_dr, nullptr);
  Status result_d = Status::Ok(), result_dr = Status::Ok();
  std::thread thread_d([&] { result_d = daemon_d->Run(); });
  std::thread thread_dr([&] { result_dr = daemon_dr->Run(); });

  connectors::KafkaProducerOptions producer_options;
  producer_options.bootstrap_servers = bootstrap;
  producer_options.properties = {{"linger.ms", "0"}};
  auto producer = connectors::KafkaProducer::Create(producer_options);
  ASSERT_TRUE(producer.ok());
  // The idempotent producer's first delivery bootstraps its producer id
  // (about a second on the mock): done here, outside the stream.
  ASSERT_TRUE((*producer)->ProduceAndWait({{{"warmup", "w", "w", {}}}}, 10s).ok());
  // Records planned for the same time go in one produce call, to both
  // topics, stamped with that time: D and D + r get the same stamps.
  for (size_t i = 0; i < setup.plan.size();) {
    const double position = setup.plan[i].position;
    const double time = start + position * setup.interval;
    SleepUntil(time);
    std::vector<connectors::OutMessage> messages;
    for (; i < setup.plan.size() && setup.plan[i].position == position; ++i) {
      const Planned& planned = setup.plan[i];
      const std::string id = planned.id == kRecordR ? "\"r\"" : std::to_string(planned.id);
      const std::string doc = "{\"id\": " + id + ", \"text\": \"" + Word(planned.id) + " " +
                              Word(planned.id) + "\"}";
      const std::string key = "k" + std::to_string(planned.id);
      const auto stamp = static_cast<int64_t>(std::floor(time * 1000));
      if (!planned.only_with_r) messages.push_back({"d", key, doc, {}, stamp});
      messages.push_back({"dr", key, doc, {}, stamp});
    }
    ASSERT_TRUE((*producer)->ProduceAndWait(messages, 10s).ok());
    // Its slot: the first whose time is at or after the stamp; slot 1 for
    // stamps before slot 0 (no slot before 1 is checked, and slot 1's
    // window of two or more intervals holds them wherever they join).
    const double slot_time =
        start + std::max(1.0, std::ceil(position - 1e-9)) * setup.interval;
    const double lateness = WallNow() - (slot_time + grace - 0.005);
    if (lateness > 0) {
      ++result->late_batches;
      result->worst_lateness = std::max(result->worst_lateness, lateness);
    }
  }
  ASSERT_TRUE((*producer)->Close(5s).ok());
  const auto until = std::chrono::steady_clock::now() + 60s;
  while (std::chrono::steady_clock::now() < until &&
         (daemon_d->status().last_slot < setup.slots ||
          daemon_dr->status().last_slot < setup.slots)) {
    std::this_thread::sleep_for(50ms);
  }
  daemon_d->RequestStop();
  daemon_dr->RequestStop();
  thread_d.join();
  thread_dr.join();
  EXPECT_TRUE(result_d.ok()) << result_d.ToString();
  EXPECT_TRUE(result_dr.ok()) << result_dr.ToString();
  std::filesystem::remove_all(dir);
}

// The pools differ by exactly {r} in the slots whose window holds r's stamp,
// and each holds exactly the records stamped in its window's intervals
// (slot 0 is observed by no daemon: records before it join slot 1).
void ExpectNeighbourPools(const PairSetup& setup, const PairResult& result) {
  auto millis = [&](double position) {
    return static_cast<int64_t>(std::floor((result.start + position * setup.interval) * 1000));
  };
  int r_slots = 0;
  for (int64_t slot = 1; slot <= setup.slots; ++slot) {
    ASSERT_TRUE(result.without.pools.count(slot)) << "slot " << slot;
    ASSERT_TRUE(result.with.pools.count(slot)) << "slot " << slot;
    std::set<int> window, window_with;
    for (const Planned& planned : setup.plan) {
      const int64_t stamp = millis(planned.position);
      const bool in = (slot - setup.window <= 0 ||
                       stamp > millis(static_cast<double>(slot - setup.window))) &&
                      stamp <= millis(static_cast<double>(slot));
      if (!in) continue;
      window_with.insert(planned.id);
      if (!planned.only_with_r) window.insert(planned.id);
    }
    if (window_with.count(kRecordR) > 0) ++r_slots;
    std::set<int> expected = result.without.pools.at(slot);
    if (window_with.count(kRecordR) > 0) expected.insert(kRecordR);
    EXPECT_EQ(result.with.pools.at(slot), expected) << "slot " << slot;
    EXPECT_EQ(result.without.pools.at(slot), window) << "slot " << slot;
  }
  EXPECT_EQ(r_slots, setup.window);
}

// Runs the pair until a run's environment met the premise (every batch
// acknowledged before its slot's cut was read), then checks that run. A run
// that missed it is not evidence either way: on a loaded CI machine the
// producer (this test's main thread) or the mock broker can stall for half
// a second. Three misses in a row fail: then the environment, not the
// daemon, is too slow for this test, and the message says so.
void RunPairAndExpectNeighbourPools(const PairSetup& setup, const std::string& tag) {
  for (int attempt = 1; attempt <= 3; ++attempt) {
    PairResult result;
    RunPair(setup, tag + std::to_string(attempt), &result);
    if (::testing::Test::HasFatalFailure()) return;
    if (result.late_batches == 0) {
      ExpectNeighbourPools(setup, result);
      return;
    }
    std::fprintf(stderr,
                 "attempt %d: %d batch(es) acknowledged after their slot's cut was read "
                 "(worst %.3f s late): the environment broke the premise; running again\n",
                 attempt, result.late_batches, result.worst_lateness);
  }
  FAIL() << "three runs in a row had batches acknowledged after their slot's cut was read: "
            "the machine is too loaded for this test";
}

// A batch in the middle of every slot interval; r joins the batch of
// interval 2 (slots 3 and 4); the daemon with r sleeps 1.5 intervals.
TEST(DaemonNeighbourTest, OneAddedRecordChangesOnlyItsOwnWindowsOnARealBroker) {
  PairSetup setup;
  int next_id = 0;
  for (int batch = -1; batch < setup.slots; ++batch) {
    for (int i = 0; i < 3; ++i) setup.plan.push_back({next_id++, batch + 0.5, false});
    if (batch == 2) setup.plan.push_back({kRecordR, batch + 0.5, true});
  }
  RunPairAndExpectNeighbourPools(setup, "batches");
}

// Issue 26: records sent continuously — one every 23 ms, so every slot time
// has records a few milliseconds on each side of it — while the daemon with
// r burns both cores for 1.5 intervals whenever r is in its pool, and the
// log ends are read when the clock thread gets to run. The cuts follow the
// records' stamps, not when the reads happened.
TEST(DaemonNeighbourTest, RecordsSentAroundEverySlotTimeKeepTheirSlotsUnderACpuBurn) {
  PairSetup setup;
  setup.interval = 0.5;
  setup.slots = 8;
  setup.burn = true;
  // The producer (this test's main thread) is the environment: under the
  // burn it may send a record late; the grace covers that lag, as it covers
  // a broker's replication lag in production. Measured here under the burn,
  // a batch sent just before a slot time was acknowledged up to 0.21 s after
  // it: 0.4 s (below the default release delay of one interval) leaves room.
  setup.cut_grace = 0.4;
  const double step = 0.023 / setup.interval;  // 23 ms in slot intervals
  int next_id = 0;
  bool r_placed = false;
  for (double position = -0.5; position < setup.slots + 0.2; position += step) {
    // None within 2 ms of a slot time, where the test's and the daemon's
    // millisecond of a slot time could differ.
    if (std::abs(position - std::round(position)) * setup.interval < 0.002) continue;
    if (!r_placed && position >= 3.98) {
      setup.plan.push_back({kRecordR, 3.98, true});  // 10 ms before t_4: slots 4 and 5
      r_placed = true;
    }
    setup.plan.push_back({next_id++, position, false});
  }
  RunPairAndExpectNeighbourPools(setup, "continuous");
}

}  // namespace
}  // namespace vipsd::daemon
