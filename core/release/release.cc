#include "core/release/release.h"

#include <sodium.h>

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <set>

#include "core/base/format.h"
#include "core/privacy/mechanisms/privacy_unit.h"

namespace vipsd::release {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the '<f8' encoding copies doubles byte for byte");
static_assert(sizeof(double) == 8 && std::numeric_limits<double>::is_iec559);

constexpr size_t kMaxRank = 32;  // NumPy's own limit (NPY_MAXDIMS)
constexpr size_t kNpyPreamble = 10;  // magic (6) + version (2) + header length (2)
constexpr size_t kNpyAlignment = 64;
constexpr std::string_view kNpyMagic = "\x93NUMPY";
constexpr std::string_view kNpyHeaderPrefix = "{'descr': '<f8', 'fortran_order': False, 'shape': (";
constexpr std::string_view kNpyHeaderSuffix = "), }";

bool IsLowerName(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_'; }
bool IsKeyName(char c) { return IsLowerName(c) || (c >= 'A' && c <= 'Z'); }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

template <typename CharOk>
bool AllOf(std::string_view s, size_t max_length, CharOk ok) {
  return !s.empty() && s.size() <= max_length && std::all_of(s.begin(), s.end(), ok);
}

bool IsPrintableAscii(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c >= 0x20 && c <= 0x7e; });
}

bool IsReleaseId(std::string_view id) {
  // A leading letter or digit keeps ids apart from "." / ".." and from the
  // sink's hidden ".<id>.tmp" directories.
  return AllOf(id, 128, [](char c) { return IsKeyName(c) || c == '-' || c == '.'; }) &&
         IsKeyName(id.front()) && id.front() != '_';
}

// 256 bits in lowercase hex (the BLAKE2b digests a manifest names).
bool IsHex256(std::string_view s) { return IsLowerHex(s, 64); }

// Fixed-width decimal field within [low, high].
bool DigitsInRange(std::string_view s, size_t pos, size_t width, int low, int high) {
  if (pos + width > s.size()) return false;
  int value = 0;
  for (size_t i = pos; i < pos + width; ++i) {
    if (!IsDigit(s[i])) return false;
    value = value * 10 + (s[i] - '0');
  }
  return value >= low && value <= high;
}

// RFC 3339 date-time: YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM), upper-case T/Z.
bool IsRfc3339(std::string_view s) {
  if (!DigitsInRange(s, 0, 4, 0, 9999) || s.size() < 20 || s[4] != '-' ||
      !DigitsInRange(s, 5, 2, 1, 12) || s[7] != '-' || !DigitsInRange(s, 8, 2, 1, 31) ||
      s[10] != 'T' || !DigitsInRange(s, 11, 2, 0, 23) || s[13] != ':' ||
      !DigitsInRange(s, 14, 2, 0, 59) || s[16] != ':' || !DigitsInRange(s, 17, 2, 0, 60)) {
    return false;
  }
  size_t pos = 19;
  if (s[pos] == '.') {
    const size_t start = ++pos;
    while (pos < s.size() && IsDigit(s[pos])) ++pos;
    if (pos == start) return false;
  }
  if (pos < s.size() && s[pos] == 'Z') return pos + 1 == s.size();
  return pos + 6 == s.size() && (s[pos] == '+' || s[pos] == '-') &&
         DigitsInRange(s, pos + 1, 2, 0, 23) && s[pos + 3] == ':' &&
         DigitsInRange(s, pos + 4, 2, 0, 59);
}

bool CheckedProduct(std::span<const int64_t> shape, int64_t* product) {
  int64_t result = 1;
  for (int64_t dim : shape) {
    if (dim < 0 || __builtin_mul_overflow(result, dim, &result)) return false;
  }
  // The data section must also be addressable in bytes.
  if (result > static_cast<int64_t>(SIZE_MAX / sizeof(double)) ||
      result > INT64_MAX / static_cast<int64_t>(sizeof(double))) {
    return false;
  }
  *product = result;
  return true;
}

Status FieldError(std::string_view field, std::string_view requirement) {
  return InvalidArgumentError("release metadata: " + std::string(field) + " must be " +
                              std::string(requirement));
}

