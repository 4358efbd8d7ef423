#include "connectors/kafka/mock_cluster.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <regex>

#include "tests/connectors/kafka/kafka_test_util.h"

namespace vipsd::connectors {
namespace {

using ::testing::HasSubstr;
using testing_kafka::ReadAll;
using testing_kafka::RunCommand;

TEST(MockClusterTest, BootstrapListsEveryBroker) {
  auto cluster = MockCluster::Create(3);
  ASSERT_TRUE(cluster.ok()) << cluster.status().message();
  EXPECT_EQ((*cluster)->broker_count(), 3);
  const std::string& bootstrap = (*cluster)->bootstrap_servers();
  const std::regex one_broker("127\\.0\\.0\\.1:[0-9]+");
  int count = 0;
  for (std::sregex_iterator it(bootstrap.begin(), bootstrap.end(), one_broker), end; it != end;
       ++it) {
    ++count;
  }
  EXPECT_EQ(count, 3) << bootstrap;
}

TEST(MockClusterTest, RejectsBadArguments) {
  EXPECT_EQ(MockCluster::Create(0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MockCluster::Create(17).status().code(), StatusCode::kInvalidArgument);
  auto cluster = MockCluster::Create(1);
  ASSERT_TRUE(cluster.ok());
  MockCluster& c = **cluster;
  EXPECT_EQ(c.CreateTopic("", 1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c.CreateTopic("bad name", 1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c.CreateTopic("t", 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c.CreateTopic("t", 1, 2).code(), StatusCode::kInvalidArgument);  // 1 broker
  ASSERT_TRUE(c.CreateTopic("t", 2).ok());
  const Status again = c.CreateTopic("t", 2);
  EXPECT_EQ(again.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(again.message(), HasSubstr("already exists"));
  EXPECT_EQ(c.SetBrokerDown(0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c.SetBrokerUp(2).code(), StatusCode::kInvalidArgument);
}

// Another process (kcat) sees the topics and can produce and consume.
TEST(MockClusterTest, KcatProducesAndConsumesAcrossProcesses) {
  auto cluster = MockCluster::Create(2);
  ASSERT_TRUE(cluster.ok());
  MockCluster& c = **cluster;
  ASSERT_TRUE(c.CreateTopic("records", 3, 2).ok());
  const std::string b = c.bootstrap_servers();

  const testing_kafka::CommandResult metadata = RunCommand("kcat -L -b " + b + " -t records");
  ASSERT_EQ(metadata.exit_code, 0) << metadata.output;
  EXPECT_THAT(metadata.output, HasSubstr("3 partitions"));
  EXPECT_THAT(metadata.output, HasSubstr("2 brokers"));

  const std::string input = testing_kafka::TempPath("mock_input.txt");
  testing_kafka::WriteFile(input, "a:one\nb:two\nc:three\n");
  const auto produce = RunCommand("kcat -P -b " + b + " -t records -K: -l " + input);
  ASSERT_EQ(produce.exit_code, 0) << produce.output;
  const auto consume =
      RunCommand("kcat -C -b " + b + " -t records -o beginning -e -q -f '%k=%s\\n' | sort");
  ASSERT_EQ(consume.exit_code, 0) << consume.output;
  EXPECT_EQ(consume.output, "a=one\nb=two\nc=three\n");
}

// A broker taken down refuses clients; brought back up it serves its data.
TEST(MockClusterTest, BrokerDownAndUp) {
  auto cluster = MockCluster::Create(1);
  ASSERT_TRUE(cluster.ok());
  MockCluster& c = **cluster;
  ASSERT_TRUE(c.CreateTopic("t", 1).ok());
  const std::string b = c.bootstrap_servers();
  ASSERT_EQ(RunCommand("echo hello | kcat -P -b " + b + " -t t").exit_code, 0);

  ASSERT_TRUE(c.SetBrokerDown(1).ok());
  const auto down = RunCommand("timeout 10 kcat -L -b " + b + " -m 1 -t t");
  EXPECT_NE(down.exit_code, 0) << down.output;

  ASSERT_TRUE(c.SetBrokerUp(1).ok());
  const std::vector<testing_kafka::RawMessage> messages = ReadAll(b, "t", 1);
  ASSERT_EQ(messages.size(), 1u);
  EXPECT_EQ(messages[0].value, "hello");
}

}  // namespace
}  // namespace vipsd::connectors
