// Decoder for sigmoid belief network records (docs/models.md; docs/architecture.md): bytes of
// one JSON record → model::Record{features = the J observations as 0.0/1.0},
// or a reject reason for the dead-letter topic. Implements
// connectors::RecordDecoder (record_decoder.h); the daemon picks it when
// `model.type` is "sbn" (core/models/sbn.h reads Record::features).
//
// Accepted record: a JSON object (valid UTF-8, one JSON value) with
//   "y": an array of exactly J numbers, each equal to 0 or 1 (JSON integers
//        0/1 or the floats 0.0/1.0; -0.0 reads as 0).
// Other keys (e.g. "id", "label") are ignored.
//
// Reject reasons (json_document.h), checked in this order:
//   kInvalidUtf8     the bytes are not well-formed UTF-8
//   kInvalidJson     not one valid JSON value (a number too large for a
//                    double, e.g. 1e400, is refused by the parser itself)
//   kNotAnObject     valid JSON, not an object
//   kMissingFeatures no "y" key
//   kBadFeatures     "y" is not an array, or an entry is not a number
//                    (booleans, strings, null, arrays, objects)
//   kWrongDimension  the array does not have exactly J entries
//   kNotBinary       an entry is a number other than 0 or 1
// A wrong length is reported before the entries are inspected (except that
// a non-number entry anywhere makes the record kBadFeatures first).
//
// Privacy: as for every RecordDecoder, a DecodeFailure carries only the
// reason code — no value, position, id or byte offset of the record.
//
// Thread-safety: Decode is const and thread-safe; it never throws.
#pragma once

#include <cstdint>
#include <memory>

#include "connectors/decode/record_decoder.h"

namespace vipsd::connectors {

// `visible` = J, the model's number of visible units (sbn.visible, ≥ 1 after
// config validation). With visible < 1 every record is rejected as
// kWrongDimension.
std::unique_ptr<RecordDecoder> NewSbnRecordDecoder(int64_t visible);

}  // namespace vipsd::connectors
