#include "config/config.h"
#include "connectors/file/file_util.h"
#include "core/base/format.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

namespace vipsd::config {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string Example() {
  std::ifstream in(std::string(VIPSD_SOURCE_DIR) + "/config/examples/lda_offline.yaml");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Replaces the first occurrence of `from` in the example.
std::string With(const std::string& from, const std::string& to) {
  std::string text = Example();
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return text.replace(at, from.size(), to);
}

TEST(ConfigTest, ExampleParsesWithItsValues) {
  auto config = ParseConfig(Example(), "/etc/vipsd/vipsd.yaml");
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_EQ(config->lda.num_topics, 20);
  EXPECT_EQ(config->lda.resample_length, 500);
  EXPECT_DOUBLE_EQ(config->driver.mechanism.noise_multiplier, 1.0);
  EXPECT_DOUBLE_EQ(config->driver.mechanism.sampling_rate, 0.01);
  EXPECT_DOUBLE_EQ(config->driver.epsilon_ceiling, 3.0);
  EXPECT_DOUBLE_EQ(config->driver.tau0, 64);
  EXPECT_EQ(config->driver.threads, 2);
  EXPECT_EQ(config->publish_every, 10);
  EXPECT_EQ(config->noise_mode, NoiseMode::kSecure);
  // Relative paths are resolved against the configuration file.
  EXPECT_EQ(config->vocabulary_path, "/etc/vipsd/demo/vocab.txt");
  EXPECT_EQ(config->source_path, "/etc/vipsd/train.jsonl");
  EXPECT_EQ(config->state_directory, "/etc/vipsd/state");
  EXPECT_TRUE(config->is_private());
}

struct Bad {
  std::string text;
  std::string expected;  // substring of the one message
};

TEST(ConfigTest, ErrorsNameFileLineKeyAndAllowedValues) {
  const std::vector<Bad> cases = {
      {With("  sampling_rate: 0.01", "  sampling_rate: 1.5"),
       "f.yaml:17: privacy.sampling_rate: must be a number in (0, 1], got '1.5'"},
      {With("  kappa: 0.7 ", "  kappa: 0.5 "),
       "f.yaml:24: schedule.kappa: must be a number in (0.5, 1], got '0.5'"},
      {With("    topics: 20 ", "    topics: many "),
       "f.yaml:6: model.lda.topics: must be a whole number in [1, 100000], got 'many'"},
      {With("  type: lda ", "  type: gmm "), "f.yaml:4: model.type: must be one of lda, blr, sbn, got 'gmm'"},
      {With("  noise: secure ", "  noise: weak "),
       "privacy.noise: must be one of secure, fixed_seed, got 'weak'"},
      {With("  publish_every: 10", "  publish_every: 10\n  colour: blue"),
       "f.yaml:35: sink.colour: unknown key"},
      {With("  tau0: 64", "  tau0: 64\n  tau0: 65"), "f.yaml:24: schedule.tau0: duplicate key"},
      {With("    alpha: 0.05 ", "    # alpha removed "), "model.lda.alpha: required key is missing"},
      {With("  threads: 2 ", "  threads: [1, 2] "), "schedule.threads: must be a whole number"},
      {With("  noise: secure ", "  noise: secure\n  noise_seed: 5 "),
       "privacy.noise_seed: only allowed with noise: fixed_seed"},
      {With("    resample_length: 500", "    resample_length: 0"),
       "model.lda.resample_length: must be >= 1 when privacy.noise_multiplier > 0"},
      {With("model:", "model: [unclosed"), "f.yaml:"},
      {"model: 3\n", "f.yaml:1: source: required key is missing"},
      {"privacy: 3\nsource: {type: file}\n", "f.yaml:1: privacy: must be a mapping"},
      {With("  noise: secure ", "  noise: secure\n  residency_steps: 5 "),
       "privacy.residency_steps: no longer a key"},
      {With("  noise: secure ", "  noise: secure\n  accounting: residency "),
       "privacy.accounting: residency needs source.type: kafka"},
      {With("  noise: secure ", "  noise: secure\n  warn_at: [0.9, 0.5] "),
       "privacy.warn_at: must be strictly increasing"},
      {With("  noise: secure ", "  noise: secure\n  warn_at: [0.5, 1.5] "),
       "privacy.warn_at: must be numbers in (0, 1) (fractions of the ceiling), got '1.5'"},
      {With("  max_epochs: 0 ", "  max_epochs: 0\n  interval_seconds: 5 "),
       "schedule.interval_seconds: only allowed with source.type: kafka"},
      {With("state:", "kafka:\n  embedded: true\nstate:"),
       "kafka: only allowed with source.type: kafka"},
      {With("  type: file\n  directory", "  type: kafka\n  directory"),
       "sink.type: kafka sinks need source.type: kafka"},
  };
  for (const Bad& bad : cases) {
    auto config = ParseConfig(bad.text, "f.yaml");
    ASSERT_FALSE(config.ok()) << bad.expected;
    EXPECT_THAT(config.status().message(), HasSubstr(bad.expected));
    // Every reported line names the file and a line (several errors of one
    // file are reported together, one per line).
    std::istringstream lines(config.status().message());
    for (std::string line; std::getline(lines, line);) {
      EXPECT_THAT(line, ::testing::StartsWith("f.yaml:")) << config.status().message();
    }
  }
}

TEST(ConfigTest, NonPrivateRunNeedsAStopAndNoPrivacyKeys) {
  std::string text = With("  noise_multiplier: 1.0", "  noise_multiplier: 0");
  auto config = ParseConfig(text, "f.yaml");
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(), HasSubstr("schedule.max_steps"));
  text = text.replace(text.find("  max_steps: 0"), 14, "  max_steps: 9");
  config = ParseConfig(text, "f.yaml");
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_FALSE(config->is_private());
  EXPECT_EQ(config->max_steps, 9);
}

std::string KafkaExample() {
  std::ifstream in(std::string(VIPSD_SOURCE_DIR) + "/config/examples/lda_kafka.yaml");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string KafkaWith(const std::string& from, const std::string& to) {
  std::string text = KafkaExample();
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return text.replace(at, from.size(), to);
}

// privacy.unit (docs/privacy_accounting.md "The privacy unit"): the unit id
// comes from the message key (kafka) or a named field (file), the cap is
// required with a unit and refused without one, what cannot keep a unit's
// bound (residency) is refused with the reason, and shared work needs the
// producers' key partitioner (privacy.unit_partitioner).
// `keys` (whole lines) go after privacy.noise.
std::string PrivacyKeys(const std::string& example, const std::string& keys) {
  std::string text = example;
  const size_t at = text.find("  noise: secure ");
  EXPECT_NE(at, std::string::npos);
  return text.replace(at, 16, "  noise: secure\n" + keys + "  #");
}

TEST(ConfigTest, PrivacyUnitKeysAndWhatTheyCannotBeCombinedWith) {
  auto file = ParseConfig(
      PrivacyKeys(Example(), "  unit: field\n  unit_field: article\n  max_records_per_unit: 5\n"),
      "f.yaml");
  ASSERT_TRUE(file.ok()) << file.status().message();
  EXPECT_EQ(file->privacy_unit, PrivacyUnit::kField);
  EXPECT_EQ(file->unit_field, "article");
  EXPECT_EQ(file->driver.max_records_per_unit, 5);
  auto record = ParseConfig(Example(), "f.yaml");
  ASSERT_TRUE(record.ok());
  EXPECT_EQ(record->privacy_unit, PrivacyUnit::kRecord);
  EXPECT_EQ(record->driver.max_records_per_unit, 0);
  // The Kafka example accounts by residency, which a unit cannot use.
  const std::string global_kafka =
      KafkaWith("  accounting: residency ", "  accounting: global    ");
  auto keyed =
      ParseConfig(PrivacyKeys(global_kafka, "  unit: key\n  max_records_per_unit: 20\n"), "k.yaml");
  ASSERT_TRUE(keyed.ok()) << keyed.status().message();
  EXPECT_EQ(keyed->privacy_unit, PrivacyUnit::kKey);
  EXPECT_EQ(keyed->driver.max_records_per_unit, 20);

  auto share = [](std::string text) {
    text.replace(text.find("  # work_topic: vipsd-work"), 26, "  work_topic: vipsd-work");
    text.replace(text.find("  # ledger_topic: vipsd-ledger"), 30, "  ledger_topic: vipsd-ledger");
    return text;
  };
  const std::string shared = share(PrivacyKeys(global_kafka, "  unit: key\n  max_records_per_unit: 3\n"));
  // Shared work with a unit names the producers' partitioner.
  auto partitioned = ParseConfig(
      share(PrivacyKeys(global_kafka,
                        "  unit: key\n  max_records_per_unit: 3\n  unit_partitioner: crc32\n")),
      "s.yaml");
  ASSERT_TRUE(partitioned.ok()) << partitioned.status().message();
  EXPECT_EQ(partitioned->unit_partitioner, privacy::UnitPartitioner::kCrc32);
  EXPECT_EQ(keyed->unit_partitioner, privacy::UnitPartitioner::kNone);
  const std::vector<Bad> cases = {
      {PrivacyKeys(Example(), "  unit: person\n"),
       "privacy.unit: must be one of record, key, field, got 'person'"},
      {PrivacyKeys(Example(), "  unit: field\n  unit_field: a\n"),
       "privacy.unit: a unit needs privacy.max_records_per_unit (an integer in [1, 1000000]"},
      {PrivacyKeys(Example(), "  max_records_per_unit: 3\n"),
       "privacy.max_records_per_unit: only allowed with privacy.unit: key or field"},
      {PrivacyKeys(Example(), "  unit: field\n  unit_field: a\n  max_records_per_unit: 0\n"),
       "privacy.max_records_per_unit: must be a whole number in [1, 1000000], got '0'"},
      {PrivacyKeys(Example(), "  unit: field\n  max_records_per_unit: 3\n"),
       "privacy.unit: field needs privacy.unit_field"},
      {PrivacyKeys(Example(), "  unit: field\n  unit_field: a b\n  max_records_per_unit: 3\n"),
       "privacy.unit_field: must be 1 to 128 characters"},
      {PrivacyKeys(Example(), "  unit_field: article\n"),
       "privacy.unit_field: only allowed with privacy.unit: field"},
      {PrivacyKeys(Example(), "  unit: key\n  max_records_per_unit: 3\n"),
       "privacy.unit: key needs source.type: kafka"},
      {PrivacyKeys(global_kafka, "  unit: field\n  unit_field: a\n  max_records_per_unit: 3\n"),
       "privacy.unit: field is for source.type: file"},
      {PrivacyKeys(KafkaExample(), "  unit: key\n  max_records_per_unit: 3\n"),
       "privacy.accounting: residency cannot be used with privacy.unit key"},
      {shared,
       "privacy.unit: shared work with privacy.unit: key needs privacy.unit_partitioner: "
       "murmur2 | crc32"},
      {PrivacyKeys(global_kafka,
                   "  unit: key\n  max_records_per_unit: 3\n  unit_partitioner: murmur2\n"),
       "privacy.unit_partitioner: only allowed with privacy.unit: key and state.work_topic"},
      {share(PrivacyKeys(global_kafka,
                         "  unit: key\n  max_records_per_unit: 3\n  unit_partitioner: java\n")),
       "privacy.unit_partitioner: must be one of murmur2, crc32, got 'java'"},
  };
  for (const Bad& bad : cases) {
    auto config = ParseConfig(bad.text, "f.yaml");
    ASSERT_FALSE(config.ok()) << bad.expected;
    EXPECT_THAT(config.status().message(), HasSubstr(bad.expected));
  }
}

TEST(ConfigTest, LedgerTopicKeys) {
  auto plain = ParseConfig(KafkaExample(), "f.yaml");
  ASSERT_TRUE(plain.ok()) << plain.status().message();
  EXPECT_EQ(plain->ledger_topic, "");
  auto with = ParseConfig(KafkaWith("  # ledger_topic: vipsd-ledger\n", "  ledger_topic: vipsd-ledger\n"),
                          "f.yaml");
  ASSERT_TRUE(with.ok()) << with.status().message();
  EXPECT_EQ(with->ledger_topic, "vipsd-ledger");
  EXPECT_EQ(with->ledger_key, "vipsd-lda");  // the group id by default
  auto keyed = ParseConfig(KafkaWith("  # ledger_topic: vipsd-ledger\n  # ledger_key: lda-news",
                                     "  ledger_topic: vipsd-ledger\n  ledger_key: lda-news"),
                           "f.yaml");
  ASSERT_TRUE(keyed.ok()) << keyed.status().message();
  EXPECT_EQ(keyed->ledger_key, "lda-news");
  auto bad_name = ParseConfig(KafkaWith("  # ledger_topic: vipsd-ledger", "  ledger_topic: a/b"),
                              "f.yaml");
  ASSERT_FALSE(bad_name.ok());
  EXPECT_THAT(bad_name.status().message(), HasSubstr("state.ledger_topic: must be"));
  auto key_alone = ParseConfig(KafkaWith("  # ledger_key: lda-news", "  ledger_key: lda-news"),
                               "f.yaml");
  ASSERT_FALSE(key_alone.ok());
  EXPECT_THAT(key_alone.status().message(),
              HasSubstr("state.ledger_key: only allowed together with state.ledger_topic"));
  // state.work_topic: with the ledger topic only; its own topic; line named.
  auto work = ParseConfig(KafkaWith("  # ledger_topic: vipsd-ledger\n",
                                    "  ledger_topic: vipsd-ledger\n  work_topic: vipsd-work\n"),
                          "f.yaml");
  ASSERT_TRUE(work.ok()) << work.status().message();
  EXPECT_EQ(work->work_topic, "vipsd-work");
  auto work_alone = ParseConfig(KafkaWith("  # ledger_topic: vipsd-ledger\n",
                                          "  work_topic: vipsd-work\n"),
                                "f.yaml");
  ASSERT_FALSE(work_alone.ok());
  EXPECT_THAT(work_alone.status().message(),
              HasSubstr("state.work_topic: only allowed together with state.ledger_topic"));
  EXPECT_THAT(work_alone.status().message(), HasSubstr("f.yaml:"));
  // state.work_partitions: false (a coordinator that reads no partition)
  // only with a work topic.
  EXPECT_TRUE(work->work_partitions);
  auto coordinate_only = ParseConfig(
      KafkaWith("  # ledger_topic: vipsd-ledger\n",
                "  ledger_topic: vipsd-ledger\n  work_topic: vipsd-work\n"
                "  work_partitions: false\n"),
      "f.yaml");
  ASSERT_TRUE(coordinate_only.ok()) << coordinate_only.status().message();
  EXPECT_FALSE(coordinate_only->work_partitions);
  auto no_partitions_alone = ParseConfig(
      KafkaWith("  # ledger_topic: vipsd-ledger\n", "  work_partitions: false\n"), "f.yaml");
  ASSERT_FALSE(no_partitions_alone.ok());
  EXPECT_THAT(no_partitions_alone.status().message(),
              HasSubstr("state.work_partitions: false is only allowed together with "
                        "state.work_topic"));
  EXPECT_THAT(no_partitions_alone.status().message(), HasSubstr("f.yaml:"));
  auto work_is_ledger = ParseConfig(
      KafkaWith("  # ledger_topic: vipsd-ledger\n",
                "  ledger_topic: vipsd-ledger\n  work_topic: vipsd-ledger\n"),
      "f.yaml");
  ASSERT_FALSE(work_is_ledger.ok());
  EXPECT_THAT(work_is_ledger.status().message(),
              HasSubstr("state.work_topic: must differ from state.ledger_topic and from the "
                        "input topics"));
  auto on_file = ParseConfig(With("state:\n", "state:\n  ledger_topic: l\n"), "f.yaml");
  ASSERT_FALSE(on_file.ok());
  EXPECT_THAT(on_file.status().message(),
              HasSubstr("state.ledger_topic: only allowed with source.type: kafka"));
}

// federation (issue 31): a holder's secret key comes from a file or a
// systemd credential, never from the YAML (nor the environment); the
// roster and the roles' keys are checked with key and line.
TEST(ConfigTest, FederationKeysAndWhereASecretKeyMayComeFrom) {
  const std::string dir = ::testing::TempDir() + "config_federation";
  std::filesystem::create_directories(dir);
  const std::string secret(64, 'a');
  ASSERT_TRUE(connectors::WriteFileDurably(dir + "/h1.key", secret + "\n", false, 0600).ok());
  const std::string roster = "  holders:\n    h1: " + std::string(64, 'B') + "\n    h2: " +
                             std::string(64, 'c') + "\n";
  auto holder_with = [&](const std::string& key_line, const std::string& extra = "") {
    std::string text = KafkaWith("  # ledger_topic: vipsd-ledger\n",
                                 "  ledger_key: fedjob\n  work_topic: vipsd-work\n");
    text.replace(text.find("accounting: residency"), 21, "accounting: global   ");
    return text.replace(text.find("log:"), 4,
                        "federation:\n  role: holder\n  holder_id: h1\n" + key_line +
                            "  tolerated_holders: 1\n" + roster + extra + "log:");
  };
  auto holder = ParseConfig(holder_with("  secret_key: {file: h1.key}\n"), dir + "/v.yaml");
  ASSERT_TRUE(holder.ok()) << holder.status().message();
  EXPECT_EQ(holder->federation.role, FederationRole::kHolder);
  EXPECT_EQ(holder->federation.secret_key, secret);
  EXPECT_EQ(holder->federation.holders.at("h1"), std::string(64, 'b'));  // lower case
  for (const auto& [key, value] : AppliedKeyValues(*holder)) {
    EXPECT_EQ(value.find(secret), std::string::npos) << key;
  }
  // Written in the file: refused, and the message does not repeat it.
  auto inline_key = ParseConfig(holder_with("  secret_key: " + secret + "\n"), dir + "/v.yaml");
  ASSERT_FALSE(inline_key.ok());
  EXPECT_THAT(inline_key.status().message(),
              HasSubstr("federation.secret_key: a secret key is never written in the "
                        "configuration file"));
  EXPECT_THAT(inline_key.status().message(), Not(HasSubstr(secret)));
  auto from_env = ParseConfig(holder_with("  secret_key: {env: KEY}\n"), dir + "/v.yaml");
  ASSERT_FALSE(from_env.ok());
  EXPECT_THAT(from_env.status().message(),
              HasSubstr("must be one of {file: PATH}, {credential: NAME}"));
  auto missing = ParseConfig(holder_with(""), dir + "/v.yaml");
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("federation.secret_key: required"));
  // The holder's id must be in the roster; t below n; public keys are hex.
  std::string stranger = holder_with("  secret_key: {file: h1.key}\n");
  stranger.replace(stranger.find("holder_id: h1"), 13, "holder_id: h9");
  auto not_listed = ParseConfig(stranger, dir + "/v.yaml");
  ASSERT_FALSE(not_listed.ok());
  EXPECT_THAT(not_listed.status().message(),
              HasSubstr("federation.holder_id: 'h9' is not one of federation.holders"));
  std::string too_tolerant = holder_with("  secret_key: {file: h1.key}\n");
  too_tolerant.replace(too_tolerant.find("tolerated_holders: 1"), 20, "tolerated_holders: 2");
  auto tolerant = ParseConfig(too_tolerant, dir + "/v.yaml");
  ASSERT_FALSE(tolerant.ok());
  EXPECT_THAT(tolerant.status().message(),
              HasSubstr("federation.tolerated_holders: must be below the number of holders (2)"));
  std::string short_key = holder_with("  secret_key: {file: h1.key}\n");
  short_key.replace(short_key.find(std::string(64, 'c')), 64, "cafe");
  auto bad_key = ParseConfig(short_key, dir + "/v.yaml");
  ASSERT_FALSE(bad_key.ok());
  EXPECT_THAT(bad_key.status().message(),
              HasSubstr("federation.holders.h2: must be the holder's X25519 public key"));
  // The share delay: a holder's, below the round timeout less 1 s.
  auto delayed = ParseConfig(holder_with("  secret_key: {file: h1.key}\n",
                                         "  round_timeout_seconds: 10\n  share_delay_seconds: 9.5\n"),
                             dir + "/v.yaml");
  ASSERT_FALSE(delayed.ok());
  EXPECT_THAT(delayed.status().message(),
              HasSubstr("federation.share_delay_seconds: 9.5 leaves less than 1 s before "
                        "federation.round_timeout_seconds = 10"));
  auto in_time = ParseConfig(holder_with("  secret_key: {file: h1.key}\n",
                                         "  round_timeout_seconds: 10\n  share_delay_seconds: 4\n"),
                             dir + "/v.yaml");
  ASSERT_TRUE(in_time.ok()) << in_time.status().message();
  EXPECT_EQ(in_time->federation.share_delay_seconds, 4);
  auto instant = ParseConfig(holder_with("  secret_key: {file: h1.key}\n",
                                         "  share_delay_seconds: 0\n"),
                             dir + "/v.yaml");
  ASSERT_FALSE(instant.ok());
  EXPECT_THAT(instant.status().message(),
              HasSubstr("federation.share_delay_seconds: must be a number of seconds in "
                        "[0.05, 3600]"));
  // An aggregator reads no input and holds no key.
  std::string aggregator = KafkaWith("  # ledger_topic: vipsd-ledger\n",
                                     "  ledger_topic: l\n  work_topic: vipsd-work\n");
  aggregator.replace(aggregator.find("accounting: residency"), 21, "accounting: global   ");
  aggregator.replace(aggregator.find("log:"), 4,
                     "federation:\n  role: aggregator\n" + roster + "log:");
  auto with_topics = ParseConfig(aggregator, dir + "/v.yaml");
  ASSERT_FALSE(with_topics.ok());
  EXPECT_THAT(with_topics.status().message(),
              HasSubstr("source.topics: an aggregator reads no input"));
  const size_t topics = aggregator.find("  topics: [documents]");
  aggregator.erase(topics, aggregator.find('\n', topics) + 1 - topics);
  auto no_input = ParseConfig(aggregator, dir + "/v.yaml");
  ASSERT_TRUE(no_input.ok()) << no_input.status().message();
  EXPECT_EQ(no_input->federation.role, FederationRole::kAggregator);
  std::string aggregator_delay = aggregator;
  aggregator_delay.replace(aggregator_delay.find("log:"), 4, "log:");
  aggregator_delay.replace(aggregator_delay.find("  role: aggregator\n"), 19,
                           "  role: aggregator\n  share_delay_seconds: 2\n");
  auto delay_on_aggregator = ParseConfig(aggregator_delay, dir + "/v.yaml");
  ASSERT_FALSE(delay_on_aggregator.ok());
  EXPECT_THAT(delay_on_aggregator.status().message(),
              HasSubstr("federation.share_delay_seconds: only allowed with federation.role: "
                        "holder"));
  // Without federation.role, source.topics is required and the section's
  // other keys are refused.
  std::string plain = KafkaExample();
  plain.erase(plain.find("  topics: [documents]"),
              plain.find('\n', plain.find("  topics: [documents]")) + 1 -
                  plain.find("  topics: [documents]"));
  auto no_topics = ParseConfig(plain, dir + "/v.yaml");
  ASSERT_FALSE(no_topics.ok());
  EXPECT_THAT(no_topics.status().message(), HasSubstr("source.topics: required key is missing"));
  std::string stray = KafkaExample();
  stray.replace(stray.find("log:"), 4, "federation:\n" + roster + "log:");
  auto stray_holders = ParseConfig(stray, dir + "/v.yaml");
  ASSERT_FALSE(stray_holders.ok());
  EXPECT_THAT(stray_holders.status().message(),
              HasSubstr("federation.holders: only allowed with federation.role"));
}

TEST(ConfigTest, KafkaExampleParsesWithItsValues) {
  auto config = ParseConfig(KafkaExample(), "/etc/vipsd/vipsd.yaml");
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_EQ(config->source_type, SourceType::kKafka);
  EXPECT_EQ(config->sink_type, SinkType::kKafka);
  EXPECT_EQ(config->source_topics, std::vector<std::string>{"documents"});
  EXPECT_EQ(config->group_id, "vipsd-lda");
  EXPECT_EQ(config->release_topic, "vipsd-releases");
  EXPECT_EQ(config->dead_letter_topic, "vipsd-dead-letters");
  EXPECT_EQ(config->alert_topic, "vipsd-alerts");
  EXPECT_EQ(config->accounting, Accounting::kResidency);
  EXPECT_EQ(config->window_steps, 500);
  EXPECT_EQ(config->on_ceiling, CeilingAction::kHalt);
  EXPECT_EQ(config->warn_at, (std::vector<double>{0.5, 0.8, 0.95}));
  EXPECT_DOUBLE_EQ(config->step_interval_seconds, 10);
  EXPECT_DOUBLE_EQ(config->release_delay_seconds, 10);
  EXPECT_EQ(config->start_time, 0);
  EXPECT_EQ(config->pool_capacity, 100000);
  EXPECT_FALSE(config->expose_step_timing);  // private: off unless asked for
  EXPECT_EQ(config->kafka.bootstrap_servers, "kafka-1:9092,kafka-2:9092");
  EXPECT_EQ(config->kafka.properties.at("reconnect.backoff.max.ms"), "1000");
  EXPECT_EQ(config->state_directory, "/var/lib/vipsd");
  EXPECT_EQ(config->metrics_listen, "127.0.0.1:9464");
  EXPECT_EQ(config->log_level, LogLevel::kInfo);
  EXPECT_GT(config->line_of("privacy.sampling_rate"), 0);
}

TEST(ConfigTest, KafkaErrorsNameTheKey) {
  const std::vector<Bad> cases = {
      {KafkaWith("  bootstrap_servers:", "  embedded: true\n  bootstrap_servers:"),
       "kafka.bootstrap_servers: not allowed with embedded: true"},
      {KafkaWith("  topics: [documents]", "  topics: [\"no spaces\"]"),
       "source.topics: every entry must be a Kafka topic name"},
      {KafkaWith("  topics: [documents]", "  topics: []"), "source.topics: must be a non-empty list"},
      {KafkaWith("  interval_seconds: 10 ", "  interval_seconds: 0 "),
       "schedule.interval_seconds: must be a number of seconds in [0.01, 604800]"},
      {KafkaWith("  interval_seconds: 10 ", "  # no interval "),
       "schedule.interval_seconds: required key is missing"},
      {KafkaWith("  topic: vipsd-dead-letters", "  path: dl.jsonl"),
       "dead_letter.topic: required key is missing"},
      {KafkaWith("  window_steps: 500 ", "  window_steps: some "),
       "schedule.window_steps: must be all or a whole number in [1, 1099511627776], got 'some'"},
      {KafkaWith("  release_delay_seconds: 10 ", "  release_delay_seconds: 101 "),
       "schedule.release_delay_seconds: must be a number of seconds in [0, 10 * interval_seconds]"},
      {KafkaWith("  # start_time: 1767225600 ", "  start_time: 17 "),
       "schedule.start_time: must be unix seconds in [1e9, 1e11]"},
      {KafkaWith("  level: info ", "  level: chatty "), "log.level: must be one of debug"},
      {KafkaWith("  cut_grace_seconds: 1 ", "  cut_grace_seconds: 10 "),
       "schedule.cut_grace_seconds: must be a number of seconds in [0, 60], below "
       "interval_seconds (or 0) and at most release_delay_seconds"},
      {KafkaWith("  timestamps: log_append_time ", "  timestamps: producer "),
       "source.timestamps: must be one of log_append_time"},
  };
  for (const Bad& bad : cases) {
    auto config = ParseConfig(bad.text, "k.yaml");
    ASSERT_FALSE(config.ok()) << bad.expected;
    EXPECT_THAT(config.status().message(), HasSubstr(bad.expected));
    EXPECT_THAT(config.status().message(), HasSubstr("k.yaml:"));
  }
}

// Slot cuts (core/svi/slot_windows.h): the broker's timestamps by default,
// the producers' only when asked, with a warning that names the weaker
// claim; the grace defaults to min(1 s, interval / 4, release delay / 4).
TEST(ConfigTest, SlotCutsTrustTheBrokersTimestampsUnlessCreateTimeIsAskedForWithAWarning) {
  auto standard = ParseConfig(KafkaWith("  cut_grace_seconds: 1 ", "  # no grace "), "k.yaml");
  ASSERT_TRUE(standard.ok()) << standard.status().ToString();
  EXPECT_EQ(standard->source_timestamps, "log_append_time");
  EXPECT_DOUBLE_EQ(standard->cut_grace_seconds, 1.0);  // min(1, 10 / 4, 10 / 4)
  for (const std::string& warning : standard->warnings) {
    EXPECT_THAT(warning, Not(HasSubstr("source.timestamps")));
  }
  auto producers = ParseConfig(
      KafkaWith("  timestamps: log_append_time ", "  timestamps: create_time     "), "k.yaml");
  ASSERT_TRUE(producers.ok()) << producers.status().ToString();
  EXPECT_EQ(producers->source_timestamps, "create_time");
  bool warned = false;
  for (const std::string& warning : producers->warnings) {
    if (warning.find("source.timestamps: warning: create_time trusts the producers' "
                     "timestamps") != std::string::npos) {
      warned = true;
      EXPECT_THAT(warning, HasSubstr("k.yaml:"));
      EXPECT_THAT(warning, HasSubstr("message.timestamp.type=LogAppendTime"));
    }
  }
  EXPECT_TRUE(warned);
}

TEST(ConfigTest, KafkaSecretsComeFromAFileAnEnvironmentVariableOrASystemdCredential) {
  const std::string dir = ::testing::TempDir() + "config_secrets";
  std::filesystem::create_directories(dir + "/creds");
  std::ofstream(dir + "/password.txt") << "s3cret-from-file\n";
  std::ofstream(dir + "/creds/kafka-password") << "s3cret-from-systemd";
  ::setenv("VIPSD_TEST_KAFKA_USER", "vipsd-user", 1);
  ::setenv("CREDENTIALS_DIRECTORY", (dir + "/creds").c_str(), 1);
  const std::string with_secrets = KafkaWith(
      "    reconnect.backoff.max.ms: \"1000\"",
      "    sasl.password: {file: password.txt}\n"
      "    sasl.username: {env: VIPSD_TEST_KAFKA_USER}\n"
      "    ssl.key.password: {credential: kafka-password}");
  auto config = ParseConfig(with_secrets, dir + "/k.yaml");
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_EQ(config->kafka.properties.at("sasl.password"), "s3cret-from-file");  // newline dropped
  EXPECT_EQ(config->kafka.properties.at("sasl.username"), "vipsd-user");
  EXPECT_EQ(config->kafka.properties.at("ssl.key.password"), "s3cret-from-systemd");

  // Every unusable reference is an error naming the key and the reference,
  // never any content.
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"    sasl.password: {file: missing.txt}", "missing.txt does not exist"},
      {"    sasl.password: {env: VIPSD_TEST_UNSET_VARIABLE}", "VIPSD_TEST_UNSET_VARIABLE is not set"},
      {"    sasl.password: {credential: ../password.txt}", "plain file name"},
      {"    sasl.password: {vault: x}", "unknown secret reference 'vault'"},
      {"    sasl.password: [a, b]", "must be a plain value or one of"},
      {"    sasl.password: {file: creds}", "not a regular file"},
      // Issue 27: a FIFO or a device is refused by name, without blocking.
      {"    sasl.password: {file: secret.fifo}", "secret.fifo is a FIFO"},
      {"    sasl.password: {file: /dev/zero}", "/dev/zero is a character device"},
      {"    sasl.password: {file: big.txt}", "more than the 65536 this file may have"},
  };
  ::unlink((dir + "/secret.fifo").c_str());
  ASSERT_EQ(::mkfifo((dir + "/secret.fifo").c_str(), 0600), 0);
  std::ofstream(dir + "/big.txt") << std::string(70000, 'x');
  ::unsetenv("VIPSD_TEST_UNSET_VARIABLE");
  for (const auto& [line, expected] : bad) {
    auto refused =
        ParseConfig(KafkaWith("    reconnect.backoff.max.ms: \"1000\"", line), dir + "/k.yaml");
    ASSERT_FALSE(refused.ok()) << line;
    EXPECT_THAT(refused.status().message(), HasSubstr("kafka.properties.sasl.password: "))
        << refused.status().message();
    EXPECT_THAT(refused.status().message(), HasSubstr(expected)) << refused.status().message();
    EXPECT_THAT(refused.status().message(), Not(HasSubstr("s3cret")));
  }
  ::unsetenv("CREDENTIALS_DIRECTORY");
  auto no_systemd = ParseConfig(with_secrets, dir + "/k.yaml");
  ASSERT_FALSE(no_systemd.ok());
  EXPECT_THAT(no_systemd.status().message(), HasSubstr("CREDENTIALS_DIRECTORY is not set"));
  EXPECT_THAT(no_systemd.status().message(), Not(HasSubstr("s3cret")));
}

