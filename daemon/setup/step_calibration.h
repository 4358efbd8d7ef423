// The worst-case step, timed on public synthetic records (issues 26, 49):
// how long one step of the configured model takes at the batch size that
// Poisson sampling exceeds with probability below 1e-9, against the time a
// slot gives a step. `vipsd --check-config`, every start of a Kafka source
// and every reload that changes a key in StepCostKeys() run it:
//   * refused, always: the step's CPU time divided by the threads it can
//     use (at most the CPUs this process may run on) exceeds the slot's
//     budget. That is a lower bound on the step's wall time even on an idle
//     machine, and it barely moves with the machine's load, so every step
//     near the batch bound would overrun.
//   * refused when the claim needs the margin (margin_required: a private
//     run with schedule.on_overrun: stop, or a federated holder): the
//     faster of two timed runs × kCalibrationSafety exceeds the budget.
//     The claim is (ε, δ + β) with β the chance of a batch above B
//     (planner.h OverrunBeta) only when the worst-case step fits with
//     margin (SECURITY.md "Overruns"); the faster run is the machine's
//     load at its least, so a busy moment does not refuse a configuration
//     an idle machine runs with margin.
//   * warned otherwise: the faster run without margin (catch_up or a
//     non-private run: β is then not bounded, and said so), or the slower
//     run × kCalibrationSafety over the budget (a machine this busy).
// A refusal at --check-config or a start exits 2 naming the key, its line
// and the figures; at a reload the running configuration stays
// (daemon_reload.cc). The timing takes the step thread for about two
// worst-case steps; a reload runs between slots, so the slot after it may
// be late and then runs no step (a public, data-independent delay: the
// records are synthetic).
//
// What is timed: a fresh model of the configured type and size (the same
// BuildModel a start uses, so the LDA vocabulary is read), one StepDriver
// with the configured threads and σ, q = 1 over B synthetic records — LDA:
// documents of resample_length words (100 when it is 0) drawn uniformly
// from the vocabulary; BLR: d standard normal features and a 0/1 label;
// SBN: J binary features — twice. The LDA and SBN E-steps run their
// configured maximum of iterations on every record (the tolerance is set
// to the smallest double), the most any real record can take. With each
// step: the sample's keyed words over a full pool (pool.capacity
// candidates; timed on at most kCalibrationWords and scaled), and, on a
// thread beside them as in a run (LedgerKeeper::PrefetchNextCheck), a
// fixed schedule's check of the next step — one PLD composition of
// check_steps steps from a fresh accountant, beside both runs while it
// lasts. The check takes CPU from the step as in a
// run, but its own length is not the step's: it depends on q, σ and the
// count only, never on the data, so a check longer than the slot delays
// steps whatever the data (an availability problem, said in the text, and
// not an event β must bound).
// Nothing is released and no private record is touched: the records are
// made from a fixed public seed. Above kCalibrationRecords the step's time
// is scaled linearly (the E-step is linear in the batch; the noise and
// M-step are not, so the scaling overstates them, which errs on the safe
// side). Not timed: the ledger commit and the release, which come after
// the deadline (daemon.cc ProcessSlot) and take from the next step only
// when release_delay_seconds − cut_grace_seconds is close to the interval;
// a shared-work coordinator's exchange with its workers (their steps are
// at most this one: a worker's batch is part of the slot's), a holder's
// share on the work topic.
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
// (daemon/step/holder.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/base/status.h"

namespace vipsd::daemon {

inline constexpr int64_t kCalibrationRecords = 5000;
inline constexpr double kCalibrationSafety = 1.5;
inline constexpr int64_t kCalibrationCheckSteps = 10000;
inline constexpr int64_t kCalibrationWords = 1 << 20;

struct StepCalibration {
  int64_t batch_bound = 0;     // B
  int64_t timed_records = 0;   // min(B, kCalibrationRecords)
  // A fixed schedule's check beside the step: ε of this many steps (the
  // smallest of schedule.max_steps, twice what the ceiling admits by RDP,
  // and kCalibrationCheckSteps); 0: none timed.
  int64_t check_steps = 0;
  double check_seconds = 0;    // its wall time (one composition, beside both runs)
  // The worst-case step (its sample's words and the step), scaled to B,
  // timed with the check beside it: the slower of the two runs
  // (step_seconds) and the faster (fastest_seconds).
  double step_seconds = 0;
  double fastest_seconds = 0;
  // min(release_delay − cut_grace, interval) seconds; a federated holder's:
  // federation.share_delay_seconds (from the plan to its share time).
  double budget_seconds = 0;
  std::string budget_key;      // the key that sets it (messages name it)
  double cpu_seconds = 0;      // the step's CPU time over all its threads, scaled to B
  // min(threads the step runs at once, CPUs this process may use): its
  // threads, plus the one that draws the noise ahead in a private run with
  // schedule.threads > 1 or on a shared-work coordinator
  // (svi::StepDriver::DrawNoiseAhead).
  int usable_threads = 1;
  double floor_seconds = 0;    // cpu_seconds / usable_threads: no faster on an idle machine
  // kCalibrationSafety · fastest_seconds ≤ budget_seconds: the worst-case
  // step fits with margin, so β (planner.h OverrunBeta) is bounded.
  bool fits = true;
  bool busy = false;           // kCalibrationSafety · step_seconds > budget_seconds
  // fits is required: a private run with schedule.on_overrun: stop (not an
  // aggregator, whose rounds' times do not depend on data), or a holder.
  bool margin_required = false;
  bool refused_idle = false;   // floor_seconds > budget_seconds
  bool refused = false;        // refused_idle, or margin_required && !fits
  std::string text;            // one line: the figures, and what to change unless fits && !busy
};

// P[Binomial(n, q) ≥ b] ≤ 1e-9 by the Chernoff bound: the smallest such b.
int64_t BatchBound(int64_t n, double q);

// Kafka sources only (FailedPrecondition otherwise).
StatusOr<StepCalibration> CalibrateWorstCaseStep(const config::VipsdConfig& config);

// Sets fits, busy, refused_idle and refused from the figures, the budget
// and margin_required (the rules above).
void JudgeStepTiming(StepCalibration& timing);

// The live-reloadable keys the timing or its budget depends on: a reload
// that changes one is timed before it applies (daemon_reload.cc).
const std::vector<std::string>& StepCostKeys();

}  // namespace vipsd::daemon
