// Small, durable file operations shared by the file connectors and the
// daemon's ledger.
//
// WriteFileDurably: create `path` with permission bits `mode` (fails if
// `exclusive` and it exists),
// write all bytes, fsync, close. SyncDirectory: fsync a directory so that a
// rename or creation in it survives a crash. ReadWholeFile: the bytes of a
// file. Errors name the path and the OS reason (paths are configuration,
// never record content).
#pragma once

#include <string>

#include "core/base/status.h"

namespace vipsd::connectors {

Status WriteFileDurably(const std::string& path, const std::string& data, bool exclusive,
                        unsigned mode);
Status SyncDirectory(const std::string& directory);
StatusOr<std::string> ReadWholeFile(const std::string& path);

}  // namespace vipsd::connectors