TEST(ConfigTest, ReloadAppliesLiveKeysAndNamesTheFirstFixedOne) {
  auto running = ParseConfig(KafkaExample(), "k.yaml");
  ASSERT_TRUE(running.ok());
  auto same = ChangedReloadableKeys(*running, *running);
  ASSERT_TRUE(same.ok());
  EXPECT_TRUE(same->empty());

  auto live = ParseConfig(KafkaWith("  sampling_rate: 0.01", "  sampling_rate: 0.02"), "k.yaml");
  ASSERT_TRUE(live.ok());
  std::vector<std::string> described;
  auto changed = ChangedReloadableKeys(*running, *live, &described);
  ASSERT_TRUE(changed.ok());
  EXPECT_EQ(*changed, std::vector<std::string>{"privacy.sampling_rate"});
  // The reload log says old -> new, without float noise.
  EXPECT_EQ(described, std::vector<std::string>{"privacy.sampling_rate: 0.01 -> 0.02"});

  // librdkafka properties may hold credentials: a refused change names the
  // key but never shows a value.
  auto secret = ParseConfig(KafkaWith("    reconnect.backoff.max.ms: \"1000\"",
                                      "    sasl.password: \"hunter2\""),
                            "k.yaml");
  ASSERT_TRUE(secret.ok()) << secret.status().message();
  auto secret_refused = ChangedReloadableKeys(*running, *secret);
  ASSERT_FALSE(secret_refused.ok());
  EXPECT_THAT(secret_refused.status().message(), HasSubstr("kafka.properties: cannot change"));
  EXPECT_THAT(secret_refused.status().message(), Not(HasSubstr("hunter2")));
  EXPECT_THAT(secret_refused.status().message(), Not(HasSubstr("1000")));

  // log.format is live and named.
  auto json = ParseConfig(KafkaWith("  format: logfmt ", "  format: json "), "k.yaml");
  ASSERT_TRUE(json.ok()) << json.status().message();
  EXPECT_EQ(json->log_format, LogFormat::kJson);
  ASSERT_TRUE(ChangedReloadableKeys(*running, *json, &described).ok());
  EXPECT_EQ(described, std::vector<std::string>{"log.format: logfmt -> json"});
  auto bad_format = ParseConfig(KafkaWith("  format: logfmt ", "  format: xml "), "k.yaml");
  ASSERT_FALSE(bad_format.ok());
  EXPECT_THAT(bad_format.status().message(), HasSubstr("log.format"));

  auto window = ParseConfig(KafkaWith("  window_steps: 500 ", "  window_steps: 400 "), "k.yaml");
  ASSERT_TRUE(window.ok()) << window.status().message();
  auto window_changed = ChangedReloadableKeys(*running, *window);
  ASSERT_TRUE(window_changed.ok());
  EXPECT_EQ(*window_changed, std::vector<std::string>{"schedule.window_steps"});

  auto start = ParseConfig(KafkaWith("  # start_time: 1767225600 ", "  start_time: 1767225600 "),
                           "k.yaml");
  ASSERT_TRUE(start.ok()) << start.status().message();
  auto start_changed = ChangedReloadableKeys(*running, *start);
  ASSERT_FALSE(start_changed.ok());
  EXPECT_THAT(start_changed.status().message(), HasSubstr("schedule.start_time: cannot change"));

  auto topics = ParseConfig(KafkaWith("    topics: 50 ", "    topics: 60 "), "k.yaml");
  ASSERT_TRUE(topics.ok());
  auto refused = ChangedReloadableKeys(*running, *topics);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(),
              HasSubstr("k.yaml:8: model.lda.topics: cannot change on reload (running: 50, "
                        "file: 60); the old configuration keeps running"));
  EXPECT_THAT(refused.status().message(), HasSubstr("new state directory"));

  // σ = 0 with the Kafka example's residency accounting is itself invalid
  // (the reload of a privacy-mode switch: ReloadRefusesASwitchOfPrivacyMode,
  // on the global-accounting example).
  auto private_off =
      ParseConfig(KafkaWith("  noise_multiplier: 1.1", "  noise_multiplier: 0"), "k.yaml");
  EXPECT_FALSE(private_off.ok());
}

