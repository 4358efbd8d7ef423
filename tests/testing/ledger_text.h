// TEST-ONLY edits of a ledger's text (daemon/state/ledger.h, docs/ledger_format.md)
// that keep it checksum-valid, so that a test reaches the checks behind the
// checksum: the body is every byte before the last line, which is
// `blake2b <hex of the body>`; a section is `section NAME LENGTH\n` followed
// by LENGTH bytes.
#pragma once

#include <fstream>
#include <functional>
#include <iterator>
#include <string>

#include <gtest/gtest.h>

#include "core/release/release.h"

namespace vipsd::testing {

// The body of ledger bytes (everything before the checksum line).
inline std::string LedgerBody(const std::string& bytes) {
  return bytes.substr(0, bytes.rfind("blake2b "));
}

// `body` followed by its checksum line: a ledger whose checksum verifies.
inline std::string ResignLedgerBody(const std::string& body) {
  return body + "blake2b " + release::Blake2bHex(body) + "\n";
}

// `text` with its line that starts with `prefix` replaced by `line` (no
// newline in either): e.g. ReplaceLedgerLine(body, "next_step ", "next_step 9").
inline std::string ReplaceLedgerLine(std::string text, const std::string& prefix,
                                     const std::string& line) {
  size_t at = text.rfind(prefix, 0) == 0 ? 0 : text.find("\n" + prefix);
  EXPECT_NE(at, std::string::npos) << prefix;
  if (at == std::string::npos) return text;
  if (text[at] == '\n') ++at;
  text.replace(at, text.find('\n', at) - at, line);
  return text;
}

// `body` with the text of its section `name` edited by `edit` (the section's
// length header follows the edit).
inline std::string EditLedgerSection(const std::string& body, const std::string& name,
                                     const std::function<std::string(std::string)>& edit) {
  const std::string header = "section " + name + " ";
  const size_t at = body.find(header);
  EXPECT_NE(at, std::string::npos) << header;
  if (at == std::string::npos) return body;
  const size_t length_at = at + header.size();
  const size_t text_at = body.find('\n', length_at) + 1;
  const size_t length = std::stoul(body.substr(length_at, text_at - 1 - length_at));
  const std::string text = edit(body.substr(text_at, length));
  return body.substr(0, at) + header + std::to_string(text.size()) + "\n" + text +
         body.substr(text_at + length);
}

// Rewrites the ledger file at `path` with `edit` applied to its body and a
// valid checksum.
inline void ResignLedgerFile(const std::string& path,
                             const std::function<std::string(std::string)>& edit) {
  std::string bytes;
  {
    std::ifstream in(path);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  std::ofstream(path, std::ios::trunc) << ResignLedgerBody(edit(LedgerBody(bytes)));
}

}  // namespace vipsd::testing
