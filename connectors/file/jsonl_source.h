// JsonlDocumentSource: reads a JSON Lines file of documents and decodes each
// line into a text::Document or a Rejection (the file counterpart of the
// Kafka source; docs/architecture.md).
//
// Line format: one record per line as described in
// connectors/decode/json_document.h, e.g.
//   {"id": "doc-1", "text": "Free text ..."}
//   {"id": 17, "tokens": ["free", "text"]}
// Lines end with "\n"; a "\r" before it is JSON whitespace and is ignored. The
// last line may lack its "\n". Lines holding only spaces, tabs and "\r" are
// skipped (counted in stats().blank_lines). Line numbers are 1-based and count
// every physical line, blank or not, so they match `sed -n Np`.
//
// Size limit: a line whose bytes before its "\n" exceed
// options.max_line_bytes is rejected (kLineTooLong) while it is being read:
// at most max_line_bytes bytes of a line are ever stored (plus one 64 KiB read
// buffer), and the rest of the line is skipped without being stored.
//
// Privacy: Documents are private record content; the caller pools them in
// memory only. A Rejection carries the line number, the reason code and a
// fixed description that names at most a JSON key — never the id, text,
// tokens or any other byte of the record. Status errors name only the path
// and the operating-system error.
//
// Failure: Open fails (NOT_FOUND / UNAVAILABLE / INVALID_ARGUMENT) if the
// file cannot be opened, is a directory, or the options are invalid. Next()
// returns UNAVAILABLE on a read error; malformed records are never errors,
// they are Rejections.
//
// Ownership and thread-safety: the source owns its file handle and keeps a
// pointer to the Vocabulary, which must outlive it. Not thread-safe: one
// thread calls Next().
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "connectors/decode/json_document.h"
#include "connectors/decode/record_decoder.h"
#include "connectors/file/file_util.h"
#include "core/base/status.h"
#include "core/text/document.h"
#include "core/text/vocabulary.h"

namespace vipsd::connectors {

struct JsonlSourceOptions {
  size_t max_line_bytes = size_t{10} << 20;  // 10 MiB; must be ≥ 1
};

struct Rejection {
  int64_t line_number = 0;  // 1-based
  RejectReason reason_code = RejectReason::kInvalidJson;
  // "line 12: bad_text: key \"text\" must be a string". No record content.
  std::string reason;
};

// Either a decoded document or the reason its line was refused.
using DecodedLine = std::variant<text::Document, Rejection>;
// Either a record decoded by a model's RecordDecoder or the reason.
using DecodedRecordLine = std::variant<model::Record, Rejection>;

// One non-blank line as read, undecoded (the daemon's file source decodes
// with the model's decoder on its ingest thread). PRIVATE content.
struct RawLine {
  int64_t line_number = 0;  // 1-based
  bool too_long = false;    // bytes is empty then
  std::string bytes;
};

// Counts since Open. Data-dependent, like the rejected-by-reason metric
// (docs/architecture.md and README "Running as a service"); the daemon decides which it exports.
struct JsonlSourceStats {
  int64_t lines = 0;            // physical lines read, blank ones included
  int64_t blank_lines = 0;
  int64_t documents = 0;        // decoded, empty ones included
  int64_t empty_documents = 0;  // decoded with no in-vocabulary word
  int64_t rejections = 0;
};

class JsonlDocumentSource {
 public:
  static StatusOr<JsonlDocumentSource> Open(const std::string& path,
                                            const text::Vocabulary& vocabulary,
                                            JsonlSourceOptions options = {});
  // For NextRecord only (any model's records; no vocabulary needed here).
  static StatusOr<JsonlDocumentSource> OpenForRecords(const std::string& path,
                                                      JsonlSourceOptions options = {});

  // The next non-blank line, decoded; nullopt at end of file (and on every
  // later call).
  StatusOr<std::optional<DecodedLine>> Next();

  // The next non-blank line decoded by `decoder` (the model's record
  // decoder, record_decoder.h); the same line handling, size limit and
  // rejections as Next(). stats().documents counts decoded records.
  StatusOr<std::optional<DecodedRecordLine>> NextRecord(const RecordDecoder& decoder);

  // The next non-blank line, undecoded; nullopt at end of file.
  StatusOr<std::optional<RawLine>> NextRawLine();

  // Number of physical lines of the file at `path` (a last line without
  // "\n" counts): the end of its log. UNAVAILABLE on a read error.
  static StatusOr<int64_t> CountLines(const std::string& path);

  // Line number of the item Next() last returned (0 before the first).
  int64_t line_number() const { return line_number_; }
  const JsonlSourceStats& stats() const { return stats_; }
  const std::string& path() const { return path_; }

 private:
  enum class LineStatus { kLine, kTooLong, kEndOfFile };

  JsonlDocumentSource(std::string path, const text::Vocabulary* vocabulary,
                      JsonlSourceOptions options, UniqueFile file);
  static StatusOr<JsonlDocumentSource> OpenFile(const std::string& path,
                                                const text::Vocabulary* vocabulary,
                                                JsonlSourceOptions options);

  // Reads the next physical line into line_ (without its "\n").
  StatusOr<LineStatus> ReadLine();

  std::string path_;
  const text::Vocabulary* vocabulary_;  // null when opened for records
  JsonlSourceOptions options_;
  UniqueFile file_;
  std::vector<char> buffer_;
  size_t buffer_begin_ = 0;
  size_t buffer_end_ = 0;
  bool end_of_file_ = false;
  std::string line_;
  int64_t line_number_ = 0;
  JsonlSourceStats stats_;
};

}  // namespace vipsd::connectors