// The 1-based line of the first line of `text` that contains `needle`.
int LineOf(const std::string& text, const std::string& needle) {
  const size_t at = text.find(needle);
  EXPECT_NE(at, std::string::npos) << needle;
  return 1 + static_cast<int>(std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(at), '\n'));
}

// One privacy mode per state directory (issue 11): a reload never switches
// between private and non-private steps, nor between secure and fixed-seed
// noise; the refusal names the key's line in the new file and says that the
// switch needs a new state directory (a restart on the same one is refused).
TEST(ConfigTest, ReloadRefusesASwitchOfPrivacyMode) {
  struct Switch {
    std::string running, next;  // the example with one replacement each ("" = as shipped)
    std::string key_line;       // the line of the new file the message must name
    std::string expected;       // after "rl.yaml:<line>: "
  };
  const std::vector<Switch> cases = {
      {"", "  noise_multiplier: 0 ", "noise_multiplier: 0",
       "privacy.noise_multiplier: cannot change on reload between private (> 0) and non-private "
       "(0) (running: 1, file: 0)"},
      {"  noise_multiplier: 0 ", "", "noise_multiplier: 1.0",
       "privacy.noise_multiplier: cannot change on reload between private (> 0) and non-private "
       "(0) (running: 0, file: 1)"},
      {"", "  noise: fixed_seed ", "noise: fixed_seed",
       "privacy.noise: cannot change on reload (running: secure, file: fixed_seed)"},
      {"  noise: fixed_seed ", "", "noise: secure",
       "privacy.noise: cannot change on reload (running: fixed_seed, file: secure)"},
      // Left out of the new file (its default, secure, applies): the line
      // of its section.
      {"  noise: fixed_seed ", "  # noise: left out ", "privacy:",
       "privacy.noise: cannot change on reload (running: fixed_seed, file: secure)"},
  };
  for (const Switch& c : cases) {
    SCOPED_TRACE(c.expected);
    // max_steps > 0: a non-private run needs a limit.
    auto variant = [](const std::string& replacement) {
      std::string text = With("  max_steps: 0 ", "  max_steps: 5 ");
      if (replacement.empty()) return text;
      const std::string key = replacement.find("noise_multiplier") != std::string::npos
                                  ? "  noise_multiplier: 1.0 "
                                  : "  noise: secure ";
      return text.replace(text.find(key), key.size(), replacement);
    };
    auto running = ParseConfig(variant(c.running), "rl.yaml");
    ASSERT_TRUE(running.ok()) << running.status().message();
    const std::string next_text = variant(c.next);
    auto next = ParseConfig(next_text, "rl.yaml");
    ASSERT_TRUE(next.ok()) << next.status().message();
    auto refused = ChangedReloadableKeys(*running, *next);
    ASSERT_FALSE(refused.ok());
    const std::string line = std::to_string(LineOf(next_text, c.key_line));
    ASSERT_NE(line, "0");
    EXPECT_THAT(refused.status().message(), HasSubstr("rl.yaml:" + line + ": " + c.expected))
        << refused.status().message();
    EXPECT_THAT(refused.status().message(),
                HasSubstr("the old configuration keeps running. Changing it needs a restart "
                          "with a new state directory"));
  }
  // Within one mode σ is live.
  auto more_noise = ParseConfig(With("  noise_multiplier: 1.0 ", "  noise_multiplier: 2 "), "rl.yaml");
  ASSERT_TRUE(more_noise.ok()) << more_noise.status().message();
  auto running = ParseConfig(Example(), "rl.yaml");
  ASSERT_TRUE(running.ok());
  auto changed = ChangedReloadableKeys(*running, *more_noise);
  ASSERT_TRUE(changed.ok()) << changed.status().message();
  EXPECT_EQ(*changed, std::vector<std::string>{"privacy.noise_multiplier"});
}

