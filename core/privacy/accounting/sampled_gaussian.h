// The values at the accountant's edges: what one step is charged for, and
// what a guarantee states.
//
// SampledGaussian: one step of the Poisson-subsampled Gaussian mechanism —
// each record (or privacy unit) enters the step's sample with probability
// q, and the Gaussian noise on the clipped sum has standard deviation σ
// times the sum's L2 sensitivity. A step's privacy loss depends on these
// two numbers and nothing else (rdp.h), so they travel as one value: from
// the configuration (svi::DriverConfig::mechanism) through the charge
// (svi::ChargeBook::Charge, RdpAccountant, ResidencyAccountant,
// FixedScheduleAccountant) to the step's result (svi::StepResult), the
// M-step, the federated plan and the release (release::ReleaseFacts).
// Compared bit for bit: the ledger records the doubles exactly.
//
// EpsilonDelta: an (ε, δ) guarantee — a ceiling a run must stay within, or
// what an accountant reports for a δ.
//
// What is private: nothing; both are public parameters.
#pragma once

#include "core/base/status.h"

namespace vipsd::privacy {

struct SampledGaussian {
  double sampling_rate = 0;     // q ∈ (0, 1]
  double noise_multiplier = 0;  // σ ≥ 0; 0: a non-private step (no noise, no charge)

  bool is_private() const { return noise_multiplier > 0; }
  bool operator==(const SampledGaussian&) const = default;
};

// INVALID_ARGUMENT naming the field (sampling_rate, noise_multiplier) when q
// is not in (0, 1] or σ is negative or not finite; σ = 0 too when
// `require_noise` (what an accountant charges must be private).
Status ValidateSampledGaussian(const SampledGaussian& step, bool require_noise);

struct EpsilonDelta {
  double epsilon = 0;  // > 0 for a ceiling
  double delta = 0;    // ∈ (0, 1)

  bool operator==(const EpsilonDelta&) const = default;
};

}  // namespace vipsd::privacy
