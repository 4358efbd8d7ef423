// "file:line: key: ", the prefix of every message about a configuration
// key: parse errors and warnings (config/section.cc), checks across keys,
// reload refusals and the daemon's start-up refusals (config::KeyWhere in
// config/config.h takes the line from a loaded configuration).
//
// Thread-safety: pure.
#pragma once

#include <string>
#include <string_view>

namespace vipsd::config {

inline std::string KeyWhere(std::string_view file, int line, std::string_view key) {
  std::string out(file);
  out += ":" + std::to_string(line) + ": ";
  out += key;
  out += ": ";
  return out;
}

}  // namespace vipsd::config
