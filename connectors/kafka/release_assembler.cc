#include "connectors/kafka/release_assembler.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <set>
#include <nlohmann/json.hpp>

#include "core/base/format.h"

namespace vipsd::connectors {
namespace {

constexpr size_t kMaxChunks = 1 << 20;
constexpr size_t kMaxManifestBytes = 1 << 20;
constexpr int kSupportedSchema = 1;

bool IsArrayName(std::string_view name) {
  return !name.empty() && name.size() <= 64 && std::all_of(name.begin(), name.end(), [](char c) {
           return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
         });
}

bool IsNpyFileName(std::string_view file) {
  return file.size() > 4 && file.ends_with(".npy") && IsArrayName(file.substr(0, file.size() - 4));
}

bool IsHex256(std::string_view s) { return IsLowerHex(s, 64); }

// Strict decimal: digits only, no sign, no leading zero (except "0").
std::optional<size_t> ParseDecimal(std::string_view s) {
  if (s.empty() || s.size() > 9 || (s.size() > 1 && s[0] == '0')) return std::nullopt;
  size_t value = 0;
  const auto result = std::from_chars(s.data(), s.data() + s.size(), value);
  if (result.ec != std::errc() || result.ptr != s.data() + s.size()) return std::nullopt;
  return value;
}

// Printable form of an untrusted header value for an error message.
std::string Printable(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 128)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  return out;
}

// One entry of the manifest's `arrays`, checked for its form.
struct ManifestArray {
  std::string name;
  std::string file;
  std::vector<int64_t> shape;
  std::string blake2b;
  uint64_t bytes = 0;
};

// Checks format, schema_version and release_id of a manifest that is a JSON
// object. Returns why the release is dropped, or nothing if they hold.
std::optional<std::string> CheckManifestHeader(const nlohmann::json& manifest,
                                               const std::string& release_id) {
  const auto string_field = [&manifest](const char* key) -> std::optional<std::string> {
    const auto it = manifest.find(key);
    if (it == manifest.end() || !it->is_string()) return std::nullopt;
    return it->get<std::string>();
  };
  if (string_field("format") != std::string(release::kFormatName)) {
    return "manifest format is not \"vipsd-release\"";
  }
  const auto version = manifest.find("schema_version");
  if (version == manifest.end() || !version->is_number_integer() ||
      version->get<int64_t>() != kSupportedSchema) {
    return "manifest schema_version is not 1";
  }
  if (string_field("release_id") != release_id) {
    return "manifest release_id differs from vipsd-release-id";
  }
  return std::nullopt;
}

// Reads arrays[index] of the manifest into `array`; `listed` collects the
// file names (a repeated one is refused). Returns why the release is
// dropped, or nothing if the entry is well-formed.
std::optional<std::string> ReadManifestArray(const nlohmann::json& entry, size_t index,
                                             std::set<std::string>& listed,
                                             ManifestArray& array) {
  const std::string where = "arrays[" + std::to_string(index) + "]";
  if (!entry.is_object()) return "manifest " + where + " is not an object";
  const auto name = entry.find("name");
  const auto file = entry.find("file");
  const auto dtype = entry.find("dtype");
  const auto shape = entry.find("shape");
  const auto bytes = entry.find("bytes");
  const auto hash = entry.find("blake2b");
  if (name == entry.end() || !name->is_string() || file == entry.end() || !file->is_string() ||
      dtype == entry.end() || !dtype->is_string() || shape == entry.end() ||
      !shape->is_array() || bytes == entry.end() || !bytes->is_number_unsigned() ||
      hash == entry.end() || !hash->is_string()) {
    return "manifest " + where + ": missing or mistyped name/file/dtype/shape/bytes/blake2b";
  }
  array.name = name->get<std::string>();
  array.file = file->get<std::string>();
  const std::string& file_name = array.file;
  if (!IsArrayName(array.name) || file_name != release::ArrayFileName(array.name) ||
      !listed.insert(file_name).second) {
    return "manifest " + where + ": bad or repeated name, or file is not <name>.npy";
  }
  if (dtype->get<std::string>() != release::kNpyDtype) {
    return "manifest " + where + " (" + file_name + "): dtype is not '<f8'";
  }
  for (const nlohmann::json& dim : *shape) {
    if (!dim.is_number_unsigned()) {
      return "manifest " + where + " (" + file_name + "): shape is not a list of integers >= 0";
    }
    array.shape.push_back(dim.get<int64_t>());
  }
  array.blake2b = hash->get<std::string>();
  if (!IsHex256(array.blake2b)) {
    return "manifest " + where + " (" + file_name + "): blake2b is not 64 hex characters";
  }
  array.bytes = bytes->get<uint64_t>();
  return std::nullopt;
}

// Checks the concatenated chunks of `array`'s file against its entry: hash,
// a strict .npy of its shape, finite values. Returns why the release is
// dropped, or nothing if they match.
std::optional<std::string> CheckArrayContent(const ManifestArray& array,
                                             const std::string& content) {
  const std::string& file_name = array.file;
  if (release::Blake2bHex(content) != array.blake2b) {
    return file_name + ": BLAKE2b-256 does not match the manifest";
  }
  StatusOr<release::ReleaseArray> decoded = release::DecodeNpy(content, array.name);
  if (!decoded.ok()) return decoded.status().message();
  if (decoded->shape != array.shape) {
    return file_name + ": .npy shape differs from the manifest's";
  }
  for (double v : decoded->data) {
    if (!std::isfinite(v)) return file_name + ": contains non-finite values";
  }
  return std::nullopt;
}

}  // namespace

