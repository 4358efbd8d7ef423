// Secret references in librdkafka properties, resolved when the
// configuration is loaded so that the YAML itself holds no credential:
//   {file: PATH}        a file (relative to the configuration file; at most
//                       64 KiB; one trailing line end is dropped);
//   {env: NAME}         an environment variable;
//   {credential: NAME}  systemd's LoadCredential=NAME:… —
//                       $CREDENTIALS_DIRECTORY/NAME.
//
// Ownership: the returned value is a copy; nothing is cached.
// Thread-safety: reads the environment (getenv) and the filesystem; safe as
// long as no other thread changes the environment meanwhile.
// Failure: INVALID_ARGUMENT naming the reference (variable, credential or
// path) and why — never any content of the secret. A FIFO, device or file
// above 64 KiB is refused without being read (connectors/file/file_util.h).
#pragma once

#include <string>

#include "core/base/status.h"

namespace vipsd::config::internal {

// `kind` is "file", "env" or "credential"; `config_file` anchors a relative
// file path.
StatusOr<std::string> SecretValue(const std::string& kind, const std::string& reference,
                                  const std::string& config_file);

}  // namespace vipsd::config::internal
