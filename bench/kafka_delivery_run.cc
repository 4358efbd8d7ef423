// kafka_delivery_run: how long a work-topic-sized message takes from one
// Kafka client to another (issue 30: what the plan and the partial of a
// shared step wait for between two processes).
//
//   kafka_delivery_run [--bootstrap HOST:PORT] [--bytes N] [--messages M]
//                      [--fetch-wait-ms W] [--rest] [--busy-threads B]
//
// A producer (linger.ms 0, acks=all, as the work exchange's) appends M
// messages of N bytes, one every 100–150 ms, each waited for; a
// KafkaPartitionReader long-polls for them (ReadAvailable) with the given
// fetch.wait.max.ms. Each message carries its send time, so a delivery is
// the time from the append's start to the reader's return. --rest pauses the
// reader (KafkaPartitionReader::Pause) after each message until 5 ms before
// the next is sent (how the work exchange rests while it sums). Without
// --bootstrap, an in-process mock cluster (librdkafka's) is used.
// --busy-threads keeps B threads spinning meanwhile (load on every core).
//
// Prints one JSON object: how many messages arrived (fewer than M when the
// cluster's retention took some first: the mock cluster keeps at most 5 MiB a
// partition), the append's and the delivery's 10th, 50th and 90th
// percentiles and maximum, in ms. Message content is filler: nothing
// private goes through it.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "connectors/kafka/kafka_producer.h"
#include "connectors/kafka/mock_cluster.h"
#include "connectors/kafka/partition_reader.h"

namespace {

using Clock = std::chrono::steady_clock;
using vipsd::connectors::KafkaPartitionReader;
using vipsd::connectors::KafkaPartitionReaderOptions;
using vipsd::connectors::KafkaProducer;
using vipsd::connectors::KafkaProducerOptions;
using vipsd::connectors::OutMessage;

constexpr char kTopic[] = "vipsd-delivery-bench";

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

struct Percentiles {
  double p10 = 0, p50 = 0, p90 = 0, max = 0;
};

Percentiles Summarise(std::vector<double> values) {
  Percentiles p;
  if (values.empty()) return p;
  std::sort(values.begin(), values.end());
  auto at = [&](double f) { return values[static_cast<size_t>(f * (values.size() - 1))]; };
  p.p10 = at(0.1);
  p.p50 = at(0.5);
  p.p90 = at(0.9);
  p.max = values.back();
  return p;
}

std::string Json(const char* name, const Percentiles& p) {
  char buffer[200];
  std::snprintf(buffer, sizeof(buffer),
                "\"%s_ms\": {\"p10\": %.2f, \"p50\": %.2f, \"p90\": %.2f, \"max\": %.2f}", name,
                p.p10, p.p50, p.p90, p.max);
  return buffer;
}

constexpr char kUsage[] =
    "usage: kafka_delivery_run [--bootstrap HOST:PORT] [--bytes N] [--messages M]\n"
    "                          [--fetch-wait-ms W] [--rest] [--busy-threads B]\n"
    "  --bootstrap      a broker to use (default: an in-process mock cluster; the\n"
    "                   topic vipsd-delivery-bench must exist there, 1 partition)\n"
    "  --bytes          message size (default 800000: a plan at K*V = 100,000)\n"
    "  --messages       messages to send, one every 100-150 ms (default 60)\n"
    "  --fetch-wait-ms  the reader's fetch.wait.max.ms (default 10, the daemon's)\n"
    "  --rest           pause the reader between messages (KafkaPartitionReader::Pause)\n"
    "  --busy-threads   threads spinning meanwhile (default 0)\n"
    "Prints one JSON object: messages received, append and delivery p10/p50/p90/max ms.\n";

int Usage(const char* why) {
  std::fprintf(stderr, "%s\n%s", why, kUsage);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string bootstrap;
  long bytes = 800000, messages = 60, fetch_wait_ms = 10, busy_threads = 0;
  bool rest = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto number = [&](long* out, long low, long high) {
      if (i + 1 >= argc) return false;
      char* end = nullptr;
      *out = std::strtol(argv[++i], &end, 10);
      return *end == '\0' && *out >= low && *out <= high;
    };
    if (arg == "--bootstrap" && i + 1 < argc) {
      bootstrap = argv[++i];
    } else if (arg == "--bytes") {
      if (!number(&bytes, 8, 64L << 20)) return Usage("--bytes: 8 .. 64 MiB");
    } else if (arg == "--messages") {
      if (!number(&messages, 1, 100000)) return Usage("--messages: 1 .. 100000");
    } else if (arg == "--fetch-wait-ms") {
      if (!number(&fetch_wait_ms, 0, 60000)) return Usage("--fetch-wait-ms: 0 .. 60000");
    } else if (arg == "--busy-threads") {
      if (!number(&busy_threads, 0, 256)) return Usage("--busy-threads: 0 .. 256");
    } else if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (arg == "--rest") {
      rest = true;
    } else {
      return Usage(("unknown argument " + arg).c_str());
    }
  }
  std::unique_ptr<vipsd::connectors::MockCluster> cluster;
  if (bootstrap.empty()) {
    auto created = vipsd::connectors::MockCluster::Create(1);
    if (!created.ok()) return Usage(created.status().ToString().c_str());
    cluster = std::move(*created);
    bootstrap = cluster->bootstrap_servers();
    const auto topic = cluster->CreateTopic(kTopic, 1);
    if (!topic.ok()) return Usage(topic.ToString().c_str());
  }
  KafkaProducerOptions producer_options;
  producer_options.bootstrap_servers = bootstrap;
  producer_options.properties["linger.ms"] = "0";
  producer_options.properties["message.max.bytes"] = std::to_string(64 << 20);
  auto producer = KafkaProducer::Create(producer_options);
  if (!producer.ok()) return Usage(producer.status().ToString().c_str());
  KafkaPartitionReaderOptions reader_options;
  reader_options.bootstrap_servers = bootstrap;
  reader_options.topic = kTopic;
  reader_options.properties["fetch.wait.max.ms"] = std::to_string(fetch_wait_ms);
  reader_options.properties["fetch.max.bytes"] = std::to_string(64 << 20);
  auto reader = KafkaPartitionReader::Create(reader_options);
  if (!reader.ok()) return Usage(reader.status().ToString().c_str());
  auto bounds = (*reader)->Bounds();
  if (!bounds.ok()) return Usage(bounds.status().ToString().c_str());