ReleaseAssembler::ReleaseAssembler(ReleaseAssemblerOptions options) : options_(options) {}

ReleaseAssembler::AddResult ReleaseAssembler::Add(const SourceMessage& message) {
  if (message.oversize) {
    AddResult result;
    ++stats_.messages_ignored;
    result.errors.push_back(InvalidArgumentError(
        "release assembler: oversize message at " + message.topic + "[" +
        std::to_string(message.partition) + "]@" + std::to_string(message.offset) +
        " ignored (raise the source's max_record_bytes above the chunk size)"));
    return result;
  }
  return Add(message.key, message.headers, message.payload);
}

ReleaseAssembler::AddResult ReleaseAssembler::Add(
    std::string_view key, std::span<const std::pair<std::string, std::string>> headers,
    std::string_view value) {
  std::map<std::string_view, std::string_view> fields;
  auto ignore = [this](std::string why) {
    AddResult result;
    ++stats_.messages_ignored;
    result.errors.push_back(InvalidArgumentError("release assembler: message ignored: " + why));
    return result;
  };
  for (const auto& [name, header_value] : headers) {
    if (!name.starts_with("vipsd-")) continue;
    if (!fields.emplace(name, header_value).second) {
      return ignore("header " + Printable(name) + " appears twice");
    }
  }
  const auto id_it = fields.find("vipsd-release-id");
  const auto file_it = fields.find("vipsd-file");
  if (id_it == fields.end() || file_it == fields.end()) {
    return ignore("not a release message (no vipsd-release-id / vipsd-file header)");
  }
  const std::string release_id(id_it->second);
  const std::string file(file_it->second);
  if (release_id.empty() || release_id.size() > 128 || Printable(release_id) != release_id) {
    return ignore("vipsd-release-id is not 1-128 printable characters");
  }
  if (key != release_id) {
    return ignore("release " + release_id + ": message key differs from vipsd-release-id");
  }
  if (file == release::kManifestFileName) return Complete(release_id, value);
  if (!IsNpyFileName(file)) {
    return ignore("release " + release_id + ": vipsd-file '" + Printable(file) +
                  "' is neither manifest.json nor <array>.npy");
  }
  const auto chunk_it = fields.find("vipsd-chunk");
  const auto count_it = fields.find("vipsd-chunks");
  const std::optional<size_t> chunk =
      chunk_it == fields.end() ? std::nullopt : ParseDecimal(chunk_it->second);
  const std::optional<size_t> count =
      count_it == fields.end() ? std::nullopt : ParseDecimal(count_it->second);
  if (!chunk || !count || *count < 1 || *count > kMaxChunks || *chunk >= *count) {
    return ignore("release " + release_id + " file " + file +
                  ": vipsd-chunk / vipsd-chunks missing or not 0 <= chunk < chunks <= 2^20");
  }
  return AddChunk(release_id, file, *chunk, *count, value);
}

ReleaseAssembler::AddResult ReleaseAssembler::AddChunk(const std::string& release_id,
                                                       const std::string& file, size_t chunk,
                                                       size_t chunk_count,
                                                       std::string_view value) {
  AddResult result;
  if (value.size() > options_.max_buffered_bytes) {
    Drop(release_id);
    ++stats_.releases_dropped;
    result.errors.push_back(ResourceExhaustedError(
        "release assembler: release " + release_id + " dropped: a chunk of " + file +
        " is larger than max_buffered_bytes"));
    return result;
  }
  auto [it, inserted] = pending_.try_emplace(release_id);
  Pending& pending = it->second;
  if (inserted) pending.sequence = next_sequence_++;
  FileChunks& chunks = pending.files[file];
  if (chunks.chunk_count != chunk_count) {
    if (chunks.chunk_count != 0) {
      result.errors.push_back(DataLossError(
          "release assembler: release " + release_id + " file " + file + ": chunk count changed from " +
          std::to_string(chunks.chunk_count) + " to " + std::to_string(chunk_count) +
          "; the earlier chunks of this file are discarded"));
      for (const auto& [index, bytes] : chunks.chunks) {
        pending.bytes -= bytes.size();
        buffered_bytes_ -= bytes.size();
      }
      chunks.chunks.clear();
    }
    chunks.chunk_count = chunk_count;
  }
  std::string& slot = chunks.chunks[chunk];
  pending.bytes -= slot.size();
  buffered_bytes_ -= slot.size();
  slot.assign(value.data(), value.size());
  pending.bytes += slot.size();
  buffered_bytes_ += slot.size();
  Evict(release_id, result.errors);
  return result;
}