Status ValidateArray(const ReleaseArray& array) {
  if (!AllOf(array.name, 64, IsLowerName)) {
    return InvalidArgumentError("release array name '" +
                                (IsPrintableAscii(array.name) ? array.name : "?") +
                                "' must be 1-64 characters of [a-z0-9_]");
  }
  const std::string label = "release array " + array.name + ": ";
  if (array.shape.size() > kMaxRank) {
    return InvalidArgumentError(label + "rank must be at most 32");
  }
  int64_t size = 0;
  if (!CheckedProduct(array.shape, &size)) {
    return InvalidArgumentError(label + "dimensions must be >= 0 with a representable product");
  }
  if (static_cast<uint64_t>(size) != array.data.size()) {
    return InvalidArgumentError(label + "shape has " + std::to_string(size) +
                                " elements but data has " + std::to_string(array.data.size()));
  }
  for (double value : array.data) {
    if (!std::isfinite(value)) return InvalidArgumentError(label + "values must be finite");
  }
  return Status::Ok();
}

// Shortest representation that parses back to the same double (to_chars),
// with ".0" added to integral values so that every reader sees a float.
std::string JsonNumber(double value) {
  std::string text = ShortestNumber(value);
  if (text.find_first_of(".e") == std::string::npos) text += ".0";
  return text;
}

// {"name": number, ...} in the given order (clip bounds, hyperparameters).
// Strings are JsonString of core/base/format.h.
std::string JsonNumberObject(const std::vector<std::pair<std::string, double>>& entries) {
  std::string out = "{";
  for (size_t i = 0; i < entries.size(); ++i) {
    out += (i > 0 ? ", " : "") + JsonString(entries[i].first) + ": " +
           JsonNumber(entries[i].second);
  }
  return out + "}";
}

std::string ShapeTuple(std::span<const int64_t> shape) {
  std::string out = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(shape[i]);
  }
  if (shape.size() == 1) out += ',';
  return out + ")";
}

std::string ManifestJsonUnchecked(const Release& release,
                                  std::span<const std::string> npy_files) {
  const ReleaseMetadata& m = release.metadata;
  std::string j = "{\n";
  auto field = [&j](std::string_view key, const std::string& value) {
    j += "  " + JsonString(key) + ": " + value + ",\n";
  };
  field("format", JsonString(kFormatName));
  field("schema_version", std::to_string(m.schema_version));
  field("release_id", JsonString(m.release_id));
  field("model_type", JsonString(m.model_type));
  field("step", std::to_string(m.step));
  field("rho", JsonNumber(m.rho));
  field("epsilon_spent", JsonNumber(m.epsilon_spent));
  field("delta", JsonNumber(m.delta));
  field("noise_multiplier", JsonNumber(m.noise_multiplier));
  field("sampling_rate", JsonNumber(m.sampling_rate));
  field("accountant", JsonString(m.accountant));
  field("schedule", JsonString(m.schedule));
  field("conversion", JsonString(m.conversion));
  field("clip_bounds", JsonNumberObject(m.clip_bounds));
  std::string dims = "{";
  for (size_t i = 0; i < m.dimensions.size(); ++i) {
    dims += (i > 0 ? ", " : "") + JsonString(m.dimensions[i].first) + ": " +
            std::to_string(m.dimensions[i].second);
  }
  field("dimensions", dims + "}");
  field("vocabulary_fingerprint", JsonString(m.vocabulary_fingerprint));
  field("vocabulary_source", JsonString(m.vocabulary_source));
  if (!m.public_prior_fingerprint.empty()) {
    field("public_prior_fingerprint", JsonString(m.public_prior_fingerprint));
    field("public_prior_source", JsonString(m.public_prior_source));
    if (m.public_prior_weight > 0) field("public_prior_weight", JsonNumber(m.public_prior_weight));
  }
  field("hyperparameters", JsonNumberObject(m.hyperparameters));
  if (m.privacy_unit != "record") {
    field("privacy_unit", JsonString(m.privacy_unit));
    if (m.privacy_unit == "field") field("unit_field", JsonString(m.unit_field));
    field("max_records_per_unit", std::to_string(m.max_records_per_unit));
  }
  field("config_fingerprint", JsonString(m.config_fingerprint));
  field("is_private", m.is_private ? "true" : "false");
  field("noise_description", JsonString(m.noise_description));
  field("created_at_utc", JsonString(m.created_at_utc));
  j += "  \"arrays\": [\n";
  for (size_t i = 0; i < release.arrays.size(); ++i) {
    const ReleaseArray& a = release.arrays[i];
    std::string shape = "[";
    for (size_t d = 0; d < a.shape.size(); ++d) {
      shape += (d > 0 ? ", " : "") + std::to_string(a.shape[d]);
    }
    j += "    {\"name\": " + JsonString(a.name) + ", \"shape\": " + shape +
         "], \"dtype\": " + JsonString(kNpyDtype) + ", \"file\": " +
         JsonString(ArrayFileName(a.name)) + ", \"bytes\": " + std::to_string(npy_files[i].size()) +
         ", \"blake2b\": " + JsonString(Blake2bHex(npy_files[i])) + "}" +
         (i + 1 < release.arrays.size() ? ",\n" : "\n");
  }
  j += "  ]\n}\n";
  return j;
}

