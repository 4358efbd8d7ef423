#include "connectors/decode/unit_decoder.h"

#include <nlohmann/json.hpp>

#include <utility>

#include "core/svi/step_randomness.h"

namespace vipsd::connectors {
namespace {

class UnitDecoder final : public RecordDecoder {
 public:
  UnitDecoder(std::unique_ptr<RecordDecoder> inner, UnitSource source, std::string field,
              privacy::UnitPartitioner partitioner)
      : inner_(std::move(inner)), source_(source), field_(std::move(field)),
        partitioner_(partitioner) {}

  RecordDecodeResult Decode(std::string_view bytes) const override {
    return DecodeKeyed(bytes, std::string_view());
  }

  RecordDecodeResult DecodeKeyed(std::string_view bytes, std::string_view key) const override {
    RecordDecodeResult result = inner_->Decode(bytes);
    auto* record = std::get_if<model::Record>(&result);
    if (record == nullptr) return result;
    if (source_ == UnitSource::kKey) {
      if (key.empty()) return DecodeFailure{RejectReason::kMissingUnit};
      record->unit = svi::UnitDigest(key);
      record->unit_hash = privacy::UnitKeyHash(partitioner_, key);
      return result;
    }
    // The model's decoder accepted the bytes as one JSON object; read the
    // unit field from it (a second parse: unit mode on file sources only).
    const nlohmann::json json = nlohmann::json::parse(bytes, nullptr, /*allow_exceptions=*/false);
    if (!json.is_object()) return DecodeFailure{RejectReason::kInvalidJson};
    const auto it = json.find(field_);
    if (it == json.end() || it->is_null()) return DecodeFailure{RejectReason::kMissingUnit};
    std::string id;
    if (it->is_string()) {
      id = it->get<std::string>();
    } else if (it->is_number_integer()) {
      id = it->is_number_unsigned() ? std::to_string(it->get<uint64_t>())
                                    : std::to_string(it->get<int64_t>());
    }
    if (id.empty()) return DecodeFailure{RejectReason::kBadUnit};
    record->unit = svi::UnitDigest(id);
    return result;
  }

 private:
  std::unique_ptr<RecordDecoder> inner_;
  UnitSource source_;
  std::string field_;
  privacy::UnitPartitioner partitioner_;
};

}  // namespace

std::unique_ptr<RecordDecoder> NewUnitDecoder(std::unique_ptr<RecordDecoder> inner,
                                              UnitSource source, std::string field,
                                              privacy::UnitPartitioner partitioner) {
  return std::make_unique<UnitDecoder>(std::move(inner), source, std::move(field), partitioner);
}

}  // namespace vipsd::connectors
