// vipsd-eval for Bayesian logistic regression releases:
//
//   vipsd-eval RELEASE_DIR --test HELDOUT.jsonl [--norm-rule reject|rescale]
//              [--reference REFERENCE_RELEASE_DIR]
//
// when RELEASE_DIR/manifest.json says "model_type": "blr". Reads the
// release's "mean" and "covariance" arrays (.npy, strictly decoded), decodes
// every line of HELDOUT.jsonl with the BLR record decoder (same record
// format as training: connectors/decode/blr_record_decoder.h, d from the
// release; default norm rule "reject"), and prints one JSON object:
//   {"model_type": "blr", "release_id", "step", "epsilon_spent",
//    "predictive": "probit_approximation", "auc", "log_loss", "accuracy",
//    "records", "positives", "rejected_records"}
// (core/models/blr_eval.h for the definitions). With --reference (for
// example a non-private release on the same data), also "reference":
// {"release_dir", "coverage_50", "coverage_95", "sd_ratio_median",
// "coefficients"}: how often this release's central 50 % and 95 %
// intervals contain the reference's mean, over the coefficients, and the
// median ratio of their marginal sds (models::CoverageOfReference). Lines the decoder rejects
// are counted in "rejected_records" and skipped; empty lines are ignored.
// Exit status: 0 on success, 2 for invalid flags, 1 for unreadable or
// inconsistent input (message on stderr naming the file or array).
//
// Thread-safety: a plain function; it reads files and writes to the given
// streams only.
#pragma once

#include <iosfwd>
#include <map>
#include <optional>
#include <string>

namespace vipsd::tools {

// If RELEASE_DIR/manifest.json exists, is JSON and has model_type "blr",
// runs the command above and returns its exit status. Otherwise returns
// nullopt and prints nothing (the caller handles other model types and
// reports a missing manifest itself). `flags` maps "--flag" to its value.
std::optional<int> MaybeRunBlrEval(const std::string& release_dir,
                                   const std::map<std::string, std::string>& flags,
                                   std::ostream& out, std::ostream& err);

}  // namespace vipsd::tools