TEST(ConfigTest, BlrExampleParsesAndModelSectionsMustMatchTheType) {
  std::ifstream in(std::string(VIPSD_SOURCE_DIR) + "/config/examples/blr_offline.yaml");
  std::ostringstream text;
  text << in.rdbuf();
  auto config = ParseConfig(text.str(), "/etc/vipsd/blr.yaml");
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_EQ(config->model_type, "blr");
  EXPECT_EQ(config->blr.dim, 92);
  EXPECT_EQ(config->blr_norm_rule, "rescale");
  // prior_groups: consecutive runs of coefficients, group g the g-th run.
  ASSERT_EQ(config->blr.prior_group.size(), 92u);
  EXPECT_EQ(config->blr.prior_group[0], 0);
  EXPECT_EQ(config->blr.prior_group[1], 1);
  EXPECT_EQ(config->blr.prior_group[5], 1);
  EXPECT_EQ(config->blr.prior_group[6], 2);
  EXPECT_EQ(config->blr.prior_group[91], 8);
  EXPECT_EQ(models::PriorGroupCount(config->blr), 9);
  const std::string groups = "prior_groups: [1, 5, 9, 7, 15, 6, 5, 2, 42]";
  for (const auto& [replacement, expected] :
       std::vector<std::pair<std::string, std::string>>{
           {"prior_groups: [1, 5, 9, 7, 15, 6, 5, 2, 41]",
            "model.blr.prior_groups: the group sizes sum to 91; they must sum to "
            "model.blr.dimension (92)"},
           {"prior_groups: [1, 5, 9, 7, 15, 6, 5, 2, 41.5, 0.5]",
            "model.blr.prior_groups: must be integers in [1, 1024]"}}) {
    std::string changed = text.str();
    changed.replace(changed.find(groups), groups.size(), replacement);
    auto refused = ParseConfig(changed, "g.yaml");
    ASSERT_FALSE(refused.ok()) << replacement;
    EXPECT_THAT(refused.status().message(),
                HasSubstr("g.yaml:" + std::to_string(LineOf(changed, "prior_groups")) + ": " +
                          expected));
  }
  std::string one_group = text.str();
  one_group.replace(one_group.find(groups), groups.size(), "");
  auto ungrouped = ParseConfig(one_group, "g.yaml");
  ASSERT_TRUE(ungrouped.ok()) << ungrouped.status().message();
  EXPECT_TRUE(ungrouped->blr.prior_group.empty());
  // A public prior (allowed for every model type) has one scale for BLR:
  // not with prior groups.
  const std::string public_prior = "  public_prior:\n    release: public/step-9\n";
  std::string with_public = one_group;
  with_public.replace(with_public.find("privacy:"), 0, public_prior);
  auto public_blr = ParseConfig(with_public, "/etc/vipsd/p.yaml");
  ASSERT_TRUE(public_blr.ok()) << public_blr.status().message();
  EXPECT_EQ(public_blr->public_prior_path, "/etc/vipsd/public/step-9");
  std::string both = text.str();
  both.replace(both.find("privacy:"), 0, public_prior);
  auto refused = ParseConfig(both, "g.yaml");
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(),
              HasSubstr("g.yaml:" + std::to_string(LineOf(both, "prior_groups")) +
                        ": model.blr.prior_groups: cannot be combined with model.public_prior"));
  std::ifstream sbn_in(std::string(VIPSD_SOURCE_DIR) + "/config/examples/sbn_offline.yaml");
  std::ostringstream sbn;
  sbn << sbn_in.rdbuf();
  // SBN has a public start too (issue 48: every model).
  std::string sbn_public = sbn.str();
  sbn_public.replace(sbn_public.find("privacy:"), 0, public_prior);
  auto public_sbn = ParseConfig(sbn_public, "/etc/vipsd/s.yaml");
  ASSERT_TRUE(public_sbn.ok()) << public_sbn.status().message();
  EXPECT_EQ(public_sbn->model_type, "sbn");
  EXPECT_EQ(public_sbn->public_prior_path, "/etc/vipsd/public/step-9");
  // The public start's weight is LDA's (its start is a blend): refused for
  // the other models with key and line.
  std::string sbn_weight = sbn.str();
  sbn_weight.replace(sbn_weight.find("privacy:"), 0, public_prior + "    weight: 0.5\n");
  auto refused_weight = ParseConfig(sbn_weight, "s.yaml");
  ASSERT_FALSE(refused_weight.ok());
  EXPECT_THAT(refused_weight.status().message(),
              HasSubstr("s.yaml:" + std::to_string(LineOf(sbn_weight, "weight: 0.5")) +
                        ": model.public_prior.weight: only allowed with model.type: lda"));
  // A public_prior section still needs its release, with key and line.
  std::string no_release = sbn.str();
  no_release.replace(no_release.find("privacy:"), 0, "  public_prior: {}\n");
  auto refused_sbn = ParseConfig(no_release, "s.yaml");
  ASSERT_FALSE(refused_sbn.ok());
  EXPECT_THAT(refused_sbn.status().message(),
              HasSubstr("s.yaml:" + std::to_string(LineOf(no_release, "public_prior")) +
                        ": model.public_prior.release: required key is missing"));
  std::string mixed = text.str();
  mixed.replace(mixed.find("privacy:"), 8,
                "  lda:\n    topics: 3\nprivacy:");
  auto bad = ParseConfig(mixed, "b.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("model.lda: only allowed with model.type: lda"));
  std::string rule = text.str();
  rule.replace(rule.find("norm_rule: rescale"), 18, "norm_rule: clip");
  bad = ParseConfig(rule, "b.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(),
              HasSubstr("model.blr.norm_rule: must be one of rescale, reject, got 'clip'"));
}

