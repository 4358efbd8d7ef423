// Holder: a data holder of a federation (federation.role: holder; issue 31,
// docs/federation.md). It reads its own input (source.topics, its own
// consumer group) and follows the aggregator's federated plans
// (daemon/io/work_exchange.h FederatedPlan; daemon/step/aggregator.cc):
//
//   for a round that names it, it checks the plan against its own
//   configuration (roster, record settings, q, σ, tolerated_holders) and
//   its own budget, cuts its partitions at the slot's cut time (the cut rule
//   of core/svi/slot_windows.h, its window of schedule.window_steps slots),
//   CHARGES the step to its own ledger (svi::StepDriver::Begin: its own
//   accountant, its own ceiling, a step key of its own that the aggregator
//   never learns), sums its sampled records on the noise grid, adds its
//   noise share N_Z(0, s²) with s² = ⌈σ_g²/(n − t)⌉
//   (core/privacy/mechanisms/distributed_noise.h), masks the result with its pair pads
//   for the round (core/privacy/mechanisms/secure_aggregation.h), COMMITS its ledger —
//   the charge, the cuts and the round, which is its last masked round —
//   and only then appends the masked share.
//
// When it speaks (docs/federation.md "What the aggregator learns"):
//   * JOIN, with its FederationTerms, once its input partitions are all
//     assigned to it: every 3 s until a plan names it, then not while plans
//     keep naming it; again at a plan that does not name it, and every 30 s
//     when no plan at all arrives for 30 s (the aggregator restarted or
//     halted). The aggregator refuses a join whose terms differ
//     (FederatedRefusal: the holder stops, exit 2, with the keys named), so a
//     mismatch is never charged.
//   * its SHARE, at the plan's public time issued_ms +
//     federation.share_delay_seconds, never earlier, whatever its data. A
//     share not ready by then is never sent.
//   * a DECLINE with a public reason at once (its ceiling; a plan received
//     after its share time; named before it joined since its start).
//   * data-dependent failures — its window over pool.capacity, its input not
//     read to the cut by the share time, its share not ready by then — STOP
//     its participation for the run, as one vipsd's overflow stops its
//     steps: a decline at the share time (or, for a share not ready,
//     silence), then no join and no share until the process restarts. The
//     aggregator learns one bit per run (and the round it happened in).
//   * LEAVE when it stops, so that no later round names it.
// A plan of another configuration than its own (terms, tolerated_holders,
// share delay against the aggregator's timeout) stops the holder with
// INVALID_ARGUMENT (exit 2) before it is charged. A round at or below its
// last masked round is never answered (a pad is used once).
//
// What it writes: its ledger only (state.directory): one entry per round it
// was charged for, so that a holder can show what its data were charged
// independently of the aggregator (`vipsd status --state DIR`). No
// checkpoint and no release (the model is the aggregator's, public, in
// every plan).
//
// Privacy: its records and sums stay in the process; the only number that
// leaves is the masked share (uniform to the aggregator unless every other
// participant colludes with it) — and dead letters of malformed input, as
// for every vipsd.
//
// Thread-safety: Create and Run on one thread; RequestStop from any.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "config/config.h"
#include "core/base/status.h"
#include "core/privacy/mechanisms/gaussian_mechanism.h"
#include "core/privacy/mechanisms/noise_source.h"
#include "core/privacy/mechanisms/secure_aggregation.h"
#include "daemon/io/metrics.h"
#include "daemon/parts/ingest.h"
#include "daemon/parts/ledger_keeper.h"
#include "daemon/parts/run_control.h"
#include "daemon/setup/model_setup.h"
#include "daemon/setup/startup_check.h"
#include "daemon/state/ledger.h"
#include "daemon/step/follower.h"
#include "daemon/step/work_io.h"

namespace vipsd::daemon {

class Holder final : public WorkFollower {
 public:
  static StatusOr<std::unique_ptr<Holder>> Create(const config::VipsdConfig& config,
                                                  SourceFactory make_source,
                                                  std::unique_ptr<OutputSink> sink,
                                                  Metrics* metrics,
                                                  std::unique_ptr<WorkExchange> exchange,
                                                  DaemonOptions options = {});
  ~Holder() override;

  // Follows the aggregator's rounds until RequestStop (OK) or a failure.
  Status Run();

