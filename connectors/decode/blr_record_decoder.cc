#include "connectors/decode/blr_record_decoder.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "core/models/blr.h"

namespace vipsd::connectors {
namespace {

using Json = nlohmann::json;

constexpr int64_t kMaxDim = 1024;  // BlrConfig's range

// A finite double from a JSON number, or nullopt (non-number, bool, ±inf).
std::optional<double> FiniteNumber(const Json& value) {
  if (!value.is_number()) return std::nullopt;
  const double number = value.get<double>();
  if (!std::isfinite(number)) return std::nullopt;
  return number;
}

// A JSON integer (signed or unsigned), or nullopt. Floats are not integers
// here, even 3.0.
std::optional<int64_t> Integer(const Json& value) {
  if (value.is_number_unsigned()) {
    const auto number = value.get<uint64_t>();
    if (number > static_cast<uint64_t>(INT64_MAX)) return INT64_MAX;  // out of any range
    return static_cast<int64_t>(number);
  }
  if (value.is_number_integer()) return value.get<int64_t>();
  return std::nullopt;
}

// Moves x inside the unit ball (header: kRescale).
void RescaleToUnitBall(std::vector<double>& x) {
  double largest = 0;
  for (double value : x) largest = std::max(largest, std::fabs(value));
  if (largest > 1) {
    for (double& value : x) value /= largest;
  }
  const double squared = models::FeatureSquaredNorm(x);
  if (squared > 1) {
    const double norm = std::sqrt(squared);
    for (double& value : x) value /= norm;
  }
  // Each round moves every non-zero coordinate strictly toward zero, so the
  // computed squared norm falls; 64 rounds is far more than rounding needs.
  for (int round = 0; round < 64 && models::FeatureSquaredNorm(x) > 1; ++round) {
    for (double& value : x) {
      if (value != 0) value = std::nextafter(value, 0.0);
    }
  }
  if (models::FeatureSquaredNorm(x) > 1) std::fill(x.begin(), x.end(), 0.0);  // unreachable
}

class BlrRecordDecoder final : public RecordDecoder {
 public:
  BlrRecordDecoder(int64_t dim, NormRule rule) : dim_(dim), rule_(rule) {}

  RecordDecodeResult Decode(std::string_view bytes) const override {
    if (!IsValidUtf8(bytes)) return DecodeFailure{RejectReason::kInvalidUtf8};
    try {
      const Json value = Json::parse(bytes.begin(), bytes.end(), /*cb=*/nullptr,
                                     /*allow_exceptions=*/false, /*ignore_comments=*/false);
      if (value.is_discarded()) return DecodeFailure{RejectReason::kInvalidJson};
      if (!value.is_object()) return DecodeFailure{RejectReason::kNotAnObject};
      return DecodeObject(value);
    } catch (const Json::exception&) {
      // nlohmann's messages quote the input: only the reason leaves.
      return DecodeFailure{RejectReason::kInvalidJson};
    }
  }

 private:
  RecordDecodeResult DecodeObject(const Json& object) const {
    if (dim_ < 1 || dim_ > kMaxDim) return DecodeFailure{RejectReason::kWrongDimension};
    const auto x_it = object.find("x");
    if (x_it == object.end()) return DecodeFailure{RejectReason::kMissingFeatures};
    std::optional<int64_t> declared_dim;
    if (const auto dim_it = object.find("dim"); dim_it != object.end()) {
      declared_dim = Integer(*dim_it);
      if (!declared_dim.has_value()) return DecodeFailure{RejectReason::kBadFeatures};
      if (*declared_dim != dim_) return DecodeFailure{RejectReason::kWrongDimension};
    }
    model::Record record;
    record.features.assign(static_cast<size_t>(dim_), 0.0);
    const Json& x = *x_it;
    if (x.is_array()) {
      if (x.size() != static_cast<size_t>(dim_)) {
        return DecodeFailure{RejectReason::kWrongDimension};
      }
      for (size_t i = 0; i < x.size(); ++i) {
        const std::optional<double> number = FiniteNumber(x[i]);
        if (!number.has_value()) return DecodeFailure{RejectReason::kBadFeatures};
        record.features[i] = *number;
      }
    } else if (x.is_object()) {
      const auto indices_it = x.find("indices");
      const auto values_it = x.find("values");
      if (!declared_dim.has_value() || indices_it == x.end() || values_it == x.end() ||
          !indices_it->is_array() || !values_it->is_array() ||
          indices_it->size() != values_it->size()) {
        return DecodeFailure{RejectReason::kBadFeatures};
      }
      std::vector<char> seen(static_cast<size_t>(dim_), 0);
      for (size_t k = 0; k < indices_it->size(); ++k) {
        const std::optional<int64_t> index = Integer((*indices_it)[k]);
        const std::optional<double> number = FiniteNumber((*values_it)[k]);
        if (!index.has_value() || !number.has_value()) {
          return DecodeFailure{RejectReason::kBadFeatures};
        }
        if (*index < 0 || *index >= dim_) return DecodeFailure{RejectReason::kWrongDimension};
        const auto slot = static_cast<size_t>(*index);
        if (seen[slot]) return DecodeFailure{RejectReason::kBadFeatures};
        seen[slot] = 1;
        record.features[slot] = *number;
      }
    } else {
      return DecodeFailure{RejectReason::kBadFeatures};
    }

    const auto y_it = object.find("y");
    if (y_it == object.end()) return DecodeFailure{RejectReason::kMissingLabel};
    if (y_it->is_number_integer() || y_it->is_number_unsigned()) {
      const std::optional<int64_t> label = Integer(*y_it);
      if (!label.has_value() || (*label != 0 && *label != 1)) {
        return DecodeFailure{RejectReason::kBadLabel};
      }
      record.label = static_cast<double>(*label);
    } else if (y_it->is_number_float()) {
      const double label = y_it->get<double>();
      if (label != 0.0 && label != 1.0) return DecodeFailure{RejectReason::kBadLabel};
      record.label = label == 1.0 ? 1.0 : 0.0;  // −0.0 → 0
    } else {
      return DecodeFailure{RejectReason::kBadLabel};
    }

    double largest = 0;
    for (double value : record.features) largest = std::max(largest, std::fabs(value));
    const bool over = largest > 1 || models::FeatureSquaredNorm(record.features) > 1;
    if (over) {
      if (rule_ == NormRule::kReject) return DecodeFailure{RejectReason::kNormTooLarge};
      RescaleToUnitBall(record.features);
    }
    return record;
  }

  int64_t dim_;
  NormRule rule_;
};

}  // namespace

std::string_view NormRuleName(NormRule rule) {
  switch (rule) {
    case NormRule::kReject: return "reject";
    case NormRule::kRescale: return "rescale";
  }
  return "unknown";
}

std::optional<NormRule> ParseNormRule(std::string_view name) {
  if (name == "reject") return NormRule::kReject;
  if (name == "rescale") return NormRule::kRescale;
  return std::nullopt;
}

std::unique_ptr<RecordDecoder> NewBlrRecordDecoder(int64_t dim, NormRule rule) {
  return std::make_unique<BlrRecordDecoder>(dim, rule);
}

}  // namespace vipsd::connectors
