// Document: one decoded record for LDA, the unit that enters the privacy wall
// (docs/architecture.md, the pool). Connectors build it from a record (id + text or
// id + pre-split tokens) and a Vocabulary; models read only word_ids.
//
// Privacy: everything in a Document is private record content. It is held in
// memory only, never written to the daemon's disk, logged or put in an error
// message — including the id, which a producer may derive from the content.
//
// Invariants (established by the connector that builds it): every element of
// word_ids is in [0, V) for the vocabulary it was decoded with; word_ids is in
// text order with repeats; it may be empty (a document with no in-vocabulary
// token is valid, and contributes the zero statistic).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace vipsd::text {

struct Document {
  std::string id;                 // producer's record id (integers in decimal)
  std::vector<int32_t> word_ids;  // vocabulary ids in text order, repeats counted
};

}  // namespace vipsd::text
