// DeadLetterFile: the file counterpart of the dead-letter topic. Appends one
// JSON line per rejected record,
//   {"line": 12, "reason": "bad_text", "source": "train.jsonl"}
// so that an operator can find the bad line in the source file, which they
// already hold. Nothing else is written: private records are never written
// to the daemon's disk (docs/architecture.md), so a dead letter holds no id, text,
// token or description — only the line number, the reason code (see
// RejectReasonName) and the source name given at Open.
//
// The file must be a regular file (a FIFO or a device is refused by name,
// and opening never blocks). An existing file is opened at Open; a missing
// one is created (0600) by the first Append, so that a run refused at
// start-up leaves nothing behind. It is opened O_APPEND and each Append is one
// write(2) of one whole line, so concurrent appenders do not interleave
// partial lines. Sync() makes the appended lines durable (fdatasync).
//
// counts_by_reason() counts the rejections this object appended
// successfully; lines already in the file are not read.
//
// Failure: Open and Append return UNAVAILABLE with the path and the
// operating-system error. A failed Append is not counted.
// Thread-safety: not thread-safe; one thread appends.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "connectors/decode/json_document.h"
#include "connectors/file/jsonl_source.h"
#include "core/base/status.h"

namespace vipsd::connectors {

class DeadLetterFile {
 public:
  // `source_name` identifies the source in every line (e.g. the JSONL file
  // name); it is configuration, not record content.
  static StatusOr<DeadLetterFile> Open(const std::string& path, std::string source_name);

  DeadLetterFile(DeadLetterFile&& other) noexcept;
  DeadLetterFile& operator=(DeadLetterFile&& other) noexcept;
  DeadLetterFile(const DeadLetterFile&) = delete;
  DeadLetterFile& operator=(const DeadLetterFile&) = delete;
  ~DeadLetterFile();

  Status Append(const Rejection& rejection);
  Status Sync();

  const std::map<RejectReason, int64_t>& counts_by_reason() const { return counts_by_reason_; }
  int64_t total() const { return total_; }
  const std::string& path() const { return path_; }

 private:
  DeadLetterFile(std::string path, int fd, std::string quoted_source_name);

  std::string path_;
  int fd_ = -1;
  std::string quoted_source_name_;  // JSON string literal, escaped once at Open
  std::map<RejectReason, int64_t> counts_by_reason_;
  int64_t total_ = 0;
};

}  // namespace vipsd::connectors
