// "Did you mean" suggestions for misspelt keys and values.
//
// What it is: the Levenshtein distance and the choice of the closest known
// word, used by the parser (config/section.h) for unknown keys, misspelt
// choices and a required key that is missing next to a near-miss.
// Ownership: pure functions on their arguments.
// Thread-safety: thread-safe (no state).
// Failure: none; "no suggestion" is an empty optional.
#pragma once

#include <cstddef>
#include <optional>
#include <set>
#include <string>

namespace vipsd::config::internal {

// The number of single-character insertions, deletions and substitutions
// that turn `a` into `b`.
size_t EditDistance(const std::string& a, const std::string& b);

// The closest of `candidates` to `word`, if it is close enough to be a typo
// of it: at most max(1, |word| / 4) edits away. Ties go to the first
// candidate in order.
std::optional<std::string> Closest(const std::string& word,
                                   const std::set<std::string>& candidates);

}  // namespace vipsd::config::internal
