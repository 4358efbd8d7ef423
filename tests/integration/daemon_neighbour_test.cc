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
// LogAppendTime), so there the daemons run with source.timestamps:
// create_time and the producer stamps each record with the time it sends
// it at. The same test runs on the real Apache Kafka broker of the ctest
// fixture real_kafka (scripts/kafka_broker.sh, its directory in
// VIPSD_KAFKA_BROKER_DIR) with topics created message.timestamp.type=
// LogAppendTime and the default source.timestamps: log_append_time: the
// broker stamps each record when it appends it, and the expected windows
// are computed from the stamps read back from each topic.
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

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafkacpp.h>

#include "connectors/kafka/kafka_producer.h"
#include "connectors/kafka/mock_cluster.h"
#include "daemon/io/kafka_io.h"
#include "daemon/service/daemon.h"

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
  // The real broker of the fixture (LogAppendTime) instead of a mock cluster.
  bool real_broker = false;
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
  // Each record's stamp in unix ms, in D and in D + r, by record id: the
  // producer's (mock) or the broker's, read back (real broker).
  std::map<int, int64_t> stamps_d, stamps_dr;
  // The premise the claim rests on, as this run's environment met it: every
  // record readable before its slot's cut was read (slot time + the grace).
  // Acknowledged is later than readable, so a batch acknowledged by then met
  // it. Otherwise its records may join the next slot in one daemon and not
  // the other — outside the claim, not a fault of the daemon.
  int late_batches = 0;
  double worst_lateness = 0;  // seconds past slot time + grace
};

// The real broker's address (the ctest fixture real_kafka's directory).
std::string RealBrokerBootstrap() {
  std::ifstream file(std::string(VIPSD_KAFKA_BROKER_DIR) + "/bootstrap");
  std::string bootstrap;
  std::getline(file, bootstrap);
  return bootstrap;
}

// Creates `names` (two partitions each, message.timestamp.type=LogAppendTime)
// with the admin API and waits until a client sees them.
void CreateLogAppendTimeTopics(const std::string& bootstrap,
                               const std::vector<std::string>& names) {
  char error[512];
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  ASSERT_EQ(rd_kafka_conf_set(conf, "bootstrap.servers", bootstrap.c_str(), error, sizeof(error)),
            RD_KAFKA_CONF_OK);
  rd_kafka_t* rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, error, sizeof(error));
  ASSERT_NE(rk, nullptr) << error;
  std::vector<rd_kafka_NewTopic_t*> topics;
  for (const std::string& name : names) {
    topics.push_back(rd_kafka_NewTopic_new(name.c_str(), 2, 1, error, sizeof(error)));
    ASSERT_NE(topics.back(), nullptr) << error;
    ASSERT_EQ(rd_kafka_NewTopic_set_config(topics.back(), "message.timestamp.type",
                                           "LogAppendTime"),
              RD_KAFKA_RESP_ERR_NO_ERROR);
  }
  rd_kafka_queue_t* queue = rd_kafka_queue_new(rk);
  rd_kafka_CreateTopics(rk, topics.data(), topics.size(), nullptr, queue);
  rd_kafka_event_t* event = rd_kafka_queue_poll(queue, 60000);
  ASSERT_NE(event, nullptr);
  EXPECT_EQ(rd_kafka_event_error(event), RD_KAFKA_RESP_ERR_NO_ERROR)
      << rd_kafka_event_error_string(event);
  size_t count = 0;
  const rd_kafka_topic_result_t** results =
      rd_kafka_CreateTopics_result_topics(rd_kafka_event_CreateTopics_result(event), &count);
  for (size_t i = 0; i < count; ++i) {
    EXPECT_EQ(rd_kafka_topic_result_error(results[i]), RD_KAFKA_RESP_ERR_NO_ERROR)
        << rd_kafka_topic_result_name(results[i]) << ": "
        << rd_kafka_topic_result_error_string(results[i]);
  }
  rd_kafka_event_destroy(event);
  for (rd_kafka_NewTopic_t* topic : topics) rd_kafka_NewTopic_destroy(topic);
  // Until the metadata names every partition of every topic.
  const auto until = std::chrono::steady_clock::now() + 30s;
  for (bool seen = false; !seen && std::chrono::steady_clock::now() < until;) {
    const rd_kafka_metadata_t* metadata = nullptr;
    seen = rd_kafka_metadata(rk, 1, nullptr, &metadata, 5000) == RD_KAFKA_RESP_ERR_NO_ERROR;
    for (const std::string& name : names) {
      bool found = false;
      for (int i = 0; seen && i < metadata->topic_cnt; ++i) {
        found = found || (name == metadata->topics[i].topic && metadata->topics[i].err == 0 &&
                          metadata->topics[i].partition_cnt == 2);
      }
      seen = seen && found;
    }
    if (metadata != nullptr) rd_kafka_metadata_destroy(metadata);
    if (!seen) std::this_thread::sleep_for(100ms);
  }
  rd_kafka_queue_destroy(queue);
  rd_kafka_destroy(rk);
}

