// Small, durable file operations shared by the file connectors and the
// daemon's ledger.
//
// WriteFileDurably: create `path` with permission bits `mode` (fails if
// `exclusive` and it exists),
// write all bytes, fsync, close. SyncDirectory: fsync a directory so that a
// rename or creation in it survives a crash.
//
// Reading. Every file vipsd reads because a configuration or a command line
// names it (configuration, secrets, vocabulary, JSONL source, ledger,
// checkpoint, releases, evaluation data) is opened through OpenRegularFile:
// the open never blocks (O_NONBLOCK, so a FIFO without a writer or a tty
// does not hang --check-config or a start), and what is not a regular file
// is refused by name before a byte is read — "is a directory", "is a FIFO",
// "is a character device (such as /dev/zero)", "is a block device", "is a
// socket" — as is a regular file larger than the caller's bound (so that a
// wrong path cannot exhaust memory). ReadRegularFile reads such a file
// whole; it also stops at the bound if the file grows while it is read.
// Errors name the path and the OS reason (paths are configuration, never
// record content); NOT_FOUND for a missing file, INVALID_ARGUMENT for the
// wrong kind of file or size, UNAVAILABLE for an I/O error.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "core/base/status.h"

namespace vipsd::connectors {

Status WriteFileDurably(const std::string& path, const std::string& data, bool exclusive,
                        unsigned mode);
Status SyncDirectory(const std::string& directory);

// Bounds for the files vipsd reads (bytes).
inline constexpr uint64_t kMaxConfigFileBytes = uint64_t{4} << 20;
inline constexpr uint64_t kMaxSecretFileBytes = uint64_t{64} << 10;
inline constexpr uint64_t kMaxVocabularyBytes = uint64_t{256} << 20;
inline constexpr uint64_t kMaxStateFileBytes = uint64_t{16} << 30;  // ledger, checkpoint
inline constexpr uint64_t kMaxDataFileBytes = uint64_t{16} << 30;   // demo corpus, eval data
inline constexpr uint64_t kNoSizeBound = UINT64_MAX;                 // streamed (JSONL)

// "a directory", "a FIFO", … for a file that is not regular; empty for a
// regular file. `mode` is stat's st_mode.
std::string NonRegularFileKind(unsigned mode);

struct FileCloser {
  void operator()(std::FILE* file) const {
    if (file != nullptr) std::fclose(file);
  }
};
using UniqueFile = std::unique_ptr<std::FILE, FileCloser>;

// Opens `path` read-only (close-on-exec) if it is a regular file of at most
// `max_bytes` bytes. Errors name the path ("<path> is a directory, not a
// regular file", "<path> does not exist", …).
StatusOr<UniqueFile> OpenRegularFile(const std::string& path, uint64_t max_bytes);
// The whole content of such a file.
StatusOr<std::string> ReadRegularFile(const std::string& path, uint64_t max_bytes);
// ReadRegularFile bounded by kMaxStateFileBytes: files vipsd wrote itself
// (ledger, checkpoint, status.json, releases).
StatusOr<std::string> ReadWholeFile(const std::string& path);

}  // namespace vipsd::connectors
