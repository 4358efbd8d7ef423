#include "tools/privacy/privacy_cli.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "core/privacy/accounting/filter_weights.h"
#include "core/privacy/accounting/fixed_schedule.h"
#include "core/privacy/accounting/planner.h"
#include "core/privacy/accounting/rdp_accountant.h"
#include "core/privacy/accounting/residency_accountant.h"

namespace vipsd::tools {
namespace {

using ::testing::HasSubstr;

struct CliResult {
  int code;
  std::string out;
  std::string err;
};

CliResult RunCli(std::vector<std::string> args) {
  std::ostringstream out, err;
  const int code = RunPrivacyCli(args, out, err);
  return {code, out.str(), err.str()};
}

// The number after "key": in a one-line JSON object.
double JsonNumber(const std::string& json, const std::string& key) {
  std::smatch match;
  const std::regex pattern("\"" + key + "\": (-?[0-9.eE+-]+)");
  if (!std::regex_search(json, match, pattern)) {
    ADD_FAILURE() << "no numeric key " << key << " in " << json;
    return NAN;
  }
  return std::stod(match[1]);
}

std::string JsonString(const std::string& json, const std::string& key) {
  std::smatch match;
  const std::regex pattern("\"" + key + "\": \"([^\"]*)\"");
  if (!std::regex_search(json, match, pattern)) {
    ADD_FAILURE() << "no string key " << key << " in " << json;
    return "";
  }
  return match[1];
}

TEST(PrivacyCliTest, EpsilonHumanReadable) {
  CliResult run = RunCli({"epsilon", "--sampling-rate", "0.004", "--noise-multiplier", "1",
                    "--steps", "100", "--delta", "1e-3", "--accountant", "rdp"});
  ASSERT_EQ(run.code, 0) << run.err;
  EXPECT_TRUE(run.err.empty());
  auto expected = privacy::EstimateEpsilon(privacy::AccountantKind::kRdp, {0.004, 1}, 100, 1e-3);
  ASSERT_TRUE(expected.ok());
  char line[64];
  std::snprintf(line, sizeof(line), "epsilon = %.6g at delta = 0.001", expected->epsilon);
  EXPECT_THAT(run.out, HasSubstr(line));
  EXPECT_THAT(run.out, HasSubstr("optimal order"));
  EXPECT_THAT(run.out, HasSubstr("classic conversion"));
}

TEST(PrivacyCliTest, EpsilonJsonHasTheDocumentedKeys) {
  CliResult run = RunCli({"epsilon", "--sampling-rate=0.02", "--noise-multiplier=1.24",
                    "--steps=50", "--delta=1e-5", "--json", "--accountant=rdp"});
  ASSERT_EQ(run.code, 0) << run.err;
  auto expected = privacy::EstimateEpsilon(privacy::AccountantKind::kRdp, {0.02, 1.24}, 50, 1e-5);
  ASSERT_TRUE(expected.ok());
  // Exact round trip of every number.
  EXPECT_EQ(JsonNumber(run.out, "epsilon"), expected->epsilon);
  EXPECT_EQ(JsonNumber(run.out, "order"), *expected->order);
  EXPECT_EQ(JsonNumber(run.out, "epsilon_classic"), *expected->epsilon_classic);
  EXPECT_EQ(JsonNumber(run.out, "delta"), 1e-5);
  EXPECT_EQ(JsonNumber(run.out, "steps"), 50);
  EXPECT_EQ(JsonNumber(run.out, "noise_multiplier"), 1.24);
  EXPECT_EQ(JsonNumber(run.out, "sampling_rate"), 0.02);
  EXPECT_EQ(JsonString(run.out, "accountant"), "rdp");
  EXPECT_EQ(std::count(run.out.begin(), run.out.end(), '\n'), 1);
  EXPECT_EQ(run.out.front(), '{');
}

TEST(PrivacyCliTest, EveryAccountantAnswers) {
  double rdp = 0, pld = 0, strong = 0;
  for (const char* name : {"rdp", "pld", "strong"}) {
    CliResult run = RunCli({"epsilon", "--sampling-rate", "0.02", "--noise-multiplier", "1.24",
                      "--steps", "50", "--delta", "1e-5", "--accountant", name, "--json"});
    ASSERT_EQ(run.code, 0) << name << ": " << run.err;
    EXPECT_EQ(JsonString(run.out, "accountant"), name);
    const double epsilon = JsonNumber(run.out, "epsilon");
    (std::string(name) == "rdp" ? rdp : std::string(name) == "pld" ? pld : strong) = epsilon;
    if (std::string(name) != "rdp") {
      EXPECT_THAT(run.out, ::testing::Not(HasSubstr("order")));
    }
  }
  // PLD is the tightest valid bound; strong composition the loosest.
  EXPECT_LT(pld, rdp);
  EXPECT_LT(rdp, strong);
}

TEST(PrivacyCliTest, SigmaAndStepsRoundTrip) {
  CliResult sigma = RunCli({"sigma", "--target-epsilon", "1", "--sampling-rate", "0.02", "--steps",
                      "50", "--delta", "1e-5", "--json"});
  ASSERT_EQ(sigma.code, 0) << sigma.err;
  const double noise = JsonNumber(sigma.out, "noise_multiplier");
  EXPECT_LE(JsonNumber(sigma.out, "epsilon"), 1.0);
  EXPECT_EQ(JsonNumber(sigma.out, "target_epsilon"), 1.0);
  // With that σ, the budget allows at least the 50 planned steps.
  CliResult steps = RunCli({"steps", "--target-epsilon", "1", "--sampling-rate", "0.02",
                      "--noise-multiplier", std::to_string(noise), "--delta", "1e-5"});
  ASSERT_EQ(steps.code, 0) << steps.err;
  std::smatch match;
  ASSERT_TRUE(std::regex_search(steps.out, match, std::regex("steps = ([0-9]+)")));
  EXPECT_GE(std::stoll(match[1]), 50);
}

TEST(PrivacyCliTest, StepsReportsZeroWhenNothingFits) {
  CliResult run = RunCli({"steps", "--target-epsilon", "0.001", "--sampling-rate", "1",
                    "--noise-multiplier", "0.5", "--delta", "1e-5", "--json"});
  ASSERT_EQ(run.code, 0) << run.err;
  EXPECT_EQ(JsonNumber(run.out, "steps"), 0);
  EXPECT_EQ(JsonNumber(run.out, "epsilon"), 0);
}

TEST(PrivacyCliTest, HelpExitsZero) {
  for (std::vector<std::string> args :
       {std::vector<std::string>{"--help"}, {"epsilon", "--help"}}) {
    CliResult run = RunCli(args);
    EXPECT_EQ(run.code, 0);
    EXPECT_THAT(run.out, HasSubstr("vipsd-privacy epsilon --sampling-rate"));
    EXPECT_THAT(run.out, HasSubstr("--accountant fixed|filter|rdp|pld|strong"));
    EXPECT_THAT(run.out, HasSubstr("vipsd-privacy plan    --config FILE"));
  }
}

// One number everywhere: the default accountant is the daemon's charge for
// its default schedule, and `filter` is its charge for an adaptive one.
TEST(PrivacyCliTest, TheDefaultIsTheDaemonsFixedScheduleChargeAndFilterItsAdaptiveOne) {
  CliResult run = RunCli({"epsilon", "--sampling-rate", "0.1", "--noise-multiplier", "2",
                          "--steps", "150", "--delta", "1e-5", "--json"});
  ASSERT_EQ(run.code, 0) << run.err;
  EXPECT_EQ(JsonString(run.out, "accountant"), "fixed");
  auto fixed = privacy::FixedScheduleAccountant::Create({0.1, 2});
  ASSERT_TRUE(fixed.ok());
  const auto at = fixed->Epsilon(150, 1e-5);
  EXPECT_EQ(JsonNumber(run.out, "epsilon"), at->epsilon);
  EXPECT_EQ(JsonNumber(run.out, "epsilon_pld"), at->pld);
  EXPECT_EQ(JsonNumber(run.out, "epsilon_rdp"), at->rdp);
  run = RunCli({"epsilon", "--sampling-rate", "0.1", "--noise-multiplier", "2", "--steps", "150",
                "--delta", "1e-5", "--json", "--accountant", "filter"});
  ASSERT_EQ(run.code, 0) << run.err;
  // The filter with the split designed for 150 steps.
  privacy::RdpAccountant filter;
  ASSERT_TRUE(filter.Compose({0.1, 2}, 150).ok());
  const double uniform = filter.GetEpsilon(1e-5, privacy::RdpConversion::kImproved,
                                           privacy::Adaptivity::kAdaptiveFilter)->epsilon;
  auto weights = privacy::ConcentratedFilterWeights(privacy::DefaultRdpOrders(), 0.1, 2, 1e-5, 150);
  ASSERT_TRUE(weights.ok());
  ASSERT_TRUE(filter.SetFilterWeights(*weights).ok());
  EXPECT_EQ(JsonNumber(run.out, "epsilon"),
            filter.GetEpsilon(1e-5, privacy::RdpConversion::kImproved,
                              privacy::Adaptivity::kAdaptiveFilter)->epsilon);
  // The filter pays for adaptivity: it is the loosest of the daemon's two,
  // but the concentrated split pays far less than the uniform one.
  EXPECT_GT(JsonNumber(run.out, "epsilon"), at->epsilon);
  EXPECT_LT(JsonNumber(run.out, "epsilon"), uniform - 0.5);
}

TEST(PrivacyCliTest, PlanReadsTheConfigurationAndAnswersWithTheDaemonsAccountant) {
  const std::string examples = std::string(VIPSD_SOURCE_DIR) + "/config/examples/";
  // The demo: global accounting, fixed schedule, q = 0.1, σ = 2, ceiling 4.
  CliResult run = RunCli({"plan", "--config", examples + "demo.yaml", "--json"});
  ASSERT_EQ(run.code, 0) << run.err;
  EXPECT_EQ(JsonString(run.out, "schedule"), "fixed");
  auto fixed = privacy::FixedScheduleAccountant::Create({0.1, 2});
  const int64_t steps = *fixed->MaxSteps(1e-5, 4, int64_t{1} << 40);
  EXPECT_EQ(JsonNumber(run.out, "max_steps"), steps);
  EXPECT_EQ(JsonNumber(run.out, "epsilon"), fixed->Epsilon(steps, 1e-5)->epsilon);
  // A paced run's claim is (ε, δ + β), β = T · the batch tail the
  // worst-case step is timed at (planner.h OverrunBeta), T the steps to the
  // ceiling; the text says the same numbers.
  EXPECT_DOUBLE_EQ(JsonNumber(run.out, "overrun_beta"), privacy::OverrunBeta(steps));
  EXPECT_DOUBLE_EQ(JsonNumber(run.out, "overrun_beta"), steps * privacy::kBatchTailProbability);
  EXPECT_DOUBLE_EQ(JsonNumber(run.out, "delta_plus_beta"), 1e-5 + privacy::OverrunBeta(steps));
  EXPECT_EQ(JsonString(run.out, "on_overrun"), "catch_up");
  // A JSON boolean, not the string "true".
  EXPECT_NE(run.out.find("\"starts\": true}"), std::string::npos) << run.out;
  // The service example (residency, M = 500) is affordable and says so.
  run = RunCli({"plan", "--config", examples + "lda_kafka.yaml"});
  ASSERT_EQ(run.code, 0) << run.err;
  EXPECT_THAT(run.out, HasSubstr("at most 500 steps"));
  EXPECT_THAT(run.out, HasSubstr("(within the ceiling)"));
  EXPECT_THAT(run.out, HasSubstr("overruns: the claim is (epsilon, delta + beta) = ("));
  EXPECT_THAT(run.out, HasSubstr(", 1.5e-06) with beta = 500 x 1e-09 = 5e-07"));
  // An unaffordable window: exit 1 and the reason.
  const std::string dir = ::testing::TempDir() + "privacy_cli_plan";
  std::filesystem::create_directories(dir);
  std::ifstream in(examples + "lda_kafka.yaml");
  std::stringstream text;
  text << in.rdbuf();
  std::string yaml = text.str();
  yaml.replace(yaml.find("window_steps: 500"), 17, "window_steps: 5000");
  std::ofstream(dir + "/lda_kafka.yaml") << yaml;
  run = RunCli({"plan", "--config", dir + "/lda_kafka.yaml"});
  EXPECT_EQ(run.code, 1) << run.out << run.err;
  EXPECT_THAT(run.out, HasSubstr("OVER the ceiling"));
  // The same service example with an adaptive schedule: the window's ε is
  // the daemon's start-up check under the split a new directory gets.
  yaml.replace(yaml.find("window_steps: 5000"), 18, "window_steps: 500");
  yaml.replace(yaml.find("schedule: fixed"), 15, "schedule: adaptive");
  std::ofstream(dir + "/lda_kafka_adaptive.yaml") << yaml;
  run = RunCli({"plan", "--config", dir + "/lda_kafka_adaptive.yaml", "--json"});
  ASSERT_EQ(run.code, 0) << run.out << run.err;
  EXPECT_EQ(JsonString(run.out, "schedule"), "adaptive");
  EXPECT_EQ(JsonString(run.out, "accountant"), "filter");
  auto weights = privacy::DesignFilterWeights(0.01, 1.1, 1e-6, 2.0, 500);
  ASSERT_TRUE(weights.ok());
  auto check = privacy::ResidencyAccountant::CheckConfiguration(
      500, {0.01, 1.1}, {2.0, 1e-6}, privacy::Adaptivity::kAdaptiveFilter, *weights);
  ASSERT_TRUE(check.ok());
  EXPECT_EQ(JsonNumber(run.out, "window_epsilon"), check->epsilon_after);
  EXPECT_EQ(JsonNumber(run.out, "max_window_steps"),
            *privacy::MaxResidencyWindow(privacy::AccountantKind::kFilter, 2.0, 0.01, 1.1, 1e-6));
  // Residency: β counts the window's steps, the ones a record's claim covers.
  EXPECT_DOUBLE_EQ(JsonNumber(run.out, "overrun_beta"), privacy::OverrunBeta(500));
  EXPECT_DOUBLE_EQ(JsonNumber(run.out, "delta_plus_beta"), 1e-6 + privacy::OverrunBeta(500));
  // A bad file: the configuration's own message, exit 2.
  run = RunCli({"plan", "--config", dir + "/missing.yaml"});
  EXPECT_EQ(run.code, 2);
  EXPECT_THAT(run.err, HasSubstr("missing.yaml"));
}

struct InvalidCase {
  std::vector<std::string> args;
  std::string must_name;  // the flag (or word) the one-line error must name
};

TEST(PrivacyCliTest, InvalidArgumentsGiveOneLineNamingTheFlagAndExitTwo) {
  const std::vector<std::string> ok_tail = {"--noise-multiplier", "1", "--steps", "10",
                                            "--delta", "1e-5"};
  auto epsilon_with_rate = [&](const std::string& rate) {
    std::vector<std::string> args = {"epsilon", "--sampling-rate", rate};
    args.insert(args.end(), ok_tail.begin(), ok_tail.end());
    return args;
  };
  const std::vector<InvalidCase> cases = {
      {epsilon_with_rate("0"), "--sampling-rate"},
      {epsilon_with_rate("1.5"), "--sampling-rate"},
      {epsilon_with_rate("-0.1"), "--sampling-rate"},
      {epsilon_with_rate("abc"), "--sampling-rate"},
      {epsilon_with_rate("0.1x"), "--sampling-rate"},
      {epsilon_with_rate("nan"), "--sampling-rate"},
      {{"epsilon", "--sampling-rate", "0.1", "--noise-multiplier", "0", "--steps", "10",
        "--delta", "1e-5"},
       "--noise-multiplier"},
      {{"epsilon", "--sampling-rate", "0.1", "--noise-multiplier", "-2", "--steps", "10",
        "--delta", "1e-5"},
       "--noise-multiplier"},
      {{"epsilon", "--sampling-rate", "0.1", "--noise-multiplier", "1", "--steps", "10",
        "--delta", "0"},
       "--delta"},
      {{"epsilon", "--sampling-rate", "0.1", "--noise-multiplier", "1", "--steps", "10",
        "--delta", "1"},
       "--delta"},
      {{"epsilon", "--sampling-rate", "0.1", "--noise-multiplier", "1", "--steps", "2.5",
        "--delta", "1e-5"},
       "--steps"},
      {{"epsilon", "--sampling-rate", "0.1", "--noise-multiplier", "1", "--steps", "0",
        "--delta", "1e-5"},
       "--steps"},
      {{"epsilon", "--sampling-rate", "0.1", "--noise-multiplier", "1", "--delta", "1e-5"},
       "--steps"},
      {{"epsilon", "--sampling-rate", "0.1", "--noise-multiplier", "1", "--steps", "10",
        "--delta", "1e-5", "--accountant", "moments"},
       "--accountant"},
      {{"epsilon", "--sampling-rate", "0.1", "--noise-multiplier", "1", "--steps", "10",
        "--delta", "1e-5", "--target-epsilon", "1"},
       "--target-epsilon"},
      {{"sigma", "--target-epsilon", "zero", "--sampling-rate", "0.1", "--steps", "10",
        "--delta", "1e-5"},
       "--target-epsilon"},
      {{"steps", "--target-epsilon", "1", "--sampling-rate", "0.1", "--noise-multiplier",
        "1", "--delta"},
       "--delta"},
      {{"epsilon", "--sampling-rate", "0.1", "--sampling-rate", "0.2"}, "--sampling-rate"},
      {{"budget"}, "budget"},
      {{}, "command"},
  };
  for (const InvalidCase& c : cases) {
    CliResult run = RunCli(c.args);
    std::string joined;
    for (const auto& a : c.args) joined += a + " ";
    EXPECT_EQ(run.code, 2) << joined;
    EXPECT_TRUE(run.out.empty()) << joined;
    EXPECT_EQ(std::count(run.err.begin(), run.err.end(), '\n'), 1) << joined << run.err;
    EXPECT_THAT(run.err, HasSubstr(c.must_name)) << joined;
    EXPECT_THAT(run.err, HasSubstr("vipsd-privacy: ")) << joined;
  }
}

// The real executable: exit status and streams as a shell sees them.
CliResult RunBinary(const std::string& args) {
  const std::string err_file = ::testing::TempDir() + "vipsd_privacy_stderr.txt";
  const std::string command = std::string(VIPSD_PRIVACY_BINARY) + " " + args + " 2>" + err_file;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return {-1, "", "popen failed"};
  std::string out;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
  const int status = pclose(pipe);
  std::string err;
  if (FILE* f = std::fopen(err_file.c_str(), "r")) {
    while ((n = fread(buffer, 1, sizeof(buffer), f)) > 0) err.append(buffer, n);
    std::fclose(f);
  }
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out, err};
}

TEST(PrivacyCliBinaryTest, ValidAndInvalidInvocations) {
  CliResult ok = RunBinary(
      "epsilon --sampling-rate 0.004 --noise-multiplier 1 --steps 100 --delta 1e-3 --json");
  EXPECT_EQ(ok.code, 0) << ok.err;
  EXPECT_THAT(ok.out, HasSubstr("\"epsilon\": "));
  EXPECT_TRUE(ok.err.empty()) << ok.err;
  CliResult bad = RunBinary("epsilon --sampling-rate 2 --noise-multiplier 1 --steps 100 --delta 1e-3");
  EXPECT_EQ(bad.code, 2);
  EXPECT_TRUE(bad.out.empty());
  EXPECT_THAT(bad.err, HasSubstr("--sampling-rate must be a number in (0, 1], got '2'"));
}

}  // namespace
}  // namespace vipsd::tools
