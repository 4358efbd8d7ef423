// The model contract: what the private step driver (core/svi) needs from a
// Bayesian model, and nothing else. LDA (core/models/lda.h) implements it;
// Bayesian logistic regression and the sigmoid belief network implement the
// same interface without changes to the driver.
//
// Division of labour (docs/architecture.md; docs/models.md):
//   * EStep runs behind the privacy wall, once per sampled record, against
//     the model's current RELEASED parameters (everything the model holds is
//     post-processing of earlier noisy releases, so reading it is free). It
//     produces the record's expected sufficient statistic as named blocks
//     (statistic_layout()), each with a proven L2 bound under add/remove-one
//     adjacency. The driver clips and sums; a model never sees other
//     records' statistics.
//   * MStep receives the noisy sum (already in original units, i.e. after
//     the one Gaussian mechanism of the step) with the public sampling rate q
//     and step size ρ_t. Dividing by q, never by the realised batch size,
//     gives an unbiased estimate of the pool-wide sum (docs/models.md, "The stochastic step").
//   * Release exports the public parameters as named arrays.
//
// Records: the pool holds `Record`s; each model documents which fields it
// reads (LDA: word_ids; BLR: features + label; SBN: features as 0/1).
//
// Thread-safety: EStep is const and is called concurrently from the
// driver's worker threads, each with its own EStepScratch and RNG. MStep,
// Release and parameter access are called from the step thread only, never
// concurrently with EStep.
#pragma once

#include <Eigen/Core>
#include <array>
#include <cmath>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/base/status.h"
#include "core/privacy/accounting/sampled_gaussian.h"
#include "core/privacy/mechanisms/block_layout.h"

namespace vipsd::model {

// One private record as the pool keeps it. Field use is model-specific.
struct Record {
  std::vector<int32_t> word_ids;  // LDA: vocabulary ids in text order
  std::vector<double> features;   // BLR / SBN inputs
  double label = 0;               // BLR: 0 or 1
  // Unit-level privacy (privacy.unit other than record): the 128-bit digest
  // of the record's unit id (svi::UnitDigest), the same for every record of
  // one unit; all zero in record mode. PRIVATE: it tells whose record this is.
  std::array<uint8_t, 16> unit{};
  // Shared work with a unit (privacy.unit_partitioner): the partitioner
  // hash of the unit id (privacy::UnitKeyHash), which decides the unit's
  // home partition; 0 otherwise. PRIVATE, as `unit`.
  uint32_t unit_hash = 0;
};

// A record's statistic in sparse form: flat coordinates of the statistic
// layout (strictly increasing) and their values. Dense models list every
// coordinate.
struct SparseStatistic {
  std::vector<uint32_t> indices;
  std::vector<double> values;
  void Clear() {
    indices.clear();
    values.clear();
  }
};

// Per-record randomness for E-steps that sample (LDA resampling to N
// words). SplitMix64: fast and statistically sound, NOT cryptographic —
// fine here, because this randomness is part of the function whose output
// the Gaussian mechanism protects; sensitivity bounds hold for every draw.
class RecordRng {
 public:
  explicit RecordRng(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  // Uniform integer in [0, n), n ≥ 1 (rejection of the biased top range).
  uint64_t Below(uint64_t n) {
    const uint64_t limit = (UINT64_MAX / n) * n;
    uint64_t x = Next();
    while (x >= limit) x = Next();
    return x % n;
  }

 private:
  uint64_t state_;
};

// Reusable per-thread buffers for EStep; models downcast to their own type.
class EStepScratch {
 public:
  virtual ~EStepScratch() = default;
};

// A named parameter array for a release (row-major).
struct NamedArray {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<double> data;
};

class Model {
 public:
  virtual ~Model() = default;

  // "lda", "blr", "sbn".
  virtual std::string type() const = 0;

  // Named statistic blocks with their L2 bounds. Fixed for the model's life.
  virtual const privacy::BlockLayout& statistic_layout() const = 0;

  // True if every block's bound is proven (see the model's header). A model
  // configured without proven bounds (e.g. LDA on actual token counts) may
  // only run non-privately; the driver refuses σ > 0.
  virtual bool has_proven_bounds() const = 0;

