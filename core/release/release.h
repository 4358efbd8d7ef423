// A release: what leaves the process after a private step (docs/architecture.md), and
// its byte encoding. docs/release_format.md is the normative description;
// tools/decode_release.py is the reference decoder.
//
// Content: public metadata plus named parameter arrays (row-major doubles).
// Encoded as one `manifest.json` (the metadata, and per array its file name,
// shape, dtype, byte size and BLAKE2b-256) plus one NumPy `.npy` v1.0 file per
// array. The file sink (connectors/file/release_file_sink.h) writes exactly
// these bytes into `<directory>/<release_id>/`; the Kafka sink carries the
// same bytes, chunked as described below.
//
// Privacy: everything in a release is public. The arrays are post-processing
// of the noisy sum (natural parameters after the M-step), and the metadata may
// hold only values that do not depend on private records: configuration,
// the step counter t, ρ_t, (ε, δ) spent, σ, q, clip bounds, dimensions,
// fingerprints, a timestamp. There is deliberately no field for the realised
// batch size, the pool size, clip counts, rejected-record counts or any loss:
// they depend on the data and would be released without noise (docs/models.md, "The stochastic step").
// Do not add one; a test checks that the manifest holds exactly the
// documented fields.
//
// Kafka chunking (used by the Kafka sink; the file sink does not chunk).
// Kafka's default message limit is 1 MB and LDA's λ is K×V doubles (50×8000
// = 3.2 MB), so a release is sent as several messages, all with the message
// key = release_id (one key → one partition → order is kept):
//   1. for each array, in manifest order, ChunkBytes(npy bytes,
//      kDefaultChunkBytes): chunk i of n is one message with headers
//      `vipsd-release-id` = release_id, `vipsd-file` = "<name>.npy",
//      `vipsd-chunk` = i (0-based, decimal), `vipsd-chunks` = n;
//   2. last, the manifest: one message with `vipsd-release-id`,
//      `vipsd-file` = "manifest.json", value = ManifestJson bytes.
// The manifest goes last so that its successful delivery report means the
// whole release is on the broker; the release counts as published only then.
// A consumer buffers chunks per (release_id, file), concatenates them in
// chunk order once the manifest arrives, and accepts the release only if
// every file has the manifest's byte count and BLAKE2b-256; anything else is
// an incomplete release and is dropped whole.
//
// Thread-safety: plain values and pure functions; no I/O here.
// Failure: Validate and the Encode*/Decode* functions return
// INVALID_ARGUMENT naming the field or array; nothing throws.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/base/status.h"

