#include "connectors/file/release_reader.h"

#include <nlohmann/json.hpp>

#include <cctype>
#include <set>
#include <vector>

#include "connectors/file/file_util.h"
#include "core/base/format.h"

namespace vipsd::connectors {
namespace {

using nlohmann::json;

// Nesting depth of the JSON text (brackets outside strings); the parser is
// never given deeper input, so no reader recurses without bound.
int MaxDepth(std::string_view text) {
  int depth = 0;
  int deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      deepest = std::max(deepest, ++depth);
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return deepest;
}

bool IsLowerHex64(const std::string& text) { return IsLowerHex(text, 64); }

bool IsArrayName(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  }
  return true;
}

enum class Kind { kString, kInteger, kNumber, kObject, kBool };

bool HasKind(const json& value, Kind kind) {
  switch (kind) {
    case Kind::kString: return value.is_string();
    case Kind::kInteger: return value.is_number_integer();
    case Kind::kNumber: return value.is_number();
    case Kind::kObject: return value.is_object();
    case Kind::kBool: return value.is_boolean();
  }
  return false;
}

const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::kString: return "a string";
    case Kind::kInteger: return "an integer";
    case Kind::kNumber: return "a number";
    case Kind::kObject: return "an object";
    case Kind::kBool: return "true or false";
  }
  return "?";
}

struct Field {
  const char* name;
  Kind kind;
};

// The documented metadata fields of schema 1 (docs/release_format.md).
constexpr Field kFields[] = {
    {"format", Kind::kString},          {"schema_version", Kind::kInteger},
    {"release_id", Kind::kString},      {"model_type", Kind::kString},
    {"step", Kind::kInteger},           {"rho", Kind::kNumber},
    {"epsilon_spent", Kind::kNumber},   {"delta", Kind::kNumber},
    {"noise_multiplier", Kind::kNumber}, {"sampling_rate", Kind::kNumber},
    {"accountant", Kind::kString},      {"clip_bounds", Kind::kObject},
    {"dimensions", Kind::kObject},      {"vocabulary_fingerprint", Kind::kString},
    {"config_fingerprint", Kind::kString}, {"is_private", Kind::kBool},
    {"noise_description", Kind::kString}, {"created_at_utc", Kind::kString},
};
constexpr Field kOptionalFields[] = {{"schedule", Kind::kString},
                                     {"conversion", Kind::kString},
                                     {"vocabulary_source", Kind::kString},
                                     {"public_prior_fingerprint", Kind::kString},
                                     {"public_prior_source", Kind::kString},
                                     {"public_prior_weight", Kind::kNumber},
                                     {"hyperparameters", Kind::kObject},
                                     {"privacy_unit", Kind::kString},
                                     {"unit_field", Kind::kString},
                                     {"max_records_per_unit", Kind::kInteger}};

// Integers must fit int64 (nlohmann keeps unsigned values above INT64_MAX
// as unsigned).
bool FitsInt64(const json& value) {
  return value.is_number_integer() &&
         (!value.is_number_unsigned() ||
          value.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX));
}

// An error in the manifest `where` (<label>/manifest.json).
Status BadManifest(const std::string& where, const std::string& what) {
  return InvalidArgumentError(where + ": " + what);
}

// The manifest's JSON: at most 1 MiB, nested at most kMaxManifestDepth
// deep, valid, without duplicate keys, an object.
StatusOr<json> ParseManifest(std::string_view manifest_bytes, const std::string& where) {
  auto bad = [&where](const std::string& what) { return BadManifest(where, what); };
  if (manifest_bytes.size() > kMaxManifestBytes) return bad("larger than 1 MiB");
  if (MaxDepth(manifest_bytes) > kMaxManifestDepth) {
    return bad("nested deeper than " + std::to_string(kMaxManifestDepth) + " levels");
  }
  // Duplicate keys are refused (a reader that kept the last one and one that
  // kept the first would see different releases).
  std::vector<std::set<std::string>> keys;
  bool duplicate = false;
  json::parser_callback_t check = [&](int, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) keys.emplace_back();
    if (event == json::parse_event_t::object_end && !keys.empty()) keys.pop_back();
    if (event == json::parse_event_t::key && !keys.empty() &&
        !keys.back().insert(parsed.get<std::string>()).second) {
      duplicate = true;
    }
    return true;
  };
  // nlohmann refuses NaN/Infinity tokens and invalid UTF-8.
  json manifest = json::parse(manifest_bytes, check, /*allow_exceptions=*/false);
  if (manifest.is_discarded()) return bad("not valid JSON (UTF-8, no NaN or Infinity)");
  if (duplicate) return bad("a key appears twice in one object");
  if (!manifest.is_object()) return bad("not a JSON object");
  return manifest;
}

