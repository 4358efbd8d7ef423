// The batch-size bound of the worst-case step timing (daemon/setup/step_calibration.h)
// against the exact binomial tail, summed in log space.
#include "daemon/setup/step_calibration.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "config/config.h"
#include "daemon/setup/federation.h"

namespace vipsd::daemon {
namespace {

// ln P[Binomial(n, q) ≥ b], exactly (log-sum-exp over the tail terms).
double LogUpperTail(int64_t n, double q, int64_t b) {
  auto log_term = [&](int64_t k) {
    return std::lgamma(n + 1.0) - std::lgamma(k + 1.0) - std::lgamma(n - k + 1.0) +
           k * std::log(q) + (n - k) * std::log1p(-q);
  };
  double top = log_term(b);
  for (int64_t k = b; k <= n; ++k) top = std::max(top, log_term(k));
  double sum = 0;
  for (int64_t k = b; k <= n; ++k) sum += std::exp(log_term(k) - top);
  return top + std::log(sum);
}

TEST(StepCalibrationTest, TheBatchBoundIsExceededWithProbabilityBelowOneInABillionAndIsNotLoose) {
  const struct {
    int64_t n;
    double q;
  } cases[] = {{20000, 0.1}, {100000, 0.01}, {5000, 0.5}, {1000, 0.001}, {300, 0.9}};
  for (const auto& c : cases) {
    const int64_t b = BatchBound(c.n, c.q);
    SCOPED_TRACE(std::to_string(c.n) + " at " + std::to_string(c.q) + ": " + std::to_string(b));
    EXPECT_GT(b, c.q * c.n);
    EXPECT_LE(b, c.n);
    // A bound: the exact tail at b is below 1e-9 ...
    EXPECT_LT(LogUpperTail(c.n, c.q, b), std::log(1e-9));
    // ... and not a loose one: a batch 25 % closer to the mean still has a
    // tail above 1e-12 (the Chernoff bound overshoots by a little only).
    const auto closer = static_cast<int64_t>(c.q * c.n + 0.75 * (b - c.q * c.n));
    if (closer > c.q * c.n) {
      EXPECT_GT(LogUpperTail(c.n, c.q, closer), std::log(1e-12));
    }
  }
  EXPECT_EQ(BatchBound(1000, 1.0), 1000);
  EXPECT_EQ(BatchBound(0, 0.5), 0);
}

// The Kafka example with `schedule` replaced and the demo vocabulary.
config::VipsdConfig KafkaExampleWith(const std::string& schedule) {
  const std::string source = VIPSD_SOURCE_DIR;
  std::ifstream in(source + "/config/examples/lda_kafka.yaml");
  std::ostringstream buffer;
  buffer << in.rdbuf();
  std::string text = buffer.str();
  const size_t begin = text.find("schedule:\n");
  const size_t end = text.find("pool:\n");
  EXPECT_TRUE(begin != std::string::npos && end != std::string::npos);
  text.replace(begin, end - begin, schedule);
  const size_t vocabulary = text.find("vocabulary: demo/vocab.txt");
  EXPECT_NE(vocabulary, std::string::npos);
  text.replace(vocabulary, 26, "vocabulary: " + source + "/config/examples/demo/vocab.txt");
  auto config = config::ParseConfig(text, "c.yaml");
  EXPECT_TRUE(config.ok()) << config.status().ToString();
  return config.ok() ? *config : config::VipsdConfig{};
}

// A slot shorter than the step's CPU time spread over its threads is
// refused whatever the machine's load (no step near the batch bound could
// meet its deadline even on an idle machine); a long slot is neither
// refused nor warned about. The figures are consistent with each other.
TEST(StepCalibrationTest, ASlotShorterThanTheStepsWorkOverItsThreadsIsRefusedALongOneFits) {
  const std::string common =
      "schedule:\n  tau0: 64\n  kappa: 0.7\n  threads: 2\n  window_steps: 500\n";
  auto short_slot = CalibrateWorstCaseStep(KafkaExampleWith(
      common + "  interval_seconds: 0.01\n  release_delay_seconds: 0.01\n"));
  ASSERT_TRUE(short_slot.ok()) << short_slot.status().ToString();
  EXPECT_TRUE(short_slot->refused) << short_slot->text;
  EXPECT_FALSE(short_slot->fits);
  EXPECT_DOUBLE_EQ(short_slot->budget_seconds, 0.01 - 0.0025);  // delay − default grace
  EXPECT_EQ(short_slot->batch_bound, BatchBound(100000, 0.01));
  EXPECT_GE(short_slot->usable_threads, 1);
  EXPECT_LE(short_slot->usable_threads, 2);
  EXPECT_DOUBLE_EQ(short_slot->floor_seconds,
                   short_slot->cpu_seconds / short_slot->usable_threads);
  EXPECT_GT(short_slot->floor_seconds, short_slot->budget_seconds);
  // Wall time is at least the work spread over the threads (up to clock
  // granularity).
  EXPECT_GE(short_slot->step_seconds, 0.9 * short_slot->floor_seconds);
  EXPECT_NE(short_slot->text.find("even on an idle machine: every step near this batch would "
                                  "overrun its deadline; raise schedule.interval_seconds"),
            std::string::npos)
      << short_slot->text;

  auto long_slot = CalibrateWorstCaseStep(KafkaExampleWith(
      common + "  interval_seconds: 600\n  release_delay_seconds: 600\n"));
  ASSERT_TRUE(long_slot.ok()) << long_slot.status().ToString();
  EXPECT_FALSE(long_slot->refused) << long_slot->text;
  EXPECT_TRUE(long_slot->fits) << long_slot->text;
  EXPECT_DOUBLE_EQ(long_slot->budget_seconds, 599);  // grace: min(1, 600/4)
  EXPECT_EQ(long_slot->text.find("overrun"), std::string::npos) << long_slot->text;
}

// Issue 49: the claim's β needs the worst-case step to fit with margin, so
// a run whose claim depends on it (margin_required: private with
// on_overrun: stop, or a holder) is refused without it; any other run is
// warned. The faster run decides (the machine at its least loaded); the
// slower only warns. The idle floor refuses every run.
TEST(StepCalibrationTest, WithoutMarginAStopRunIsRefusedACatchUpRunWarned) {
  auto judged = [](double fastest, double slowest, double floor, bool margin_required) {
    StepCalibration timing;
    timing.fastest_seconds = fastest;
    timing.step_seconds = slowest;
    timing.floor_seconds = floor;
    timing.budget_seconds = 1.0;
    timing.margin_required = margin_required;
    JudgeStepTiming(timing);
    return timing;
  };
  // 1.5 x 0.6 = 0.9 fits 1 s; 1.5 x 0.8 = 1.2 does not.
  for (const bool required : {true, false}) {
    SCOPED_TRACE(required ? "margin required" : "margin not required");
    const StepCalibration fits = judged(0.6, 0.6, 0.3, required);
    EXPECT_TRUE(fits.fits);
    EXPECT_FALSE(fits.busy);
    EXPECT_FALSE(fits.refused);

    const StepCalibration busy = judged(0.6, 0.8, 0.3, required);  // only the slower run is over
    EXPECT_TRUE(busy.fits);
    EXPECT_TRUE(busy.busy);
    EXPECT_FALSE(busy.refused);

    const StepCalibration tight = judged(0.8, 0.9, 0.5, required);  // under 1 s, not under 1/1.5
    EXPECT_FALSE(tight.fits);
    EXPECT_FALSE(tight.refused_idle);
    EXPECT_EQ(tight.refused, required);

    const StepCalibration idle = judged(1.4, 1.5, 1.1, required);  // over even when idle
    EXPECT_TRUE(idle.refused_idle);
    EXPECT_TRUE(idle.refused);
  }
}

// A private run that stops at overruns (the default) with a slot its
// worst-case step fits only without margin is refused, naming why; the same
// slot under catch_up is warned. The slot is set from a first timing, at
// 1.05 x its faster run: under 1.5 x any second timing unless the machine
// became much faster, over the idle floor.
TEST(StepCalibrationTest, TheMarginIsRequiredOfAPrivateRunThatStopsAtOverruns) {
  const std::string common =
      "schedule:\n  tau0: 64\n  kappa: 0.7\n  threads: 1\n  window_steps: 500\n";
  auto first = CalibrateWorstCaseStep(KafkaExampleWith(
      common + "  interval_seconds: 600\n  release_delay_seconds: 600\n"));
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_TRUE(first->margin_required);  // private, on_overrun: stop by default
  const double slot = 1.05 * first->fastest_seconds + 0.02;  // + the default grace (slot / 4, at most 1)
  char times[160];
  std::snprintf(times, sizeof times,
                "  interval_seconds: %.6f\n  release_delay_seconds: %.6f\n  cut_grace_seconds: 0.01\n",
                slot, slot);
  for (const std::string overrun : {"stop", "catch_up"}) {
    SCOPED_TRACE(overrun);
    auto timing = CalibrateWorstCaseStep(
        KafkaExampleWith(common + times + "  on_overrun: " + overrun + "\n"));
    ASSERT_TRUE(timing.ok()) << timing.status().ToString();
    if (timing->fits || timing->refused_idle) {
      GTEST_SKIP() << "the machine's speed changed between the timings: " << timing->text;
    }
    EXPECT_EQ(timing->margin_required, overrun == "stop");
    EXPECT_EQ(timing->refused, overrun == "stop") << timing->text;
    EXPECT_NE(timing->text.find(overrun == "stop"
                                    ? "a private run that stops at an overrun "
                                      "(schedule.on_overrun: stop) is refused"
                                    : "schedule.on_overrun: catch_up shows how late they are"),
              std::string::npos)
        << timing->text;
  }
}

// The federated holder example with its share delay and overrun action
// set (and the demo vocabulary).
config::VipsdConfig HolderExampleWith(double share_delay, const std::string& overrun) {
  const std::string source = VIPSD_SOURCE_DIR;
  std::ifstream in(source + "/config/examples/federation/holder.yaml");
  std::ostringstream buffer;
  buffer << in.rdbuf();
  std::string text = buffer.str();
  auto replace = [&](const std::string& from, const std::string& to) {
    const size_t at = text.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    text.replace(at, from.size(), to);
  };
  replace("vocabulary: ../demo/vocab.txt",
          "vocabulary: " + source + "/config/examples/demo/vocab.txt");
  char delay[64];
  std::snprintf(delay, sizeof delay, "share_delay_seconds: %.6f", share_delay);
  replace("share_delay_seconds: 4", delay);
  // The aggregator's timeout past the share time, as the schema requires.
  std::snprintf(delay, sizeof delay, "round_timeout_seconds: %.6f", share_delay + 10);
  replace("round_timeout_seconds: 8", delay);
  const std::string key = ::testing::TempDir() + "step_calibration_holder.key";
  std::filesystem::remove(key);
  EXPECT_TRUE(WriteNewHolderKey(key).ok());
  replace("secret_key: {file: holder.key}", "secret_key: {file: " + key + "}");
  replace("schedule:\n", "schedule:\n  on_overrun: " + overrun + "\n");
  auto config = config::ParseConfig(text, "holder.yaml");
  EXPECT_TRUE(config.ok()) << config.status().ToString();
  return config.ok() ? *config : config::VipsdConfig{};
}

// A holder's share leaves at its share time or never, so its claim always
// needs the margin: a share delay its worst-case round fits only without
// margin is refused whatever schedule.on_overrun says, naming the key to
// raise; a long one fits. Its budget is federation.share_delay_seconds,
// not the slot's.
TEST(StepCalibrationTest, AHolderNeedsTheMarginWithinItsShareDelayWhateverItsOverrunAction) {
  auto first = CalibrateWorstCaseStep(HolderExampleWith(600, "stop"));
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_TRUE(first->margin_required);
  EXPECT_TRUE(first->fits) << first->text;
  EXPECT_FALSE(first->refused) << first->text;
  EXPECT_DOUBLE_EQ(first->budget_seconds, 600);
  EXPECT_EQ(first->budget_key, "federation.share_delay_seconds");
  EXPECT_NE(first->text.find("a round gives its share 600 s (federation.share_delay_seconds)"),
            std::string::npos)
      << first->text;
  const double delay = 1.05 * first->fastest_seconds;
  for (const std::string overrun : {"stop", "catch_up"}) {
    SCOPED_TRACE(overrun);
    auto timing = CalibrateWorstCaseStep(HolderExampleWith(delay, overrun));
    ASSERT_TRUE(timing.ok()) << timing.status().ToString();
    if (timing->fits || timing->refused_idle) {
      GTEST_SKIP() << "the machine's speed changed between the timings: " << timing->text;
    }
    EXPECT_TRUE(timing->margin_required);
    EXPECT_TRUE(timing->refused) << timing->text;
    EXPECT_NE(timing->text.find("raise federation.share_delay_seconds (below the aggregator's "
                                "round_timeout_seconds)"),
              std::string::npos)
        << timing->text;
  }
}

}  // namespace
}  // namespace vipsd::daemon
