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