// Format, schema version and the JSON type of every documented field.
Status CheckManifestFields(const json& manifest, const std::string& where) {
  auto bad = [&where](const std::string& what) { return BadManifest(where, what); };
  if (!manifest.contains("format") || manifest["format"] != release::kFormatName) {
    return bad("format is not \"vipsd-release\"");
  }
  if (!manifest.contains("schema_version") || !manifest["schema_version"].is_number_integer() ||
      manifest["schema_version"] != release::kSchemaVersion) {
    return bad("schema_version is not supported (this reader reads " +
               std::to_string(release::kSchemaVersion) + ")");
  }
  for (const Field& field : kFields) {
    if (!manifest.contains(field.name)) return bad(std::string("missing field ") + field.name);
    if (!HasKind(manifest[field.name], field.kind)) {
      return bad(std::string("field ") + field.name + " must be " + KindName(field.kind));
    }
  }
  for (const Field& field : kOptionalFields) {
    if (manifest.contains(field.name) && !HasKind(manifest[field.name], field.kind)) {
      return bad(std::string("field ") + field.name + " must be " + KindName(field.kind));
    }
  }
  if (!FitsInt64(manifest["step"])) return bad("field step is out of range");
  return Status::Ok();
}

// The metadata of a manifest that passed CheckManifestFields.
Status ReadMetadata(const json& manifest, const std::string& where,
                    release::ReleaseMetadata& m) {
  auto bad = [&where](const std::string& what) { return BadManifest(where, what); };
  m.schema_version = manifest["schema_version"].get<int>();
  m.release_id = manifest["release_id"].get<std::string>();
  m.model_type = manifest["model_type"].get<std::string>();
  m.step = manifest["step"].get<int64_t>();
  m.rho = manifest["rho"].get<double>();
  m.epsilon_spent = manifest["epsilon_spent"].get<double>();
  m.delta = manifest["delta"].get<double>();
  m.noise_multiplier = manifest["noise_multiplier"].get<double>();
  m.sampling_rate = manifest["sampling_rate"].get<double>();
  m.accountant = manifest["accountant"].get<std::string>();
  // Releases written before these fields existed: "unrecorded".
  m.schedule = manifest.contains("schedule") ? manifest["schedule"].get<std::string>()
                                             : "unrecorded";
  m.conversion = manifest.contains("conversion") ? manifest["conversion"].get<std::string>()
                                                 : "unrecorded";
  for (const auto& [name, value] : manifest["clip_bounds"].items()) {
    if (!value.is_number()) return bad("clip_bounds." + name + " must be a number");
    m.clip_bounds.emplace_back(name, value.get<double>());
  }
  for (const auto& [name, value] : manifest["dimensions"].items()) {
    if (!FitsInt64(value)) return bad("dimensions." + name + " must be an integer");
    m.dimensions.emplace_back(name, value.get<int64_t>());
  }
  m.vocabulary_fingerprint = manifest["vocabulary_fingerprint"].get<std::string>();
  if (manifest.contains("vocabulary_source")) {
    m.vocabulary_source = manifest["vocabulary_source"].get<std::string>();
  }
  if (manifest.contains("public_prior_fingerprint")) {
    m.public_prior_fingerprint = manifest["public_prior_fingerprint"].get<std::string>();
  }
  if (manifest.contains("public_prior_source")) {
    m.public_prior_source = manifest["public_prior_source"].get<std::string>();
  }
  if (manifest.contains("public_prior_weight")) {
    m.public_prior_weight = manifest["public_prior_weight"].get<double>();
  }
  if (manifest.contains("hyperparameters")) {
    for (const auto& [name, value] : manifest["hyperparameters"].items()) {
      if (!value.is_number()) return bad("hyperparameters." + name + " must be a number");
      m.hyperparameters.emplace_back(name, value.get<double>());
    }
  }
  if (manifest.contains("privacy_unit")) {
    m.privacy_unit = manifest["privacy_unit"].get<std::string>();
    // Absent: "record", which a manifest never spells out.
    if (m.privacy_unit == "record") return bad("privacy_unit record is written by leaving it out");
  }
  if (manifest.contains("unit_field")) m.unit_field = manifest["unit_field"].get<std::string>();
  if (manifest.contains("max_records_per_unit")) {
    m.max_records_per_unit = manifest["max_records_per_unit"].get<int64_t>();
  }
  m.config_fingerprint = manifest["config_fingerprint"].get<std::string>();
  m.is_private = manifest["is_private"].get<bool>();
  m.noise_description = manifest["noise_description"].get<std::string>();
  m.created_at_utc = manifest["created_at_utc"].get<std::string>();
  return Status::Ok();
}

