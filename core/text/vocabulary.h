// Vocabulary: the fixed, PUBLIC list of terms an LDA model is defined over
// (docs/models.md). A vocabulary built from the private stream would leak, so
// it always comes from an operator-supplied file; core only ever sees that
// file's text (the daemon or a connector reads it).
//
// File format (the specification in shared/peers/tokenize.py): UTF-8, one
// term per line, lines ended by "\n" or "\r\n" (the last line may lack its
// end). Every line must be a distinct, non-empty term of lowercase ASCII
// letters [a-z]+. A term's id is its 0-based line number. Anything else —
// an empty line (including a blank line at the end), an uppercase letter,
// a digit, a space, a stray "\r", a byte-order mark, a duplicate — is
// refused with an error that names the 1-based line and the problem. A file
// with no lines at all is refused too: V must be at least 1.
//
// Fingerprint(): lowercase hex of BLAKE2b-256 (libsodium crypto_generichash,
// unkeyed, 32-byte output) over the canonical text, the concatenation of
// "term\n" for every term in id order. The canonical text ignores "\r\n"
// versus "\n" and a missing final line end, so two files that define the same
// ids get the same fingerprint. Releases carry it (docs/architecture.md) so that a
// consumer can tell which vocabulary a λ matrix is indexed by.
//
// Ownership and thread-safety: a Vocabulary is an immutable value after
// Parse(); copies are independent. All const methods may be called
// concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/status.h"

namespace vipsd::text {

class Vocabulary {
 public:
  // Parses the full text of a vocabulary file. INVALID_ARGUMENT on any
  // violation of the format above, e.g. "vocabulary line 7: duplicate of
  // line 3".
  static StatusOr<Vocabulary> Parse(std::string_view file_text);

  // Number of terms V (≥ 1).
  int32_t size() const { return static_cast<int32_t>(terms_.size()); }

  // The term with this id. Precondition: 0 ≤ id < size() (asserted).
  const std::string& term(int32_t id) const;

  // The id of `term`, or nullopt if it is not in the vocabulary. Exact,
  // case-sensitive match: callers lowercase first (see tokenizer.h).
  std::optional<int32_t> Find(std::string_view term) const;

  // Length in bytes of the longest term; a word longer than this cannot match.
  size_t max_term_length() const { return max_term_length_; }

  // 64 lowercase hex digits; see the header comment.
  const std::string& Fingerprint() const { return fingerprint_; }

 private:
  // Open addressing with linear probing over a power-of-two table at most
  // half full. Find() runs once per letter run of every document, so it
  // is the tokenizer's hot path: each slot holds the term's first 8 bytes
  // (zero-padded), its length and a hash tag, so that a lookup of a term of
  // at most 8 bytes — most words of running text — reads one slot and
  // nothing else; longer terms compare their remaining bytes with terms_.
  struct Slot {
    uint64_t prefix = 0;    // first min(8, length) bytes, zero-padded
    uint32_t length = 0;    // term length in bytes
    int32_t id = -1;        // -1: empty
  };

  Vocabulary() = default;
  // The first min(8, size) bytes of `term`, zero-padded (no read past it).
  static uint64_t Prefix(std::string_view term);
  static uint64_t Hash(uint64_t prefix, std::string_view term);
  // Puts terms_[id], known to be absent from the table, in a free slot.
  void PlaceTerm(int32_t id);
  // Rebuilds the table with `slot_count` (a power of two) slots.
  void Rehash(size_t slot_count);

  std::vector<std::string> terms_;
  std::vector<Slot> slots_;
  size_t slot_mask_ = 0;
  size_t max_term_length_ = 0;
  std::string fingerprint_;
};

}  // namespace vipsd::text