// Issue 11: every rule that would let one record change which other records
// a step sees, or drop a well-formed record for its content outside the
// mechanism, is refused — in private mode always, with the key and its line.
TEST(ConfigTest, RulesThatBreakPerRecordMembershipAreRefusedWithKeyAndLine) {
  struct Refused {
    std::string text;
    std::string needle;    // the line the error must name
    std::string expected;  // substring after "k.yaml:<line>: "
  };
  std::ifstream blr_in(std::string(VIPSD_SOURCE_DIR) + "/config/examples/blr_offline.yaml");
  std::ostringstream blr;
  blr << blr_in.rdbuf();
  std::string blr_reject = blr.str();
  blr_reject.replace(blr_reject.find("norm_rule: rescale"), 18, "norm_rule: reject");
  std::string residency_all = KafkaWith("  window_steps: 500 ", "  window_steps: all ");
  std::string epochs = With("  max_epochs: 0 ", "  max_epochs: 1e11 ");
  const std::vector<Refused> cases = {
      {KafkaWith("  max_steps: 0 ", "  max_steps: 0\n  min_new_records: 100 "),
       "min_new_records", "schedule.min_new_records: removed: a step triggered by a record count"},
      {KafkaWith("  max_steps: 0 ", "  max_steps: 0\n  min_pool_records: 1000 "),
       "min_pool_records", "schedule.min_pool_records: removed: a step triggered by a record count"},
      {KafkaWith("  capacity: 100000 ", "  capacity: 100000\n  eviction: oldest "), "eviction:",
       "pool.eviction: removed: both policies let a count of other records decide"},
      {KafkaWith("  capacity: 100000 ", "  capacity: 100000\n  eviction: refuse_new "), "eviction:",
       "pool.eviction: removed: both policies let a count of other records decide"},
      {KafkaWith("  capacity: 100000 ", "  capacity: 100000\n  rebuild_lookback: 500 "),
       "rebuild_lookback", "pool.rebuild_lookback: removed"},
      {KafkaWith("  warn_at:", "  residency_steps: 500\n  warn_at:"), "residency_steps",
       "privacy.residency_steps: no longer a key"},
      {blr_reject, "norm_rule: reject",
       "model.blr.norm_rule: reject is not allowed when privacy.noise_multiplier > 0"},
      {residency_all, "window_steps: all",
       "schedule.window_steps: residency accounting needs a finite window"},
      {epochs, "max_epochs", "schedule.max_epochs: max_epochs / privacy.sampling_rate is"},
  };
  for (const Refused& bad : cases) {
    auto config = ParseConfig(bad.text, "k.yaml");
    ASSERT_FALSE(config.ok()) << bad.expected;
    const std::string where = "k.yaml:" + std::to_string(LineOf(bad.text, bad.needle)) + ": ";
    EXPECT_THAT(config.status().message(), HasSubstr(where + bad.expected));
  }
  // Without noise the BLR reject rule has no claim to break: allowed.
  std::string open = blr_reject;
  open.replace(open.find("noise_multiplier: "), 18, "noise_multiplier: 0 #");
  open.replace(open.find("  max_steps: "), 13, "  max_steps: 5 #");
  auto allowed = ParseConfig(open, "k.yaml");
  EXPECT_TRUE(allowed.ok()) << allowed.status().message();
}

