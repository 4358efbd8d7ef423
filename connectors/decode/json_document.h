// Decoding one JSON record into a text::Document (docs/models.md; records are
// decoded and validated before the privacy wall: docs/architecture.md). Shared by the file source and, later,
// the Kafka source: both carry the same JSON objects, one per line/message.
//
// Accepted record: a JSON object with
//   "id":     a non-empty string, or an integer (kept in decimal), and
//   exactly one of
//   "text":   a string, tokenized by text::AppendTokenIds (the reference
//             rules of shared/peers/tokenize.py), or
//   "tokens": an array of strings, words a producer already split; each is
//             ASCII-lowercased and kept if it is a vocabulary term
//             (text::FindWordId: rules 3–5, never split further).
// Other keys (e.g. "label") are ignored. Duplicate keys keep the last value,
// as Python's json module does. The record must be valid UTF-8 (checked
// before parsing, so that an encoding problem gets its own reason) and a
// single JSON value (RFC 8259, no comments, nothing after it).
// A record with no in-vocabulary word is NOT rejected: it decodes to a
// Document with empty word_ids, which the models handle.
//
// Privacy: a DecodeFailure holds only a reason code; its description is a
// fixed string naming at most the JSON key concerned. No id, text, token,
// parser message or byte offset of the record ever appears in it (parser
// messages quote the input, so they are dropped, never forwarded).
//
// Thread-safety: DecodeJsonDocument is a pure function; safe to call
// concurrently on a shared Vocabulary. It does not throw.
#pragma once

#include <cstddef>
#include <string_view>
#include <variant>

#include "core/text/document.h"
#include "core/text/vocabulary.h"

namespace vipsd::connectors {

enum class RejectReason {
  kInvalidJson,        // not one valid JSON value
  kNotAnObject,        // valid JSON, but not an object
  kMissingId,          // no "id" key
  kBadId,              // "id" is not a non-empty string or an integer
  kMissingText,        // neither "text" nor "tokens"
  kBadText,            // "text" is not a string
  kBadTokens,          // "tokens" is not an array of strings
  kBothTextAndTokens,  // "text" and "tokens" both present
  kLineTooLong,        // longer than the source's size limit (not read whole)
  kInvalidUtf8,        // bytes are not well-formed UTF-8
  // The reasons above are all DecodeJsonDocument / the JSONL source produce.
  // The record decoders (record_decoder.h) add:
  kRecordTooLarge,     // a message above the configured size limit
  // Feature records (BLR: "x" and "y"; SBN: "y" as the observation vector):
  kMissingFeatures,    // the feature key is missing
  kBadFeatures,        // features are not finite numbers in the accepted forms
  kWrongDimension,     // feature vector has the wrong length / index out of range
  kMissingLabel,       // BLR: "y" is missing
  kBadLabel,           // BLR: "y" is not 0 or 1
  kNormTooLarge,       // BLR: ||x||_2 > 1 under the "reject" rule (non-private runs only)
  kNotBinary,          // SBN: an observation is not 0 or 1
  // Unit-level privacy (privacy.unit: key | field; unit_decoder.h):
  kMissingUnit,        // no unit id: an empty message key, or no privacy.unit_field key
  kBadUnit,            // the unit field is not a non-empty string or an integer
  // Paced Kafka runs (source.timestamps): the message's timestamp is not one
  // the slot cuts may trust (not LogAppendTime under log_append_time; none).
  kUntrustedTimestamp,
};

// Reasons DecodeJsonDocument and JsonlDocumentSource can produce (the first
// ones of the enum).
inline constexpr size_t kNumDocumentRejectReasons = 10;
// All reasons; RejectReason values are 0 .. kNumRejectReasons - 1.
inline constexpr size_t kNumRejectReasons = 21;

// Stable snake_case code, e.g. "bad_text": used in dead-letter records and as
// a metric label value.
std::string_view RejectReasonName(RejectReason reason);

// Fixed human description naming only the JSON key concerned, e.g.
// "key \"text\" must be a string".
std::string_view RejectReasonDescription(RejectReason reason);

// Whether the input path of `model_type` ("lda" | "blr" | "sbn") can
// reject a record for `reason` (its decoder, the JSONL source's line limit,
// the Kafka source's size limit). Metrics create series only for these.
// `per_unit`: privacy.unit is not record (missing_unit and bad_unit apply).
bool RejectReasonApplies(RejectReason reason, std::string_view model_type, bool per_unit = false);

struct DecodeFailure {
  RejectReason reason;
};

using DecodeResult = std::variant<text::Document, DecodeFailure>;

// Decodes one record (the bytes of one line or message, without its line end).
// A single-pass scanner (json_document.cc) that validates the whole record
// as strictly as the reference below and tokenises "text" straight out of
// the record's bytes (unescaping into a per-thread buffer only when the
// string holds an escape): no DOM, no allocation besides the word ids.
DecodeResult DecodeJsonDocument(std::string_view record, const text::Vocabulary& vocabulary);

// The reference decoder: builds an nlohmann::json DOM and reads the keys
// from it. DecodeJsonDocument returns exactly what this returns (the same
// Document or the same reason) for every input; tests and the fuzzer
// (fuzz/fuzz_record_decoders.cc) check that. Slower; not used by sources.
// The accepted language is nlohmann's (3.11): RFC 8259 plus a leading UTF-8
// byte order mark, and a NUL byte after the value ends the input; a number
// whose value overflows a double is invalid JSON.
DecodeResult DecodeJsonDocumentReference(std::string_view record,
                                         const text::Vocabulary& vocabulary);

// True if `bytes` is well-formed UTF-8 (Unicode 15, Table 3-7: no overlong
// forms, no surrogates, nothing above U+10FFFF).
bool IsValidUtf8(std::string_view bytes);

}  // namespace vipsd::connectors
