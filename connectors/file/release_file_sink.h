// Writes releases to a directory: `<directory>/<release_id>/manifest.json`
// plus `<array>.npy` per array (docs/release_format.md).
//
// Atomic and durable: everything is written into `.<release_id>.tmp/`, each
// file fsync'd, the temporary directory renamed to its final name, and the
// parent directory fsync'd; a reader never sees a half-written release. A
// release id that already exists is refused (FAILED_PRECONDITION), never
// overwritten.
//
// Thread-safety: one sink per directory, used from one thread.
#pragma once

#include <string>

#include "core/base/status.h"
#include "core/release/release.h"

namespace vipsd::connectors {

class ReleaseFileSink {
 public:
  // Creates the directory if needed.
  static StatusOr<ReleaseFileSink> Open(const std::string& directory);

  Status Write(const release::Release& release);

  const std::string& directory() const { return directory_; }

 private:
  explicit ReleaseFileSink(std::string directory) : directory_(std::move(directory)) {}
  std::string directory_;
};

}  // namespace vipsd::connectors
