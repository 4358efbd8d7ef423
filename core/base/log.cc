#include "core/base/log.h"

#include "core/base/format.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <string>
#include <utility>

namespace vipsd {
namespace {

LogSink& Sink() {
  static LogSink sink;
  return sink;
}

std::atomic<int> min_level{static_cast<int>(LogLevel::kInfo)};
std::atomic<int> log_format{static_cast<int>(LogFormat::kLogfmt)};

void AppendJsonString(std::string& out, std::string_view text) { out += JsonString(text); }

// "2026-11-23T05:22:30.123Z"
std::string Timestamp() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t seconds = std::chrono::system_clock::to_time_t(now);
  const auto millis =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&seconds, &tm);
  char buffer[40];
  const size_t n = std::strftime(buffer, sizeof(buffer), "%Y-%m-%dT%H:%M:%S", &tm);
  std::snprintf(buffer + n, sizeof(buffer) - n, ".%03dZ", static_cast<int>(millis));
  return buffer;
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

void SetMinLogLevel(LogLevel level) { min_level.store(static_cast<int>(level)); }
LogLevel MinLogLevel() { return static_cast<LogLevel>(min_level.load()); }

void SetLogFormat(LogFormat format) { log_format.store(static_cast<int>(format)); }
LogFormat CurrentLogFormat() { return static_cast<LogFormat>(log_format.load()); }

std::string FormatLogLine(LogFormat format, std::string_view timestamp, LogLevel level,
                          std::string_view component, std::string_view message) {
  std::string line;
  if (format == LogFormat::kJson) {
    line = "{\"ts\":";
    AppendJsonString(line, timestamp);
    line += ",\"level\":";
    AppendJsonString(line, LogLevelName(level));
    line += ",\"component\":";
    AppendJsonString(line, component);
    line += ",\"msg\":";
    AppendJsonString(line, message);
    line += "}\n";
    return line;
  }
  line = "ts=" + std::string(timestamp) + " level=";
  line += LogLevelName(level);
  line += " component=";
  line += component;
  line += " msg=\"";
  for (char c : message) {
    if (c == '"' || c == '\\') line += '\\';
    line += (c == '\n') ? ' ' : c;
  }
  line += "\"\n";
  return line;
}

std::string FormatLogLineNow(LogFormat format, LogLevel level, std::string_view component,
                             std::string_view message) {
  return FormatLogLine(format, Timestamp(), level, component, message);
}

void Log(LogLevel level, std::string_view component, std::string_view message) {
  if (static_cast<int>(level) < min_level.load(std::memory_order_relaxed)) return;
  if (Sink()) {
    Sink()(level, component, message);
    return;
  }
  const std::string line =
      FormatLogLine(CurrentLogFormat(), Timestamp(), level, component, message);
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace vipsd
