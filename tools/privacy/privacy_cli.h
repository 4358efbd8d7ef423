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

namespace vipsd::tools {

// Runs the tool with `args` (argv without the program name). Writes the
// result to `out` and diagnostics to `err`; returns the process exit code.
int RunPrivacyCli(std::span<const std::string> args, std::ostream& out, std::ostream& err);

// The --help text.
std::string PrivacyCliUsage();

}  // namespace vipsd::tools