// Record id -> the stamp the broker gave it, read back from both partitions
// of `topic` (keys are "k<id>").
std::map<int, int64_t> ReadStamps(const std::string& bootstrap, const std::string& topic) {
  std::string error;
  std::unique_ptr<RdKafka::Conf> conf(RdKafka::Conf::create(RdKafka::Conf::CONF_GLOBAL));
  conf->set("bootstrap.servers", bootstrap, error);
  conf->set("group.id", topic + "-stamps", error);
  conf->set("enable.partition.eof", "true", error);
  std::unique_ptr<RdKafka::KafkaConsumer> consumer(
      RdKafka::KafkaConsumer::create(conf.get(), error));
  std::map<int, int64_t> stamps;
  if (consumer == nullptr) return stamps;
  std::vector<RdKafka::TopicPartition*> partitions = {
      RdKafka::TopicPartition::create(topic, 0, RdKafka::Topic::OFFSET_BEGINNING),
      RdKafka::TopicPartition::create(topic, 1, RdKafka::Topic::OFFSET_BEGINNING)};
  consumer->assign(partitions);
  RdKafka::TopicPartition::destroy(partitions);
  std::set<int32_t> done;
  const auto until = std::chrono::steady_clock::now() + 30s;
  while (done.size() < 2 && std::chrono::steady_clock::now() < until) {
    std::unique_ptr<RdKafka::Message> message(consumer->consume(500));
    if (message->err() == RdKafka::ERR__PARTITION_EOF) done.insert(message->partition());
    if (message->err() != RdKafka::ERR_NO_ERROR || message->key() == nullptr) continue;
    EXPECT_EQ(message->timestamp().type,
              RdKafka::MessageTimestamp::MSG_TIMESTAMP_LOG_APPEND_TIME);
    stamps[std::stoi(message->key()->substr(1))] = message->timestamp().timestamp;
  }
  consumer->close();
  return stamps;
}