// The array of entry `at` of the manifest's `arrays`, read with `read_file`
// and checked against the entry; `names` collects the names seen so far.
StatusOr<release::ReleaseArray> ReadArray(
    const json& entry, const std::string& at, std::set<std::string>& names,
    const std::function<StatusOr<std::string>(const std::string&)>& read_file,
    const std::string& label, const std::string& where) {
  auto bad = [&where](const std::string& what) { return BadManifest(where, what); };
  if (!entry.is_object()) return bad(at + " is not an object");
  for (const auto& [key, kind] : {std::pair<const char*, Kind>{"name", Kind::kString},
                                  {"dtype", Kind::kString},
                                  {"file", Kind::kString},
                                  {"bytes", Kind::kInteger},
                                  {"blake2b", Kind::kString}}) {
    if (!entry.contains(key) || !HasKind(entry[key], kind)) {
      return bad(at + ": missing or mistyped " + key);
    }
  }
  if (!entry.contains("shape") || !entry["shape"].is_array()) {
    return bad(at + ": missing or mistyped shape");
  }
  const std::string name = entry["name"].get<std::string>();
  if (!IsArrayName(name) || !names.insert(name).second) {
    return bad(at + ": bad or repeated name");
  }
  // The file name is derived, never trusted: no path leaves the release.
  if (entry["file"] != release::ArrayFileName(name)) {
    return bad(at + ": file is not " + release::ArrayFileName(name));
  }
  if (entry["dtype"] != "<f8") return bad(at + ": dtype is not '<f8'");
  std::vector<int64_t> shape;
  for (const json& dim : entry["shape"]) {
    if (!FitsInt64(dim) || dim.get<int64_t>() < 0) {
      return bad(at + ": shape is not a list of integers >= 0");
    }
    shape.push_back(dim.get<int64_t>());
  }
  if (!FitsInt64(entry["bytes"])) return bad(at + ": bytes is out of range");
  const std::string hash = entry["blake2b"].get<std::string>();
  if (!IsLowerHex64(hash)) return bad(at + ": blake2b is not 64 lowercase hex characters");
  const std::string file = label + "/" + release::ArrayFileName(name);
  VIPSD_ASSIGN_OR_RETURN(std::string bytes, read_file(release::ArrayFileName(name)));
  if (static_cast<int64_t>(bytes.size()) != entry["bytes"].get<int64_t>()) {
    return InvalidArgumentError(file + ": " + std::to_string(bytes.size()) +
                                " bytes, the manifest says " +
                                std::to_string(entry["bytes"].get<int64_t>()));
  }
  if (release::Blake2bHex(bytes) != hash) {
    return InvalidArgumentError(file + ": BLAKE2b-256 does not match the manifest");
  }
  auto array = release::DecodeNpy(bytes, name);
  if (!array.ok()) return InvalidArgumentError(label + "/" + std::string(array.status().message()));
  if (array->shape != shape) {
    return InvalidArgumentError(file + ": the shape differs from the manifest's");
  }
  return std::move(*array);
}

}  // namespace

StatusOr<release::Release> DecodeReleaseFiles(
    std::string_view manifest_bytes,
    const std::function<StatusOr<std::string>(const std::string&)>& read_file,
    const std::string& label) {
  const std::string where = label + "/" + std::string(release::kManifestFileName);
  auto bad = [&where](const std::string& what) { return BadManifest(where, what); };
  VIPSD_ASSIGN_OR_RETURN(const json manifest, ParseManifest(manifest_bytes, where));
  VIPSD_RETURN_IF_ERROR(CheckManifestFields(manifest, where));

  release::Release result;
  VIPSD_RETURN_IF_ERROR(ReadMetadata(manifest, where, result.metadata));

  if (!manifest.contains("arrays") || !manifest["arrays"].is_array() ||
      manifest["arrays"].empty()) {
    return bad("arrays must be a non-empty list");
  }
  std::set<std::string> names;
  size_t index = 0;
  for (const json& entry : manifest["arrays"]) {
    const std::string at = "arrays[" + std::to_string(index++) + "]";
    VIPSD_ASSIGN_OR_RETURN(release::ReleaseArray array,
                           ReadArray(entry, at, names, read_file, label, where));
    result.arrays.push_back(std::move(array));
  }
  // The writer's rules (ranges, names, privacy claims) on what was read.
  const Status valid = release::Validate(result);
  if (!valid.ok()) return bad(std::string(valid.message()));
  return result;
}

StatusOr<release::Release> ReadReleaseDirectory(const std::string& directory) {
  const std::string manifest_path =
      directory + "/" + std::string(release::kManifestFileName);
  VIPSD_ASSIGN_OR_RETURN(std::string manifest, ReadWholeFile(manifest_path));
  return DecodeReleaseFiles(
      manifest,
      [&directory](const std::string& name) { return ReadWholeFile(directory + "/" + name); },
      directory);
}

}  // namespace vipsd::connectors
