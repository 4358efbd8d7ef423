#include "core/text/vocabulary.h"

#include <sodium.h>

#include <array>
#include <cassert>
#include <cstring>
#include <limits>

namespace vipsd::text {
namespace {

Status LineError(size_t line_number, std::string_view problem) {
  std::string message = "vocabulary line ";
  message += std::to_string(line_number);
  message += ": ";
  message += problem;
  return InvalidArgumentError(std::move(message));
}

bool IsLowercaseAsciiLetter(char c) { return c >= 'a' && c <= 'z'; }

}  // namespace

StatusOr<Vocabulary> Vocabulary::Parse(std::string_view file_text) {
  if (file_text.empty()) {
    return InvalidArgumentError("vocabulary is empty: it must hold at least one term");
  }
  if (sodium_init() < 0) {
    return InternalError("libsodium initialisation failed (sodium_init returned -1)");
  }
  Vocabulary vocabulary;
  vocabulary.Rehash(16);
  crypto_generichash_state hash_state;
  constexpr size_t kFingerprintBytes = crypto_generichash_BYTES;  // 32: BLAKE2b-256
  static_assert(kFingerprintBytes == 32);
  crypto_generichash_init(&hash_state, nullptr, 0, kFingerprintBytes);

  size_t line_start = 0;
  size_t line_number = 0;
  // A final "\n" closes the last line; it does not open an empty one.
  while (line_start < file_text.size()) {
    ++line_number;
    size_t line_end = file_text.find('\n', line_start);
    const size_t next_start = line_end == std::string_view::npos ? file_text.size() : line_end + 1;
    if (line_end == std::string_view::npos) line_end = file_text.size();
    std::string_view term = file_text.substr(line_start, line_end - line_start);
    if (!term.empty() && term.back() == '\r' && line_end < file_text.size()) {
      term.remove_suffix(1);  // "\r\n" line end
    }
    line_start = next_start;

    if (term.empty()) return LineError(line_number, "empty line (every line must hold one term)");
    for (const char c : term) {
      if (!IsLowercaseAsciiLetter(c)) {
        return LineError(line_number,
                         "term has a character other than a-z (terms are lowercase ASCII "
                         "letters only; no spaces, digits, uppercase or non-ASCII)");
      }
    }
    if (vocabulary.terms_.size() >=
        static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
      return LineError(line_number, "too many terms (ids must fit in int32)");
    }
    if (const std::optional<int32_t> earlier = vocabulary.Find(term)) {
      return LineError(line_number, "duplicate of line " + std::to_string(*earlier + 1) +
                                        " ('" + std::string(term) + "')");
    }
    vocabulary.terms_.emplace_back(term);
    if (2 * vocabulary.terms_.size() > vocabulary.slots_.size()) {
      vocabulary.Rehash(2 * vocabulary.slots_.size());
    } else {
      vocabulary.PlaceTerm(static_cast<int32_t>(vocabulary.terms_.size() - 1));
    }
    if (term.size() > vocabulary.max_term_length_) vocabulary.max_term_length_ = term.size();
    crypto_generichash_update(&hash_state, reinterpret_cast<const unsigned char*>(term.data()),
                              term.size());
    const unsigned char line_end_byte = '\n';
    crypto_generichash_update(&hash_state, &line_end_byte, 1);
  }

  std::array<unsigned char, kFingerprintBytes> digest{};
  crypto_generichash_final(&hash_state, digest.data(), digest.size());
  std::array<char, 2 * kFingerprintBytes + 1> hex{};
  sodium_bin2hex(hex.data(), hex.size(), digest.data(), digest.size());
  vocabulary.fingerprint_.assign(hex.data(), 2 * kFingerprintBytes);
  return vocabulary;
}

const std::string& Vocabulary::term(int32_t id) const {
  assert(id >= 0 && static_cast<size_t>(id) < terms_.size());
  return terms_[static_cast<size_t>(id)];
}

inline uint64_t Vocabulary::Prefix(std::string_view term) {
  const char* bytes = term.data();
  const size_t size = term.size();
  uint64_t prefix = 0;
  if (size >= 8) {
    std::memcpy(&prefix, bytes, sizeof(prefix));
  } else if (size >= 4) {
    // Two overlapping 4-byte loads give bytes [0, size) in place.
    uint32_t head = 0;
    uint32_t tail = 0;
    std::memcpy(&head, bytes, sizeof(head));
    std::memcpy(&tail, bytes + size - 4, sizeof(tail));
    std::memcpy(&prefix, &head, sizeof(head));
    uint64_t high = 0;
    std::memcpy(reinterpret_cast<char*>(&high) + (size - 4), &tail, sizeof(tail));
    prefix |= high;
  } else {
    std::memcpy(&prefix, bytes, size);
  }
  return prefix;
}

inline uint64_t Vocabulary::Hash(uint64_t prefix, std::string_view term) {
  // Words are short: the first 8 bytes come mixed in already loaded, the rest
  // 8 at a time, then MurmurHash3's 64-bit finaliser so that the low bits
  // (the slot index) depend on every input bit. Not for adversarial keys:
  // the table holds only the public vocabulary, and a query costs at most
  // one probe sequence of a table that is at most half full.
  constexpr uint64_t kMultiplier = 0x9E3779B97F4A7C15ULL;
  uint64_t hash = ((term.size() + 1) * kMultiplier) ^ prefix;
  if (term.size() > 8) {
    const char* bytes = term.data() + 8;
    size_t remaining = term.size() - 8;
    while (remaining > 0) {
      uint64_t word = 0;
      const size_t take = remaining < 8 ? remaining : 8;
      std::memcpy(&word, bytes, take);
      hash = (hash * kMultiplier) ^ word;
      hash ^= hash >> 29;
      bytes += take;
      remaining -= take;
    }
  }
  hash *= kMultiplier;
  hash ^= hash >> 33;
  hash *= 0xFF51AFD7ED558CCDULL;
  hash ^= hash >> 33;
  hash *= 0xC4CEB9FE1A85EC53ULL;
  hash ^= hash >> 33;
  return hash;
}

std::optional<int32_t> Vocabulary::Find(std::string_view term) const {
  // Also guards a moved-from object, whose table is empty.
  if (term.size() > max_term_length_ || term.empty() || slots_.empty()) return std::nullopt;
  const uint64_t prefix = Prefix(term);
  const uint64_t hash = Hash(prefix, term);
  const auto length = static_cast<uint32_t>(term.size());
  for (size_t index = hash & slot_mask_;; index = (index + 1) & slot_mask_) {
    const Slot& slot = slots_[index];
    if (slot.id < 0) return std::nullopt;
    if (slot.prefix != prefix || slot.length != length) continue;
    if (length <= 8) return slot.id;
    const std::string& stored = terms_[static_cast<size_t>(slot.id)];
    if (std::memcmp(stored.data() + 8, term.data() + 8, length - 8) == 0) return slot.id;
  }
}

void Vocabulary::PlaceTerm(int32_t id) {
  const std::string& term = terms_[static_cast<size_t>(id)];
  const uint64_t prefix = Prefix(term);
  size_t index = Hash(prefix, term) & slot_mask_;
  while (slots_[index].id >= 0) index = (index + 1) & slot_mask_;
  slots_[index] = Slot{prefix, static_cast<uint32_t>(term.size()), id};
}
void Vocabulary::Rehash(size_t slot_count) {
  assert(slot_count > 0 && (slot_count & (slot_count - 1)) == 0);
  slots_.assign(slot_count, Slot{});
  slot_mask_ = slot_count - 1;
  for (size_t id = 0; id < terms_.size(); ++id) PlaceTerm(static_cast<int32_t>(id));
}

}  // namespace vipsd::text