namespace vipsd::release {

// Bumped on any incompatible change of the manifest or the array encoding.
// Adding a manifest field is compatible (readers ignore unknown fields).
inline constexpr int kSchemaVersion = 1;
// The manifest's "format" field: identifies the file like a magic number.
inline constexpr std::string_view kFormatName = "vipsd-release";
inline constexpr std::string_view kManifestFileName = "manifest.json";
// The only array encoding: little-endian IEEE-754 binary64 (NumPy '<f8').
inline constexpr std::string_view kNpyDtype = "<f8";
// Largest chunk a Kafka message carries: below librdkafka's default
// message.max.bytes (1,000,000) with room for key, headers and framing.
inline constexpr size_t kDefaultChunkBytes = 900 * 1000;

struct ReleaseArray {
  std::string name;            // [a-z0-9_]+ (≤ 64), unique within a release
  std::vector<int64_t> shape;  // rank 0..32, each ≥ 0; product = data.size()
  std::vector<double> data;    // row-major (C order), all finite
};

// Every string is printable ASCII. Fields that are "0" / "none" in a
// non-private run are documented in docs/release_format.md.
struct ReleaseMetadata {
  int schema_version = kSchemaVersion;
  std::string release_id;       // [A-Za-z0-9][A-Za-z0-9_.-]* (≤ 128), e.g. "step-120"
  std::string model_type;       // "lda"
  int64_t step = 0;             // t of the step this release follows, ≥ 0
  double rho = 0;               // ρ_t of that step, in (0, 1]
  double epsilon_spent = 0;     // cumulative ε, ≥ 0 (0 for non-private runs)
  double delta = 0;             // δ of epsilon_spent, in [0, 1)
  double noise_multiplier = 0;  // σ, ≥ 0
  double sampling_rate = 0;     // q, in (0, 1]
  std::string accountant;       // e.g. "fixed_pld", "rdp_filter"; "none" if non-private
  // "fixed" | "adaptive"; "none" if non-private; "unrecorded" only as read
  // from a release written before these two fields existed.
  std::string schedule = "none";
  std::string conversion = "none";  // "pld_pessimistic" | "rdp_improved" |
                                    // "pld_or_rdp_improved"; "none" if non-private
  std::vector<std::pair<std::string, double>> clip_bounds;  // block → C_b ≥ 0
  std::vector<std::pair<std::string, int64_t>> dimensions;  // e.g. K, V, N ≥ 0
  std::string vocabulary_fingerprint;  // BLAKE2b-256, 64 lowercase hex, or ""
  // Where the public vocabulary lives (the configured path on the daemon's
  // host), so that a consumer can find it; "" if none (optional field).
  std::string vocabulary_source;
  // The public source the model started from (model.public_prior): the
  // BLAKE2b-256 of its bytes (64 lowercase hex) and the configured path;
  // both "" if none (optional fields, omitted then).
  std::string public_prior_fingerprint;
  std::string public_prior_source;
  // LDA's public start: the public topics' share of the start
  // (model.public_prior.weight), in (0, 1]; 0 = none (other models, or no
  // public prior; optional field, omitted then).
  double public_prior_weight = 0;
  // The model's public priors a consumer needs to use it (LDA: alpha, eta;
  // BLR: prior_shape, prior_rate; SBN: the prior precisions), each finite
  // and > 0 (optional field; empty for releases written before it existed).
  std::vector<std::pair<std::string, double>> hyperparameters;
  // What the ε protects (privacy.unit; docs/privacy_accounting.md §6d):
  // "record" (one record; the manifest then omits these three fields, as
  // releases written before them did), "key" (every record of one Kafka
  // message key) or "field" (every record with one value of the JSON field
  // unit_field: [A-Za-z0-9_.-], 1-128); max_records_per_unit in
  // [1, 1000000] for a unit, 0 for "record" (optional fields).
  std::string privacy_unit = "record";
  std::string unit_field;
  int64_t max_records_per_unit = 0;
  std::string config_fingerprint;      // BLAKE2b-256, 64 lowercase hex
  bool is_private = false;  // requires σ > 0, an accountant, 0 < δ < 1, C_b > 0
  std::string noise_description;  // e.g. "chacha20-os-seeded"
  std::string created_at_utc;     // RFC 3339, e.g. "2026-11-23T00:10:00Z"
};

struct Release {
  ReleaseMetadata metadata;
  std::vector<ReleaseArray> arrays;  // at least one
};

// Checks every range stated above and that a release claiming is_private
// is consistent with its parameters. Messages name the field or array.
Status Validate(const Release& release);

// "<name>.npy": the file (or Kafka `vipsd-file` header) of an array.
std::string ArrayFileName(std::string_view array_name);

// The exact bytes of a NumPy .npy v1.0 file: magic "\x93NUMPY", version 1.0,
// little-endian uint16 header length, the header
//   {'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }
// padded with spaces and ended by '\n' so that 10 + header length is a
// multiple of 64, then the doubles in row-major order. Deterministic: equal
// arrays give equal bytes (hence equal hashes). The shape is written as
// Python writes a tuple: "()", "(5,)", "(2, 3)".
// Precondition: the array passes Validate (rank ≤ 32, shape matches data).
std::string EncodeNpy(const ReleaseArray& array);

// Strict inverse of EncodeNpy: exactly the v1.0 header EncodeNpy writes
// (key order, spacing, padding, 64-byte alignment), '<f8', C order, and a
// data section of exactly the shape's size. Bit-exact: -0.0, subnormals and
// NaN payloads come back unchanged (finiteness is Validate's business).
// `name` becomes the array's name and labels error messages.
StatusOr<ReleaseArray> DecodeNpy(std::string_view bytes, std::string name);

// BLAKE2b with a 32-byte digest (libsodium crypto_generichash; Python:
// hashlib.blake2b(data, digest_size=32)), as 64 lowercase hex characters.
std::string Blake2bHex(std::string_view bytes);

// The manifest: a JSON object with "format", every ReleaseMetadata field
// (clip_bounds and dimensions as objects, in their given order) and
// "arrays": [{"name", "shape", "dtype": "<f8", "file": "<name>.npy",
// "bytes": N, "blake2b": hex}] describing `npy_files[i]`, which must be
// EncodeNpy(release.arrays[i]) (checked: INVALID_ARGUMENT otherwise). Numbers
// are written so that they parse back to the same double; a non-integral
// field is always written with '.' or an exponent, so it reads as a float.
StatusOr<std::string> ManifestJson(const Release& release,
                                   std::span<const std::string> npy_files);

// One file of an encoded release.
struct ReleaseFile {
  std::string name;   // "<array>.npy" or "manifest.json"
  std::string bytes;
};

// A validated release in its byte form: one .npy per array (in the order of
// release.arrays), then manifest.json last — the order in which a sink must
// make them visible (the manifest vouches for the arrays).
struct EncodedRelease {
  std::string release_id;
  std::vector<ReleaseFile> files;
};

// Validate + EncodeNpy for every array + ManifestJson, encoding each array
// once. This is what the sinks call.
StatusOr<EncodedRelease> EncodeRelease(const Release& release);

// Splits `bytes` into consecutive pieces of max_chunk bytes (the last may be
// shorter); concatenating them gives `bytes` back. Empty input gives no
// chunks. max_chunk must be > 0 (0 is treated as 1).
std::vector<std::string> ChunkBytes(std::string_view bytes,
                                    size_t max_chunk = kDefaultChunkBytes);

}  // namespace vipsd::release
