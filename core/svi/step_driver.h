// The private step driver: one step of private stochastic variational
// inference (docs/models.md; docs/privacy_accounting.md; VIPS Algorithm 2).
//
// Step(streams), at step t (t = 1, 2, …; persisted by the caller across
// restarts):
//   1. Private mode (σ > 0): ask the accountant whether one more
//      subsampled-Gaussian step (q, σ) would push ε above the ceiling. If so
//      the step does not run (outcome kRefusedCeiling): nothing is sampled,
//      no noise is drawn, nothing changes (skipped when enforce_ceiling is
//      false: the caller has checked its own budget). Otherwise the step is
//      charged NOW,
//      before any record is touched, so a failure later in the step can
//      only overcount, never undercount. (The daemon persists the ledger
//      before it publishes the release.) The step then draws its secret
//      256-bit key from the NoiseSource (svi/step_randomness.h).
//   2. Poisson sampling: every candidate record is included independently
//      with probability q, decided by a keystream word at the record's own
//      (stream, offset) under the step key. The batch size is random and
//      PRIVATE. Unit-level (max_records_per_unit > 0): every unit instead,
//      by a keyed word of the unit; a kept unit's records beyond the cap are
//      left out by their own keyed rank (DriverConfig).
//   3. E-step per sampled record, in parallel over `threads` workers, with
//      the record's own keyed seed. Each stream's batch (in offset order) is
//      cut into fixed chunks of 64 records; each chunk is clipped and summed
//      in order, chunk sums are merged in order into the stream's partial
//      sum, and the partial sums are added in stream order (streams sorted
//      by name). So the result depends neither on the thread count nor on
//      which process computed which stream's partial (scale-out: the same
//      step split across processes gives the same bits), and memory stays
//      at a few dense accumulators per worker whatever the batch size.
//   4. Clip per block, sum, ONE Gaussian mechanism (GaussianSumMechanism).
//      A step with an empty batch still adds noise and is still charged.
//   5. M-step on the noisy sum with ρ_t = (τ0 + t)^(−κ); the model divides
//      by q, never by the realised batch size.
// Non-private mode (σ = 0, no accountant) is plain SVI with Poisson
// minibatches: the exact sum, no noise, no charge.
//
// Scale-out (issue 16). The same step in pieces: Begin() (1), SumStreams()
// (2–4 for some streams, giving each stream's un-noised partial sum to a
// sink: PRIVATE), Finish() (one noise draw on the combined sum, M-step) on
// the process that owns the step, and Advance() on replicas that apply the
// released sum so that their model stays identical. Step() is exactly
// Begin + SumStreams + Finish in one process.
//
// What leaves: StepResult holds only public values (t, ρ_t, ε spent, the
// outcome), plus the wall-clock time of each phase (StepPhaseSeconds), which
// depends on the batch size and is therefore PRIVATE: the daemon does not
// export it (the whole step's duration goes out only under
// metrics.expose_step_timing); benchmarks print it. The batch size,
// rejected records and clip counts stay inside.
//
// Thread-safety: a driver is used from one thread (the step thread); it
// starts its own workers inside SumStreams().
#pragma once

#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/base/status.h"
#include "core/model/model.h"
#include "core/privacy/accounting/rdp_accountant.h"
#include "core/privacy/accounting/sampled_gaussian.h"
#include "core/privacy/mechanisms/gaussian_mechanism.h"
#include "core/privacy/mechanisms/noise_source.h"
#include "core/svi/record_pool.h"
#include "core/svi/step_randomness.h"

