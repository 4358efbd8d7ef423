#include "connectors/decode/record_decoder.h"

#include <utility>

namespace vipsd::connectors {
namespace {

class LdaRecordDecoder final : public RecordDecoder {
 public:
  explicit LdaRecordDecoder(const text::Vocabulary& vocabulary) : vocabulary_(&vocabulary) {}

  RecordDecodeResult Decode(std::string_view bytes) const override {
    DecodeResult decoded = DecodeJsonDocument(bytes, *vocabulary_);
    if (auto* failure = std::get_if<DecodeFailure>(&decoded)) return *failure;
    model::Record record;
    // A document with no vocabulary word is well-formed: it is pooled and
    // contributes a zero statistic inside the mechanism. Rejecting it here
    // would decide, from its content and outside the mechanism, whether a
    // record takes part.
    record.word_ids = std::move(std::get<text::Document>(decoded).word_ids);
    return record;
  }

 private:
  const text::Vocabulary* vocabulary_;
};

}  // namespace

std::unique_ptr<RecordDecoder> NewLdaRecordDecoder(const text::Vocabulary& vocabulary) {
  return std::make_unique<LdaRecordDecoder>(vocabulary);
}

}  // namespace vipsd::connectors
