// KafkaPartitionReader against the in-process mock cluster: ranged reads and
// the long poll the work exchange waits in (ReadAvailable).
#include "connectors/kafka/partition_reader.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "connectors/kafka/kafka_producer.h"
#include "connectors/kafka/mock_cluster.h"
#include "tests/connectors/kafka/kafka_test_util.h"

namespace vipsd::connectors {
namespace {

using Clock = std::chrono::steady_clock;

struct Fixture {
  std::unique_ptr<MockCluster> cluster;
  std::unique_ptr<KafkaProducer> producer;
  std::unique_ptr<KafkaPartitionReader> reader;

  void Append(const std::vector<std::string>& values) {
    std::vector<OutMessage> messages;
    for (const std::string& v : values) {
      OutMessage m;
      m.topic = "log";
      m.partition = 1;
      m.key = "job";
      m.value = v;
      messages.push_back(std::move(m));
    }
    ASSERT_TRUE(producer->ProduceAndWait(messages, std::chrono::seconds(10)).ok());
  }
};

Fixture MakeFixture() {
  Fixture f;
  auto cluster = MockCluster::Create(1);
  EXPECT_TRUE(cluster.ok());
  f.cluster = std::move(*cluster);
  EXPECT_TRUE(f.cluster->CreateTopic("log", 2).ok());
  KafkaProducerOptions producer;
  producer.bootstrap_servers = f.cluster->bootstrap_servers();
  producer.properties = testing_kafka::FastProducerProperties();
  auto created = KafkaProducer::Create(producer);
  EXPECT_TRUE(created.ok()) << created.status().message();
  f.producer = std::move(*created);
  KafkaPartitionReaderOptions options;
  options.bootstrap_servers = f.cluster->bootstrap_servers();
  options.topic = "log";
  options.partition = 1;
  options.timeout = std::chrono::seconds(10);
  auto reader = KafkaPartitionReader::Create(options);
  EXPECT_TRUE(reader.ok()) << reader.status().message();
  f.reader = std::move(*reader);
  return f;
}

std::vector<std::string> Values(const std::vector<ReadMessage>& messages) {
  std::vector<std::string> out;
  for (const ReadMessage& m : messages) out.push_back(m.value);
  return out;
}

TEST(KafkaPartitionReaderTest, ReadReturnsTheRangeAndBoundsTheLog) {
  Fixture f = MakeFixture();
  f.Append({"a", "b", "c", "d"});
  auto bounds = f.reader->Bounds();
  ASSERT_TRUE(bounds.ok()) << bounds.status().message();
  EXPECT_EQ(*bounds, std::make_pair(int64_t{0}, int64_t{4}));
  auto middle = f.reader->Read(1, 3);
  ASSERT_TRUE(middle.ok()) << middle.status().message();
  EXPECT_EQ(Values(*middle), (std::vector<std::string>{"b", "c"}));
  EXPECT_EQ((*middle)[0].offset, 1);
  EXPECT_EQ((*middle)[0].key, "job");
  auto all = f.reader->Read(0, 4);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(Values(*all), (std::vector<std::string>{"a", "b", "c", "d"}));
}

// The long poll returns what is queued at once, a message appended while it
// waits as soon as it arrives (not at the end of the wait), and nothing when
// nothing comes.
TEST(KafkaPartitionReaderTest, ALongPollReturnsAnAppendAsItArrivesAndNothingAtItsEnd) {
  Fixture f = MakeFixture();
  f.Append({"a", "b"});
  auto queued = f.reader->ReadAvailable(0, std::chrono::seconds(10));
  ASSERT_TRUE(queued.ok()) << queued.status().message();
  // The first fetch may hold only part of what was appended; the rest comes
  // with the next call.
  std::vector<std::string> got = Values(*queued);
  int64_t next = queued->empty() ? 0 : queued->back().offset + 1;
  while (got.size() < 2) {
    auto more = f.reader->ReadAvailable(next, std::chrono::seconds(10));
    ASSERT_TRUE(more.ok());
    ASSERT_FALSE(more->empty()) << "a queued message was not returned within 10 s";
    for (const ReadMessage& m : *more) got.push_back(m.value);
    next = more->back().offset + 1;
  }
  EXPECT_EQ(got, (std::vector<std::string>{"a", "b"}));
  ASSERT_EQ(next, 2);

  const auto empty_start = Clock::now();
  auto none = f.reader->ReadAvailable(next, std::chrono::milliseconds(400));
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  EXPECT_GE(Clock::now() - empty_start, std::chrono::milliseconds(390));

  std::thread appender([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    f.Append({"c"});
  });
  const auto start = Clock::now();
  auto arrived = f.reader->ReadAvailable(next, std::chrono::seconds(30));
  const auto waited = Clock::now() - start;
  appender.join();
  std::printf("long poll: a message appended after 300 ms returned after %lld ms\n",
              static_cast<long long>(
                  std::chrono::duration_cast<std::chrono::milliseconds>(waited).count()));
  ASSERT_TRUE(arrived.ok());
  ASSERT_EQ(Values(*arrived), (std::vector<std::string>{"c"}));
  EXPECT_EQ((*arrived)[0].offset, 2);
  EXPECT_GE(waited, std::chrono::milliseconds(250));
  // Returned on arrival, far from the 30 s wait (generous for a loaded run).
  EXPECT_LT(waited, std::chrono::seconds(15));

  // From an earlier offset the reader assigns again and re-reads.
  auto again = f.reader->ReadAvailable(1, std::chrono::seconds(10));
  ASSERT_TRUE(again.ok());
  ASSERT_FALSE(again->empty());
  EXPECT_EQ(again->front().offset, 1);
  EXPECT_EQ(again->front().value, "b");
}

}  // namespace
}  // namespace vipsd::connectors