TEST(ConfigTest, SbnExampleParses) {
  std::ifstream in(std::string(VIPSD_SOURCE_DIR) + "/config/examples/sbn_offline.yaml");
  std::ostringstream text;
  text << in.rdbuf();
  auto config = ParseConfig(text.str(), "/etc/vipsd/sbn.yaml");
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_EQ(config->model_type, "sbn");
  EXPECT_EQ(config->sbn.visible, 784);
  EXPECT_EQ(config->sbn.hidden, 50);
  EXPECT_EQ(config->sbn.clip_fractions.xi_zz, 1.0);
  std::string bad = text.str();
  bad.replace(bad.find("      xi_zz: 1.0"), 16, "      xi_zz: 1.5");
  auto refused = ParseConfig(bad, "s.yaml");
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(),
              HasSubstr("model.sbn.clip_fractions.xi_zz: must be a number in (0, 1]"));
}

// LDA's public start: model.public_prior.weight is the public topics' share
// of λ₀ (core/models/lda.h), in (0, 1], with its default when absent.
TEST(ConfigTest, TheLdaPublicStartWeightIsReadAndItsRangeNamed) {
  std::ifstream in(std::string(VIPSD_SOURCE_DIR) + "/config/examples/lda_public_prior.yaml");
  std::ostringstream text;
  text << in.rdbuf();
  const std::string weight = "weight: 0.01 ";
  ASSERT_NE(text.str().find(weight), std::string::npos);
  for (const auto& [value, expected] : std::vector<std::pair<std::string, double>>{
           {"0.25", 0.25}, {"1", 1.0}, {"", models::kDefaultPublicStartWeight}}) {
    std::string changed = text.str();
    changed.replace(changed.find(weight), weight.size(),
                    value.empty() ? "# no weight " : "weight: " + value + " ");
    auto config = ParseConfig(changed, "/etc/vipsd/p.yaml");
    ASSERT_TRUE(config.ok()) << config.status().message();
    EXPECT_EQ(config->lda.public_start_weight, expected) << value;
  }
  for (const std::string value : {"0", "-0.1", "1.5", "nan", "much"}) {
    std::string changed = text.str();
    changed.replace(changed.find(weight), weight.size(), "weight: " + value + " ");
    auto refused = ParseConfig(changed, "p.yaml");
    ASSERT_FALSE(refused.ok()) << value;
    EXPECT_THAT(refused.status().message(),
                HasSubstr("p.yaml:" + std::to_string(LineOf(changed, "weight: " + value)) +
                          ": model.public_prior.weight: "));
    EXPECT_THAT(refused.status().message(), HasSubstr("(0, 1]")) << value;
  }
}