 private:
  Holder(const config::VipsdConfig& config, DaemonOptions options, ModelBundle bundle,
         std::unique_ptr<OutputSink> sink, Metrics* metrics, std::unique_ptr<LedgerKeeper> keeper,
         std::unique_ptr<privacy::NoiseSource> noise, privacy::Masker masker,
         std::unique_ptr<WorkExchange> exchange, SourceFactory make_source);

  // Answers `plan` (a share, a decline, or a join); INVALID_ARGUMENT when
  // the plan is not this configuration's (the holder stops).
  Status OnPlan(const FederatedPlan& plan);
  // Whether this holder takes part in `plan`'s round: nullopt when it does
  // (the round's run and model bound); otherwise what OnPlan returns — it
  // joined, declined, or cannot follow the plans.
  std::optional<Status> Admit(const FederatedPlan& plan);
  // The round it takes part in: its budget, the share's public time, the
  // windows, the charge, the share, the commit, then the share sent at its
  // time (or never).
  Status PlayRound(const FederatedPlan& plan);
  // The round's share into *masked: the sum of the sampled records'
  // statistics (PRIVATE), plus this holder's noise share, masked. A
  // failure is the round's result (charged all the same).
  Status MaskedShare(const FederatedPlan& plan, svi::StepDriver& driver, const WorkPlan& local,
                     const std::vector<LocalStream>& ready, std::vector<uint64_t>* masked);
  // Why this holder cannot follow `plan` ("" if it can).
  std::string Mismatch(const FederatedPlan& plan) const;
  // Cuts the holder's partitions for `plan` and waits (until the wall time
  // `deadline_ms`, its share time) for them to be read: `local` gets every partition's window,
  // `ready` the non-empty ones with their cuts, `cuts` every cut. False with
  // `why` (public text) when they were not read in time or overflow.
  bool CutWindows(const FederatedPlan& plan, int64_t deadline_ms, WorkPlan* local, std::vector<LocalStream>* ready,
                  std::map<std::string, int64_t>* cuts, std::string* why);
  Status Send(const FederatedPlan& plan, ShareKind kind, const std::string& reason,
              std::vector<uint64_t> masked = {});
  // Declines `plan` at once with a public reason; it will ask to join again.
  Status Decline(const FederatedPlan& plan, const std::string& reason);
  // Computes the next round's budget check ahead (daemon/parts/ledger_keeper.h
  // AdmitsStep; public), so that a plan's share time is not spent on it.
  void PrepareBudgetCheck();
  // Metrics and status.json after a round's outcome left (never when its
  // work ended).
  void Observe();
  // Waits until the wall time `at_ms` (false: stopping).
  bool WaitUntil(int64_t at_ms);
  // Its input partitions are known and all assigned to it (it may join).
  bool InputReady();
  // A data-dependent failure at `plan`: declines at the share time (or
  // stays silent when `silent`), then no join or share for the rest of the
  // run.
  Status StopForRun(const FederatedPlan& plan, int64_t share_at_ms, const std::string& why,
                    bool silent);

  // Its own ledger (accountant, windows, last round = next_step - 1) and
  // budget checks: the daemon's LedgerKeeper, so that its epsilon is the one
  // number every vipsd states for these steps.
  std::unique_ptr<LedgerKeeper> keeper_;
  privacy::Masker masker_;
  // (WorkFollower::noise_ draws its step keys and noise shares: PRIVATE.)
  std::unique_ptr<privacy::GaussianSumMechanism> sum_;  // PRIVATE, Reset every round
  std::pair<uint64_t, std::string> highest_aggregator_{0, ""};  // (epoch, owner) seen
  std::string terms_;             // FederationTerms: what its joins carry
  int64_t joined_for_step_ = -1;  // the last plan step a join was sent for
  bool join_sent_ = false;        // a join left since this process started
  bool named_ = false;            // the latest plan named this holder
  std::chrono::steady_clock::time_point last_join_{};  // when the last join left
  std::chrono::steady_clock::time_point last_plan_{};  // when the last plan arrived
  bool halted_ = false;           // its ceiling was reached: it no longer joins
  bool warned_old_message_ = false;  // an older vipsd's plan was logged (once per run)
  std::string stopped_;           // why it stopped for the run ("" while it takes part)
  // This process's rounds by outcome (status.json; the metrics count them
  // too), and what Observe has yet to count.
  int64_t shares_ = 0, declined_ = 0, withheld_ = 0;
  int64_t rounds_charged_unobserved_ = 0, commits_unobserved_ = 0;
  std::string pending_warning_;  // a budget warning crossed, said by Observe
};

}  // namespace vipsd::daemon
