// vipsd-privacy: the privacy planning tool (library part).
//
//   vipsd-privacy epsilon --sampling-rate Q --noise-multiplier S --steps T
//                         --delta D [--accountant rdp|pld|strong] [--json]
//   vipsd-privacy sigma   --target-epsilon E --sampling-rate Q --steps T
//                         --delta D [--accountant ...] [--json]
//   vipsd-privacy steps   --target-epsilon E --sampling-rate Q
//                         --noise-multiplier S --delta D [--accountant ...] [--json]
//
// Exit codes: 0 success; 1 the question has no answer in the searched range
// (e.g. a target ε no σ ≤ 1e4 reaches); 2 invalid arguments (one line on
// stderr naming the flag and the allowed values).
//
// The tool sees only public parameters; it never reads records.
#pragma once

#include <ostream>
#include <span>
#include <string>

#include "config/config.h"
#include "core/base/status.h"
#include "core/privacy/mechanisms/distributed_noise.h"

namespace vipsd::tools {

// Runs the tool with `args` (argv without the program name). Writes the
// result to `out` and diagnostics to `err`; returns the process exit code.
int RunPrivacyCli(std::span<const std::string> args, std::ostream& out, std::ostream& err);

// A federated configuration's noise shares (docs/federation.md): n =
// federation.holders, t = tolerated_holders, σ and the model's statistic
// layout — of which only the number of blocks enters the integer noise
// parameters (core/privacy/mechanisms/gaussian_mechanism.h: S_b = (2^g + 2^(g−10))²
// with g = GridExponent(B)), so the layout is rebuilt from the model type
// without the model's data (a test holds it to the daemon's own layout).
StatusOr<privacy::DistributedNoise> FederatedNoiseOf(const config::VipsdConfig& config);

// The --help text.
std::string PrivacyCliUsage();

}  // namespace vipsd::tools
