// RecordDecoder: turns the bytes of one input record (a Kafka message value
// or a JSON Lines line) into the model::Record the pool keeps, or into a
// reason for the dead-letter topic (docs/architecture.md, "The path of a
// record": records are decoded and validated before the privacy wall). One implementation per model type; the daemon
// picks it from `model.type` and otherwise treats records as opaque.
//
// Privacy: a decoded Record is private record content (pool only, never
// logged or written to disk). A DecodeFailure carries only a reason code
// (RejectReasonName / RejectReasonDescription: fixed strings naming at most
// a JSON key) — never a value, id or byte offset of the record.
//
// Thread-safety: Decode is const and may be called concurrently. It never
// throws.
#pragma once

#include <memory>
#include <string_view>
#include <variant>

#include "connectors/decode/json_document.h"
#include "core/model/model.h"
#include "core/text/vocabulary.h"

namespace vipsd::connectors {

using RecordDecodeResult = std::variant<model::Record, DecodeFailure>;

class RecordDecoder {
 public:
  virtual ~RecordDecoder() = default;
  virtual RecordDecodeResult Decode(std::string_view bytes) const = 0;
  // The same, for a record that came with a Kafka message key (PRIVATE, like
  // the record). Only the unit decoder (unit_decoder.h) reads the key.
  virtual RecordDecodeResult DecodeKeyed(std::string_view bytes, std::string_view /*key*/) const {
    return Decode(bytes);
  }
};

// LDA documents (json_document.h): Record::word_ids. A document with no
// in-vocabulary word is a valid record with no words: it is pooled like any
// other and contributes the zero statistic (only syntax errors are
// rejected). `vocabulary` must outlive the decoder.
std::unique_ptr<RecordDecoder> NewLdaRecordDecoder(const text::Vocabulary& vocabulary);

}  // namespace vipsd::connectors
