#include "config/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

namespace vipsd::config {
namespace {

using ::testing::HasSubstr;

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
  EXPECT_DOUBLE_EQ(config->driver.noise_multiplier, 1.0);
  EXPECT_DOUBLE_EQ(config->driver.sampling_rate, 0.01);
  EXPECT_DOUBLE_EQ(config->driver.epsilon_ceiling, 3.0);
  EXPECT_DOUBLE_EQ(config->driver.tau0, 64);
  EXPECT_EQ(config->driver.threads, 2);
  EXPECT_EQ(config->publish_every, 10);
  EXPECT_EQ(config->noise_mode, NoiseMode::kSecure);
  // Relative paths are resolved against the configuration file.
  EXPECT_EQ(config->vocabulary_path, "/etc/vipsd/vocab.txt");
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
       "f.yaml:23: schedule.kappa: must be a number in (0.5, 1], got '0.5'"},
      {With("    topics: 20 ", "    topics: many "),
       "f.yaml:6: model.lda.topics: must be a whole number in [1, 100000], got 'many'"},
      {With("  type: lda ", "  type: gmm "), "f.yaml:4: model.type: must be one of lda, got 'gmm'"},
      {With("  noise: secure ", "  noise: weak "),
       "privacy.noise: must be one of secure, fixed_seed, got 'weak'"},
      {With("  publish_every: 10", "  publish_every: 10\n  colour: blue"),
       "f.yaml:34: sink.colour: unknown key"},
      {With("  tau0: 64", "  tau0: 64\n  tau0: 65"), "f.yaml:23: schedule.tau0: duplicate key"},
      {With("    alpha: 0.05 ", "    # alpha removed "), "model.lda.alpha: required key is missing"},
      {With("  threads: 2 ", "  threads: [1, 2] "), "schedule.threads: must be a whole number"},
      {With("  noise: secure ", "  noise: secure\n  noise_seed: 5 "),
       "privacy.noise_seed: only allowed with noise: fixed_seed"},
      {With("    resample_length: 500", "    resample_length: 0"),
       "model.lda.resample_length: must be >= 1 when privacy.noise_multiplier > 0"},
      {With("model:", "model: [unclosed"), "f.yaml:"},
      {"model: 3\n", "f.yaml:1: model: must be a mapping"},
  };
  for (const Bad& bad : cases) {
    auto config = ParseConfig(bad.text, "f.yaml");
    ASSERT_FALSE(config.ok()) << bad.expected;
    EXPECT_THAT(config.status().message(), HasSubstr(bad.expected));
    EXPECT_EQ(std::count(config.status().message().begin(), config.status().message().end(), '\n'), 0);
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

TEST(ConfigTest, MissingFileIsReportedByName) {
  auto config = LoadConfigFile("/nonexistent/vipsd.yaml");
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(), HasSubstr("/nonexistent/vipsd.yaml"));
}

}  // namespace
}  // namespace vipsd::config