TEST(ConfigTest, EveryErrorOfAFileIsReportedAtOnceSortedByLine) {
  std::string text = With("  sampling_rate: 0.01", "  sampling_rate: 1.5");
  text = text.replace(text.find("  kappa: 0.7 "), 13, "  kappa: 0.5 ");
  text = text.replace(text.find("    topics: 20 "), 15, "    topics: many ");
  auto config = ParseConfig(text, "f.yaml");
  ASSERT_FALSE(config.ok());
  const std::string& message = config.status().message();
  const size_t topics = message.find("f.yaml:6: model.lda.topics");
  const size_t rate = message.find("f.yaml:17: privacy.sampling_rate");
  const size_t kappa = message.find("f.yaml:24: schedule.kappa");
  ASSERT_NE(topics, std::string::npos) << message;
  ASSERT_NE(rate, std::string::npos) << message;
  ASSERT_NE(kappa, std::string::npos) << message;
  EXPECT_LT(topics, rate);
  EXPECT_LT(rate, kappa);
  EXPECT_EQ(std::count(message.begin(), message.end(), '\n'), 2) << message;
}

TEST(ConfigTest, TyposGetASuggestion) {
  // A misspelt required key: the missing key points at the typo.
  auto config = ParseConfig(With("  sampling_rate: 0.01", "  sampling_rat: 0.01"), "f.yaml");
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(), HasSubstr("f.yaml:17: privacy.sampling_rat: unknown key; "
                                                   "did you mean 'sampling_rate'?"));
  EXPECT_THAT(config.status().message(),
              HasSubstr("privacy.sampling_rate: required key is missing (line 17 has "
                        "'sampling_rat': did you mean 'sampling_rate'?)"));
  // A misspelt optional key.
  config = ParseConfig(With("  publish_every: 10", "  publish_every: 10\n  publish_evry: 3"),
                       "f.yaml");
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(),
              HasSubstr("sink.publish_evry: unknown key; did you mean 'publish_every'?"));
  // A misspelt choice.
  config = ParseConfig(With("  noise: secure ", "  noise: secur "), "f.yaml");
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(), HasSubstr("did you mean 'secure'?"));
  // Nothing close: no suggestion.
  config = ParseConfig(With("  publish_every: 10", "  publish_every: 10\n  colour: blue"),
                       "f.yaml");
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(), Not(HasSubstr("did you mean")));
}

TEST(ConfigTest, ProblemsOfTheTextItselfAreNamed) {
  auto config = ParseConfig("", "f.yaml");
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(), HasSubstr("f.yaml: the file is empty"));
  config = ParseConfig("  \n\n", "f.yaml");
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(), HasSubstr("the file is empty"));

  std::string mac = Example();
  std::replace(mac.begin(), mac.end(), '\n', '\r');
  config = ParseConfig(mac, "f.yaml");
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(), HasSubstr("lines end with CR only"));

  // CRLF files are fine.
  std::string dos;
  for (char c : Example()) {
    if (c == '\n') dos += '\r';
    dos += c;
  }
  config = ParseConfig(dos, "f.yaml");
  EXPECT_TRUE(config.ok()) << config.status().message();

  config = ParseConfig(With("  kappa: 0.7 ", "\tkappa: 0.7 "), "f.yaml");
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(),
              HasSubstr("f.yaml:24: a tab in the indentation; YAML indents with spaces only"));
}

TEST(ConfigTest, TheDeadLetterFileMayNotBeTheSource) {
  std::string text = Example();
  const size_t at = text.find("dead_letter:");
  ASSERT_NE(at, std::string::npos);
  const size_t path = text.find("  path:", at);
  const size_t end = text.find('\n', path);
  text = text.replace(path, end - path, "  path: ./train.jsonl");
  auto config = ParseConfig(text, "/etc/vipsd/vipsd.yaml");
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(),
              HasSubstr("dead_letter.path: must not be the source file itself"));
}

