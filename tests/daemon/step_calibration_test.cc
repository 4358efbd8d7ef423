// The batch-size bound of the worst-case step timing (daemon/step_calibration.h)
// against the exact binomial tail, summed in log space.
#include "daemon/step_calibration.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>

#include "config/config.h"

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

}  // namespace
}  // namespace vipsd::daemon
