// The reload diff spells values as a configuration file does (issue 29):
// every enum-typed key, reloaded with a changed value, is named by both of
// its values ("running: fixed, file: adaptive"), never as numbers.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "config/config.h"

namespace vipsd::config {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;

// A Kafka run that sets every enum-typed key explicitly.
const char* const kKafkaRun = R"(model:
  type: lda
  lda:
    topics: 2
    vocabulary: v.txt
    alpha: 0.1
    eta: 0.01
privacy:
  noise_multiplier: 1
  sampling_rate: 0.1
  delta: 1.0e-5
  epsilon_ceiling: 1
  noise: secure
  accounting: global
  schedule: fixed
  on_ceiling: halt
schedule:
  interval_seconds: 1
  window_steps: 10
  on_overrun: stop
source:
  type: kafka
  topics: [t]
  start_position: earliest
sink:
  type: kafka
  topic: r
dead_letter:
  topic: d
kafka:
  embedded: false
  bootstrap_servers: b:9092
state:
  directory: s
metrics:
  expose_step_timing: false
log:
  level: info
  format: logfmt
)";

// `text` with each `from` replaced by its `to` (each must occur).
std::string With(std::string text,
                 const std::vector<std::pair<std::string, std::string>>& replacements) {
  for (const auto& [from, to] : replacements) {
    const size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    if (at != std::string::npos) text.replace(at, from.size(), to);
  }
  return text;
}

// The same job as an offline file run.
std::string FileRun() {
  return With(kKafkaRun, {{"schedule:\n  interval_seconds: 1\n  window_steps: 10\n"
                           "  on_overrun: stop\n"
                           "source:\n  type: kafka\n  topics: [t]\n  start_position: earliest\n"
                           "sink:\n  type: kafka\n  topic: r\ndead_letter:\n  topic: d\n"
                           "kafka:\n  embedded: false\n  bootstrap_servers: b:9092\n",
                           "schedule: {}\nsource:\n  type: file\n  path: in.jsonl\n"
                           "sink:\n  type: file\n  directory: out\n"
                           "dead_letter:\n  path: dead.jsonl\n"}});
}

const std::vector<std::pair<std::string, std::string>> kBlrNonPrivate = {
    {"  type: lda\n  lda:\n    topics: 2\n    vocabulary: v.txt\n    alpha: 0.1\n    eta: 0.01\n",
     "  type: blr\n  blr:\n    dimension: 3\n    norm_rule: rescale\n"},
    {"  noise_multiplier: 1\n", "  noise_multiplier: 0\n"},
    {"  interval_seconds: 1\n", "  interval_seconds: 1\n  max_steps: 5\n"}};

// `kafka` as one job over several processes (ledger and work topics) with
// the message key as the privacy unit, partitioned by `partitioner`.
std::string Shared(const std::string& kafka, const std::string& partitioner) {
  return With(kafka, {{"accounting: global", "accounting: global\n  unit: key\n"
                                              "  max_records_per_unit: 4\n"
                                              "  unit_partitioner: " + partitioner},
                      {"  directory: s\n", "  directory: s\n  ledger_topic: l\n  work_topic: w\n"}});
}

struct EnumReload {
  std::string key;
  std::string running, next;  // the two files
  std::string running_name, file_name;
  bool live = false;  // applied (described) rather than refused
};

std::vector<EnumReload> Cases() {
  const std::string kafka = kKafkaRun;
  std::string blr = With(kafka, kBlrNonPrivate);
  return {
      {"model.type", kafka, With(kafka, {kBlrNonPrivate[0]}), "lda", "blr"},
      {"model.blr.norm_rule", blr, With(blr, {{"norm_rule: rescale", "norm_rule: reject"}}),
       "rescale", "reject"},
      {"privacy.noise", kafka, With(kafka, {{"noise: secure", "noise: fixed_seed"}}), "secure",
       "fixed_seed"},
      {"privacy.accounting", kafka, With(kafka, {{"accounting: global", "accounting: residency"}}),
       "global", "residency"},
      {"privacy.schedule", kafka, With(kafka, {{"schedule: fixed", "schedule: adaptive"}}), "fixed",
       "adaptive"},
      // Left out: the ledger's schedule (or fixed for a new state directory).
      {"privacy.schedule", With(kafka, {{"  schedule: fixed\n", ""}}),
       With(kafka, {{"schedule: fixed", "schedule: adaptive"}}), "not set", "adaptive"},
      {"privacy.unit", kafka,
       With(kafka, {{"accounting: global", "accounting: global\n  unit: key\n"
                                            "  max_records_per_unit: 4"}}),
       "record", "key"},
      {"privacy.unit_partitioner", Shared(kafka, "murmur2"), Shared(kafka, "crc32"), "murmur2",
       "crc32"},
      {"privacy.on_ceiling", kafka, With(kafka, {{"on_ceiling: halt", "on_ceiling: exit"}}), "halt",
       "exit", /*live=*/true},
      {"schedule.on_overrun", kafka, With(kafka, {{"on_overrun: stop", "on_overrun: catch_up"}}),
       "stop", "catch_up"},
      {"source.type", kafka, FileRun(), "kafka", "file"},
      {"source.start_position", kafka,
       With(kafka, {{"start_position: earliest", "start_position: latest"}}), "earliest", "latest"},
      {"source.timestamps", kafka,
       With(kafka, {{"start_position: earliest",
                     "start_position: earliest\n  timestamps: create_time"}}),
       "log_append_time", "create_time"},
      {"sink.type", kafka,
       With(kafka, {{"  type: kafka\n  topic: r", "  type: file\n  directory: o"}}), "kafka",
       "file"},
      {"kafka.embedded", kafka,
       With(kafka, {{"  embedded: false\n  bootstrap_servers: b:9092", "  embedded: true"}}),
       "false", "true"},
      {"state.work_partitions", Shared(kafka, "murmur2"),
       With(Shared(kafka, "murmur2"), {{"  work_topic: w\n", "  work_topic: w\n  work_partitions: false\n"}}),
       "true", "false"},
      // A federated aggregator (issue 31) of the same job: no input.
      {"federation.role",
       With(kafka, {{"  directory: s\n", "  directory: s\n  ledger_topic: l\n  work_topic: w\n"}}),
       With(kafka, {{"  topics: [t]\n", ""},
                    {"  directory: s\n", "  directory: s\n  ledger_topic: l\n  work_topic: w\n"},
                    {"log:\n", "federation:\n  role: aggregator\n  holders:\n    a: " +
                                   std::string(64, '1') + "\n    b: " + std::string(64, '2') +
                                   "\nlog:\n"}}),
       "none", "aggregator"},
      {"metrics.expose_step_timing", kafka,
       With(kafka, {{"expose_step_timing: false", "expose_step_timing: true"}}), "false", "true"},
      {"log.level", kafka, With(kafka, {{"level: info", "level: debug"}}), "info", "debug",
       /*live=*/true},
      {"log.format", kafka, With(kafka, {{"format: logfmt", "format: json"}}), "logfmt", "json",
       /*live=*/true},
  };
}