namespace vipsd::svi {

struct DriverConfig {
  // q ∈ (0, 1] and σ ≥ 0 (0 = non-private): what each step is charged for.
  privacy::SampledGaussian mechanism;
  double tau0 = 1;              // τ0 ≥ 0
  double kappa = 0.7;           // κ ∈ (0.5, 1]
  int threads = 1;              // [1, 256]
  // Private mode only:
  double delta = 1e-5;          // δ ∈ (0, 1)
  double epsilon_ceiling = 1;   // > 0
  privacy::Adaptivity adaptivity = privacy::Adaptivity::kFixedSchedule;
  // When false the driver still charges the accountant every step but does
  // not refuse steps at epsilon_ceiling: the caller enforces a different
  // budget before calling Step (the daemon's residency mode checks the
  // per-record window, privacy/accounting/residency_accountant.h).
  bool enforce_ceiling = true;
  // The privacy unit (docs/privacy_accounting.md "The privacy unit"). 0:
  // every record is its own unit (record-level privacy). C > 0: unit-level:
  // step 2 keeps each UNIT (model::Record::unit) with probability q, a kept
  // unit contributes at most C of its candidate records (the C with the
  // smallest rank word, svi/step_randomness.h), and step 3 sums their
  // statistics and clips the sum once, as one record's. All of a unit's
  // candidates must be among `streams` of one SumStreams call: in one
  // process, or, when the work is shared, in the unit's home partition
  // (StreamCandidates::partition_count; records elsewhere are not used).
  int64_t max_records_per_unit = 0;
};

// Checks every range above; messages name the field.
Status ValidateDriverConfig(const DriverConfig& config);

// ρ_t = (τ0 + t)^(−κ).
double StepSize(double tau0, double kappa, int64_t t);

// Wall-clock seconds of each phase of one step. Follows the realised batch
// (the E-step most of all): private, see "What leaves" above.
struct StepPhaseSeconds {
  double charge = 0;  // 1: ceiling check and accountant charge
  double sample = 0;  // 2: Poisson sampling bits and batch selection
  double estep = 0;   // 3 + 4: E-step, clip and sum, chunk merges (parallel)
  double noise = 0;   // 4: the Gaussian mechanism (noise draws and add)
  double mstep = 0;   // 5: M-step, including the model's derived caches
};

struct StepResult {
  enum class Outcome { kRan, kRefusedCeiling };
  Outcome outcome = Outcome::kRan;
  int64_t step = 0;           // t of this step (the refused one, if refused)
  double rho = 0;             // ρ_t (0 if refused)
  // The (q, σ) this step was charged and run with: the one record of them
  // for the step (its release states them, whatever a later reload sets).
  privacy::SampledGaussian mechanism;
  double epsilon_spent = 0;   // ε after this step (private mode)
  double epsilon_refused = 0; // ε the refused step would have reached
  StepPhaseSeconds phase_seconds;  // PRIVATE (timing); zero for a refused step
};

// A step that Begin() admitted and charged.
struct StepTicket {
  StepResult result;  // outcome kRefusedCeiling: nothing else to do
  StepKey key;        // PRIVATE: decides the sample
};

// Receives stream i's clipped, un-noised partial sum (PRIVATE), in stream
// order; the driver resets the partial after the call.
using PartialSink = std::function<Status(size_t stream_index, privacy::GaussianSumMechanism& partial)>;

// One step's contributions after step 2, in the order they are summed: each
// is the (stream name, offset) of a record — record-level — or of the chosen
// records of one kept unit. PRIVATE (which records were sampled): for tests
// and audits in the same process (the daemon's DaemonHooks::after_sample).
using Contributions = std::vector<std::vector<std::pair<std::string, int64_t>>>;
using SampleObserver = std::function<void(int64_t step, const Contributions& contributions)>;

// The budget of record a private step is charged to (step 1). The driver
// reads its RDP accountant (the filter's ceiling check, the ε spent) and
// charges one composition per step through Charge, never by writing to the
// accountant itself: a daemon's budget lives in its ledger, whose keeper
// (daemon/parts/ledger_keeper.h) is the only writer of it. A bare RdpAccountant
// serves the offline tools and the tests (Create's accountant overload).
class ChargeBook {
 public:
  virtual ~ChargeBook() = default;
  virtual const privacy::RdpAccountant& accountant() const = 0;
  // One step of (q, σ), composed once. A failure charges nothing.
  virtual Status Charge(const privacy::SampledGaussian& step) = 0;
};

class StepDriver {
 public:
  // `model` and `noise` must outlive the driver; `accountant` too, and it
  // must be non-null when σ > 0 (it may be null when σ = 0). `next_step` is
  // the t of the first step (≥ 1; restored from the ledger after a restart).
  static StatusOr<std::unique_ptr<StepDriver>> Create(model::Model* model,
                                                      privacy::NoiseSource* noise,
                                                      privacy::RdpAccountant* accountant,
                                                      const DriverConfig& config,
                                                      int64_t next_step = 1);
  // The same, charging `book` (which must outlive the driver; read and
  // charged only when σ > 0).
  static StatusOr<std::unique_ptr<StepDriver>> Create(model::Model* model,
                                                      privacy::NoiseSource* noise,
                                                      ChargeBook& book,
                                                      const DriverConfig& config,
                                                      int64_t next_step = 1);

  // One whole step on `streams`, which must be sorted by name, each name
  // once (RecordPool::Candidates' order: the partial sums are added in this order).
  StatusOr<StepResult> Step(const std::vector<StreamCandidates>& streams);
  // One stream named "" whose offsets are the records' positions.
  StatusOr<StepResult> Step(std::span<const model::Record> pool);

