// Every record decoder (LDA JSON documents, BLR and SBN records, and the
// privacy unit's decoder over BLR) on
// arbitrary bytes: no crash, no sanitizer report, and a decoded record is
// within its declared bounds; the LDA scanner decodes exactly what the
// nlohmann reference decodes. The first byte picks the decoder.
#include <array>
#include <cmath>

#include "connectors/decode/blr_record_decoder.h"
#include "connectors/decode/json_document.h"
#include "connectors/decode/sbn_record_decoder.h"
#include "connectors/decode/unit_decoder.h"
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
  static const auto unit = connectors::NewUnitDecoder(
      connectors::NewBlrRecordDecoder(4, connectors::NormRule::kRescale),
      connectors::UnitSource::kField, "person");
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
    case 1: {
      const auto plain = blr->Decode(record);
      // The unit decoder (privacy.unit: field) over the same decoder: the
      // model's reason when it rejects; otherwise a record with a unit
      // digest, or missing_unit / bad_unit (never another reason).
      const auto with_unit = unit->Decode(record);
      if (const auto* failure = std::get_if<connectors::DecodeFailure>(&plain)) {
        const auto* unit_failure = std::get_if<connectors::DecodeFailure>(&with_unit);
        if (unit_failure == nullptr || unit_failure->reason != failure->reason) {
          fuzz::Violated("the unit decoder changed the model decoder's verdict");
        }
      } else if (const auto* unit_failure = std::get_if<connectors::DecodeFailure>(&with_unit)) {
        if (unit_failure->reason != connectors::RejectReason::kMissingUnit &&
            unit_failure->reason != connectors::RejectReason::kBadUnit) {
          fuzz::Violated("the unit decoder rejected a record for another reason");
        }
      } else if (std::get<model::Record>(with_unit).unit == std::array<uint8_t, 16>{}) {
        fuzz::Violated("a record decoded with a unit carries no unit digest");
      }
      break;
    }
    case 2:
      (void)blr_reject->Decode(record);
      break;
    default:
      (void)sbn->Decode(record);
      break;
  }
  return 0;
}