// Validate's parts, in the order their checks run (the first error found is
// the one returned).
// The header and the mechanism's parameters.
Status ValidateHeader(const ReleaseMetadata& m) {
  if (m.schema_version != kSchemaVersion) {
    return FieldError("schema_version", std::to_string(kSchemaVersion));
  }
  if (!IsReleaseId(m.release_id)) {
    return FieldError("release_id",
                      "1-128 characters of [A-Za-z0-9_.-] starting with a letter or digit");
  }
  if (m.model_type != "lda" && m.model_type != "blr" && m.model_type != "sbn") {
    return FieldError("model_type", "\"lda\", \"blr\" or \"sbn\"");
  }
  if (m.step < 0) return FieldError("step", ">= 0");
  if (!(m.rho > 0 && m.rho <= 1)) return FieldError("rho", "in (0, 1]");
  if (!(m.epsilon_spent >= 0) || !std::isfinite(m.epsilon_spent)) {
    return FieldError("epsilon_spent", "finite and >= 0");
  }
  if (!(m.delta >= 0 && m.delta < 1)) return FieldError("delta", "in [0, 1)");
  if (!(m.noise_multiplier >= 0) || !std::isfinite(m.noise_multiplier)) {
    return FieldError("noise_multiplier", "finite and >= 0");
  }
  if (!(m.sampling_rate > 0 && m.sampling_rate <= 1)) {
    return FieldError("sampling_rate", "in (0, 1]");
  }
  if (!AllOf(m.accountant, 64, IsLowerName)) {
    return FieldError("accountant", "1-64 characters of [a-z0-9_] (\"none\" if non-private)");
  }
  if (m.schedule != "fixed" && m.schedule != "adaptive" && m.schedule != "none" &&
      m.schedule != "unrecorded") {
    return FieldError("schedule", "\"fixed\", \"adaptive\" or \"none\" (non-private)");
  }
  if (!AllOf(m.conversion, 64, IsLowerName)) {
    return FieldError("conversion", "1-64 characters of [a-z0-9_] (\"none\" if non-private)");
  }
  return Status::Ok();
}

