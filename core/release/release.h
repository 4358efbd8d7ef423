// A release: what leaves the process after a private step (DESIGN.md 5).
//
// Content: public metadata plus named parameter arrays (row-major doubles).
// On disk (connectors/file/release_file_sink.h) and, later, on Kafka it is
// a `manifest.json` plus one `.npy` file per array; docs/release_format.md
// documents every field. tools/decode_release.py is the reference decoder.
//
// Privacy: metadata holds only public values — configuration, the step
// counter, ρ_t, ε/δ spent, fingerprints, a timestamp. There is deliberately
// no field for batch sizes, pool sizes, clip counts or losses.
//
// Thread-safety: values and pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/base/status.h"

namespace vipsd::release {

inline constexpr int kSchemaVersion = 1;

struct ReleaseArray {
  std::string name;             // [a-z0-9_]+, unique within a release
  std::vector<int64_t> shape;   // product = data.size()
  std::vector<double> data;     // row-major
};

struct ReleaseMetadata {
  int schema_version = kSchemaVersion;
  std::string release_id;       // [A-Za-z0-9_.-]+, e.g. "step-120"
  std::string model_type;       // "lda"
  int64_t step = 0;             // t of the step this release follows
  double rho = 0;               // ρ_t of that step
  double epsilon_spent = 0;     // cumulative ε (0 for non-private runs)
  double delta = 0;             // δ of epsilon_spent (0 for non-private runs)
  double noise_multiplier = 0;  // σ
  double sampling_rate = 0;     // q
  std::string accountant;       // "rdp" or "none"
  std::vector<std::pair<std::string, double>> clip_bounds;  // block → C_b
  std::vector<std::pair<std::string, int64_t>> dimensions;  // e.g. K, V, N
  std::string vocabulary_fingerprint;  // BLAKE2b-256 hex of the vocabulary
  std::string config_fingerprint;      // BLAKE2b-256 hex of the public config
  bool is_private = false;
  std::string noise_description;
  std::string created_at_utc;          // RFC 3339
};

struct Release {
  ReleaseMetadata metadata;
  std::vector<ReleaseArray> arrays;
};

// Names, shapes, finiteness, required fields. Messages name the field.
Status Validate(const Release& release);

// The exact bytes of a NumPy .npy v1.0 file: little-endian '<f8', C order,
// header padded with spaces to a multiple of 64 bytes and ended by '\n'.
std::string EncodeNpy(const ReleaseArray& array);

// Strict inverse of EncodeNpy (v1.0, '<f8', C order, shape of any rank);
// anything else is INVALID_ARGUMENT naming the problem.
StatusOr<ReleaseArray> DecodeNpy(std::string_view bytes, std::string name);

// BLAKE2b-256 of `bytes`, lowercase hex (libsodium crypto_generichash).
std::string Blake2bHex(const std::string& bytes);

// manifest.json: every metadata field plus, per array, its file name
// (<name>.npy), shape, dtype, byte size and BLAKE2b-256 of the file bytes
// (`npy_files[i]` = EncodeNpy(arrays[i])).
std::string ManifestJson(const Release& release, const std::vector<std::string>& npy_files);

}  // namespace vipsd::release
