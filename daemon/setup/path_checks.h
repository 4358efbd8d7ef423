// Where a configuration reads and where it writes must never meet (issue
// 27). vipsd reads its inputs — the configuration file, the vocabulary, a
// JSONL source file, the demo corpus — and writes its outputs — the
// dead-letter file, the release directory (or the Kafka sink's mirror) and
// the state directory. Comparing path text is not enough (a symlink, a hard
// link, `..`, a bind mount or a second name of the same directory defeats
// it), so files are compared by device and inode, and "lies inside" is
// decided by walking the real (symlink-resolved) parents of a path and
// comparing each parent's device and inode with the directory's.
//
// Refused, naming both keys with their lines:
//   * an output file that is an input file (same device and inode): dead
//     letters would be appended to the training data or the vocabulary;
//   * an input file inside an output directory (vipsd creates, replaces and
//     removes files there);
//   * an output file inside an output directory (dead letters among the
//     releases or the ledger);
//   * two output directories that are the same or nested (releases among
//     the ledger and checkpoints, or the state directory among releases).
// Paths that do not exist yet are compared through their nearest existing
// parent: a file vipsd will create cannot be another file already.
//
// Thread-safety: pure function of the file system at the time of the call
// (a rename racing with it is outside what it can see).
#pragma once

#include "config/config.h"
#include "core/base/status.h"

namespace vipsd::daemon {

// INVALID_ARGUMENT "file:line: key: …" naming both paths and the other key.
Status CheckInputsAndOutputsApart(const config::VipsdConfig& config);

}  // namespace vipsd::daemon
