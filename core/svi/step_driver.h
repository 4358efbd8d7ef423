// The private step driver: one step of private stochastic variational
// inference (DESIGN.md 2.4, 3, 4; VIPS Algorithm 2).
//
// Step(pool), at step t (t = 1, 2, …; persisted by the caller across
// restarts):
//   1. Private mode (σ > 0): ask the accountant whether one more
//      subsampled-Gaussian step (q, σ) would push ε above the ceiling. If so
//      the step does not run (outcome kRefusedCeiling): nothing is sampled,
//      no noise is drawn, nothing changes (skipped when enforce_ceiling is
//      false: the caller has checked its own budget). Otherwise the step is
//      charged NOW,
//      before any record is touched, so a failure later in the step can
//      only overcount, never undercount. (The daemon persists the ledger
//      before it publishes the release.)
//   2. Poisson sampling: every pooled record is included independently with
//      probability q, decided by 64-bit words from the NoiseSource (secure
//      in production). The batch size is random and PRIVATE.
//   3. E-step per sampled record, in parallel over `threads` workers. Each
//      record's randomness comes from a per-step seed (drawn from the
//      NoiseSource) mixed with the record's position in the batch. The batch
//      is cut into fixed chunks of 64 records; each chunk is clipped and
//      summed in batch order, and chunk sums are merged in chunk order, so
//      the result does not depend on the thread count and memory stays at a
//      few dense accumulators per worker whatever the batch size.
//   4. Clip per block, sum, ONE Gaussian mechanism (GaussianSumMechanism).
//      A step with an empty batch still adds noise and is still charged.
//   5. M-step on the noisy sum with ρ_t = (τ0 + t)^(−κ); the model divides
//      by q, never by the realised batch size.
// Non-private mode (σ = 0, no accountant) is plain SVI with Poisson
// minibatches: the exact sum, no noise, no charge.
//
// What leaves: StepResult holds only public values (t, ρ_t, ε spent, the
// outcome), plus the wall-clock time of each phase (StepPhaseSeconds), which
// depends on the batch size and is therefore PRIVATE: the daemon does not
// export it (the whole step's duration goes out only under
// metrics.expose_step_timing); benchmarks print it. The batch size,
// rejected records and clip counts stay inside.
//
// Thread-safety: a driver is used from one thread (the step thread); it
// starts its own workers inside Step().
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/base/status.h"
#include "core/model/model.h"
#include "core/privacy/gaussian_mechanism.h"
#include "core/privacy/noise_source.h"
#include "core/privacy/rdp_accountant.h"

namespace vipsd::svi {

struct DriverConfig {
  double sampling_rate = 0;     // q ∈ (0, 1]
  double noise_multiplier = 0;  // σ ≥ 0; 0 = non-private
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
  // per-record window, privacy/residency_accountant.h).
  bool enforce_ceiling = true;
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
  double epsilon_spent = 0;   // ε after this step (private mode)
  double epsilon_refused = 0; // ε the refused step would have reached
  StepPhaseSeconds phase_seconds;  // PRIVATE (timing); zero for a refused step
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

  StatusOr<StepResult> Step(std::span<const model::Record> pool);

  // Applies a new (q, σ, schedule, ceiling); same validation as Create.
  // Turning a non-private driver private (or back) is refused.
  Status Reconfigure(const DriverConfig& config);

  int64_t next_step() const { return next_step_; }
  const DriverConfig& config() const { return config_; }

 private:
  StepDriver(model::Model* model, privacy::NoiseSource* noise,
             privacy::RdpAccountant* accountant, const DriverConfig& config,
             int64_t next_step);

  model::Model* model_;
  privacy::NoiseSource* noise_;
  privacy::RdpAccountant* accountant_;
  DriverConfig config_;
  int64_t next_step_;
  // Accumulators kept from step to step and Reset() before every use, so
  // nothing carries over into another step's release (a failed step's
  // partial sum stays in memory only until the next Reset). Allocating their
  // statistic-sized buffers afresh every step (4 MB each for LDA at
  // K·V = 500,000) made the allocator return them to the OS and page-fault
  // them back in: about a quarter of the LDA training time.
  std::unique_ptr<privacy::GaussianSumMechanism> total_;
  std::vector<std::unique_ptr<privacy::GaussianSumMechanism>> spare_;
};

}  // namespace vipsd::svi