TEST(ConfigTest, LegalButUnwiseValuesGetAWarningWithTheReason) {
  auto config = ParseConfig(Example(), "f.yaml");
  ASSERT_TRUE(config.ok());
  EXPECT_TRUE(config->warnings.empty());
  std::string text = With("  delta: 1.0e-5", "  delta: 0.5");
  config = ParseConfig(text, "f.yaml");
  ASSERT_TRUE(config.ok()) << config.status().message();
  ASSERT_EQ(config->warnings.size(), 1u);
  EXPECT_THAT(config->warnings[0], HasSubstr("privacy.delta: warning: 0.5 is large"));
  text = text.replace(text.find("  noise_multiplier: 1.0"), 23, "  noise_multiplier: 0.3");
  config = ParseConfig(text, "f.yaml");
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_EQ(config->warnings.size(), 2u);
}

// Issue 26: an unbounded window on a stream makes the capacity stop certain;
// a private run is warned, and every Kafka run states its margin.
TEST(ConfigTest, AnUnboundedWindowOnAStreamIsWarnedAndTheCapacityMarginStated) {
  std::string text = KafkaExample();
  text.replace(text.find("accounting: residency"), 21, "accounting: global");
  auto bounded = ParseConfig(text, "k.yaml");
  ASSERT_TRUE(bounded.ok()) << bounded.status().message();
  EXPECT_TRUE(bounded->warnings.empty());
  const CapacityMargin margin = CapacityMarginOf(*bounded);
  ASSERT_TRUE(margin.applies);
  EXPECT_FALSE(margin.unbounded);
  EXPECT_EQ(margin.capacity, 100000);
  EXPECT_EQ(margin.window_seconds, 5000);  // 500 slots of 10 s
  EXPECT_EQ(margin.records_per_second, 20);
  EXPECT_EQ(margin.text,
            "pool.capacity 100000 holds a window of 500 slots of 10 s: stepping stops if more "
            "than 100000 records arrive within 5000 s (on average more than 20 records/s)");

  text.replace(text.find("window_steps: 500 "), 18, "window_steps: all ");
  // Private on a stream: refused, naming the key, its line and the reason.
  auto refused = ParseConfig(text, "k.yaml");
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(),
              HasSubstr("schedule.window_steps: all is refused for a private run on a Kafka "
                        "stream"));
  EXPECT_THAT(refused.status().message(), HasSubstr("k.yaml:"));
  EXPECT_THAT(refused.status().message(), HasSubstr("pool.capacity (100000)"));
  // Leaving the key out means all: refused the same way.
  std::string absent = text;
  absent.erase(absent.find("  window_steps: all "),
               absent.find('\n', absent.find("  window_steps: all ")) -
                   absent.find("  window_steps: all ") + 1);
  auto refused_default = ParseConfig(absent, "k.yaml");
  ASSERT_FALSE(refused_default.ok());
  EXPECT_THAT(refused_default.status().message(),
              HasSubstr("schedule.window_steps: all (the default) is refused"));
  // Non-private: allowed; the margin says the stop is certain.
  text.replace(text.find("noise_multiplier: 1.1"), 21, "noise_multiplier: 0  ");
  auto unbounded = ParseConfig(text, "k.yaml");
  ASSERT_TRUE(unbounded.ok()) << unbounded.status().message();
  EXPECT_TRUE(CapacityMarginOf(*unbounded).unbounded);
  EXPECT_THAT(CapacityMarginOf(*unbounded).text, HasSubstr("stops for good once more than 100000"));
  // A file run has no window and no margin.
  EXPECT_FALSE(CapacityMarginOf(*ParseConfig(Example(), "f.yaml")).applies);
}

TEST(ConfigTest, AFileThatIsNotARegularFileIsRefusedWithoutReadingIt) {
  auto config = LoadConfigFile("/tmp");
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(), HasSubstr("/tmp: is a directory"));
  config = LoadConfigFile("/dev/zero");
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(), HasSubstr("not a regular file"));
}

TEST(ConfigTest, MissingFileIsReportedByName) {
  auto config = LoadConfigFile("/nonexistent/vipsd.yaml");
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(), HasSubstr("/nonexistent/vipsd.yaml"));
}

}  // namespace
}  // namespace vipsd::config

// ---- The reference configuration (config/vipsd.reference.yaml) ---------------

namespace vipsd::config {
namespace reference_test {

using ::testing::HasSubstr;

std::string ReadSource(const std::string& relative) {
  std::ifstream in(std::string(VIPSD_SOURCE_DIR) + "/" + relative);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Dotted paths of every mapping key in `node` (librdkafka property maps are
// one key: their entries are librdkafka's names, not vipsd's).
void CollectPaths(const YAML::Node& node, const std::string& prefix, std::set<std::string>* out) {
  if (!node.IsMap()) return;
  for (const auto& entry : node) {
    const std::string path = prefix.empty() ? entry.first.Scalar() : prefix + "." + entry.first.Scalar();
    out->insert(path);
    if (path.size() >= 10 && path.rfind("properties") == path.size() - 10) continue;
    CollectPaths(entry.second, path, out);
  }
}

TEST(ReferenceConfigTest, TheCommittedFileIsTheParsersOutput) {
  // Regenerate with: build/daemon/vipsd --print-reference-config > config/vipsd.reference.yaml
  EXPECT_EQ(ReadSource("config/vipsd.reference.yaml"), ReferenceConfig());
}

TEST(ReferenceConfigTest, EveryKeyOfEveryShippedExampleIsInTheReference) {
  const YAML::Node reference = YAML::Load(ReferenceConfig());
  std::set<std::string> documented;
  CollectPaths(reference, "", &documented);
  EXPECT_GT(documented.size(), 80u);
  int examples = 0;
  for (const auto& entry :
       std::filesystem::directory_iterator(std::string(VIPSD_SOURCE_DIR) + "/config/examples")) {
    if (entry.path().extension() != ".yaml") continue;
    ++examples;
    std::set<std::string> used;
    CollectPaths(YAML::LoadFile(entry.path().string()), "", &used);
    for (const std::string& key : used) {
      EXPECT_TRUE(documented.count(key)) << entry.path().filename() << ": " << key;
    }
  }
  EXPECT_GE(examples, 5);
}

TEST(ReferenceConfigTest, ReloadAndRequirednessAgreeWithTheParser) {
  const std::string reference = ReferenceConfig();
  // Every live key is marked live; a key a reload refuses is not.
  for (const std::string& key : LiveReloadKeys()) {
    const std::string leaf = key.substr(key.rfind('.') + 1);
    EXPECT_NE(reference.find("  " + leaf + ":"), std::string::npos) << key;
  }
  auto line_of = [&](const std::string& section, const std::string& key) {
    const size_t at = reference.find("\n" + section + ":");
    EXPECT_NE(at, std::string::npos) << section;
    const size_t line = reference.find("\n  " + key + ":", at);
    EXPECT_NE(line, std::string::npos) << key;
    return reference.substr(line + 1, reference.find('\n', line + 1) - line - 1);
  };
  EXPECT_THAT(line_of("privacy", "sampling_rate"), HasSubstr("required; reload: live"));
  EXPECT_THAT(line_of("privacy", "delta"), HasSubstr("required; reload: restart"));
  EXPECT_THAT(line_of("state", "checkpoint_every"), HasSubstr("optional; reload: live"));
  EXPECT_THAT(line_of("kafka", "bootstrap_servers"),
              HasSubstr("only with source.type: kafka, kafka.embedded: false"));
  EXPECT_THAT(line_of("schedule", "max_epochs"), HasSubstr("only with source.type: file"));
  // A required key of a minimal valid configuration is required in the
  // reference, and an optional key left out keeps the default it shows.
  auto config = ParseConfig(
      "model:\n  type: blr\n  blr:\n    dimension: 3\nprivacy:\n  noise_multiplier: 1\n"
      "  sampling_rate: 0.1\n  delta: 1.0e-5\n  epsilon_ceiling: 1\nschedule: {}\n"
      "source:\n  type: file\n  path: a.jsonl\nsink:\n  type: file\n  directory: out\n"
      "dead_letter:\n  path: d.jsonl\nstate:\n  directory: s\n",
      "minimal.yaml");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_THAT(line_of("schedule", "kappa"), HasSubstr("kappa: " + ShortestNumber(config->driver.kappa) + " "));
  EXPECT_THAT(line_of("sink", "publish_every"),
              HasSubstr("publish_every: " + std::to_string(config->publish_every) + " "));
}

}  // namespace reference_test
}  // namespace vipsd::config
