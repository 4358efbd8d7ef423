#include "connectors/kafka/dead_letter.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "connectors/kafka/mock_cluster.h"
#include "tests/connectors/kafka/kafka_test_util.h"

namespace vipsd::connectors {
namespace {

using Headers = std::vector<std::pair<std::string, std::string>>;

SourceMessage Record() {
  SourceMessage m;
  m.topic = "documents";
  m.partition = 3;
  m.offset = 12345;
  m.key = "doc-key-7";
  static constexpr char kBytes[] = "{\"id\": 7, \"text\": \x01\xff not json\0 after NUL";
  m.payload = std::string(kBytes, sizeof(kBytes) - 1);  // binary, with a NUL
  m.headers = {{"trace", "abc"}};
  return m;
}

TEST(DeadLetterTest, CarriesThePayloadUnchangedWithReasonAndPosition) {
  const SourceMessage record = Record();
  const OutMessage dead = MakeDeadLetter(record, RejectReason::kInvalidJson, "documents.dlq");
  EXPECT_EQ(dead.topic, "documents.dlq");
  EXPECT_EQ(dead.key, "doc-key-7");
  EXPECT_EQ(dead.value, record.payload);  // byte for byte, for replay
  EXPECT_EQ(dead.headers,
            (Headers{{"vipsd-reason", "invalid_json"},
                     {"vipsd-reason-description",
                      std::string(RejectReasonDescription(RejectReason::kInvalidJson))},
                     {"vipsd-source-topic", "documents"},
                     {"vipsd-source-partition", "3"},
                     {"vipsd-source-offset", "12345"}}));
}

TEST(DeadLetterTest, OversizeRecordHasNoValueAndSaysWhy) {
  SourceMessage record = Record();
  record.oversize = true;
  record.payload.clear();  // as KafkaSource returns it
  record.headers.clear();
  const OutMessage dead = MakeDeadLetter(record, RejectReason::kRecordTooLarge, "dlq");
  EXPECT_TRUE(dead.value.empty());
  EXPECT_EQ(dead.key, "doc-key-7");
  ASSERT_EQ(dead.headers.size(), 6u);
  EXPECT_EQ(dead.headers[0], (std::pair<std::string, std::string>{"vipsd-reason",
                                                                  "record_too_large"}));
  EXPECT_EQ(dead.headers[5], (std::pair<std::string, std::string>{"vipsd-payload-omitted",
                                                                  "record_too_large"}));
  // Even if a caller forgot to clear an oversize payload, none is sent.
  record.payload = "should not travel";
  EXPECT_TRUE(MakeDeadLetter(record, RejectReason::kRecordTooLarge, "dlq").value.empty());
}

TEST(DeadLetterTest, EveryReasonHasItsCodeAndDescription) {
  for (size_t i = 0; i < kNumRejectReasons; ++i) {
    const auto reason = static_cast<RejectReason>(i);
    const OutMessage dead = MakeDeadLetter(Record(), reason, "dlq");
    EXPECT_EQ(dead.headers[0].second, RejectReasonName(reason));
    EXPECT_EQ(dead.headers[1].second, RejectReasonDescription(reason));
    EXPECT_FALSE(dead.headers[1].second.empty());
  }
}

// Issue 27: a record just under max_record_bytes made a dead letter the
// producer refuses for ever (MSG_SIZE_TOO_LARGE), and consumption stopped at
// it. Dead letters are cut to what the producer sends, and say so; the
// producer itself (librdkafka, default message.max.bytes) accepts every one,
// whatever the record's key and value sizes.
TEST(DeadLetterTest, ADeadLetterNeverExceedsWhatTheProducerSends) {
  auto cluster = MockCluster::Create(1);
  ASSERT_TRUE(cluster.ok());
  ASSERT_TRUE((*cluster)->CreateTopic("dlq", 1).ok());
  KafkaProducerOptions options;
  options.bootstrap_servers = (*cluster)->bootstrap_servers();
  options.properties = testing_kafka::FastProducerProperties();
  auto producer = KafkaProducer::Create(options);
  ASSERT_TRUE(producer.ok());
  ASSERT_EQ((*producer)->max_message_bytes(), kDefaultMaxMessageBytes);
  const size_t limit = (*producer)->max_message_bytes();
  struct Case {
    size_t key_bytes;
    size_t value_bytes;
  };
  const Case cases[] = {{9, 1000000}, {9, 990000}, {9, 1048576}, {0, 999999},
                        {600000, 600000}, {1200000, 10}, {9, 10}};
  std::vector<OutMessage> dead;
  for (const Case& c : cases) {
    SCOPED_TRACE(std::to_string(c.key_bytes) + " + " + std::to_string(c.value_bytes));
    SourceMessage record = Record();
    record.key = std::string(c.key_bytes, 'k');
    record.payload = std::string(c.value_bytes, 'v');
    const OutMessage message = MakeDeadLetter(record, RejectReason::kInvalidJson, "dlq", limit);
    size_t total = message.key.size() + message.value.size();
    for (const auto& [name, value] : message.headers) total += name.size() + value.size();
    EXPECT_LE(total + kDeadLetterFraming, limit);
    // What was kept is the record's beginning; what was cut is said.
    EXPECT_EQ(message.key, record.key.substr(0, message.key.size()));
    EXPECT_EQ(message.value, record.payload.substr(0, message.value.size()));
    auto header = [&](const std::string& name) -> std::string {
      for (const auto& [n, v] : message.headers) {
        if (n == name) return v;
      }
      return "";
    };
    if (message.value.size() < c.value_bytes) {
      EXPECT_EQ(header("vipsd-payload-truncated"), std::to_string(c.value_bytes));
    } else {
      EXPECT_EQ(header("vipsd-payload-truncated"), "");
    }
    if (message.key.size() < c.key_bytes) {
      EXPECT_EQ(header("vipsd-key-truncated"), std::to_string(c.key_bytes));
    }
    // Small records travel whole.
    if (c.key_bytes + c.value_bytes < DeadLetterValueRoom(limit)) {
      EXPECT_EQ(message.value.size(), c.value_bytes);
      EXPECT_EQ(message.key.size(), c.key_bytes);
    }
    dead.push_back(message);
  }
  // One at a time: librdkafka's own size check is what must pass.
  for (const OutMessage& message : dead) {
    const Status sent = (*producer)->ProduceAndWait({&message, 1}, std::chrono::seconds(10));
    EXPECT_TRUE(sent.ok()) << sent.ToString();
  }
  // And the comparison --check-config warns with is below the limit.
  EXPECT_GT(DeadLetterValueRoom(limit), size_t{990000});
  EXPECT_LT(DeadLetterValueRoom(limit), limit);
  ASSERT_TRUE((*producer)->Close(std::chrono::seconds(5)).ok());
}

// A message the client refuses for good is INVALID_ARGUMENT (the daemon then
// skips it); a transient failure is UNAVAILABLE (retried).
TEST(DeadLetterTest, AMessageTheProducerCanNeverSendIsInvalidArgument) {
  auto cluster = MockCluster::Create(1);
  ASSERT_TRUE(cluster.ok());
  ASSERT_TRUE((*cluster)->CreateTopic("dlq", 1).ok());
  KafkaProducerOptions options;
  options.bootstrap_servers = (*cluster)->bootstrap_servers();
  options.properties = testing_kafka::FastProducerProperties();
  auto producer = KafkaProducer::Create(options);
  ASSERT_TRUE(producer.ok());
  OutMessage too_large;
  too_large.topic = "dlq";
  too_large.value = std::string(1000001, 'v');
  const Status refused = (*producer)->ProduceAndWait({&too_large, 1}, std::chrono::seconds(10));
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument) << refused.ToString();
  ASSERT_TRUE((*producer)->Close(std::chrono::seconds(5)).ok());
}

// What an operator's tool (kcat) sees on the dead-letter topic.
TEST(DeadLetterTest, KcatSeesTheDeadLetterAsDocumented) {
  auto cluster = MockCluster::Create(1);
  ASSERT_TRUE(cluster.ok());
  ASSERT_TRUE((*cluster)->CreateTopic("dlq", 1).ok());
  KafkaProducerOptions options;
  options.bootstrap_servers = (*cluster)->bootstrap_servers();
  options.properties = testing_kafka::FastProducerProperties();
  auto producer = KafkaProducer::Create(options);
  ASSERT_TRUE(producer.ok());
  SourceMessage oversize = Record();
  oversize.oversize = true;
  const std::vector<OutMessage> dead = {
      MakeDeadLetter(Record(), RejectReason::kBadText, "dlq"),
      MakeDeadLetter(oversize, RejectReason::kRecordTooLarge, "dlq")};
  ASSERT_TRUE((*producer)->ProduceAndWait(dead, std::chrono::seconds(10)).ok());
  ASSERT_TRUE((*producer)->Close(std::chrono::seconds(5)).ok());
  const auto out = testing_kafka::RunCommand("kcat -C -b " + (*cluster)->bootstrap_servers() +
                                             " -t dlq -o beginning -e -q -f '%k|%S|%h\\n'");
  ASSERT_EQ(out.exit_code, 0) << out.output;
  const std::string common =
      "vipsd-source-topic=documents,vipsd-source-partition=3,vipsd-source-offset=12345";
  EXPECT_EQ(out.output,
            "doc-key-7|" + std::to_string(Record().payload.size()) +
                "|vipsd-reason=bad_text,vipsd-reason-description=" +
                std::string(RejectReasonDescription(RejectReason::kBadText)) + "," + common +
                "\n" + "doc-key-7|0|vipsd-reason=record_too_large,vipsd-reason-description=" +
                std::string(RejectReasonDescription(RejectReason::kRecordTooLarge)) + "," +
                common + ",vipsd-payload-omitted=record_too_large\n");
}

}  // namespace
}  // namespace vipsd::connectors
