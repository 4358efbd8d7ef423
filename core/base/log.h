// Minimal structured logging hook for core.
//
// core/ performs no I/O of its own; the few events it must make loud (for
// example "this noise source is NOT private") go through a process-wide sink
// that the daemon or a tool installs. The default sink writes one line per
// event to stderr, in logfmt (default) or JSON (SetLogFormat), with the
// stable fields ts, level, component and msg:
//   ts=2026-11-23T05:22:30.123Z level=info component=daemon msg="..."
//   {"ts":"2026-11-23T05:22:30.123Z","level":"info","component":"daemon","msg":"..."}
//
// Privacy: callers must never pass values computed from private records.
// Thread-safety: SetLogSink is not thread-safe with concurrent Log calls;
// install the sink once at start-up. Log itself is thread-safe if the sink is.
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace vipsd {

enum class LogLevel { kDebug, kInfo, kWarning, kError };

std::string_view LogLevelName(LogLevel level);

using LogSink = std::function<void(LogLevel, std::string_view component,
                                   std::string_view message)>;

// Replaces the sink; an empty function restores the default stderr sink.
void SetLogSink(LogSink sink);

void Log(LogLevel level, std::string_view component, std::string_view message);

// Messages below `level` are dropped before they reach the sink (default
// kInfo; kDebug passes everything). Thread-safe (atomic); changed live by
// the daemon's reload.
void SetMinLogLevel(LogLevel level);
LogLevel MinLogLevel();

enum class LogFormat { kLogfmt, kJson };
// The default sink's line format; thread-safe (atomic), changed live by
// the daemon's reload.
void SetLogFormat(LogFormat format);
LogFormat CurrentLogFormat();

// One line of the default sink (ends with '\n'); exposed for tests.
std::string FormatLogLine(LogFormat format, std::string_view timestamp, LogLevel level,
                          std::string_view component, std::string_view message);
// The same, stamped now: for a tool that writes log lines to a stream of
// its own in the format a configuration asks for.
std::string FormatLogLineNow(LogFormat format, LogLevel level, std::string_view component,
                             std::string_view message);

}  // namespace vipsd
