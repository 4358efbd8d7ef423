#include "connectors/decode/json_document.h"

#include <charconv>
#include <clocale>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <locale.h>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

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
    case RejectReason::kMissingUnit: return "missing_unit";
    case RejectReason::kBadUnit: return "bad_unit";
    case RejectReason::kUntrustedTimestamp: return "untrusted_timestamp";
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
    case RejectReason::kMissingUnit:
      return "the record has no unit id (privacy.unit: key needs a non-empty message key; "
             "field needs the privacy.unit_field key)";
    case RejectReason::kBadUnit:
      return "the privacy.unit_field key must be a non-empty string or an integer";
    case RejectReason::kUntrustedTimestamp:
      return "the message's timestamp was not set by the broker (source.timestamps: "
             "log_append_time needs the topic's message.timestamp.type=LogAppendTime) or is "
             "missing";
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

DecodeResult DecodeJsonDocumentReference(std::string_view record,
                                         const text::Vocabulary& vocabulary) {
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

// ---------------------------------------------------------------------------
// The single-pass scanner behind DecodeJsonDocument. It accepts exactly the
// language of nlohmann::json::parse(strict, no comments) on input that
// IsValidUtf8 accepted, and keeps, for "id", "text" and "tokens", where the
// last occurrence of each key's value lies (duplicate keys: the last wins,
// as in the DOM's std::map). The values are interpreted only after the whole
// record validated, in the reference's order of checks.

namespace {

enum class ValueKind : uint8_t { kNone, kString, kNumber, kArray, kOther };

struct ValueSpan {
  ValueKind kind = ValueKind::kNone;
  const unsigned char* begin = nullptr;  // first byte of the value
  const unsigned char* end = nullptr;    // one past its last byte
  bool has_escape = false;               // strings: holds a backslash
  bool is_integer = false;               // numbers: no fraction, no exponent
};

constexpr uint64_t kOnes = 0x0101010101010101ULL;
constexpr uint64_t kHighs = 0x8080808080808080ULL;

// Nonzero iff some byte of `word` is < 0x20, '"' or '\\' (exact "any" tests:
// a false positive can only sit above a true hit).
inline uint64_t StringStopBytes(uint64_t word) {
  const uint64_t quote = word ^ (kOnes * '"');
  const uint64_t backslash = word ^ (kOnes * '\\');
  const uint64_t control = (word - kOnes * 0x20) & ~word;
  const uint64_t zero_quote = (quote - kOnes) & ~quote;
  const uint64_t zero_backslash = (backslash - kOnes) & ~backslash;
  return (control | zero_quote | zero_backslash) & kHighs;
}

inline int HexValue(unsigned char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

inline bool IsJsonSpace(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// Appends the UTF-8 bytes of a string value that Scanner::String accepted
// (span includes the quotes).
void Unescape(const ValueSpan& span, std::string& out) {
  const unsigned char* p = span.begin + 1;
  const unsigned char* end = span.end - 1;
  while (p < end) {
    const unsigned char* run = p;
    while (p < end && *p != '\\') ++p;
    out.append(reinterpret_cast<const char*>(run), static_cast<size_t>(p - run));
    if (p >= end) break;
    const unsigned char e = p[1];
    p += 2;
    switch (e) {
      case 'b': out.push_back('\b'); continue;
      case 'f': out.push_back('\f'); continue;
      case 'n': out.push_back('\n'); continue;
      case 'r': out.push_back('\r'); continue;
      case 't': out.push_back('\t'); continue;
      case 'u': break;
      default: out.push_back(static_cast<char>(e)); continue;  // " \\ /
    }
    auto hex4 = [](const unsigned char* at) {
      int v = 0;
      for (int i = 0; i < 4; ++i) v = (v << 4) | HexValue(at[i]);
      return v;
    };
    uint32_t code = static_cast<uint32_t>(hex4(p));
    p += 4;
    if (code >= 0xD800 && code <= 0xDBFF) {  // validated: a low surrogate follows
      const uint32_t low = static_cast<uint32_t>(hex4(p + 2));
      p += 6;
      code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
    }
    if (code < 0x80) {
      out.push_back(static_cast<char>(code));
    } else if (code < 0x800) {
      out.push_back(static_cast<char>(0xC0 | (code >> 6)));
      out.push_back(static_cast<char>(0x80 | (code & 0x3F)));
    } else if (code < 0x10000) {
      out.push_back(static_cast<char>(0xE0 | (code >> 12)));
      out.push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (code & 0x3F)));
    } else {
      out.push_back(static_cast<char>(0xF0 | (code >> 18)));
      out.push_back(static_cast<char>(0x80 | ((code >> 12) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (code & 0x3F)));
    }
  }
}

// The string's UTF-8 content: a view into the record when it holds no
// escape, else unescaped into `buffer`.
std::string_view StringContent(const ValueSpan& span, std::string& buffer) {
  if (!span.has_escape) {
    return {reinterpret_cast<const char*>(span.begin + 1),
            static_cast<size_t>(span.end - span.begin - 2)};
  }
  buffer.clear();
  Unescape(span, buffer);
  return buffer;
}

struct TopLevel {
  ValueSpan id, text, tokens;
};

enum class Key : uint8_t { kOther, kId, kText, kTokens };

Key ClassifyKey(const ValueSpan& key, std::string& buffer) {
  const std::string_view name = StringContent(key, buffer);
  if (name == "id") return Key::kId;
  if (name == "text") return Key::kText;
  if (name == "tokens") return Key::kTokens;
  return Key::kOther;
}


class Scanner {
 public:
  Scanner(const unsigned char* begin, const unsigned char* end) : p_(begin), end_(end) {}

  const unsigned char* position() const { return p_; }

  void SkipSpace() {
    while (p_ < end_ && IsJsonSpace(*p_)) ++p_;
  }

  // After the top-level value: only whitespace, then the end or a NUL byte
  // (nlohmann's lexer reads NUL as the end of input).
  bool AtEnd() {
    SkipSpace();
    return p_ == end_ || *p_ == 0;
  }

  // p_ at the opening quote. Validates the string (control characters,
  // escapes, \u surrogate pairs) and leaves p_ after the closing quote.
  bool String(ValueSpan* span) {
    span->kind = ValueKind::kString;
    span->begin = p_;
    span->has_escape = false;
    ++p_;
    for (;;) {
      while (end_ - p_ >= 8) {
        uint64_t word;
        std::memcpy(&word, p_, sizeof(word));
        if (StringStopBytes(word) != 0) break;
        p_ += 8;
      }
      if (p_ >= end_) return false;
      const unsigned char c = *p_;
      if (c == '"') {
        ++p_;
        span->end = p_;
        return true;
      }
      if (c < 0x20) return false;
      if (c != '\\') {
        ++p_;
        continue;
      }
      span->has_escape = true;
      if (end_ - p_ < 2) return false;
      const unsigned char e = p_[1];
      if (e == 'u') {
        int unit = 0;
        if (!Hex4(p_ + 2, &unit)) return false;
        p_ += 6;
        if (unit >= 0xDC00 && unit <= 0xDFFF) return false;  // lone low surrogate
        if (unit >= 0xD800 && unit <= 0xDBFF) {
          int low = 0;
          if (end_ - p_ < 2 || p_[0] != '\\' || p_[1] != 'u' || !Hex4(p_ + 2, &low) ||
              low < 0xDC00 || low > 0xDFFF) {
            return false;
          }
          p_ += 6;
        }
        continue;
      }
      switch (e) {
        case '"': case '\\': case '/': case 'b': case 'f': case 'n': case 'r': case 't':
          p_ += 2;
          continue;
        default:
          return false;
      }
    }
  }

  // -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? ; a value that is not an
  // integer of 64 bits must be a finite double (nlohmann: "number overflow").
  bool Number(ValueSpan* span) {
    span->kind = ValueKind::kNumber;
    span->begin = p_;
    if (p_ < end_ && *p_ == '-') ++p_;
    if (p_ >= end_) return false;
    const unsigned char* digits = p_;
    if (*p_ == '0') {
      ++p_;
    } else if (*p_ >= '1' && *p_ <= '9') {
      while (p_ < end_ && *p_ >= '0' && *p_ <= '9') ++p_;
    } else {
      return false;
    }
    const size_t integer_digits = static_cast<size_t>(p_ - digits);
    bool integer = true;
    if (p_ < end_ && *p_ == '.') {
      integer = false;
      ++p_;
      const unsigned char* fraction = p_;
      while (p_ < end_ && *p_ >= '0' && *p_ <= '9') ++p_;
      if (p_ == fraction) return false;
    }
    bool exponent = false;
    if (p_ < end_ && (*p_ == 'e' || *p_ == 'E')) {
      integer = false;
      exponent = true;
      ++p_;
      if (p_ < end_ && (*p_ == '+' || *p_ == '-')) ++p_;
      const unsigned char* exponent_digits = p_;
      while (p_ < end_ && *p_ >= '0' && *p_ <= '9') ++p_;
      if (p_ == exponent_digits) return false;
    }
    span->end = p_;
    span->is_integer = integer && integer_digits <= 20 && FitsInteger(span->begin, span->end);
    // Below 1e300 in magnitude without an exponent: certainly finite.
    if (span->is_integer || (!exponent && integer_digits <= 300)) return true;
    return FiniteDouble(span->begin, span->end);
  }

  // Any JSON value; containers iteratively (nlohmann sets no depth limit).
  bool Value(ValueSpan* span) {
    if (p_ >= end_) return false;
    span->begin = p_;
    const unsigned char c = *p_;
    if (c == '"') return String(span);
    if (c == '-' || (c >= '0' && c <= '9')) return Number(span);
    if (c == '[' || c == '{') {
      span->kind = c == '[' ? ValueKind::kArray : ValueKind::kOther;
      if (!Container()) return false;
      span->end = p_;
      return true;
    }
    span->kind = ValueKind::kOther;
    if (!Literal()) return false;
    span->end = p_;
    return true;
  }

  // p_ at '{' or '['.
  bool Container() {
    std::vector<unsigned char> stack;  // open containers: '{' or '['
    ValueSpan scratch;
    stack.push_back(*p_++);
    SkipSpace();
    if (p_ < end_ && *p_ == (stack.back() == '{' ? '}' : ']')) {
      ++p_;
      return true;
    }
    for (;;) {
      // Expect a member (key ':' value) or an element.
      if (stack.back() == '{') {
        if (p_ >= end_ || *p_ != '"' || !String(&scratch)) return false;
        SkipSpace();
        if (p_ >= end_ || *p_ != ':') return false;
        ++p_;
        SkipSpace();
      }
      if (p_ >= end_) return false;
      if (*p_ == '{' || *p_ == '[') {
        stack.push_back(*p_++);
        SkipSpace();
        if (p_ < end_ && *p_ == (stack.back() == '{' ? '}' : ']')) {
          ++p_;
          stack.pop_back();
        } else {
          continue;
        }
      } else if (!Value(&scratch)) {
        return false;
      }
      // After a value: ',' continues the innermost container, its closing
      // bracket ends it (and then the enclosing one continues).
      for (;;) {
        SkipSpace();
        if (p_ >= end_) return false;
        if (*p_ == ',') {
          ++p_;
          SkipSpace();
          break;
        }
        if (*p_ != (stack.back() == '{' ? '}' : ']')) return false;
        ++p_;
        stack.pop_back();
        if (stack.empty()) return true;
      }
    }
  }

  // The top-level object, p_ at '{': validates it and keeps the last
  // value span of each of "id", "text" and "tokens".
  bool TopObject(TopLevel& top, std::string& buffer) {
    ++p_;
    SkipSpace();
    if (p_ < end_ && *p_ == '}') {
      ++p_;
      return true;
    }
    ValueSpan key;
    for (;;) {
      if (p_ >= end_ || *p_ != '"' || !String(&key)) return false;
      SkipSpace();
      if (p_ >= end_ || *p_ != ':') return false;
      ++p_;
      SkipSpace();
      ValueSpan value;
      if (!Value(&value)) return false;
      switch (ClassifyKey(key, buffer)) {
        case Key::kId: top.id = value; break;
        case Key::kText: top.text = value; break;
        case Key::kTokens: top.tokens = value; break;
        case Key::kOther: break;
      }
      SkipSpace();
      if (p_ >= end_) return false;
      if (*p_ == '}') {
        ++p_;
        return true;
      }
      if (*p_ != ',') return false;
      ++p_;
      SkipSpace();
    }
  }

  // The elements of an array value that validated, p_ at '[': calls
  // on_string(span) for each string element; false at the first element that
  // is not a string.
  template <typename OnString>
  bool StringElements(OnString on_string) {
    ++p_;
    SkipSpace();
    if (p_ < end_ && *p_ == ']') return true;
    for (;;) {
      if (p_ >= end_ || *p_ != '"') return false;
      ValueSpan element;
      if (!String(&element)) return false;
      on_string(element);
      SkipSpace();
      if (p_ >= end_ || *p_ != ',') return true;  // ']'
      ++p_;
      SkipSpace();
    }
  }

 private:
  bool Hex4(const unsigned char* at, int* value) const {
    if (end_ - at < 4) return false;
    int v = 0;
    for (int i = 0; i < 4; ++i) {
      const int h = HexValue(at[i]);
      if (h < 0) return false;
      v = (v << 4) | h;
    }
    *value = v;
    return true;
  }

  bool Literal() {
    auto take = [this](std::string_view word) {
      if (static_cast<size_t>(end_ - p_) < word.size() ||
          std::memcmp(p_, word.data(), word.size()) != 0) {
        return false;
      }
      p_ += word.size();
      return true;
    };
    switch (*p_) {
      case 't': return take("true");
      case 'f': return take("false");
      case 'n': return take("null");
      default: return false;
    }
  }

  // Whether the integer text [begin, end) fits int64 (negative) or uint64.
  static bool FitsInteger(const unsigned char* begin, const unsigned char* end) {
    const char* first = reinterpret_cast<const char*>(begin);
    const char* last = reinterpret_cast<const char*>(end);
    if (*first == '-') {
      int64_t value = 0;
      const auto [ptr, ec] = std::from_chars(first, last, value);
      return ec == std::errc() && ptr == last;
    }
    uint64_t value = 0;
    const auto [ptr, ec] = std::from_chars(first, last, value);
    return ec == std::errc() && ptr == last;
  }

  // strtod in the C locale, as nlohmann does (it rewrites the decimal point
  // for the current locale; the result is the same).
  static bool FiniteDouble(const unsigned char* begin, const unsigned char* end) {
    static const locale_t c_locale = newlocale(LC_ALL_MASK, "C", static_cast<locale_t>(0));
    const std::string text(reinterpret_cast<const char*>(begin), static_cast<size_t>(end - begin));
    const double value = strtod_l(text.c_str(), nullptr, c_locale);
    return std::isfinite(value);
  }

  const unsigned char* p_;
  const unsigned char* end_;
};

}  // namespace

DecodeResult DecodeJsonDocument(std::string_view record, const text::Vocabulary& vocabulary) {
  if (!IsValidUtf8(record)) return DecodeFailure{RejectReason::kInvalidUtf8};
  auto* begin = reinterpret_cast<const unsigned char*>(record.data());
  const auto* end = begin + record.size();
  // nlohmann skips a UTF-8 byte order mark at the very start (only there).
  if (record.size() >= 3 && begin[0] == 0xEF && begin[1] == 0xBB && begin[2] == 0xBF) begin += 3;
  Scanner scanner(begin, end);
  thread_local std::string buffer;  // unescaped strings; keeps its capacity
  scanner.SkipSpace();
  TopLevel top;
  if (scanner.position() < end && *scanner.position() == '{') {
    if (!scanner.TopObject(top, buffer) || !scanner.AtEnd()) {
      return DecodeFailure{RejectReason::kInvalidJson};
    }
  } else {
    ValueSpan value;
    if (!scanner.Value(&value) || !scanner.AtEnd()) return DecodeFailure{RejectReason::kInvalidJson};
    return DecodeFailure{RejectReason::kNotAnObject};
  }

  // The reference's checks, in its order.
  if (top.id.kind == ValueKind::kNone) return DecodeFailure{RejectReason::kMissingId};
  text::Document document;
  if (top.id.kind == ValueKind::kString) {
    document.id = std::string(StringContent(top.id, buffer));
    if (document.id.empty()) return DecodeFailure{RejectReason::kBadId};
  } else if (top.id.kind == ValueKind::kNumber && top.id.is_integer) {
    // Canonical decimal, as std::to_string of the parsed integer ("-0" -> "0").
    const char* first = reinterpret_cast<const char*>(top.id.begin);
    const char* last = reinterpret_cast<const char*>(top.id.end);
    if (*first == '-') {
      int64_t value = 0;
      std::from_chars(first, last, value);
      document.id = std::to_string(value);
    } else {
      uint64_t value = 0;
      std::from_chars(first, last, value);
      document.id = std::to_string(value);
    }
  } else {
    return DecodeFailure{RejectReason::kBadId};
  }
  const bool has_text = top.text.kind != ValueKind::kNone;
  const bool has_tokens = top.tokens.kind != ValueKind::kNone;
  if (has_text && has_tokens) return DecodeFailure{RejectReason::kBothTextAndTokens};
  if (!has_text && !has_tokens) return DecodeFailure{RejectReason::kMissingText};
  if (has_text) {
    if (top.text.kind != ValueKind::kString) return DecodeFailure{RejectReason::kBadText};
    // Into a per-thread scratch vector, then one exact-size copy: the pool
    // keeps no growth slack and the record costs one allocation.
    thread_local std::vector<int32_t> ids;
    ids.clear();
    text::AppendTokenIds(StringContent(top.text, buffer), vocabulary, ids);
    document.word_ids.assign(ids.begin(), ids.end());
    return document;
  }
  if (top.tokens.kind != ValueKind::kArray) return DecodeFailure{RejectReason::kBadTokens};
  // Every element must be a string before any is kept (the reference
  // validates the whole array first).
  size_t count = 0;
  Scanner check(top.tokens.begin, top.tokens.end);
  if (!check.StringElements([&](const ValueSpan&) { ++count; })) {
    return DecodeFailure{RejectReason::kBadTokens};
  }
  document.word_ids.reserve(count);
  Scanner elements(top.tokens.begin, top.tokens.end);
  elements.StringElements([&](const ValueSpan& element) {
    const std::optional<int32_t> word_id =
        text::FindWordId(StringContent(element, buffer), vocabulary);
    if (word_id.has_value()) document.word_ids.push_back(*word_id);
  });
  return document;
}

bool RejectReasonApplies(RejectReason reason, std::string_view model_type, bool per_unit) {
  switch (reason) {
    case RejectReason::kMissingUnit:  // every model, in unit mode only
    case RejectReason::kBadUnit:
      return per_unit;
    case RejectReason::kInvalidJson:
    case RejectReason::kNotAnObject:
    case RejectReason::kLineTooLong:
    case RejectReason::kInvalidUtf8:
    case RejectReason::kRecordTooLarge:
    case RejectReason::kUntrustedTimestamp:
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