  // ---- The same step in pieces (scale-out) ----
  // Step 1: ceiling check and charge (private mode), then the step key.
  StatusOr<StepTicket> Begin();
  // Steps 2–4 for `streams` with the current model: `sink` gets each
  // stream's partial sum in the order of `streams`. Adds the sampling and
  // E-step times to `phases` if given.
  Status SumStreams(const StepKey& key, const std::vector<StreamCandidates>& streams,
                    const PartialSink& sink, StepPhaseSeconds* phases = nullptr);
  // Steps 4–5 on the owner: one Gaussian mechanism on `total` (the partial
  // sums merged in stream order), M-step with ρ_t, t advances. `ticket` must
  // be the one Begin() gave for this step.
  StatusOr<StepResult> Finish(const StepTicket& ticket, privacy::GaussianSumMechanism& total);
  // Step 5 alone on the owner, for a release whose noise others added
  // (federated mode: the sum of the holders' noised, masked shares,
  // GaussianSumMechanism::ReleaseFederatedTotal): M-step with ρ_t, t
  // advances, the release observer is called. FAILED_PRECONDITION as Finish,
  // and for a non-private driver or a DrawNoiseAhead pending.
  StatusOr<StepResult> FinishReleased(const StepTicket& ticket,
                                      const privacy::GaussianRelease& release);
  // Step 4's noise drawn ahead, on a thread of its own (private runs; a
  // no-op otherwise): the noise does not depend on the records, so it is
  // drawn while the E-step runs or while the owner of a shared step waits
  // for the partial sums, and Finish only adds it. The draws are the ones
  // Finish would have taken from the noise source, in the same order (the
  // step key comes first, from Begin), so the release is bit for bit the
  // same. Call after Begin and before Finish or Abandon, which collect it;
  // until then the noise source belongs to the drawing thread.
  void DrawNoiseAhead();
  // A step that Begin() admitted and charged but that will not Finish (a
  // failure in between; scale-out: the coordinator stops, is fenced, or a
  // process cannot hold a window): its number t is consumed — charged,
  // never released, never reused — so the step counter stays above the
  // accountant's step count (the ledger's invariant). No-op when `ticket`
  // is not the current step.
  void Abandon(const StepTicket& ticket);
  // A replica's step 5: the owner's released (noisy) sum of step `step`
  // (== next_step()) through the same M-step, so that the replica's model
  // stays identical to the owner's. Public input.
  Status Advance(const Eigen::VectorXd& released_sum, int64_t step);

  const model::Model& model() const { return *model_; }
  // Called by Finish with every released (noisy: public) sum, its step and
  // the (q, σ) and ρ_t its M-step uses (what Advance-like replays need), e.g. to
  // hand it to replicas or to a plan (daemon/step/coordinator.h). Called before
  // that M-step runs, which may still fail (Finish returns its error): an
  // observer that needs the M-stepped model waits for Finish's result.
  using ReleaseObserver =
      std::function<void(const Eigen::VectorXd& released_sum, int64_t step,
                         const privacy::SampledGaussian& mechanism, double rho)>;
  void set_release_observer(ReleaseObserver observer) {
    on_release_ = std::move(observer);
  }

  // Called by SumStreams after step 2 (see SampleObserver); none by default,
  // and nothing is collected without one.
  void set_sample_observer(SampleObserver observer) { on_sample_ = std::move(observer); }

  // Applies a new (q, σ, schedule, ceiling); same validation as Create.
  // Turning a non-private driver private (or back) is refused.
  Status Reconfigure(const DriverConfig& config);

  int64_t next_step() const { return next_step_; }
  const DriverConfig& config() const { return config_; }

 private:
  StepDriver(model::Model* model, privacy::NoiseSource* noise,
             std::unique_ptr<ChargeBook> owned_book, ChargeBook* book,
             const DriverConfig& config, int64_t next_step);

  // Step 5 on a release: M-step, observer, t advances.
  StatusOr<StepResult> MStepOn(StepResult result, const privacy::GaussianRelease& release);
  model::Model* model_;
  privacy::NoiseSource* noise_;
  std::unique_ptr<ChargeBook> owned_book_;  // the accountant overload's
  ChargeBook* book_;                         // null only when σ = 0
  DriverConfig config_;
  int64_t next_step_;
  // Accumulators kept from step to step and Reset() before every use, so
  // nothing carries over into another step's release (a failed step's
  // partial sum stays in memory only until the next Reset). Allocating their
  // statistic-sized buffers afresh every step (4 MB each for LDA at
  // K·V = 500,000) made the allocator return them to the OS and page-fault
  // them back in: about a quarter of the LDA training time.
  std::unique_ptr<privacy::GaussianSumMechanism> total_;
  std::unique_ptr<privacy::GaussianSumMechanism> current_;  // the stream being summed
  ReleaseObserver on_release_;
  SampleObserver on_sample_;
  std::vector<std::unique_ptr<privacy::GaussianSumMechanism>> spare_;
  // DrawNoiseAhead's draw (PRIVATE), collected by Finish or Abandon.
  std::future<StatusOr<privacy::GaussianSumMechanism::PreparedNoise>> noise_ahead_;
};

}  // namespace vipsd::svi
