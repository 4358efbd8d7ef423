// Tokenizer: turns a document's text into vocabulary ids, exactly as the
// reference tokenizer every quality number of the project is measured with
// (shared/peers/tokenize.py; its docstring is the specification):
//   1. input: the decoded "text" string of one record (UTF-8 bytes);
//   2. a token is a MAXIMAL run of ASCII letters [A-Za-z]; every other byte
//      ends a run (digits, '_', apostrophes, hyphens, whitespace, and every
//      byte of a non-ASCII character, all of which are ≥ 0x80 in UTF-8, so a
//      byte scan equals the reference's code-point scan);
//   3. lowercase with the ASCII map A-Z → a-z only;
//   4. drop runs shorter than 2 letters;
//   5. keep a token only if it equals a vocabulary term; its id is the term's id;
//   6. the result is the kept ids in text order, repeats counted.
// Examples: "Don't" → don; "X11R5" → nothing; "e-mail" → mail; "café" → caf;
// "abc123DEF" → abc, def.
//
// The text is not validated as UTF-8: rule 2 treats every byte ≥ 0x80 as a
// separator whatever sequence it belongs to, so invalid UTF-8 cannot create or
// merge tokens (connectors reject invalid UTF-8 before this point anyway).
//
// Cost: one pass over the bytes with a 256-entry table and one hash lookup
// per run of length in [2, longest term]. Runs already in lowercase are looked
// up in place; only runs with an uppercase letter are copied (into a stack
// buffer, or one reused heap buffer for runs longer than 64 bytes).
//
// Privacy: the text and the ids are private record content; these functions
// neither log nor keep anything. Thread-safety: pure functions of their
// arguments; safe to call concurrently on a shared Vocabulary.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "core/text/vocabulary.h"

namespace vipsd::text {

// Rules 1–6 above: the document's in-vocabulary ids in text order.
std::vector<int32_t> TokenizeToIds(std::string_view utf8_text, const Vocabulary& vocabulary);

// As TokenizeToIds, appending to `ids` (whose existing elements are kept), so
// that a caller decoding many documents can reuse one vector's capacity.
void AppendTokenIds(std::string_view utf8_text, const Vocabulary& vocabulary,
                    std::vector<int32_t>& ids);

// Rules 3–5 applied to one word that a producer already split out (the
// "tokens" form of a record): ASCII-lowercase it, drop it if it is shorter
// than 2 bytes, and look it up. The word is NOT split further: "e-mail" or
// "abc123" matches nothing, because no term contains a non-letter. So a
// record of letter-only words w1 … wn tokenizes exactly like the text
// "w1 w2 … wn".
std::optional<int32_t> FindWordId(std::string_view word, const Vocabulary& vocabulary);

}  // namespace vipsd::text
