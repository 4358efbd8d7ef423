// Holder: a data holder of a federation (federation.role: holder; issue 31,
// docs/federation.md). It reads its own input (source.topics, its own
// consumer group) and follows the aggregator's federated plans
// (daemon/work_exchange.h FederatedPlan; daemon/aggregator_round.cc):
//
//   for a round that names it, it checks the plan against its own
//   configuration (roster, record settings, q, σ, tolerated_holders) and
//   its own budget, cuts its partitions at the slot's cut time (the cut rule
//   of core/svi/slot_windows.h, its window of schedule.window_steps slots),
//   CHARGES the step to its own ledger (svi::StepDriver::Begin: its own
//   accountant, its own ceiling, a step key of its own that the aggregator
//   never learns), sums its sampled records on the noise grid, adds its
//   noise share N_Z(0, s²) with s² = ⌈σ_g²/(n − t)⌉
//   (core/privacy/distributed_noise.h), masks the result with its pair pads
//   for the round (core/privacy/secure_aggregation.h), COMMITS its ledger —
//   the charge, the cuts and the round, which is its last masked round —
//   and only then appends the masked share.
//
// A round it cannot take part in is declined with a public reason (its
// ceiling; input not read to the cut in time; a window over pool.capacity);
// a plan of another configuration is declined and stops the holder with
// INVALID_ARGUMENT (exit 2). A round at or below its last masked round is
// never answered (a pad is used once), so after a restart it waits for the
// next round. It asks to JOIN when it starts, every 3 s until a plan names
// it, and at a plan that does not name it.
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
#include "core/privacy/gaussian_mechanism.h"
#include "core/privacy/noise_source.h"
#include "core/privacy/secure_aggregation.h"
#include "daemon/daemon.h"
#include "daemon/ingest.h"
#include "daemon/ledger.h"
#include "daemon/ledger_keeper.h"
#include "daemon/metrics.h"
#include "daemon/model_setup.h"
#include "daemon/run_control.h"
#include "daemon/work_io.h"

namespace vipsd::daemon {

class Holder {
 public:
  static StatusOr<std::unique_ptr<Holder>> Create(const config::VipsdConfig& config,
                                                  SourceFactory make_source,
                                                  std::unique_ptr<OutputSink> sink,
                                                  Metrics* metrics,
                                                  std::unique_ptr<WorkExchange> exchange,
                                                  DaemonOptions options = {});
  ~Holder();

  // Follows the aggregator's rounds until RequestStop (OK) or a failure.
  Status Run();
  void RequestStop();

 private:
  Holder(const config::VipsdConfig& config, DaemonOptions options, ModelBundle bundle,
         std::unique_ptr<OutputSink> sink, Metrics* metrics, std::unique_ptr<LedgerKeeper> keeper,
         std::unique_ptr<privacy::NoiseSource> noise, privacy::Masker masker,
         std::unique_ptr<WorkExchange> exchange, SourceFactory make_source);

  // Answers `plan` (a share, a decline, or a join); INVALID_ARGUMENT when
  // the plan is not this configuration's (the holder stops).
  Status OnPlan(const FederatedPlan& plan);
  // Why this holder cannot follow `plan` ("" if it can).
  std::string Mismatch(const FederatedPlan& plan) const;
  // Cuts the holder's partitions for `plan` and waits (until the round's
  // timeout) for them to be read: `local` gets every partition's window,
  // `ready` the non-empty ones with their cuts, `cuts` every cut. False with
  // `why` (public text) when they were not read in time or overflow.
  bool CutWindows(const FederatedPlan& plan, WorkPlan* local, std::vector<LocalStream>* ready,
                  std::map<std::string, int64_t>* cuts, std::string* why);
  Status Send(const FederatedPlan& plan, ShareKind kind, const std::string& reason,
              std::vector<uint64_t> masked = {});

  const config::VipsdConfig config_;
  const DaemonOptions options_;
  ModelBundle bundle_;
  std::unique_ptr<OutputSink> sink_;  // dead letters of its input
  Metrics* const metrics_;
  // Its own ledger (accountant, windows, last round = next_step - 1) and
  // budget checks: the daemon's LedgerKeeper, so that its epsilon is the one
  // number every vipsd states for these steps.
  std::unique_ptr<LedgerKeeper> keeper_;
  std::unique_ptr<privacy::NoiseSource> noise_;  // its step keys and noise shares (PRIVATE)
  privacy::Masker masker_;
  std::string roster_fingerprint_;
  SourceFactory make_source_;
  RunControl control_;
  WorkIo work_;
  Ingest ingest_;
  std::unique_ptr<privacy::GaussianSumMechanism> sum_;  // PRIVATE, Reset every round
  std::pair<uint64_t, std::string> highest_aggregator_{0, ""};  // (epoch, owner) seen
  int64_t joined_for_step_ = -1;  // the last plan step a join was sent for
  // Steady time of the last join sent or plan that named this holder: a
  // holder that hears nothing for kJoinInterval asks again (an aggregator
  // that started after it never read its first join).
  std::chrono::steady_clock::time_point last_contact_{};
  bool halted_ = false;           // its ceiling was reached: it no longer joins
};

}  // namespace vipsd::daemon
