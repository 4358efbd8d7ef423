// The worst-case step, timed on public synthetic records (issue 26): how
// long one step of the configured model takes at the batch size that
// Poisson sampling exceeds with probability below 1e-9, against the time a
// slot gives a step. `vipsd --check-config` and every start of a Kafka
// source run it:
//   * refused: the step's CPU time divided by the threads it can use
//     (schedule.threads, at most the CPUs this process may run on) exceeds
//     the slot's budget. That is a lower bound on the step's wall time even
//     on an idle machine (a step cannot be faster than its work spread
//     perfectly over its threads), and it barely moves with the machine's
//     load (CPU time is counted only while the step runs), so every step
//     near the batch bound would overrun: --check-config fails and vipsd
//     does not start, naming the key, its line and the figures.
//   * warned: the measured wall time × kCalibrationSafety exceeds the
//     budget. Wall time does move with load (CI measured the demo's at
//     twice an idle machine's), so it warns and never refuses.
// A reload is not timed (it would stall the slot it runs in): check the
// new file with --check-config first (docs/operations.md).
//
// What is timed: a fresh model of the configured type and size (the same
// BuildModel a start uses, so the LDA vocabulary is read), one StepDriver
// with the configured threads and σ, q = 1 over B synthetic records — LDA:
// documents of resample_length words (100 when it is 0) drawn uniformly
// from the vocabulary; BLR: d standard normal features and a 0/1 label;
// SBN: J binary features — twice; the slower wall time of the two counts
// (erring towards a warning) and the smaller CPU time (erring towards not
// refusing). The LDA
// and SBN E-steps run their configured maximum of iterations on every
// record (the tolerance is set to the smallest double), the most any real
// record can take. Nothing is
// released and no private record is touched: the records are made from a
// fixed public seed. Above kCalibrationRecords the measured time is scaled
// linearly (the E-step is linear in the batch; the noise and M-step are
// not, so the scaling overstates them, which errs on the safe side).
//
// The batch bound B: the smallest b with the Chernoff bound
// exp(−N·KL(b/N ‖ q)) ≤ 1e-9 on P[Binomial(N, q) ≥ b], N = pool.capacity
// (with a privacy unit, times max_records_per_unit, at most N).
//
// The budget: a step may run from its cut's read (slot time +
// cut_grace_seconds) to its release deadline (slot time +
// release_delay_seconds), and steps run one after another, so it gets
// min(release_delay_seconds − cut_grace_seconds, interval_seconds). A
// federated holder's round (reading its window, its E-step, its share) gets
// federation.share_delay_seconds: its share leaves then or never
// (daemon/holder.h).
#pragma once

#include <cstdint>
#include <string>

#include "config/config.h"
#include "core/base/status.h"

namespace vipsd::daemon {

inline constexpr int64_t kCalibrationRecords = 5000;
inline constexpr double kCalibrationSafety = 1.5;

struct StepCalibration {
  int64_t batch_bound = 0;     // B
  int64_t timed_records = 0;   // min(B, kCalibrationRecords)
  double step_seconds = 0;     // the worst-case step, scaled to B
  // min(release_delay − cut_grace, interval) seconds; a federated holder's:
  // federation.share_delay_seconds (from the plan to its share time).
  double budget_seconds = 0;
  std::string budget_key;      // the key that sets it (messages name it)
  double cpu_seconds = 0;      // its CPU time over all threads, scaled to B
  // min(threads a step runs at once, CPUs this process may use): the step's
  // threads, plus the one that draws the noise ahead in a private run with
  // schedule.threads > 1 or on a shared-work coordinator
  // (svi::StepDriver::DrawNoiseAhead).
  int usable_threads = 1;
  double floor_seconds = 0;    // cpu_seconds / usable_threads: no faster on an idle machine
  bool fits = true;            // kCalibrationSafety · step_seconds ≤ budget_seconds
  bool refused = false;        // floor_seconds > budget_seconds
  std::string text;            // one line: the figures, and what to change if !fits
};

// P[Binomial(n, q) ≥ b] ≤ 1e-9 by the Chernoff bound: the smallest such b.
int64_t BatchBound(int64_t n, double q);

// Kafka sources only (FailedPrecondition otherwise).
StatusOr<StepCalibration> CalibrateWorstCaseStep(const config::VipsdConfig& config);

}  // namespace vipsd::daemon