// The keyed maps (clip bounds, dimensions, hyperparameters) and the
// provenance fingerprints and sources.
Status ValidateShapeAndProvenance(const ReleaseMetadata& m) {
  std::set<std::string_view> keys;
  for (const auto& [block, bound] : m.clip_bounds) {
    if (!AllOf(block, 64, IsKeyName) || !keys.insert(block).second) {
      return FieldError("clip_bounds", "keyed by distinct names of [A-Za-z0-9_] (1-64)");
    }
    if (!(bound >= 0) || !std::isfinite(bound)) {
      return FieldError("clip_bounds." + block, "finite and >= 0");
    }
  }
  keys.clear();
  for (const auto& [name, value] : m.dimensions) {
    if (!AllOf(name, 64, IsKeyName) || !keys.insert(name).second) {
      return FieldError("dimensions", "keyed by distinct names of [A-Za-z0-9_] (1-64)");
    }
    // N (LDA word draws per document) is 0 for "actual counts"; every other
    // dimension is a size.
    if (value < 0 || (value == 0 && name != "N")) {
      return FieldError("dimensions." + name, name == "N" ? ">= 0" : ">= 1");
    }
  }
  if (!m.vocabulary_fingerprint.empty() && !IsHex256(m.vocabulary_fingerprint)) {
    return FieldError("vocabulary_fingerprint", "empty or 64 lowercase hex characters");
  }
  if (!IsHex256(m.config_fingerprint)) {
    return FieldError("config_fingerprint", "64 lowercase hex characters");
  }
  if (m.vocabulary_source.size() > 4096 || !IsPrintableAscii(m.vocabulary_source)) {
    return FieldError("vocabulary_source", "0-4096 printable ASCII characters");
  }
  if (!m.public_prior_fingerprint.empty() && !IsHex256(m.public_prior_fingerprint)) {
    return FieldError("public_prior_fingerprint", "empty or 64 lowercase hex characters");
  }
  if (m.public_prior_source.size() > 4096 || !IsPrintableAscii(m.public_prior_source) ||
      (m.public_prior_fingerprint.empty() && !m.public_prior_source.empty())) {
    return FieldError("public_prior_source",
                      "0-4096 printable ASCII characters, and empty without a "
                      "public_prior_fingerprint");
  }
  if (!(m.public_prior_weight == 0 || (m.public_prior_weight > 0 && m.public_prior_weight <= 1)) ||
      (m.public_prior_fingerprint.empty() && m.public_prior_weight != 0)) {
    return FieldError("public_prior_weight",
                      "0 (none) or in (0, 1], and 0 without a public_prior_fingerprint");
  }
  keys.clear();
  for (const auto& [name, value] : m.hyperparameters) {
    if (!AllOf(name, 64, IsKeyName) || !keys.insert(name).second) {
      return FieldError("hyperparameters", "keyed by distinct names of [A-Za-z0-9_] (1-64)");
    }
    if (!(std::isfinite(value) && value > 0)) {
      return FieldError("hyperparameters." + name, "a finite number > 0");
    }
  }
  return Status::Ok();
}

// The privacy unit, the noise description, the time, and what a release
// that claims privacy must carry.
Status ValidateUnitAndClaim(const ReleaseMetadata& m) {
  if (m.privacy_unit != "record" && m.privacy_unit != "key" && m.privacy_unit != "field") {
    return FieldError("privacy_unit", "record, key or field");
  }
  if (m.privacy_unit == "field" ? !privacy::IsUnitFieldName(m.unit_field)
                                 : !m.unit_field.empty()) {
    return FieldError("unit_field",
                      "1-128 of [A-Za-z0-9_.-] with privacy_unit field, empty otherwise");
  }
  if (m.privacy_unit == "record" ? m.max_records_per_unit != 0
                                 : !(m.max_records_per_unit >= 1 &&
                                     m.max_records_per_unit <= privacy::kMaxRecordsPerUnit)) {
    return FieldError("max_records_per_unit",
                      "in [1, 1000000] with a privacy unit, 0 with privacy_unit record");
  }
  if (m.noise_description.empty() || m.noise_description.size() > 256 ||
      !IsPrintableAscii(m.noise_description)) {
    return FieldError("noise_description", "1-256 printable ASCII characters");
  }
  if (!IsRfc3339(m.created_at_utc)) {
    return FieldError("created_at_utc", "an RFC 3339 date-time such as 2026-01-31T12:00:00Z");
  }
  if (m.is_private) {
    // A release that claims privacy must carry the parameters of a mechanism
    // that can provide it.
    if (!(m.noise_multiplier > 0)) return FieldError("noise_multiplier", "> 0 when is_private");
    if (m.accountant == "none") return FieldError("accountant", "not \"none\" when is_private");
    if (m.schedule == "none") return FieldError("schedule", "not \"none\" when is_private");
    if (m.conversion == "none") return FieldError("conversion", "not \"none\" when is_private");
    if (!(m.delta > 0)) return FieldError("delta", "> 0 when is_private");
    if (m.clip_bounds.empty()) return FieldError("clip_bounds", "non-empty when is_private");
    for (const auto& [block, bound] : m.clip_bounds) {
      if (!(bound > 0)) return FieldError("clip_bounds." + block, "> 0 when is_private");
    }
  }
  return Status::Ok();
}

}  // namespace

