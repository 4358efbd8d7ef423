// The YAML configuration loader on arbitrary text: every input is either a
// configuration or an INVALID_ARGUMENT that names the file; never a crash,
// an exception or a sanitizer report.
#include <string>

#include "config/config.h"
#include "fuzz/fuzz_util.h"

using namespace vipsd;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (1 << 16)) return 0;
  const auto parsed = config::ParseConfig(fuzz::AsText(data, size), "/fuzz/vipsd.yaml");
  if (!parsed.ok() && parsed.status().message().find("vipsd.yaml") == std::string_view::npos) {
    fuzz::Violated("a configuration error does not name the file");
  }
  return 0;
}
