#include "config/field.h"

#include <filesystem>

#include "core/base/format.h"

namespace vipsd::config::internal {

std::string ShowValue(double value) { return ShortestNumber(value); }

std::string ShowValue(bool value) { return value ? "true" : "false"; }

std::string ShowValue(const std::string& value) { return value; }

std::string ShowValue(const std::vector<double>& values) {
  std::string out = "[";
  for (double value : values) out += (out.size() > 1 ? ", " : "") + ShortestNumber(value);
  return out + "]";
}

std::string ShowValue(const std::vector<std::string>& values) {
  std::string out = "[";
  for (const auto& value : values) out += (out.size() > 1 ? ", " : "") + value;
  return out + "]";
}

std::string ShowValue(const std::map<std::string, std::string>& values) {
  std::string out = "{";
  for (const auto& [key, value] : values) out += (out.size() > 1 ? ", " : "") + key + ": " + value;
  return out + "}";
}

std::string ResolvePath(const std::string& file, const std::string& path) {
  const std::filesystem::path p(path);
  if (p.is_absolute()) return path;
  return (std::filesystem::path(file).parent_path() / p).lexically_normal().string();
}

}  // namespace vipsd::config::internal
