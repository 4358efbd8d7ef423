#include "connectors/kafka/kafka_source.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <set>
#include <thread>
#include <tuple>

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#include "connectors/kafka/mock_cluster.h"
#include "tests/connectors/kafka/kafka_test_util.h"

namespace vipsd::connectors {
namespace {

using ::testing::HasSubstr;
using testing_kafka::Committed;
using testing_kafka::FastConsumerProperties;
using testing_kafka::LogCapture;
using testing_kafka::RunCommand;
using testing_kafka::UniqueName;

// Every payload and key carries these markers: no log line or error may.
constexpr char kSecretPayload[] = "SECRET-PAYLOAD-c0ffee";
constexpr char kSecretKey[] = "SECRETKEY";

using Position = std::tuple<std::string, int32_t, int64_t>;

std::unique_ptr<MockCluster> NewCluster(int brokers = 1) {
  auto cluster = MockCluster::Create(brokers);
  EXPECT_TRUE(cluster.ok()) << cluster.status().message();
  return cluster.ok() ? std::move(cluster).value() : nullptr;
}

// Produces "key:value" lines with kcat (keys pick the partition).
void KcatProduce(const std::string& bootstrap, const std::string& topic,
                 const std::vector<std::pair<std::string, std::string>>& records) {
  std::string lines;
  for (const auto& [key, value] : records) lines += key + ":" + value + "\n";
  const std::string path = testing_kafka::TempPath(UniqueName("kcat_in") + ".txt");
  testing_kafka::WriteFile(path, lines);
  const auto result = RunCommand("kcat -P -b " + bootstrap + " -t " + topic + " -K: -l " + path);
  std::remove(path.c_str());
  ASSERT_EQ(result.exit_code, 0) << result.output;
}

std::vector<std::pair<std::string, std::string>> Records(const std::string& prefix, int count) {
  std::vector<std::pair<std::string, std::string>> records;
  for (int i = 0; i < count; ++i) {
    records.emplace_back(std::string(kSecretKey) + "-" + prefix + "-" + std::to_string(i),
                         std::string(kSecretPayload) + " " + prefix + " #" + std::to_string(i) +
                             " bytes \x01\xff\x7f: colon");
  }
  return records;
}

KafkaSourceOptions BaseOptions(const MockCluster& cluster, std::vector<std::string> topics,
                               const std::string& group) {
  KafkaSourceOptions options;
  options.bootstrap_servers = cluster.bootstrap_servers();
  options.topics = std::move(topics);
  options.group_id = group;
  options.client_id = "vipsd-test";
  options.properties = FastConsumerProperties();
  return options;
}

// Polls until `count` messages arrived in total (or the deadline), storing
// every offset as the daemon does after pooling a record.
// `timeout` is a deadline, not a wait: a loaded CI runner (ASan, every core
// busy) took more than 20 s for a group join and the first fetch.
std::vector<SourceMessage> PollAndStore(KafkaSource& source, size_t count,
                                        std::chrono::seconds timeout = std::chrono::seconds(60),
                                        size_t batch = 7) {
  std::vector<SourceMessage> out;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (out.size() < count && std::chrono::steady_clock::now() < deadline) {
    auto polled = source.Poll(batch, std::chrono::milliseconds(200));
    EXPECT_TRUE(polled.ok()) << polled.status().message();
    if (!polled.ok()) break;
    for (SourceMessage& m : *polled) {
      EXPECT_TRUE(source.StoreOffset(m.topic, m.partition, m.offset).ok());
      out.push_back(std::move(m));
    }
  }
  return out;
}

void ExpectNoSecretIn(const LogCapture& logs) {
  for (const std::string& line : logs.lines()) {
    EXPECT_EQ(line.find(kSecretPayload), std::string::npos) << line;
    EXPECT_EQ(line.find(kSecretKey), std::string::npos) << line;
    EXPECT_EQ(line.find("colon"), std::string::npos) << line;
  }
}

int64_t Sum(const std::vector<int64_t>& values) {
  int64_t sum = 0;
  for (int64_t v : values) sum += v;
  return sum;
}

TEST(KafkaSourceTest, RejectsInvalidOptionsNamingTheProblem) {
  auto cluster = NewCluster();
  ASSERT_NE(cluster, nullptr);
  auto expect_error = [](KafkaSourceOptions options, const std::string& fragment) {
    auto source = KafkaSource::Create(std::move(options));
    ASSERT_FALSE(source.ok());
    EXPECT_EQ(source.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(source.status().message(), HasSubstr(fragment));
  };
  const KafkaSourceOptions base = BaseOptions(*cluster, {"t"}, UniqueName("g"));
  KafkaSourceOptions o = base;
  o.topics.clear();
  expect_error(o, "at least one topic");
  o = base;
  o.topics = {"t", "t"};
  expect_error(o, "listed twice");
  o = base;
  o.group_id.clear();
  expect_error(o, "group_id");
  o = base;
  o.start_position = "middle";
  expect_error(o, "start_position");
  o = base;
  o.max_record_bytes = 0;
  expect_error(o, "max_record_bytes");
  o = base;
  o.properties["no.such.property"] = "1";
  expect_error(o, "'no.such.property'");
  o = base;
  o.properties["session.timeout.ms"] = "banana";
  expect_error(o, "'session.timeout.ms'");
  o = base;
  o.properties["enable.auto.offset.store"] = "true";
  expect_error(o, "'enable.auto.offset.store' is set by vipsd");
  o = base;
  o.properties["partition.assignment.strategy"] = "cooperative-sticky";
  EXPECT_TRUE(KafkaSource::Create(o).ok());
}

TEST(KafkaSourceTest, AFailedOffsetCommitIsCountedAsACommitError) {
  // The daemon maps "OFFSET_COMMIT:*" kinds to vipsd_kafka_errors_total{kind="commit"}.
  auto cluster = NewCluster();
  ASSERT_NE(cluster, nullptr);
  ASSERT_TRUE(cluster->CreateTopic("t", 1).ok());
  KcatProduce(cluster->bootstrap_servers(), "t", Records("r", 5));
  auto source = KafkaSource::Create(BaseOptions(*cluster, {"t"}, UniqueName("g")));
  ASSERT_TRUE(source.ok()) << source.status().message();
  ASSERT_EQ(PollAndStore(**source, 5).size(), 5u);
  // OffsetCommit (API key 8) refused with a non-retriable error.
  rd_kafka_mock_push_request_errors(cluster->mock_handle(), 8, 1,
                                    RD_KAFKA_RESP_ERR_OFFSET_METADATA_TOO_LARGE);
  EXPECT_FALSE((*source)->Commit().ok());
  int64_t commit_errors = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (commit_errors == 0 && std::chrono::steady_clock::now() < deadline) {
    (void)(*source)->Poll(1, std::chrono::milliseconds(100));  // serves the commit callback
    for (const auto& [kind, count] : (*source)->stats().errors_by_kind) {
      if (kind.rfind("OFFSET_COMMIT:", 0) == 0) commit_errors += count;
    }
  }
  EXPECT_GT(commit_errors, 0);
  EXPECT_TRUE((*source)->Commit().ok());  // the next commit goes through
}

TEST(KafkaSourceTest, StoreOffsetNeedsAnAssignedPartitionAndCloseIsIdempotent) {
  auto cluster = NewCluster();
  ASSERT_NE(cluster, nullptr);
  auto source = KafkaSource::Create(BaseOptions(*cluster, {"t"}, UniqueName("g")));
  ASSERT_TRUE(source.ok()) << source.status().message();
  const Status not_assigned = (*source)->StoreOffset("t", 0, 5);
  EXPECT_EQ(not_assigned.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(not_assigned.message(), HasSubstr("t[0]"));
  EXPECT_EQ((*source)->StoreOffset("t", 0, -1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*source)->Poll(0, std::chrono::milliseconds(0)).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE((*source)->Commit().ok());  // nothing stored is not an error
  EXPECT_TRUE((*source)->Close().ok());
  EXPECT_TRUE((*source)->Close().ok());
  EXPECT_EQ((*source)->Poll(1, std::chrono::milliseconds(0)).status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ((*source)->Lag(), 0);
}

// The central contract: every record produced by an independent client is
// returned exactly once, oversize records come flagged and empty, Lag follows
// the cached watermarks, and stored offsets are committed on close (eager
// protocol: the default range/roundrobin assignors).
TEST(KafkaSourceTest, ConsumesEveryKcatRecordOnceAndCommitsStoredOffsets) {
  LogCapture logs;
  auto cluster = NewCluster();
  ASSERT_NE(cluster, nullptr);
  ASSERT_TRUE(cluster->CreateTopic("docs", 2).ok());
  ASSERT_TRUE(cluster->CreateTopic("more", 1).ok());
  const std::string b = cluster->bootstrap_servers();
  auto docs = Records("docs", 30);
  const std::string big_key = std::string(kSecretKey) + "-big";
  docs.emplace_back(big_key, std::string(kSecretPayload) + std::string(3000, 'x'));
  const auto more = Records("more", 10);
  KcatProduce(b, "docs", docs);
  KcatProduce(b, "more", more);
  std::map<std::string, std::string> expected;
  for (const auto& [k, v] : docs) expected[k] = v;
  for (const auto& [k, v] : more) expected[k] = v;

  const std::string group = UniqueName("g");
  KafkaSourceOptions options = BaseOptions(*cluster, {"docs", "more"}, group);
  options.max_record_bytes = 1024;
  std::vector<TopicPartitionRef> assigned;
  std::vector<TopicPartitionRef> revoked;
  options.on_assigned = [&](const std::vector<TopicPartitionRef>& p) {
    assigned.insert(assigned.end(), p.begin(), p.end());
  };
  options.on_revoked = [&](const std::vector<TopicPartitionRef>& p) {
    revoked.insert(revoked.end(), p.begin(), p.end());
  };
  auto created = KafkaSource::Create(options);
  ASSERT_TRUE(created.ok()) << created.status().message();
  KafkaSource& source = **created;

  // First batch: a few messages; remember the lag and positions then.
  std::vector<SourceMessage> got = PollAndStore(source, 1, std::chrono::seconds(60), 5);
  ASSERT_FALSE(got.empty());
  const int64_t lag_after_first = source.Lag();
  std::map<std::pair<std::string, int32_t>, int64_t> next_after_first;
  for (const SourceMessage& m : got) next_after_first[{m.topic, m.partition}] = m.offset + 1;

  std::vector<SourceMessage> rest = PollAndStore(source, expected.size() - got.size());
  got.insert(got.end(), std::make_move_iterator(rest.begin()), std::make_move_iterator(rest.end()));
  ASSERT_EQ(got.size(), expected.size());

  std::set<Position> positions;
  std::map<std::pair<std::string, int32_t>, int64_t> per_partition;
  for (const SourceMessage& m : got) {
    EXPECT_TRUE(positions.insert({m.topic, m.partition, m.offset}).second) << "duplicate";
    ++per_partition[{m.topic, m.partition}];
    ASSERT_EQ(expected.count(m.key), 1u) << "unexpected key";
    if (m.key == big_key) {
      EXPECT_TRUE(m.oversize);
      EXPECT_TRUE(m.payload.empty());
      EXPECT_TRUE(m.headers.empty());
    } else {
      EXPECT_FALSE(m.oversize);
      EXPECT_EQ(m.payload, expected[m.key]);
    }
    expected.erase(m.key);
  }
  EXPECT_TRUE(expected.empty());
  // Offsets within a partition are 0..n-1: nothing skipped.
  for (const auto& [tp, count] : per_partition) {
    for (int64_t offset = 0; offset < count; ++offset) {
      EXPECT_EQ(positions.count({tp.first, tp.second, offset}), 1u);
    }
  }
  // Lag after the first batch: what was left in the partitions it touched.
  int64_t expected_lag = 0;
  for (const auto& [tp, next] : next_after_first) expected_lag += per_partition[tp] - next;
  EXPECT_EQ(lag_after_first, expected_lag);
  EXPECT_EQ(source.Lag(), 0);

  const KafkaSourceStats stats = source.stats();
  EXPECT_EQ(stats.messages_by_topic.at("docs"), 31);
  EXPECT_EQ(stats.messages_by_topic.at("more"), 10);
  EXPECT_EQ(stats.oversize_messages, 1);
  EXPECT_EQ(stats.assigned_now, 3);
  EXPECT_EQ(assigned.size(), 3u);
  EXPECT_EQ(source.assignment().size(), 3u);

  ASSERT_TRUE(source.Close().ok());
  EXPECT_EQ(revoked.size(), 3u);
  const KafkaSourceStats closed = source.stats();
  EXPECT_GE(closed.rebalances, 2);
  EXPECT_EQ(closed.partitions_revoked, 3);
  EXPECT_GE(closed.commits, 1);

  // The committed offsets are exactly the stored ones (offset + 1).
  const std::vector<int64_t> committed_docs = Committed(b, group, "docs", 2);
  for (int32_t p = 0; p < 2; ++p) {
    EXPECT_EQ(committed_docs[static_cast<size_t>(p)], (per_partition[{"docs", p}]));
  }
  EXPECT_EQ(Committed(b, group, "more", 1)[0], 10);
  ExpectNoSecretIn(logs);
}

// Commits offsets for `group` without joining it (a standalone commit).
void CommitWithoutJoin(const std::string& bootstrap, const std::string& group,
                       const std::string& topic, int32_t partition, int64_t offset) {
  std::string errstr;
  std::unique_ptr<RdKafka::Conf> conf(RdKafka::Conf::create(RdKafka::Conf::CONF_GLOBAL));
  conf->set("bootstrap.servers", bootstrap, errstr);
  conf->set("group.id", group, errstr);
  conf->set("enable.auto.commit", "false", errstr);
  std::unique_ptr<RdKafka::KafkaConsumer> consumer(
      RdKafka::KafkaConsumer::create(conf.get(), errstr));
  ASSERT_NE(consumer, nullptr) << errstr;
  std::vector<RdKafka::TopicPartition*> list = {
      RdKafka::TopicPartition::create(topic, partition, offset)};
  const RdKafka::ErrorCode err = consumer->commitSync(list);
  RdKafka::TopicPartition::destroy(list);
  EXPECT_EQ(err, RdKafka::ERR_NO_ERROR) << RdKafka::err2str(err);
  consumer->close();
}

// After a restart: committed offsets are continued, the resume hook overrides
// them (and is clamped into the log), and start_position applies only where
// neither exists.
TEST(KafkaSourceTest, RestartUsesResumeHookThenCommittedOffsetThenStartPosition) {
  auto cluster = NewCluster();
  ASSERT_NE(cluster, nullptr);
  const std::string b = cluster->bootstrap_servers();
  for (const char* topic : {"committed", "resumed", "beyond", "fresh"}) {
    ASSERT_TRUE(cluster->CreateTopic(topic, 1).ok());
  }
  KcatProduce(b, "committed", Records("c", 10));
  KcatProduce(b, "resumed", Records("r", 10));
  KcatProduce(b, "beyond", Records("b", 5));
  KcatProduce(b, "fresh", Records("f", 3));
  const std::string group = UniqueName("g");
  // The previous run committed "committed" up to 10 and "resumed" up to 8.
  CommitWithoutJoin(b, group, "committed", 0, 10);
  CommitWithoutJoin(b, group, "resumed", 0, 8);

  KafkaSourceOptions options = BaseOptions(*cluster, {"committed", "resumed", "beyond", "fresh"},
                                           group);
  options.start_position = "latest";
  std::vector<std::string> asked;
  options.resume_offset = [&asked](const std::string& topic,
                                   int32_t partition) -> std::optional<int64_t> {
    asked.push_back(topic + "/" + std::to_string(partition));
    if (topic == "resumed") return 4;    // the daemon's ledger says: re-read from 4
    if (topic == "beyond") return 100;   // past the end: clamped to 5
    return std::nullopt;
  };
  auto created = KafkaSource::Create(options);
  ASSERT_TRUE(created.ok()) << created.status().message();
  KafkaSource& source = **created;

  // Old records: only resumed[4..9].
  std::vector<SourceMessage> got = PollAndStore(source, 6);
  ASSERT_EQ(got.size(), 6u);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].topic, "resumed");
    EXPECT_EQ(got[i].offset, static_cast<int64_t>(4 + i));
  }
  EXPECT_EQ(source.stats().resume_offsets_applied, 2);
  EXPECT_EQ(asked.size(), 4u);
  // New records arrive in the topics with absolute starting points, and
  // nothing old besides.
  KcatProduce(b, "committed", Records("c2", 2));
  KcatProduce(b, "beyond", Records("b2", 2));
  got = PollAndStore(source, 4);
  std::map<std::string, std::set<int64_t>> offsets;
  for (const SourceMessage& m : got) offsets[m.topic].insert(m.offset);
  EXPECT_EQ(offsets["committed"], (std::set<int64_t>{10, 11}));
  EXPECT_EQ(offsets["beyond"], (std::set<int64_t>{5, 6}));
  // "latest" is the end of the log when the consumer resolves it, which may
  // be a little after the assignment: feed "fresh" until records flow, then
  // check that none of the 3 old ones came and nothing after the first new
  // one was skipped.
  int fresh_produced = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (offsets["fresh"].empty() && std::chrono::steady_clock::now() < deadline) {
    KcatProduce(b, "fresh", Records("f" + std::to_string(fresh_produced), 1));
    ++fresh_produced;
    for (const SourceMessage& m : PollAndStore(source, 1, std::chrono::seconds(1))) {
      offsets[m.topic].insert(m.offset);
    }
  }
  ASSERT_FALSE(offsets["fresh"].empty());
  const int64_t end_of_fresh = 3 + fresh_produced;
  for (const SourceMessage& m : PollAndStore(source, static_cast<size_t>(
                                                          end_of_fresh - *offsets["fresh"].rbegin() - 1),
                                             std::chrono::seconds(10))) {
    offsets[m.topic].insert(m.offset);
  }
  EXPECT_GE(*offsets["fresh"].begin(), 3);
  EXPECT_EQ(*offsets["fresh"].rbegin(), end_of_fresh - 1);
  EXPECT_EQ(static_cast<int64_t>(offsets["fresh"].size()),
            end_of_fresh - *offsets["fresh"].begin());
  EXPECT_EQ(offsets.count("resumed"), 0u);
  // Nothing else is pending.
  auto extra = source.Poll(10, std::chrono::milliseconds(300));
  ASSERT_TRUE(extra.ok());
  EXPECT_TRUE(extra->empty());
  ASSERT_TRUE(source.Close().ok());
  EXPECT_EQ(Committed(b, group, "resumed", 1)[0], 10);
  EXPECT_EQ(Committed(b, group, "fresh", 1)[0], end_of_fresh);
}

// Records survive a broker outage: the source keeps running, counts the
// transport errors (without content in its logs) and resumes where it was.
TEST(KafkaSourceTest, RecordsAreNotLostAcrossBrokerDownAndUp) {
  LogCapture logs;
  auto cluster = NewCluster();
  ASSERT_NE(cluster, nullptr);
  ASSERT_TRUE(cluster->CreateTopic("docs", 2).ok());
  const std::string b = cluster->bootstrap_servers();
  KcatProduce(b, "docs", Records("before", 20));
  auto created = KafkaSource::Create(BaseOptions(*cluster, {"docs"}, UniqueName("g")));
  ASSERT_TRUE(created.ok()) << created.status().message();
  KafkaSource& source = **created;
  // Lag() and stats() may be read from another thread at any time (the
  // daemon's metrics thread); under TSan this checks that claim.
  std::atomic<bool> stop{false};
  int64_t reads = 0;
  std::thread metrics([&] {
    while (!stop.load()) {
      const int64_t lag = source.Lag();
      const KafkaSourceStats stats = source.stats();
      EXPECT_GE(lag, 0);
      EXPECT_GE(stats.rebalances, 0);
      ++reads;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  std::vector<SourceMessage> got = PollAndStore(source, 20);
  ASSERT_EQ(got.size(), 20u);

  ASSERT_TRUE(cluster->SetBrokerDown(1).ok());
  const auto outage_end = std::chrono::steady_clock::now() + std::chrono::milliseconds(2500);
  while (std::chrono::steady_clock::now() < outage_end) {
    auto polled = source.Poll(10, std::chrono::milliseconds(200));
    ASSERT_TRUE(polled.ok()) << polled.status().message();  // transient: not returned
    EXPECT_TRUE(polled->empty());
  }
  const KafkaSourceStats during = source.stats();
  int64_t transport_errors = 0;
  for (const auto& [kind, count] : during.errors_by_kind) {
    if (kind == "_TRANSPORT" || kind == "_ALL_BROKERS_DOWN") transport_errors += count;
  }
  EXPECT_GT(transport_errors, 0);

  ASSERT_TRUE(cluster->SetBrokerUp(1).ok());
  KcatProduce(b, "docs", Records("after", 20));
  std::vector<SourceMessage> after = PollAndStore(source, 20, std::chrono::seconds(30));
  got.insert(got.end(), after.begin(), after.end());
  std::set<Position> positions;
  std::set<std::string> keys;
  for (const SourceMessage& m : got) {
    EXPECT_TRUE(positions.insert({m.topic, m.partition, m.offset}).second) << "duplicate";
    keys.insert(m.key);
  }
  EXPECT_EQ(keys.size(), 40u);
  ASSERT_TRUE(source.Close().ok());
  stop = true;
  metrics.join();
  EXPECT_GT(reads, 0);
  ExpectNoSecretIn(logs);
}

// librdkafka before 2.3.0 aborts the process when a cooperative-sticky
// consumer is destroyed after it joined a group and before its first
// assignment (the assignor's state is still null: confluentinc/librdkafka
// issue 4312). Every SyncGroup is refused here, so the member joins again and
// again and never gets an assignment; closing it must neither abort nor hang.
TEST(KafkaSourceTest, ACooperativeMemberClosedBeforeItsFirstAssignmentDoesNotAbort) {
  auto cluster = NewCluster();
  ASSERT_NE(cluster, nullptr);
  ASSERT_TRUE(cluster->CreateTopic("docs", 2).ok());
  KafkaSourceOptions options = BaseOptions(*cluster, {"docs"}, UniqueName("g"));
  options.properties["partition.assignment.strategy"] = "cooperative-sticky";
  // SyncGroup is API key 14.
  rd_kafka_mock_push_request_errors(cluster->mock_handle(), 14, 200,
                                    RD_KAFKA_RESP_ERR_REBALANCE_IN_PROGRESS);
  auto source = KafkaSource::Create(options);
  ASSERT_TRUE(source.ok()) << source.status().message();
  // The mock answers a first JoinGroup after 3 s; stop once it has.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(8);
  while (std::chrono::steady_clock::now() < deadline) {
    auto polled = (*source)->Poll(10, std::chrono::milliseconds(100));
    ASSERT_TRUE(polled.ok()) << polled.status().message();
    EXPECT_TRUE(polled->empty());
  }
  EXPECT_EQ((*source)->stats().partitions_assigned, 0);
  EXPECT_TRUE((*source)->Close().ok());
  source->reset();  // destroys the consumer (where 2.0.2 aborts)
  SUCCEED();
}

// Two members of one group split the partitions; the second continues each
// moved partition exactly after the first member's committed offset: every
// record once, none lost. (The first commits before the second joins: the
// 2.0.2 mock refuses a commit that arrives during the rebalance.)
// Issue 49 item 8: a transaction held open on an input topic. Read
// committed, the records appended after it would become readable only when
// it ends (one record moving others into a later slot, and a stall while
// it is open). The source reads uncommitted: every record as it is
// appended, in offset order, the open transaction's and an aborted one's
// included. The operator cannot change that (isolation.level is managed).
TEST(KafkaSourceTest, AnOpenTransactionHoldsBackNoRecordAndItsOwnAreRead) {
  auto cluster = NewCluster();
  ASSERT_NE(cluster, nullptr);
  ASSERT_TRUE(cluster->CreateTopic("txdocs", 1).ok());
  const std::string b = cluster->bootstrap_servers();
  char errstr[512];
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  ASSERT_EQ(rd_kafka_conf_set(conf, "bootstrap.servers", b.c_str(), errstr, sizeof errstr),
            RD_KAFKA_CONF_OK);
  ASSERT_EQ(rd_kafka_conf_set(conf, "transactional.id", UniqueName("txn").c_str(), errstr,
                              sizeof errstr),
            RD_KAFKA_CONF_OK);
  ASSERT_EQ(rd_kafka_conf_set(conf, "linger.ms", "0", errstr, sizeof errstr), RD_KAFKA_CONF_OK);
  rd_kafka_t* producer = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof errstr);
  ASSERT_NE(producer, nullptr) << errstr;
  auto ok = [](rd_kafka_error_t* error) {
    const bool fine = error == nullptr;
    if (!fine) {
      ADD_FAILURE() << rd_kafka_error_string(error);
      rd_kafka_error_destroy(error);
    }
    return fine;
  };
  auto produce = [&](const std::string& value) {
    return rd_kafka_producev(producer, RD_KAFKA_V_TOPIC("txdocs"), RD_KAFKA_V_PARTITION(0),
                             RD_KAFKA_V_VALUE(const_cast<char*>(value.data()), value.size()),
                             RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
  };
  ASSERT_TRUE(ok(rd_kafka_init_transactions(producer, 30000)));
  ASSERT_TRUE(ok(rd_kafka_begin_transaction(producer)));
  for (int i = 0; i < 5; ++i) ASSERT_EQ(produce("open-" + std::to_string(i)), RD_KAFKA_RESP_ERR_NO_ERROR);
  ASSERT_EQ(rd_kafka_flush(producer, 10000), RD_KAFKA_RESP_ERR_NO_ERROR);
  // After the open transaction, from another (plain) producer.
  KcatProduce(b, "txdocs", Records("after", 5));

  KafkaSourceOptions options = BaseOptions(*cluster, {"txdocs"}, UniqueName("g"));
  auto created = KafkaSource::Create(options);
  ASSERT_TRUE(created.ok()) << created.status().message();
  // All ten while the transaction is still open: nothing waits for it.
  std::vector<SourceMessage> got = PollAndStore(**created, 10, std::chrono::seconds(60));
  ASSERT_EQ(got.size(), 10u);
  for (size_t i = 1; i < got.size(); ++i) EXPECT_LT(got[i - 1].offset, got[i].offset);
  EXPECT_EQ(got.front().payload, "open-0");
  EXPECT_NE(got.back().payload.find(" after #4 "), std::string::npos);
  // An aborted transaction's records are read too (input like any other).
  ASSERT_TRUE(ok(rd_kafka_abort_transaction(producer, 30000)));
  ASSERT_TRUE(ok(rd_kafka_begin_transaction(producer)));
  ASSERT_EQ(produce("aborted"), RD_KAFKA_RESP_ERR_NO_ERROR);
  ASSERT_EQ(rd_kafka_flush(producer, 10000), RD_KAFKA_RESP_ERR_NO_ERROR);
  ASSERT_TRUE(ok(rd_kafka_abort_transaction(producer, 30000)));
  std::vector<SourceMessage> more = PollAndStore(**created, 1, std::chrono::seconds(60));
  ASSERT_EQ(more.size(), 1u);
  EXPECT_EQ(more.front().payload, "aborted");
  EXPECT_TRUE((*created)->Close().ok());
  rd_kafka_destroy(producer);
  // The isolation level is the source's.
  options.properties["isolation.level"] = "read_committed";
  auto refused = KafkaSource::CheckOptions(options);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.message(), HasSubstr("isolation.level"));
}

class KafkaSourceGroupTest : public ::testing::TestWithParam<const char*> {};

TEST_P(KafkaSourceGroupTest, TwoMembersShareTheTopicWithoutLossOrDuplicates) {
  const std::string strategy = GetParam();
  const bool cooperative = strategy == "cooperative-sticky";
  auto cluster = NewCluster();
  ASSERT_NE(cluster, nullptr);
  ASSERT_TRUE(cluster->CreateTopic("docs", 4).ok());
  const std::string b = cluster->bootstrap_servers();
  KcatProduce(b, "docs", Records("first", 40));
  const std::string group = UniqueName("g");
  KafkaSourceOptions options = BaseOptions(*cluster, {"docs"}, group);
  options.properties["partition.assignment.strategy"] = strategy;
  // The mock elects a leader only when its rebalance timer fires, which is
  // session.timeout.ms - 1 s after a member joins a non-empty group (and the
  // cooperative protocol needs two rounds), and it drops a member that has
  // not joined again by then: its partitions count as revoked (lost). 6 s
  // keeps this test at ~15 s and leaves a member 5 s to rejoin even under a
  // loaded sanitizer run (CI once failed the cooperative case with 3 s).
  options.properties["session.timeout.ms"] = "6000";
  options.properties["heartbeat.interval.ms"] = "500";

  const auto describe = [](const KafkaSource& s) {
    const KafkaSourceStats stats = s.stats();
    std::string text = "assigned now " + std::to_string(stats.assigned_now) + ", rebalances " +
                       std::to_string(stats.rebalances) + ", assigned " +
                       std::to_string(stats.partitions_assigned) + ", revoked (incl. lost) " +
                       std::to_string(stats.partitions_revoked) + ", errors:";
    for (const auto& [kind, count] : stats.errors_by_kind) {
      text += " " + kind + "=" + std::to_string(count);
    }
    return text;
  };

  auto first = KafkaSource::Create(options);
  ASSERT_TRUE(first.ok()) << first.status().message();
  // Returns as soon as all 40 arrived (about 3 s: the mock's first-join
  // delay); CI once saw none within 20 s while the harnesses ran beside it.
  std::vector<SourceMessage> got = PollAndStore(**first, 40, std::chrono::seconds(60));
  ASSERT_EQ(got.size(), 40u) << "first: " << describe(**first);
  EXPECT_EQ((*first)->assignment().size(), 4u);
  // A member commits on revoke while the group is already rebalancing; a
  // real broker accepts that (PreparingRebalance), but the 2.0.2 mock refuses
  // it with REBALANCE_IN_PROGRESS — always for an eager member, and for a
  // cooperative one when the revocation reaches it late (seen under
  // ThreadSanitizer: 10 records read twice). Commit first so that the
  // no-duplicates check below tests the assignment, not the mock.
  ASSERT_TRUE((*first)->Commit().ok());

  options.client_id = "vipsd-test-2";
  auto second = KafkaSource::Create(options);
  ASSERT_TRUE(second.ok()) << second.status().message();
  // Drive both members (each from this one thread) until they split 2 + 2.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline &&
         !((*first)->assignment().size() == 2 && (*second)->assignment().size() == 2)) {
    for (KafkaSource* s : {first->get(), second->get()}) {
      auto polled = s->Poll(10, std::chrono::milliseconds(100));
      ASSERT_TRUE(polled.ok()) << polled.status().message();
      EXPECT_TRUE(polled->empty()) << "an old record was delivered again";
    }
  }
  ASSERT_EQ((*first)->assignment().size(), 2u) << "first: " << describe(**first);
  ASSERT_EQ((*second)->assignment().size(), 2u) << "second: " << describe(**second);
  const KafkaSourceStats first_stats = (*first)->stats();
  // Cooperative: only the two moved partitions were revoked. Eager: the whole
  // assignment, in each rebalance round the mock runs.
  if (cooperative) {
    EXPECT_EQ(first_stats.partitions_revoked, 2) << "first: " << describe(**first);
  } else {
    EXPECT_GE(first_stats.partitions_revoked, 4) << "first: " << describe(**first);
  }

  KcatProduce(b, "docs", Records("second", 40));
  std::map<KafkaSource*, int> per_member;
  const auto deadline2 = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (got.size() < 80 && std::chrono::steady_clock::now() < deadline2) {
    for (KafkaSource* s : {first->get(), second->get()}) {
      auto polled = s->Poll(10, std::chrono::milliseconds(100));
      ASSERT_TRUE(polled.ok()) << polled.status().message();
      for (SourceMessage& m : *polled) {
        ASSERT_TRUE(s->StoreOffset(m.topic, m.partition, m.offset).ok());
        ++per_member[s];
        got.push_back(std::move(m));
      }
    }
  }
  ASSERT_EQ(got.size(), 80u) << "first: " << describe(**first) << "; second: "
                             << describe(**second);
  EXPECT_GT(per_member[first->get()], 0);
  EXPECT_GT(per_member[second->get()], 0);
  std::set<Position> positions;
  for (const SourceMessage& m : got) {
    EXPECT_TRUE(positions.insert({m.topic, m.partition, m.offset}).second) << "duplicate";
  }
  // Commit while the group is stable: the member that closes second does so
  // during the rebalance the first one's departure starts.
  for (KafkaSource* s : {first->get(), second->get()}) {
    const Status committed = s->Commit();
    ASSERT_TRUE(committed.ok()) << committed.ToString() << "; " << describe(*s);
  }
  for (KafkaSource* s : {second->get(), first->get()}) {
    const Status closed = s->Close();
    ASSERT_TRUE(closed.ok()) << closed.ToString();
  }
  EXPECT_EQ(Sum(Committed(b, group, "docs", 4)), 80);
}

INSTANTIATE_TEST_SUITE_P(Protocols, KafkaSourceGroupTest,
                         ::testing::Values("cooperative-sticky", "range"),
                         [](const ::testing::TestParamInfo<const char*>& param_info) {
                           return std::string(param_info.param) == "range" ? "Eager" : "Cooperative";
                         });

}  // namespace
}  // namespace vipsd::connectors
