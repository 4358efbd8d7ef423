#include "connectors/decode/json_document.h"

#include <cstdint>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>

#include "core/text/tokenizer.h"

namespace vipsd::connectors {
namespace {

using Json = nlohmann::json;

bool IsContinuation(unsigned char byte) { return (byte & 0xC0) == 0x80; }

// Decodes the "id" value; false if it is not a non-empty string or an integer.
bool DecodeId(const Json& id, std::string& out) {
  if (id.is_string()) {
    out = id.get_ref<const std::string&>();
    return !out.empty();
  }
  if (id.is_number_unsigned()) {
    out = std::to_string(id.get<uint64_t>());
    return true;
  }
  if (id.is_number_integer()) {
    out = std::to_string(id.get<int64_t>());
    return true;
  }
  return false;
}

DecodeResult DecodeObject(const Json& object, const text::Vocabulary& vocabulary) {
  const auto id = object.find("id");
  if (id == object.end()) return DecodeFailure{RejectReason::kMissingId};
  text::Document document;
  if (!DecodeId(*id, document.id)) return DecodeFailure{RejectReason::kBadId};

  const auto text = object.find("text");
  const auto tokens = object.find("tokens");
  const bool has_text = text != object.end();
  const bool has_tokens = tokens != object.end();
  if (has_text && has_tokens) return DecodeFailure{RejectReason::kBothTextAndTokens};
  if (!has_text && !has_tokens) return DecodeFailure{RejectReason::kMissingText};

  if (has_text) {
    if (!text->is_string()) return DecodeFailure{RejectReason::kBadText};
    text::AppendTokenIds(text->get_ref<const std::string&>(), vocabulary, document.word_ids);
    return document;
  }
  if (!tokens->is_array()) return DecodeFailure{RejectReason::kBadTokens};
  // Validate every entry before keeping any, so that a malformed array is
  // rejected whole rather than half-decoded.
  for (const Json& token : *tokens) {
    if (!token.is_string()) return DecodeFailure{RejectReason::kBadTokens};
  }
  document.word_ids.reserve(tokens->size());
  for (const Json& token : *tokens) {
    const std::optional<int32_t> word_id =
        text::FindWordId(token.get_ref<const std::string&>(), vocabulary);
    if (word_id.has_value()) document.word_ids.push_back(*word_id);
  }
  return document;
}

}  // namespace

std::string_view RejectReasonName(RejectReason reason) {
  switch (reason) {
    case RejectReason::kInvalidJson: return "invalid_json";
    case RejectReason::kNotAnObject: return "not_an_object";
    case RejectReason::kMissingId: return "missing_id";
    case RejectReason::kBadId: return "bad_id";
    case RejectReason::kMissingText: return "missing_text";
    case RejectReason::kBadText: return "bad_text";
    case RejectReason::kBadTokens: return "bad_tokens";
    case RejectReason::kBothTextAndTokens: return "both_text_and_tokens";
    case RejectReason::kLineTooLong: return "line_too_long";
    case RejectReason::kInvalidUtf8: return "invalid_utf8";
    case RejectReason::kRecordTooLarge: return "record_too_large";
    case RejectReason::kMissingFeatures: return "missing_features";
    case RejectReason::kBadFeatures: return "bad_features";
    case RejectReason::kWrongDimension: return "wrong_dimension";
    case RejectReason::kMissingLabel: return "missing_label";
    case RejectReason::kBadLabel: return "bad_label";
    case RejectReason::kNormTooLarge: return "norm_too_large";
    case RejectReason::kNotBinary: return "not_binary";
  }
  return "unknown";
}

std::string_view RejectReasonDescription(RejectReason reason) {
  switch (reason) {
    case RejectReason::kInvalidJson: return "not a single valid JSON value";
    case RejectReason::kNotAnObject: return "the JSON value is not an object";
    case RejectReason::kMissingId: return "key \"id\" is missing";
    case RejectReason::kBadId: return "key \"id\" must be a non-empty string or an integer";
    case RejectReason::kMissingText: return "one of keys \"text\" or \"tokens\" is required";
    case RejectReason::kBadText: return "key \"text\" must be a string";
    case RejectReason::kBadTokens: return "key \"tokens\" must be an array of strings";
    case RejectReason::kBothTextAndTokens:
      return "keys \"text\" and \"tokens\" are both present; use exactly one";
    case RejectReason::kLineTooLong: return "record is longer than the configured limit";
    case RejectReason::kInvalidUtf8: return "bytes are not well-formed UTF-8";
    case RejectReason::kRecordTooLarge: return "record is larger than the configured limit";
    case RejectReason::kMissingFeatures:
      return "the feature key is missing (logistic regression: \"x\", belief network: \"y\")";
    case RejectReason::kBadFeatures:
      return "features must be an array of finite numbers or {\"indices\", \"values\"} with \"dim\"";
    case RejectReason::kWrongDimension:
      return "feature dimension does not match the model (or an index is out of range)";
    case RejectReason::kMissingLabel: return "key \"y\" is missing";
    case RejectReason::kBadLabel: return "key \"y\" must be 0 or 1";
    case RejectReason::kNormTooLarge:
      return "key \"x\" has L2 norm above 1 and the configured rule is reject";
    case RejectReason::kNotBinary: return "key \"y\" must hold only 0 and 1";
  }
  return "unknown reason";
}

bool IsValidUtf8(std::string_view bytes) {
  const auto* data = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t size = bytes.size();
  size_t pos = 0;
  while (pos < size) {
    // Most records are ASCII: skip 8 bytes at a time while no high bit is set.
    while (pos + 8 <= size) {
      uint64_t word;
      std::memcpy(&word, data + pos, sizeof(word));
      if ((word & 0x8080808080808080ULL) != 0) break;
      pos += 8;
    }
    if (pos >= size) break;
    const unsigned char lead = data[pos];
    if (lead < 0x80) {
      ++pos;
      continue;
    }
    // Allowed range of the second byte and the sequence length, Table 3-7.
    unsigned char second_min = 0x80;
    unsigned char second_max = 0xBF;
    size_t length = 0;
    if (lead >= 0xC2 && lead <= 0xDF) {
      length = 2;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      length = 3;
      if (lead == 0xE0) second_min = 0xA0;  // no overlong 3-byte forms
      if (lead == 0xED) second_max = 0x9F;  // no surrogates U+D800..U+DFFF
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      length = 4;
      if (lead == 0xF0) second_min = 0x90;  // no overlong 4-byte forms
      if (lead == 0xF4) second_max = 0x8F;  // nothing above U+10FFFF
    } else {
      return false;  // continuation byte as lead, C0/C1 overlong, or F5..FF
    }
    if (size - pos < length) return false;
    if (data[pos + 1] < second_min || data[pos + 1] > second_max) return false;
    for (size_t k = 2; k < length; ++k) {
      if (!IsContinuation(data[pos + k])) return false;
    }
    pos += length;
  }
  return true;
}

DecodeResult DecodeJsonDocument(std::string_view record, const text::Vocabulary& vocabulary) {
  if (!IsValidUtf8(record)) return DecodeFailure{RejectReason::kInvalidUtf8};
  try {
    // No exceptions for syntax errors: a discarded value means "invalid".
    const Json value = Json::parse(record.begin(), record.end(), /*cb=*/nullptr,
                                   /*allow_exceptions=*/false, /*ignore_comments=*/false);
    if (value.is_discarded()) return DecodeFailure{RejectReason::kInvalidJson};
    if (!value.is_object()) return DecodeFailure{RejectReason::kNotAnObject};
    return DecodeObject(value, vocabulary);
  } catch (const Json::exception&) {
    // Defensive: nlohmann's messages quote the input, so only the code leaves.
    return DecodeFailure{RejectReason::kInvalidJson};
  }
}

bool RejectReasonApplies(RejectReason reason, std::string_view model_type) {
  switch (reason) {
    case RejectReason::kInvalidJson:
    case RejectReason::kNotAnObject:
    case RejectReason::kLineTooLong:
    case RejectReason::kInvalidUtf8:
    case RejectReason::kRecordTooLarge:
      return true;
    case RejectReason::kMissingId:
    case RejectReason::kBadId:
    case RejectReason::kMissingText:
    case RejectReason::kBadText:
    case RejectReason::kBadTokens:
    case RejectReason::kBothTextAndTokens:
      return model_type == "lda";
    case RejectReason::kMissingFeatures:
    case RejectReason::kBadFeatures:
    case RejectReason::kWrongDimension:
      return model_type == "blr" || model_type == "sbn";
    case RejectReason::kMissingLabel:
    case RejectReason::kBadLabel:
    case RejectReason::kNormTooLarge:
      return model_type == "blr";
    case RejectReason::kNotBinary:
      return model_type == "sbn";
  }
  return true;
}

}  // namespace vipsd::connectors
