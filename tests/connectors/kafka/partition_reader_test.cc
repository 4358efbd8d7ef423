// KafkaPartitionReader against the in-process mock cluster: ranged reads and
// the long poll the work exchange waits in (ReadAvailable).
#include "connectors/kafka/partition_reader.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <map>
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

Fixture MakeFixture(std::map<std::string, std::string> reader_properties = {}) {
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
  options.properties = std::move(reader_properties);
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


// Reads every message from `from` until `count` arrived (a fetch may hold
// part of what is queued).
std::vector<ReadMessage> ReadCount(KafkaPartitionReader& reader, int64_t from, size_t count) {
  std::vector<ReadMessage> got;
  while (got.size() < count) {
    auto more = reader.ReadAvailable(from, std::chrono::seconds(10));
    EXPECT_TRUE(more.ok()) << more.status().message();
    if (!more.ok() || more->empty()) break;  // not within 10 s: the caller's EXPECT fails
    for (ReadMessage& m : *more) got.push_back(std::move(m));
    from = got.back().offset + 1;
  }
  return got;
}

// Pause: reads after it go on where consumption stood, with what was
// appended meanwhile, whichever read comes next (a long poll continuing, a
// range read elsewhere); pausing twice, or before anything was read, is a
// no-op.
TEST(KafkaPartitionReaderTest, APausedReaderReadsOnWhereItStood) {
  Fixture f = MakeFixture();
  ASSERT_TRUE(f.reader->Pause().ok());  // nothing assigned yet
  f.Append({"a", "b"});
  EXPECT_EQ(Values(ReadCount(*f.reader, 0, 2)), (std::vector<std::string>{"a", "b"}));
  ASSERT_TRUE(f.reader->Pause().ok());
  ASSERT_TRUE(f.reader->Pause().ok());
  f.Append({"c", "d"});
  std::vector<ReadMessage> after = ReadCount(*f.reader, 2, 2);
  EXPECT_EQ(Values(after), (std::vector<std::string>{"c", "d"}));
  ASSERT_EQ(after.size(), 2u);
  EXPECT_EQ(after[0].offset, 2);
  // Nothing more: the pause lost nothing and repeated nothing.
  ASSERT_TRUE(f.reader->Pause().ok());
  auto none = f.reader->ReadAvailable(4, std::chrono::milliseconds(300));
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  // A range read elsewhere while paused re-assigns and reads it whole.
  ASSERT_TRUE(f.reader->Pause().ok());
  auto all = f.reader->Read(0, 4);
  ASSERT_TRUE(all.ok()) << all.status().message();
  EXPECT_EQ(Values(*all), (std::vector<std::string>{"a", "b", "c", "d"}));
  ASSERT_TRUE(f.reader->Pause().ok());
  f.Append({"e"});
  auto range = f.reader->Read(4, 5);
  ASSERT_TRUE(range.ok()) << range.status().message();
  EXPECT_EQ(Values(*range), (std::vector<std::string>{"e"}));
}

// What Pause is for: a paused reader has no fetch in flight, so a watermark
// request and a read of what was just appended are answered at once. The
// mock cluster holds an empty fetch for fetch.wait.max.ms (2 s here) and
// answers a connection's requests in order; a reader left fetching has,
// 2.3 s after its last message, its second held fetch about 0.3 s old, so
// the same calls would wait about 1.7 s behind it.
TEST(KafkaPartitionReaderTest, APausedReaderDoesNotWaitBehindAHeldFetch) {
  Fixture f = MakeFixture({{"fetch.wait.max.ms", "2000"}});
  f.Append({"a"});
  ASSERT_EQ(ReadCount(*f.reader, 0, 1).size(), 1u);
  ASSERT_TRUE(f.reader->Pause().ok());
  // The fetch held when it paused ends within 2 s; no other is sent.
  std::this_thread::sleep_for(std::chrono::milliseconds(2300));
  auto ms = [](Clock::duration d) {
    return static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(d).count());
  };
  auto start = Clock::now();
  auto bounds = f.reader->Bounds();
  const auto bounds_took = Clock::now() - start;
  ASSERT_TRUE(bounds.ok()) << bounds.status().message();
  EXPECT_EQ(bounds->second, 1);
  f.Append({"b"});
  start = Clock::now();
  std::vector<ReadMessage> read = ReadCount(*f.reader, 1, 1);
  const auto read_took = Clock::now() - start;
  std::printf("paused reader: watermarks in %lld ms, a new message read in %lld ms\n",
              ms(bounds_took), ms(read_took));
  ASSERT_EQ(Values(read), (std::vector<std::string>{"b"}));
  EXPECT_LT(bounds_took, std::chrono::milliseconds(1000));
  EXPECT_LT(read_took, std::chrono::milliseconds(1000));
}

}  // namespace
}  // namespace vipsd::connectors
