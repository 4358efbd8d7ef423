#include "config/secrets.h"

#include <cstdlib>
#include <filesystem>

#include "connectors/file/file_util.h"

namespace vipsd::config::internal {

StatusOr<std::string> SecretValue(const std::string& kind, const std::string& reference,
                                  const std::string& config_file) {
  std::string path;
  if (kind == "env") {
    const char* value = std::getenv(reference.c_str());
    if (reference.empty() || value == nullptr || *value == '\0') {
      return InvalidArgumentError("the environment variable " + reference + " is not set or empty");
    }
    return std::string(value);
  }
  if (kind == "credential") {
    const char* directory = std::getenv("CREDENTIALS_DIRECTORY");
    if (directory == nullptr || *directory == '\0') {
      return InvalidArgumentError("credential " + reference +
                                  ": CREDENTIALS_DIRECTORY is not set (systemd sets it for a "
                                  "unit with LoadCredential=" +
                                  reference + ":PATH)");
    }
    if (reference.empty() || reference.find('/') != std::string::npos || reference == "." ||
        reference == "..") {
      return InvalidArgumentError("a credential name is a plain file name, got '" + reference +
                                  "'");
    }
    path = std::string(directory) + "/" + reference;
  } else if (kind == "file") {
    if (reference.empty()) return InvalidArgumentError("the secret file path is empty");
    const std::filesystem::path p(reference);
    path = p.is_absolute()
               ? reference
               : (std::filesystem::path(config_file).parent_path() / p).lexically_normal().string();
  } else {
    return InvalidArgumentError("unknown secret reference '" + kind +
                                "' (allowed: file, env, credential)");
  }
  auto read = connectors::ReadRegularFile(path, connectors::kMaxSecretFileBytes);
  if (!read.ok()) {
    return InvalidArgumentError("the secret file " + std::string(read.status().message()));
  }
  std::string value = std::move(*read);
  if (!value.empty() && value.back() == '\n') value.pop_back();
  if (!value.empty() && value.back() == '\r') value.pop_back();
  if (value.empty()) return InvalidArgumentError("the secret file " + path + " is empty");
  return value;
}

}  // namespace vipsd::config::internal