  std::atomic<bool> done{false};
  std::vector<std::thread> busy;
  for (long b = 0; b < busy_threads; ++b) {
    busy.emplace_back([&done] {
      volatile double x = 1;
      while (!done.load(std::memory_order_relaxed)) x = std::sqrt(x + 1.0);
    });
  }
  std::atomic<int64_t> next_send_ns{0};
  std::vector<double> appends, deliveries;
  std::atomic<bool> appended_all{false};
  std::thread appender([&] {
    for (long i = 0; i < messages; ++i) {
      const auto gap = std::chrono::milliseconds(100 + (i * 37) % 50);
      next_send_ns.store(NowNs() + std::chrono::nanoseconds(gap).count());
      std::this_thread::sleep_for(gap);
      OutMessage m;
      m.topic = kTopic;
      m.partition = 0;
      m.key = "bench";
      m.value.assign(static_cast<size_t>(bytes), 'x');
      const int64_t start = NowNs();
      std::memcpy(m.value.data(), &start, sizeof(start));
      const auto appended = (*producer)->ProduceAndWait(std::span(&m, 1), std::chrono::seconds(30));
      if (!appended.ok()) {
        std::fprintf(stderr, "append: %s\n", appended.ToString().c_str());
        std::exit(1);
      }
      appends.push_back((NowNs() - start) / 1e6);
    }
    appended_all = true;
  });
  int64_t position = bounds->second;
  while (static_cast<long>(deliveries.size()) < messages) {
    if (rest) {
      // Rest until shortly before the next append (the work exchange rests
      // while it sums and polls again when its partial is sent).
      const int64_t wake = next_send_ns.load() - 5'000'000;
      if (wake > NowNs()) std::this_thread::sleep_for(std::chrono::nanoseconds(wake - NowNs()));
    }
    const bool last_chance = appended_all.load();
    auto got = (*reader)->ReadAvailable(position, std::chrono::seconds(5));
    if (!got.ok()) {
      std::fprintf(stderr, "read: %s\n", got.status().ToString().c_str());
      return 1;
    }
    const int64_t now = NowNs();
    for (const auto& m : *got) {
      int64_t sent = 0;
      std::memcpy(&sent, m.value.data(), sizeof(sent));
      deliveries.push_back((now - sent) / 1e6);
      position = m.offset + 1;
    }
    if (rest && !got->empty()) (void)(*reader)->Pause();
    // Every message was appended and none came for 5 s: the rest are lost
    // to the cluster's retention (the mock keeps at most 5 MiB a partition).
    if (got->empty() && last_chance) break;
  }
  appender.join();
  done = true;
  for (auto& t : busy) t.join();
  std::printf("{\"bytes\": %ld, \"messages\": %ld, \"fetch_wait_ms\": %ld, \"rest\": %s, "
              "\"busy_threads\": %ld, \"received\": %zu, \"cluster\": \"%s\", %s, %s}\n",
              bytes, messages, fetch_wait_ms, rest ? "true" : "false", busy_threads,
              deliveries.size(),
              cluster != nullptr ? "in-process mock" : "external", Json("append", Summarise(appends)).c_str(),
              Json("delivery", Summarise(deliveries)).c_str());
  return 0;
}
