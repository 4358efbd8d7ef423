// Decoder for Bayesian logistic regression records (docs/models.md; docs/architecture.md):
// bytes of one JSON record → model::Record{features, label}, or a reject
// reason for the dead-letter topic. Implements connectors::RecordDecoder
// (record_decoder.h); the daemon picks it when `model.type` is "blr".
//
// Accepted record: a JSON object (valid UTF-8, one JSON value) with
//   "x": dense   an array of exactly `dim` finite numbers, or
//        sparse  {"indices": [...], "values": [...]} — equal-length arrays;
//                indices are JSON integers in [0, dim), pairwise distinct,
//                in any order; values finite numbers; the record must then
//                also carry "dim" (a JSON integer equal to the model's d).
//   "dim": optional for the dense form; if present it must equal d.
//   "y":  the label: the JSON integers 0 or 1, or the floats 0.0 or 1.0.
//        Booleans, strings ("1") and any other number are rejected: a label
//        that is not unambiguously 0/1 is a producer bug, not something to
//        guess about.
// Other keys (e.g. "id") are ignored. Numbers are read as doubles; a number
// literal too large for a double (e.g. 1e400) is refused by the JSON parser
// itself (kInvalidJson); JSON has no NaN/Infinity literals.
//
// Reject reasons (json_document.h): kInvalidUtf8, kInvalidJson,
// kNotAnObject; kMissingFeatures ("x" absent); kBadFeatures (wrong type, a
// non-finite or non-numeric value, sparse arrays of different lengths, a
// non-integer or duplicate index, sparse form without "dim", "dim" not an
// integer); kWrongDimension (dense length ≠ d, "dim" ≠ d, index outside
// [0, dim)); kMissingLabel; kBadLabel; kNormTooLarge (below).
//
// Norm rule, on FeatureSquaredNorm(x) (core/models/blr.h: Σ x_i² in index
// order in double — the same function the E-step checks, so a record this
// decoder accepts is never refused by the model for its norm):
//   kReject   squared norm > 1 (or some |x_i| > 1) → kNormTooLarge.
//   kRescale  x ← x / ‖x‖₂ (after first dividing by max|x_i| when that is
//             above 1, so that no square overflows); then, while rounding
//             still leaves the squared norm above 1, every non-zero
//             coordinate is moved one ulp toward zero (strictly shrinking
//             the norm; a few rounds at most). Records inside the ball are
//             left bit-for-bit unchanged. The rescaled record's direction
//             is kept; its length is ≤ 1 after rounding, within a few ulps
//             of 1.
// Either way no record with ‖x‖₂ > 1 reaches the pool, so the statistic
// bounds of core/models/blr.h hold (and the driver clips regardless).
//
// Privacy: as for every RecordDecoder, a DecodeFailure carries only the
// reason code; no value, index, id or byte offset of the record.
//
// Thread-safety: Decode is const and thread-safe; it never throws.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>

#include "connectors/decode/record_decoder.h"

namespace vipsd::connectors {

enum class NormRule { kReject, kRescale };

// "reject" / "rescale" (the names the configuration uses).
std::string_view NormRuleName(NormRule rule);
std::optional<NormRule> ParseNormRule(std::string_view name);

// `dim` is the model's d, in [1, 1024] (BlrConfig); a value outside that
// range makes every record fail with kWrongDimension.
std::unique_ptr<RecordDecoder> NewBlrRecordDecoder(int64_t dim, NormRule rule);

}  // namespace vipsd::connectors
