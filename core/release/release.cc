#include "core/release/release.h"

#include <sodium.h>

#include <bit>
#include <charconv>
#include <cstdio>
#include <cmath>
#include <cstring>
#include <set>

namespace vipsd::release {
namespace {

bool IsName(const std::string& s, bool allow_upper_and_punct) {
  if (s.empty() || s.size() > 128) return false;
  for (char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
                    (allow_upper_and_punct && ((c >= 'A' && c <= 'Z') || c == '-' || c == '.'));
    if (!ok) return false;
  }
  return true;
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buffer[8];
          std::snprintf(buffer, sizeof(buffer), "\\u%04x", c);
          out += buffer;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string JsonNumber(double value) {
  char buffer[64];
  auto result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  return std::string(buffer, result.ptr);
}

}  // namespace

Status Validate(const Release& release) {
  const ReleaseMetadata& m = release.metadata;
  if (!IsName(m.release_id, true)) {
    return InvalidArgumentError("release_id must be 1-128 characters of [A-Za-z0-9_.-]");
  }
  if (m.model_type.empty()) return InvalidArgumentError("model_type is empty");
  if (!std::isfinite(m.rho) || !std::isfinite(m.epsilon_spent) || !std::isfinite(m.delta) ||
      !std::isfinite(m.noise_multiplier) || !std::isfinite(m.sampling_rate)) {
    return InvalidArgumentError("release metadata numbers must be finite");
  }
  if (release.arrays.empty()) return InvalidArgumentError("a release needs at least one array");
  std::set<std::string> names;
  for (const ReleaseArray& array : release.arrays) {
    if (!IsName(array.name, false)) {
      return InvalidArgumentError("array name must be 1-128 characters of [a-z0-9_]");
    }
    if (!names.insert(array.name).second) {
      return InvalidArgumentError("duplicate array name " + array.name);
    }
    int64_t size = 1;
    for (int64_t dim : array.shape) {
      if (dim < 0) return InvalidArgumentError("array " + array.name + " has a negative dimension");
      size *= dim;
    }
    if (array.shape.empty() || static_cast<size_t>(size) != array.data.size()) {
      return InvalidArgumentError("array " + array.name + ": shape does not match its data");
    }
    for (double v : array.data) {
      if (!std::isfinite(v)) return InvalidArgumentError("array " + array.name + " is not finite");
    }
  }
  return Status::Ok();
}

std::string EncodeNpy(const ReleaseArray& array) {
  static_assert(std::endian::native == std::endian::little, "vipsd writes little-endian .npy");
  std::string shape = "(";
  for (size_t i = 0; i < array.shape.size(); ++i) {
    shape += std::to_string(array.shape[i]) + (array.shape.size() == 1 ? "," : "");
    if (i + 1 < array.shape.size()) shape += ", ";
  }
  shape += ")";
  std::string header = "{'descr': '<f8', 'fortran_order': False, 'shape': " + shape + ", }";
  const size_t unpadded = 10 + header.size() + 1;  // magic+version+length, header, '\n'
  header.append((64 - unpadded % 64) % 64, ' ');
  header += '\n';
  std::string out = "\x93NUMPY";
  out += '\x01';
  out += '\x00';
  const auto length = static_cast<uint16_t>(header.size());
  out += static_cast<char>(length & 0xff);
  out += static_cast<char>(length >> 8);
  out += header;
  const size_t offset = out.size();
  out.resize(offset + array.data.size() * sizeof(double));
  std::memcpy(out.data() + offset, array.data.data(), array.data.size() * sizeof(double));
  return out;
}

StatusOr<ReleaseArray> DecodeNpy(std::string_view bytes, std::string name) {
  if (bytes.size() < 10 || bytes.substr(0, 6) != "\x93NUMPY" || bytes[6] != 1 || bytes[7] != 0) {
    return InvalidArgumentError(name + ".npy: not a NumPy 1.0 file");
  }
  const size_t header_length = static_cast<unsigned char>(bytes[8]) |
                               (static_cast<size_t>(static_cast<unsigned char>(bytes[9])) << 8);
  if (10 + header_length > bytes.size()) return InvalidArgumentError(name + ".npy: truncated header");
  const std::string_view header = bytes.substr(10, header_length);
  if (header.find("'descr': '<f8'") == std::string_view::npos ||
      header.find("'fortran_order': False") == std::string_view::npos) {
    return InvalidArgumentError(name + ".npy: only little-endian float64 in C order is supported");
  }
  const size_t open = header.find("'shape': (");
  const size_t close = header.find(')', open);
  if (open == std::string_view::npos || close == std::string_view::npos) {
    return InvalidArgumentError(name + ".npy: no shape in the header");
  }
  ReleaseArray array;
  array.name = std::move(name);
  std::string_view dims = header.substr(open + 10, close - open - 10);
  int64_t count = 1;
  while (!dims.empty()) {
    while (!dims.empty() && (dims.front() == ' ' || dims.front() == ',')) dims.remove_prefix(1);
    if (dims.empty()) break;
    int64_t dim = 0;
    auto result = std::from_chars(dims.data(), dims.data() + dims.size(), dim);
    if (result.ec != std::errc() || dim < 0) {
      return InvalidArgumentError(array.name + ".npy: bad shape");
    }
    array.shape.push_back(dim);
    count *= dim;
    dims.remove_prefix(static_cast<size_t>(result.ptr - dims.data()));
  }
  const size_t data_bytes = bytes.size() - 10 - header_length;
  if (array.shape.empty() || data_bytes != static_cast<size_t>(count) * sizeof(double)) {
    return InvalidArgumentError(array.name + ".npy: data size does not match the shape");
  }
  array.data.resize(static_cast<size_t>(count));
  std::memcpy(array.data.data(), bytes.data() + 10 + header_length, data_bytes);
  return array;
}

std::string Blake2bHex(const std::string& bytes) {
  unsigned char hash[32];
  crypto_generichash(hash, sizeof(hash), reinterpret_cast<const unsigned char*>(bytes.data()),
                     bytes.size(), nullptr, 0);
  char hex[65];
  sodium_bin2hex(hex, sizeof(hex), hash, sizeof(hash));
  return hex;
}

std::string ManifestJson(const Release& release, const std::vector<std::string>& npy_files) {
  const ReleaseMetadata& m = release.metadata;
  std::string j = "{\n";
  auto field = [&](const std::string& key, const std::string& value) {
    j += "  " + JsonString(key) + ": " + value + ",\n";
  };
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
  std::string bounds = "{";
  for (size_t i = 0; i < m.clip_bounds.size(); ++i) {
    bounds += (i ? ", " : "") + JsonString(m.clip_bounds[i].first) + ": " +
              JsonNumber(m.clip_bounds[i].second);
  }
  field("clip_bounds", bounds + "}");
  std::string dims = "{";
  for (size_t i = 0; i < m.dimensions.size(); ++i) {
    dims += (i ? ", " : "") + JsonString(m.dimensions[i].first) + ": " +
            std::to_string(m.dimensions[i].second);
  }
  field("dimensions", dims + "}");
  field("vocabulary_fingerprint", JsonString(m.vocabulary_fingerprint));
  field("config_fingerprint", JsonString(m.config_fingerprint));
  field("is_private", m.is_private ? "true" : "false");
  field("noise_description", JsonString(m.noise_description));
  field("created_at_utc", JsonString(m.created_at_utc));
  j += "  \"arrays\": [\n";
  for (size_t i = 0; i < release.arrays.size(); ++i) {
    const ReleaseArray& a = release.arrays[i];
    std::string shape = "[";
    for (size_t d = 0; d < a.shape.size(); ++d) shape += (d ? ", " : "") + std::to_string(a.shape[d]);
    j += "    {\"name\": " + JsonString(a.name) + ", \"shape\": " + shape +
         "], \"dtype\": \"<f8\", \"file\": " + JsonString(a.name + ".npy") +
         ", \"bytes\": " + std::to_string(npy_files[i].size()) +
         ", \"blake2b\": " + JsonString(Blake2bHex(npy_files[i])) + "}" +
         (i + 1 < release.arrays.size() ? ",\n" : "\n");
  }
  j += "  ]\n}\n";
  return j;
}

}  // namespace vipsd::release
