#include "connectors/decode/sbn_record_decoder.h"

#include <nlohmann/json.hpp>

#include <utility>
#include <vector>

namespace vipsd::connectors {
namespace {

using Json = nlohmann::json;

RecordDecodeResult DecodeObservations(const Json& object, int64_t visible) {
  const auto y = object.find("y");
  if (y == object.end()) return DecodeFailure{RejectReason::kMissingFeatures};
  if (!y->is_array()) return DecodeFailure{RejectReason::kBadFeatures};
  for (const Json& entry : *y) {
    // nlohmann: booleans are not numbers.
    if (!entry.is_number()) return DecodeFailure{RejectReason::kBadFeatures};
  }
  if (visible < 1 || y->size() != static_cast<size_t>(visible)) {
    return DecodeFailure{RejectReason::kWrongDimension};
  }
  model::Record record;
  record.features.reserve(y->size());
  for (const Json& entry : *y) {
    const double value = entry.get<double>();
    if (value == 0.0) {
      record.features.push_back(0.0);  // also maps -0.0 to +0.0
    } else if (value == 1.0) {
      record.features.push_back(1.0);
    } else {
      return DecodeFailure{RejectReason::kNotBinary};
    }
  }
  return record;
}

class SbnRecordDecoder final : public RecordDecoder {
 public:
  explicit SbnRecordDecoder(int64_t visible) : visible_(visible) {}

  RecordDecodeResult Decode(std::string_view bytes) const override {
    if (!IsValidUtf8(bytes)) return DecodeFailure{RejectReason::kInvalidUtf8};
    try {
      const Json value = Json::parse(bytes.begin(), bytes.end(), /*cb=*/nullptr,
                                     /*allow_exceptions=*/false, /*ignore_comments=*/false);
      if (value.is_discarded()) return DecodeFailure{RejectReason::kInvalidJson};
      if (!value.is_object()) return DecodeFailure{RejectReason::kNotAnObject};
      return DecodeObservations(value, visible_);
    } catch (const Json::exception&) {
      // nlohmann's messages quote the input: only the code leaves.
      return DecodeFailure{RejectReason::kInvalidJson};
    }
  }

 private:
  int64_t visible_;
};

}  // namespace

std::unique_ptr<RecordDecoder> NewSbnRecordDecoder(int64_t visible) {
  return std::make_unique<SbnRecordDecoder>(visible);
}

}  // namespace vipsd::connectors
