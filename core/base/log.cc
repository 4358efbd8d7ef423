#include "core/base/log.h"

#include <cstdio>
#include <string>
#include <utility>

namespace vipsd {
namespace {

LogSink& Sink() {
  static LogSink sink;
  return sink;
}

}  // namespace

std::string_view LogLevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return "debug";
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarning: return "warning";
    case LogLevel::kError: return "error";
  }
  return "unknown";
}

void SetLogSink(LogSink sink) { Sink() = std::move(sink); }

void Log(LogLevel level, std::string_view component, std::string_view message) {
  if (Sink()) {
    Sink()(level, component, message);
    return;
  }
  std::string line = "level=";
  line += LogLevelName(level);
  line += " component=";
  line += component;
  line += " msg=\"";
  for (char c : message) {
    if (c == '"' || c == '\\') line += '\\';
    line += (c == '\n') ? ' ' : c;
  }
  line += "\"\n";
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace vipsd
