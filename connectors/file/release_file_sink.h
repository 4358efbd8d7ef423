// Writes releases to a directory, one subdirectory per release:
//
//   <directory>/<release_id>/<array>.npy ...   one per array
//   <directory>/<release_id>/manifest.json     written last
//
// with exactly the bytes of release::EncodeRelease (docs/release_format.md;
// tools/decode_release.py reads them back).
//
// Atomic and durable, as leveldb installs CURRENT: everything is written into
// the hidden `<directory>/.<release_id>.tmp/`, each file fsync'd, that
// directory fsync'd, renamed to `<release_id>` (renameat2 RENAME_NOREPLACE),
// and `<directory>` fsync'd. A reader that lists `<directory>` and skips
// names starting with '.' never sees a partial release. The daemon writes a
// release only after the ledger entry covering its step is durable
// (docs/ledger_format.md); that ordering is the caller's.
//
// Never overwrites: writing a release id that already exists fails with
// FAILED_PRECONDITION and leaves the existing release untouched. An invalid
// release is INVALID_ARGUMENT (release::Validate) and writes nothing. I/O
// failures are UNAVAILABLE naming the path; the temporary directory is
// removed. If only the final fsync of `<directory>` fails, the release is
// visible but may not survive a crash; the error says so.
//
// Crash leftovers: a `.<id>.tmp/` left by a crash is never visible as a
// release; Open removes all of them, and Write removes its own before use.
//
// Thread-safety: one sink (one process, one thread) per directory; nothing
// here locks against a second writer.
#pragma once

#include <string>

#include "core/base/status.h"
#include "core/release/release.h"

namespace vipsd::connectors {

class ReleaseFileSink {
 public:
  // Removes crash leftovers of an existing `directory`; a missing one (and
  // its parents) is created by the first Write, so that a run refused at
  // start-up creates nothing.
  static StatusOr<ReleaseFileSink> Open(std::string directory);

  Status Write(const release::Release& release);

  const std::string& directory() const { return directory_; }

 private:
  explicit ReleaseFileSink(std::string directory) : directory_(std::move(directory)) {}

  std::string directory_;
};

}  // namespace vipsd::connectors
