// The release reader (manifest + array files) and the .npy reader on
// arbitrary bytes. Input: manifest bytes, a NUL, then the bytes every array
// file name reads as. A release the reader accepts passes the writer's
// Validate; an .npy file it decodes re-encodes to exactly the same bytes.
// The first byte picks the reader.
#include <string>

#include "connectors/file/release_reader.h"
#include "core/release/release.h"
#include "fuzz/fuzz_util.h"

using namespace vipsd;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0 || size > (1 << 20)) return 0;
  const std::string_view input = fuzz::AsText(data + 1, size - 1);
  if (data[0] % 2 == 0) {
    const auto array = release::DecodeNpy(input, "fuzz");
    if (array.ok() && release::EncodeNpy(*array) != input) {
      fuzz::Violated("a decoded .npy file does not re-encode to the same bytes");
    }
    return 0;
  }
  const size_t split = input.find('\0');
  const std::string_view manifest = input.substr(0, split);
  const std::string file =
      split == std::string_view::npos ? std::string() : std::string(input.substr(split + 1));
  const auto release = connectors::DecodeReleaseFiles(
      manifest, [&file](const std::string&) -> StatusOr<std::string> { return file; }, "fuzz");
  if (release.ok() && !release::Validate(*release).ok()) {
    fuzz::Violated("the reader accepted a release the writer's rules refuse");
  }
  return 0;
}