void ReleaseAssembler::Drop(const std::string& release_id) {
  const auto it = pending_.find(release_id);
  if (it == pending_.end()) return;
  buffered_bytes_ -= it->second.bytes;
  pending_.erase(it);
}

void ReleaseAssembler::Evict(const std::string& keep, std::vector<Status>& errors) {
  while (!pending_.empty() && (buffered_bytes_ > options_.max_buffered_bytes ||
                               pending_.size() > options_.max_pending_releases)) {
    // The oldest other release; the one being added only if it alone is too big.
    auto victim = pending_.end();
    for (auto it = pending_.begin(); it != pending_.end(); ++it) {
      if (it->first == keep) continue;
      if (victim == pending_.end() || it->second.sequence < victim->second.sequence) victim = it;
    }
    if (victim == pending_.end()) victim = pending_.find(keep);
    const std::string id = victim->first;
    errors.push_back(ResourceExhaustedError(
        "release assembler: incomplete release " + id +
        " dropped to stay within max_buffered_bytes=" + std::to_string(options_.max_buffered_bytes) +
        " / max_pending_releases=" + std::to_string(options_.max_pending_releases)));
    Drop(id);
    ++stats_.releases_dropped;
  }
}

std::optional<std::string> ReleaseAssembler::JoinChunks(const std::string& file_name,
                                                        const FileChunks& chunks,
                                                        uint64_t expected_bytes,
                                                        std::string& content) {
  for (size_t i = 0; i < chunks.chunk_count; ++i) {
    if (chunks.chunks.count(i) == 0) {
      return file_name + ": chunk " + std::to_string(i) + " of " +
             std::to_string(chunks.chunk_count) + " missing";
    }
  }
  size_t total = 0;
  for (const auto& [i, piece] : chunks.chunks) total += piece.size();
  if (total != expected_bytes) {
    return file_name + ": " + std::to_string(total) + " bytes, manifest says " +
           std::to_string(expected_bytes);
  }
  content.reserve(total);
  for (const auto& [i, piece] : chunks.chunks) content += piece;
  return std::nullopt;
}

ReleaseAssembler::AddResult ReleaseAssembler::Complete(const std::string& release_id,
                                                       std::string_view manifest_bytes) {
  AddResult result;
  auto fail = [&](const std::string& why) {
    Drop(release_id);
    ++stats_.releases_dropped;
    result.errors.push_back(
        DataLossError("release assembler: release " + release_id + " dropped: " + why));
    return result;
  };
  if (manifest_bytes.size() > kMaxManifestBytes) return fail("manifest larger than 1 MiB");
  const nlohmann::json manifest = nlohmann::json::parse(manifest_bytes, nullptr, false);
  if (manifest.is_discarded() || !manifest.is_object()) {
    return fail("manifest.json is not a JSON object");
  }
  if (const auto why = CheckManifestHeader(manifest, release_id)) return fail(*why);
  const auto arrays = manifest.find("arrays");
  if (arrays == manifest.end() || !arrays->is_array() || arrays->empty()) {
    return fail("manifest 'arrays' is not a non-empty list");
  }
  const auto pending_it = pending_.find(release_id);
  std::map<std::string, FileChunks> no_files;
  std::map<std::string, FileChunks>& files =
      pending_it == pending_.end() ? no_files : pending_it->second.files;

  release::EncodedRelease encoded;
  encoded.release_id = release_id;
  std::set<std::string> listed;
  for (size_t index = 0; index < arrays->size(); ++index) {
    ManifestArray array;
    if (const auto why = ReadManifestArray((*arrays)[index], index, listed, array)) {
      return fail(*why);
    }
    const std::string& file_name = array.file;

    const auto chunks_it = files.find(file_name);
    if (chunks_it == files.end()) return fail(file_name + ": no chunk received");
    std::string content;
    if (const auto why = JoinChunks(file_name, chunks_it->second, array.bytes, content)) {
      return fail(*why);
    }
    if (const auto why = CheckArrayContent(array, content)) return fail(*why);
    encoded.files.push_back({file_name, std::move(content)});
  }
  for (const auto& [file_name, chunks] : files) {
    if (listed.count(file_name) == 0) return fail(file_name + " is not listed in the manifest");
  }
  encoded.files.push_back(
      {std::string(release::kManifestFileName), std::string(manifest_bytes)});
  Drop(release_id);
  ++stats_.releases_completed;
  result.release = std::move(encoded);
  return result;
}

}  // namespace vipsd::connectors
