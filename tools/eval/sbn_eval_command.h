// vipsd-eval for sigmoid belief network releases:
//
//   vipsd-eval RELEASE_DIR --test HELDOUT.jsonl [--train TRAIN.jsonl]
//              [--samples 100] [--seed 0] [--threads 1]
//              [--estep-iterations 100] [--estep-tolerance 1e-4]
//
// when RELEASE_DIR/manifest.json says "model_type": "sbn". Reads the
// release arrays w_mean, w_covariance, b_mean, c_mean, c_variance (.npy,
// strictly decoded; core/models/sbn.h), decodes every line of the JSONL
// files with the SBN record decoder ({"y": [0, 1, ...]}, J from the
// release; connectors/decode/sbn_record_decoder.h) and prints one JSON
// object (definitions in core/models/sbn_eval.h):
//   {"model_type": "sbn", "release_id", "step", "epsilon_spent",
//    "reconstruction": "sampled_z" (the paper's protocol),
//    "reconstruction_accuracy", "reconstruction_accuracy_mean_z",
//    "loglik_estimator": "importance_sampling_plugin" (a stochastic lower
//    bound in expectation on log p(y) under the posterior means; omitted
//    with --samples 0), "heldout_loglik_per_record", "heldout_loglik_per_pixel",
//    "importance_samples",
//    "marginal_baseline_accuracy", "marginal_baseline_loglik_per_record",
//    "marginal_source": "train" | "test",
//    "records", "rejected_records", "train_records"}
// The per-pixel marginal baseline is fitted on --train when given; without
// it, it is fitted on the test records themselves ("marginal_source":
// "test"), which flatters the baseline (it has seen the records it scores).
// Lines the decoder rejects are counted and skipped; empty lines ignored.
// The E-step settings are not part of a release; the defaults match
// SbnConfig's. Randomness (the sampled z and the importance samples) comes
// from --seed, so a run is repeatable.
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

// If RELEASE_DIR/manifest.json exists, is JSON and has model_type "sbn",
// runs the command above and returns its exit status. Otherwise returns
// nullopt and prints nothing. `flags` maps "--flag" to its value.
std::optional<int> MaybeRunSbnEval(const std::string& release_dir,
                                   const std::map<std::string, std::string>& flags,
                                   std::ostream& out, std::ostream& err);

}  // namespace vipsd::tools
