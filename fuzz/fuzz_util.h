// Shared helpers of the libFuzzer targets (fuzz/README.md).
#pragma once

#include <sodium.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace vipsd::fuzz {

inline std::string_view AsText(const uint8_t* data, size_t size) {
  return std::string_view(reinterpret_cast<const char*>(data), size);
}

// A property the target checks failed: report and abort (libFuzzer saves
// the input as a crash).
[[noreturn]] inline void Violated(const char* what) {
  std::fprintf(stderr, "fuzz property violated: %s\n", what);
  std::abort();
}

// `body` followed by its BLAKE2b-256 (libsodium's generichash): how the work
// topic's messages and partial sums are signed, so that a target can reach
// the parser behind the checksum.
inline std::string Blake2bSigned(std::string body) {
  constexpr size_t kDigestBytes = 32;
  unsigned char digest[kDigestBytes];
  crypto_generichash(digest, kDigestBytes, reinterpret_cast<const unsigned char*>(body.data()),
                     body.size(), nullptr, 0);
  body.append(reinterpret_cast<const char*>(digest), kDigestBytes);
  return body;
}

}  // namespace vipsd::fuzz