Status Validate(const Release& release) {
  const ReleaseMetadata& m = release.metadata;
  VIPSD_RETURN_IF_ERROR(ValidateHeader(m));
  VIPSD_RETURN_IF_ERROR(ValidateShapeAndProvenance(m));
  VIPSD_RETURN_IF_ERROR(ValidateUnitAndClaim(m));
  if (release.arrays.empty()) {
    return InvalidArgumentError("release: at least one array is required");
  }
  std::set<std::string_view> names;
  for (const ReleaseArray& array : release.arrays) {
    VIPSD_RETURN_IF_ERROR(ValidateArray(array));
    if (!names.insert(array.name).second) {
      return InvalidArgumentError("release array name " + array.name + " is used twice");
    }
  }
  return Status::Ok();
}

std::string ArrayFileName(std::string_view array_name) {
  return std::string(array_name) + ".npy";
}

std::string EncodeNpy(const ReleaseArray& array) {
  std::string header = "{'descr': '<f8', 'fortran_order': False, 'shape': " +
                       ShapeTuple(array.shape) + ", }";
  const size_t unpadded = kNpyPreamble + header.size() + 1;  // + the final '\n'
  header.append((kNpyAlignment - unpadded % kNpyAlignment) % kNpyAlignment, ' ');
  header += '\n';
  const size_t data_bytes = array.data.size() * sizeof(double);
  std::string out;
  out.reserve(kNpyPreamble + header.size() + data_bytes);
  out += kNpyMagic;
  out += '\x01';
  out += '\x00';
  const auto length = static_cast<uint16_t>(header.size());
  out += static_cast<char>(length & 0xff);
  out += static_cast<char>(length >> 8);
  out += header;
  const size_t offset = out.size();
  out.resize(offset + data_bytes);
  if (data_bytes > 0) std::memcpy(out.data() + offset, array.data.data(), data_bytes);
  return out;
}

StatusOr<ReleaseArray> DecodeNpy(std::string_view bytes, std::string name) {
  auto error = [&name](std::string_view what) {
    return InvalidArgumentError(name + ".npy: " + std::string(what));
  };
  if (bytes.size() < kNpyPreamble || bytes.substr(0, kNpyMagic.size()) != kNpyMagic) {
    return error("not a NumPy .npy file");
  }
  if (bytes[6] != '\x01' || bytes[7] != '\x00') return error("only .npy version 1.0 is supported");
  const size_t header_length = static_cast<unsigned char>(bytes[8]) |
                               (static_cast<size_t>(static_cast<unsigned char>(bytes[9])) << 8);
  if (kNpyPreamble + header_length > bytes.size()) return error("truncated header");
  if ((kNpyPreamble + header_length) % kNpyAlignment != 0) {
    return error("header is not padded to a multiple of 64 bytes");
  }
  std::string_view header = bytes.substr(kNpyPreamble, header_length);
  if (header.empty() || header.back() != '\n') return error("header does not end with '\\n'");
  header.remove_suffix(1);
  while (!header.empty() && header.back() == ' ') header.remove_suffix(1);
  if (!header.starts_with(kNpyHeaderPrefix) || !header.ends_with(kNpyHeaderSuffix)) {
    return error("header is not {'descr': '<f8', 'fortran_order': False, 'shape': (...), }");
  }
  // The prefix ends in '(' and the suffix starts with ')', so they cannot overlap.
  const std::string_view body = header.substr(
      kNpyHeaderPrefix.size(), header.size() - kNpyHeaderPrefix.size() - kNpyHeaderSuffix.size());
  std::string_view dims = body;
  ReleaseArray array;
  // The tuple body: "" | "N," | "N, M" | "N, M, L" ...
  while (!dims.empty()) {
    int64_t dim = 0;
    const auto parsed = std::from_chars(dims.data(), dims.data() + dims.size(), dim);
    // from_chars accepts a leading '-'; NumPy never writes one, nor leading zeros.
    if (parsed.ec != std::errc() || dims.front() == '-' ||
        (dims.front() == '0' && parsed.ptr - dims.data() > 1)) {
      return error("malformed shape");
    }
    array.shape.push_back(dim);
    dims.remove_prefix(static_cast<size_t>(parsed.ptr - dims.data()));
    if (dims.empty()) break;
    if (dims == ",") {
      if (array.shape.size() != 1) return error("malformed shape");
      dims = {};
    } else if (dims.starts_with(", ") && dims.size() > 2) {
      dims.remove_prefix(2);
    } else {
      return error("malformed shape");
    }
  }
  // Python writes a one-element tuple as "(N,)" and only then.
  if ((array.shape.size() == 1) != body.ends_with(",")) return error("malformed shape");
  if (array.shape.size() > kMaxRank) return error("rank above 32");
  int64_t count = 0;
  if (!CheckedProduct(array.shape, &count)) return error("shape too large");
  const size_t data_bytes = bytes.size() - kNpyPreamble - header_length;
  if (data_bytes != static_cast<size_t>(count) * sizeof(double)) {
    return error("data size does not match the shape");
  }
  array.name = std::move(name);
  array.data.resize(static_cast<size_t>(count));
  if (data_bytes > 0) {
    std::memcpy(array.data.data(), bytes.data() + kNpyPreamble + header_length, data_bytes);
  }
  return array;
}

