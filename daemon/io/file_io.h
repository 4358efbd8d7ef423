// The offline run's connectors (docs/architecture.md; issue 11 "one path"): the
// daemon's InputSource over a JSON Lines file and its OutputSink over a
// release directory and a dead-letter file. With them, `source.type: file`
// runs the same Daemon as Kafka — the same start-up check, step loop and
// ledger discipline — on a fixed data set.
//
// FileInputSource: one stream (the file), offsets = line index (line number
// − 1), blank lines skipped. The file is the whole log: ObserveBounds gives
// [0, number of physical lines), counted when it is opened, and the source
// reports reaching that end once it has returned every line. A line longer
// than the configured limit comes back oversize (empty payload) and is
// dead-lettered. Pause/Resume/MarkDone/Commit have nothing to do.
//
// FileOutputSink: releases to `sink.directory` (connectors/file/
// release_file_sink.h); dead letters to `dead_letter.path` — line number and
// reason only, never content (connectors/file/dead_letter_file.h), synced
// when the sink closes; alerts to the log (a file run has no alert topic).
//
// Privacy: lines are private record content; they are handed to the daemon
// and never logged or written. Errors name the path and the line number.
// Thread-safety: as daemon/io/io.h requires (the source's ObserveBounds reads a
// value fixed at Open; dead letters and releases use separate objects).
#pragma once

#include <memory>
#include <string>

#include "config/config.h"
#include "core/base/status.h"
#include "daemon/io/io.h"

namespace vipsd::daemon {

StatusOr<std::unique_ptr<InputSource>> NewFileInput(const config::VipsdConfig& config);
StatusOr<std::unique_ptr<OutputSink>> NewFileOutput(const config::VipsdConfig& config);

}  // namespace vipsd::daemon
