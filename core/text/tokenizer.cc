#include "core/text/tokenizer.h"

#include <array>
#include <cstddef>
#include <string>

namespace vipsd::text {
namespace {

// Byte classes for rule 2: not a letter, lowercase letter, uppercase letter.
enum : uint8_t { kNotLetter = 0, kLower = 1, kUpper = 2 };

constexpr std::array<uint8_t, 256> MakeByteClasses() {
  std::array<uint8_t, 256> classes{};
  for (int b = 'a'; b <= 'z'; ++b) classes[static_cast<size_t>(b)] = kLower;
  for (int b = 'A'; b <= 'Z'; ++b) classes[static_cast<size_t>(b)] = kUpper;
  return classes;
}

constexpr std::array<uint8_t, 256> kByteClasses = MakeByteClasses();

constexpr size_t kStackWordBytes = 64;

// Rule 4 (length ≥ 2) and the cheap "longer than any term" rejection, then
// rules 3 and 5. `classes_seen` is the OR of the classes of the word's bytes
// when the caller knows them (kLower alone means no copy is needed).
class WordMatcher {
 public:
  explicit WordMatcher(const Vocabulary& vocabulary)
      : vocabulary_(vocabulary), max_length_(vocabulary.max_term_length()) {}

  std::optional<int32_t> Match(std::string_view word, uint8_t classes_seen) {
    if (word.size() < 2 || word.size() > max_length_) return std::nullopt;
    if (classes_seen == kLower) return vocabulary_.Find(word);
    char* lowered = stack_buffer_.data();
    if (word.size() > stack_buffer_.size()) {
      if (heap_buffer_.size() < word.size()) heap_buffer_.resize(word.size());
      lowered = heap_buffer_.data();
    }
    for (size_t i = 0; i < word.size(); ++i) {
      const char c = word[i];
      lowered[i] = (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
    }
    return vocabulary_.Find(std::string_view(lowered, word.size()));
  }

 private:
  const Vocabulary& vocabulary_;
  const size_t max_length_;
  std::array<char, kStackWordBytes> stack_buffer_{};
  std::string heap_buffer_;
};

}  // namespace

void AppendTokenIds(std::string_view utf8_text, const Vocabulary& vocabulary,
                    std::vector<int32_t>& ids) {
  WordMatcher matcher(vocabulary);
  const auto* bytes = reinterpret_cast<const unsigned char*>(utf8_text.data());
  const size_t size = utf8_text.size();
  size_t pos = 0;
  while (pos < size) {
    while (pos < size && kByteClasses[bytes[pos]] == kNotLetter) ++pos;
    const size_t start = pos;
    uint8_t classes_seen = kNotLetter;
    while (pos < size) {
      const uint8_t byte_class = kByteClasses[bytes[pos]];
      if (byte_class == kNotLetter) break;
      classes_seen |= byte_class;
      ++pos;
    }
    if (pos == start) break;  // end of text
    const std::optional<int32_t> id =
        matcher.Match(utf8_text.substr(start, pos - start), classes_seen);
    if (id.has_value()) ids.push_back(*id);
  }
}

std::vector<int32_t> TokenizeToIds(std::string_view utf8_text, const Vocabulary& vocabulary) {
  std::vector<int32_t> ids;
  AppendTokenIds(utf8_text, vocabulary, ids);
  return ids;
}

std::optional<int32_t> FindWordId(std::string_view word, const Vocabulary& vocabulary) {
  uint8_t classes_seen = kNotLetter;
  for (const char c : word) {
    const uint8_t byte_class = kByteClasses[static_cast<unsigned char>(c)];
    // Terms are [a-z]+, so a word with any non-letter byte matches nothing.
    if (byte_class == kNotLetter) return std::nullopt;
    classes_seen |= byte_class;
  }
  WordMatcher matcher(vocabulary);
  return matcher.Match(word, classes_seen);
}

}  // namespace vipsd::text
