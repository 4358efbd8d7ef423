// Every record decoder (LDA JSON documents, BLR and SBN records) on
// arbitrary bytes: no crash, no sanitizer report, and a decoded record is
// within its declared bounds; the LDA scanner decodes exactly what the
// nlohmann reference decodes. The first byte picks the decoder.
#include <cmath>

#include "connectors/decode/blr_record_decoder.h"
#include "connectors/decode/json_document.h"
#include "connectors/decode/sbn_record_decoder.h"
#include "core/text/vocabulary.h"
#include "fuzz/fuzz_util.h"

using namespace vipsd;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const text::Vocabulary vocabulary =
      *text::Vocabulary::Parse("apple\nbanana\ncherry\ndate\nelder\nfig\n");
  static const auto blr = connectors::NewBlrRecordDecoder(4, connectors::NormRule::kRescale);
  static const auto blr_reject = connectors::NewBlrRecordDecoder(4, connectors::NormRule::kReject);
  static const auto sbn = connectors::NewSbnRecordDecoder(8);
  const std::string_view record = fuzz::AsText(data + 1, size - 1);
  switch (data[0] % 4) {
    case 0: {
      const auto result = connectors::DecodeJsonDocument(record, vocabulary);
      if (const auto* document = std::get_if<text::Document>(&result)) {
        for (int32_t id : document->word_ids) {
          if (id < 0 || id >= vocabulary.size()) fuzz::Violated("word id out of range");
        }
      }
      // The single-pass scanner must agree with the nlohmann reference.
      const auto reference = connectors::DecodeJsonDocumentReference(record, vocabulary);
      if (result.index() != reference.index()) fuzz::Violated("scanner and reference disagree");
      if (const auto* failure = std::get_if<connectors::DecodeFailure>(&reference)) {
        if (std::get<connectors::DecodeFailure>(result).reason != failure->reason) {
          fuzz::Violated("scanner and reference give different reasons");
        }
      } else if (std::get<text::Document>(result).id != std::get<text::Document>(reference).id ||
                 std::get<text::Document>(result).word_ids !=
                     std::get<text::Document>(reference).word_ids) {
        fuzz::Violated("scanner and reference decode different documents");
      }
      break;
    }
    case 1:
      (void)blr->Decode(record);
      break;
    case 2:
      (void)blr_reject->Decode(record);
      break;
    default:
      (void)sbn->Decode(record);
      break;
  }
  return 0;
}