TEST(ReloadDiffTest, EveryEnumKeyIsNamedByBothOfItsValues) {
  for (const EnumReload& c : Cases()) {
    SCOPED_TRACE(c.key + ": " + c.running_name + " -> " + c.file_name);
    auto running = ParseConfig(c.running, "r.yaml");
    ASSERT_TRUE(running.ok()) << running.status().message();
    auto next = ParseConfig(c.next, "r.yaml");
    ASSERT_TRUE(next.ok()) << next.status().message();
    std::vector<std::string> described;
    auto changed = ChangedReloadableKeys(*running, *next, &described);
    if (c.live) {
      ASSERT_TRUE(changed.ok()) << changed.status().message();
      EXPECT_THAT(described, Contains(c.key + ": " + c.running_name + " -> " + c.file_name));
    } else {
      ASSERT_FALSE(changed.ok());
      EXPECT_THAT(changed.status().message(),
                  HasSubstr(c.key + ": cannot change on reload (running: " + c.running_name +
                            ", file: " + c.file_name + ")"));
    }
  }
}

// The window keyword is spelt too: "all", not 0 (a non-private run: a
// private one refuses all on a stream).
TEST(ReloadDiffTest, AnUnboundedWindowIsSpeltAll) {
  const std::string non_private = With(kKafkaRun, {{"noise_multiplier: 1", "noise_multiplier: 0"}});
  auto running = ParseConfig(non_private, "r.yaml");
  ASSERT_TRUE(running.ok()) << running.status().message();
  auto next = ParseConfig(With(non_private, {{"window_steps: 10", "window_steps: all"}}), "r.yaml");
  ASSERT_TRUE(next.ok()) << next.status().message();
  std::vector<std::string> described;
  ASSERT_TRUE(ChangedReloadableKeys(*running, *next, &described).ok());
  EXPECT_EQ(described, std::vector<std::string>{"schedule.window_steps: 10 -> all"});
}

// Dotted paths of the reference keys whose allowed values are a list of
// names ("secure | fixed_seed"): the enum-typed keys.
std::set<std::string> EnumKeysOfTheReference() {
  std::set<std::string> keys;
  std::vector<std::string> stack;
  std::istringstream lines(ReferenceConfig());
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] == '#') continue;
    const size_t indent = line.find_first_not_of(' ');
    const size_t colon = line.find(':');
    stack.resize(indent / 2);
    stack.push_back(line.substr(indent, colon - indent));
    const size_t hash = line.find("# ");
    const std::string comment = line.substr(hash + 2);
    const std::string kind = comment.substr(0, comment.find(';'));
    const size_t first = comment.find("; ") + 2;
    const std::string allowed = comment.substr(first, comment.find("; ", first) - first);
    if ((kind == "string" || kind == "bool") && allowed.find(" | ") != std::string::npos) {
      std::string path;
      for (const auto& part : stack) path += (path.empty() ? "" : ".") + part;
      keys.insert(path);
    }
  }
  return keys;
}

TEST(ReloadDiffTest, EveryEnumKeyOfTheReferenceHasACase) {
  std::set<std::string> covered;
  for (const EnumReload& c : Cases()) covered.insert(c.key);
  const std::set<std::string> enum_keys = EnumKeysOfTheReference();
  EXPECT_GE(enum_keys.size(), 12u);
  for (const std::string& key : enum_keys) {
    EXPECT_TRUE(covered.count(key)) << key << " has no reload case here";
  }
}

}  // namespace
}  // namespace vipsd::config