// Runs the daemons on D and D + r over a mock cluster (or the real broker)
// while a producer sends `setup.plan` in real time.
void RunPair(const PairSetup& setup, const std::string& tag, PairResult* result) {
  std::unique_ptr<connectors::MockCluster> mock;
  std::string bootstrap;
  const std::string prefix =
      setup.real_broker ? "nb-" + tag + "-" + std::to_string(getpid()) + "-" : "";
  if (setup.real_broker) {
    bootstrap = RealBrokerBootstrap();
    ASSERT_FALSE(bootstrap.empty())
        << "no broker in " << VIPSD_KAFKA_BROKER_DIR
        << " (ctest starts it: the fixture real_kafka; by hand: scripts/kafka_broker.sh start "
        << VIPSD_KAFKA_BROKER_DIR << ")";
  } else {
    auto cluster = connectors::MockCluster::Create(1);
    ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
    mock = std::move(*cluster);
    bootstrap = mock->bootstrap_servers();
  }
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
  std::vector<std::string> topic_names;
  for (const char* topic : {"d", "dr", "rel-d", "rel-dr", "dead", "warmup"}) {
    topic_names.push_back(prefix + topic);
  }
  if (setup.real_broker) {
    CreateLogAppendTimeTopics(bootstrap, topic_names);
    if (::testing::Test::HasFatalFailure()) return;
  } else {
    for (const std::string& topic : topic_names) ASSERT_TRUE(mock->CreateTopic(topic, 2).ok());
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
            "schedule:\n  tau0: 1\n  kappa: 0.7\n  threads: 1\n  start_delay_seconds: 0\n  on_overrun: catch_up\n  interval_seconds: "
         << setup.interval << "\n  window_steps: " << setup.window << "\n  start_time: " << start << "\n"
         << (setup.cut_grace >= 0 ? "  cut_grace_seconds: " + std::to_string(setup.cut_grace) + "\n"
                                  : std::string())
         << "source:\n  type: kafka\n  topics: [" << prefix << name << "]\n  group_id: nb-"
         << prefix << name << "-" << getpid() << "\n"
         // The mock keeps producers' stamps; the real broker stamps on append
         // (the default source.timestamps: log_append_time).
         << (setup.real_broker ? "" : "  timestamps: create_time\n")
         << "sink:\n  type: kafka\n  topic: " << prefix << "rel-" << name << "\n"
         << "dead_letter:\n  topic: " << prefix << "dead\n"
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
  ASSERT_TRUE((*producer)->ProduceAndWait({{{prefix + "warmup", "w", "w", {}}}}, 10s).ok());
  std::map<int, double> acked;  // record id -> when its batch was acknowledged
  // Records planned for the same time go in one produce call, to both
  // topics, stamped with that time: D and D + r get the same stamps.
  for (size_t i = 0; i < setup.plan.size();) {
    const double position = setup.plan[i].position;
    const double time = start + position * setup.interval;
    SleepUntil(time);
    std::vector<connectors::OutMessage> messages;
    const size_t first = i;
    for (; i < setup.plan.size() && setup.plan[i].position == position; ++i) {
      const Planned& planned = setup.plan[i];
      const std::string id = planned.id == kRecordR ? "\"r\"" : std::to_string(planned.id);
      const std::string doc = "{\"id\": " + id + ", \"text\": \"" + Word(planned.id) + " " +
                              Word(planned.id) + "\"}";
      const std::string key = "k" + std::to_string(planned.id);
      // The broker stamps records itself; the mock keeps the producer's.
      const auto stamp =
          setup.real_broker ? int64_t{0} : static_cast<int64_t>(std::floor(time * 1000));
      if (!planned.only_with_r) {
        messages.push_back({prefix + "d", key, doc, {}, stamp});
        result->stamps_d[planned.id] = stamp;
      }
      messages.push_back({prefix + "dr", key, doc, {}, stamp});
      result->stamps_dr[planned.id] = stamp;
    }
    ASSERT_TRUE((*producer)->ProduceAndWait(messages, 10s).ok());
    for (size_t j = first; j < i; ++j) acked[setup.plan[j].id] = WallNow();
    // Its slot: the first whose time is at or after the stamp; slot 1 for
    // stamps before slot 0 (no slot before 1 is checked, and slot 1's
    // window of two or more intervals holds them wherever they join).
    const double slot_time =
        start + std::max(1.0, std::ceil(position - 1e-9)) * setup.interval;
    const double lateness = WallNow() - (slot_time + grace - 0.005);
    if (!setup.real_broker && lateness > 0) {
      ++result->late_batches;
      result->worst_lateness = std::max(result->worst_lateness, lateness);
    }
  }
  ASSERT_TRUE((*producer)->Close(5s).ok());
  if (setup.real_broker) {
    // The broker's stamps, and the premise against them: each record
    // acknowledged before the cut of the slot its stamp names was read.
    result->stamps_d = ReadStamps(bootstrap, prefix + "d");
    result->stamps_dr = ReadStamps(bootstrap, prefix + "dr");
    for (const auto& [id, stamp] : result->stamps_dr) {
      const double slot =
          std::max(1.0, std::ceil((static_cast<double>(stamp) / 1000 - start) / setup.interval -
                                  1e-9));
      const double lateness = acked[id] - (start + slot * setup.interval + grace - 0.005);
      if (lateness > 0) {
        ++result->late_batches;
        result->worst_lateness = std::max(result->worst_lateness, lateness);
      }
    }
  }
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
// (slot 0 is observed by no daemon: records before it join slot 1). The
// stamps are each topic's own (the broker's, on a real broker: the same
// record may get another millisecond in D than in D + r).
void ExpectNeighbourPools(const PairSetup& setup, const PairResult& result) {
  auto millis = [&](double position) {
    return static_cast<int64_t>(std::floor((result.start + position * setup.interval) * 1000));
  };
  auto window_of = [&](const std::map<int, int64_t>& stamps, int64_t slot) {
    std::set<int> window;
    for (const auto& [id, stamp] : stamps) {
      const bool in = (slot - setup.window <= 0 ||
                       stamp > millis(static_cast<double>(slot - setup.window))) &&
                      stamp <= millis(static_cast<double>(slot));
      if (in) window.insert(id);
    }
    return window;
  };
  ASSERT_EQ(result.stamps_dr.size(), setup.plan.size());
  ASSERT_EQ(result.stamps_d.size(), setup.plan.size() - 1);
  int r_slots = 0;
  for (int64_t slot = 1; slot <= setup.slots; ++slot) {
    ASSERT_TRUE(result.without.pools.count(slot)) << "slot " << slot;
    ASSERT_TRUE(result.with.pools.count(slot)) << "slot " << slot;
    const std::set<int> window = window_of(result.stamps_d, slot);
    const std::set<int> window_with = window_of(result.stamps_dr, slot);
    if (window_with.count(kRecordR) > 0) ++r_slots;
    EXPECT_EQ(result.without.pools.at(slot), window) << "slot " << slot;
    EXPECT_EQ(result.with.pools.at(slot), window_with) << "slot " << slot;
    // Where every other record has its slot in both topics, the pools
    // differ by exactly {r}.
    std::set<int> without_r = window_with;
    without_r.erase(kRecordR);
    if (without_r == window) {
      std::set<int> expected = result.without.pools.at(slot);
      if (window_with.count(kRecordR) > 0) expected.insert(kRecordR);
      EXPECT_EQ(result.with.pools.at(slot), expected) << "slot " << slot;
    }
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

// The same on the real Apache Kafka broker of the fixture real_kafka: topics
// stamped LogAppendTime, the daemons on the default source.timestamps.
TEST(DaemonNeighbourTest, OneAddedRecordChangesOnlyItsOwnWindowsOnApacheKafka) {
  PairSetup setup;
  setup.real_broker = true;
  int next_id = 0;
  for (int batch = -1; batch < setup.slots; ++batch) {
    for (int i = 0; i < 3; ++i) setup.plan.push_back({next_id++, batch + 0.5, false});
    if (batch == 2) setup.plan.push_back({kRecordR, batch + 0.5, true});
  }
  RunPairAndExpectNeighbourPools(setup, "apache");
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