std::string Blake2bHex(std::string_view bytes) {
  unsigned char hash[32];
  static_assert(sizeof(hash) >= crypto_generichash_BYTES_MIN &&
                sizeof(hash) <= crypto_generichash_BYTES_MAX);
  // crypto_generichash cannot fail for a valid output length and no key.
  crypto_generichash(hash, sizeof(hash), reinterpret_cast<const unsigned char*>(bytes.data()),
                     bytes.size(), nullptr, 0);
  char hex[2 * sizeof(hash) + 1];
  sodium_bin2hex(hex, sizeof(hex), hash, sizeof(hash));
  return std::string(hex, 2 * sizeof(hash));
}

StatusOr<std::string> ManifestJson(const Release& release,
                                   std::span<const std::string> npy_files) {
  VIPSD_RETURN_IF_ERROR(Validate(release));
  if (npy_files.size() != release.arrays.size()) {
    return InvalidArgumentError("release manifest: " + std::to_string(npy_files.size()) +
                                " .npy files for " + std::to_string(release.arrays.size()) +
                                " arrays");
  }
  for (size_t i = 0; i < npy_files.size(); ++i) {
    if (npy_files[i] != EncodeNpy(release.arrays[i])) {
      return InvalidArgumentError("release manifest: file " + std::to_string(i) +
                                  " is not the encoding of array " + release.arrays[i].name);
    }
  }
  return ManifestJsonUnchecked(release, npy_files);
}

StatusOr<EncodedRelease> EncodeRelease(const Release& release) {
  VIPSD_RETURN_IF_ERROR(Validate(release));
  std::vector<std::string> npy_files;
  npy_files.reserve(release.arrays.size());
  for (const ReleaseArray& array : release.arrays) npy_files.push_back(EncodeNpy(array));
  EncodedRelease encoded;
  encoded.release_id = release.metadata.release_id;
  std::string manifest = ManifestJsonUnchecked(release, npy_files);
  for (size_t i = 0; i < npy_files.size(); ++i) {
    encoded.files.push_back({ArrayFileName(release.arrays[i].name), std::move(npy_files[i])});
  }
  encoded.files.push_back({std::string(kManifestFileName), std::move(manifest)});
  return encoded;
}

std::vector<std::string> ChunkBytes(std::string_view bytes, size_t max_chunk) {
  max_chunk = std::max<size_t>(max_chunk, 1);
  std::vector<std::string> chunks;
  chunks.reserve(bytes.size() / max_chunk + 1);
  for (size_t offset = 0; offset < bytes.size(); offset += max_chunk) {
    chunks.emplace_back(bytes.substr(offset, max_chunk));
  }
  return chunks;
}

}  // namespace vipsd::release