  // Public dimensions for release metadata, e.g. {{"K", 50}, {"V", 8000}}.
  virtual std::vector<std::pair<std::string, int64_t>> dimensions() const = 0;

  virtual std::unique_ptr<EStepScratch> NewScratch() const = 0;

  // Expected sufficient statistic of one record against the current
  // parameters. Must satisfy the layout's bounds before clipping whenever
  // the model's proof says so (tests check); the driver clips regardless.
  // An error means the record is malformed for this model (e.g. a word id
  // ≥ V); the message must not contain record content.
  virtual Status EStep(const Record& record, RecordRng& rng, EStepScratch& scratch,
                       SparseStatistic& out) const = 0;

  // Global update from the step's noisy (or, non-private mode, exact) sum
  // in original units, layout order, with ρ_t. `released_by` is the step's
  // sampling rate q and the σ of the mechanism that released the sum
  // (GaussianRelease::noise_multiplier; 0 for an exact sum): with the
  // layout's bounds σ gives each block's
  // per-coordinate noise std (privacy::NoiseStdPerBlock), which a
  // noise-aware model folds into its posterior (docs/models.md,
  // "Noise-aware posteriors"). Public, like the sum.
  virtual Status MStep(const Eigen::VectorXd& statistic_sum,
                       const privacy::SampledGaussian& released_by, double rho) = 0;

  // The released parameters.
  virtual std::vector<NamedArray> ReleaseArrays() const = 0;

  // Everything the model has accumulated across M-steps (for LDA: λ), so
  // that a restarted daemon resumes the same posterior. Public: it is
  // post-processing of earlier noisy sums and the public initialisation.
  // May equal ReleaseArrays() when the release is the whole state.
  virtual std::vector<NamedArray> CheckpointArrays() const = 0;

  // Restores what CheckpointArrays() returned for a model of the same
  // configuration. Checks names, shapes and value ranges; on error the
  // model is unchanged and the message names the array.
  virtual Status RestoreCheckpoint(std::span<const NamedArray> arrays) = 0;

  // The public starting point (model.public_prior; docs/models.md, "Public
  // priors"): `arrays` are the release of a model of the same type and
  // dimensions fitted on public data only. Sets the state the first step
  // starts from (a checkpoint restored after it replaces it). Public: no
  // record is read. On error the model is unchanged and the message names
  // the array. A model without public priors returns FAILED_PRECONDITION
  // (the configuration refuses model.public_prior for it first).
  virtual Status SetPublicPrior(std::span<const NamedArray> arrays) {
    (void)arrays;
    return FailedPreconditionError(type() + " has no public prior");
  }
};

// The MStep arguments every model checks first: `statistic_sum` has the
// layout's size (INVALID_ARGUMENT), q and ρ are in (0, 1] and σ is finite
// and ≥ 0 (INVALID_ARGUMENT), and the sum is finite (OUT_OF_RANGE).
// `model` prefixes the messages.
inline Status CheckMStepInputs(const std::string& model, const Eigen::VectorXd& statistic_sum,
                               const privacy::BlockLayout& layout, double sampling_rate,
                               double rho, double noise_multiplier) {
  if (statistic_sum.size() != static_cast<Eigen::Index>(layout.total_size())) {
    return InvalidArgumentError(model + ": statistic sum has " +
                                std::to_string(statistic_sum.size()) +
                                " coordinates, the layout has " +
                                std::to_string(layout.total_size()));
  }
  if (!(sampling_rate > 0 && sampling_rate <= 1)) {
    return InvalidArgumentError(model + ": sampling_rate must be in (0, 1]");
  }
  if (!(rho > 0 && rho <= 1)) return InvalidArgumentError(model + ": rho must be in (0, 1]");
  if (!(noise_multiplier >= 0 && std::isfinite(noise_multiplier))) {
    return InvalidArgumentError(model + ": noise_multiplier must be finite and >= 0");
  }
  if (!statistic_sum.allFinite()) {
    return OutOfRangeError(model + ": statistic sum is not finite");
  }
  return Status::Ok();
}

}  // namespace vipsd::model
