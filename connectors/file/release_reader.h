// The C++ reader of a release (docs/release_format.md): what vipsd-eval and
// every other C++ consumer use, never a field-by-field read of manifest.json.
//
// A release is accepted only if all of these hold (tools/decode_release.py,
// the reference decoder, applies the same list; tests/tools/
// release_readers_agree_test.sh feeds both the same good and bad releases and
// requires the same verdicts):
//   * manifest.json is at most 1 MiB of UTF-8 JSON, nested at most 16
//     deep, with no duplicate key and no NaN/Infinity token, and is an object;
//   * `format` is "vipsd-release" and `schema_version` the integer 1;
//   * every documented field is present with its JSON type (integers are
//     integers: "step": 1e30 or "step": "5" is refused); `schedule` and
//     `conversion` are optional strings (added within schema 1);
//   * `arrays` is a non-empty list; each entry has name (1-64 of [a-z0-9_],
//     unique), file == name + ".npy" (no path can leave the directory),
//     dtype "<f8", shape (integers >= 0), bytes, blake2b (64 lowercase hex);
//   * each file has exactly `bytes` bytes and that BLAKE2b-256, and is a
//     strict .npy v1.0 of that shape with no trailing bytes (release::DecodeNpy);
//   * the metadata and arrays then pass release::Validate — the writer's own
//     rules — plus the reader's: model_type is lda, blr or sbn and every
//     dimension is >= 1.
// Errors are one line naming the file and the field; nothing throws.
//
// Thread-safety: pure functions (ReadReleaseDirectory reads files).
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include "core/base/status.h"
#include "core/release/release.h"

namespace vipsd::connectors {

inline constexpr size_t kMaxManifestBytes = 1 << 20;
inline constexpr int kMaxManifestDepth = 16;

// Decodes and checks a release from its manifest bytes; `read_file(name)`
// returns the bytes of file `name` of the release. `label` names the
// release in errors (e.g. its directory).
StatusOr<release::Release> DecodeReleaseFiles(
    std::string_view manifest_bytes,
    const std::function<StatusOr<std::string>(const std::string&)>& read_file,
    const std::string& label);

// The release in `directory` (manifest.json and its .npy files).
StatusOr<release::Release> ReadReleaseDirectory(const std::string& directory);

}  // namespace vipsd::connectors
