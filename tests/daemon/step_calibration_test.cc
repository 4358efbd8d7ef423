// The batch-size bound of the worst-case step timing (daemon/step_calibration.h)
// against the exact binomial tail, summed in log space.
#include "daemon/step_calibration.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

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

}  // namespace
}  // namespace vipsd::daemon
