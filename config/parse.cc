// The parser: ParseConfig and LoadConfigFile (config/config.h).
//
// It walks the key table (config/keys.h) section by section in row order:
// a key that does not apply to the chosen model, source, sink or embedded
// cluster is refused if present; a key that applies is read by its Field,
// then its value rules and checks run (config/checks.h); a section's
// leftover keys are unknown. The source type decides which keys apply
// everywhere, so it is read first, quietly. Rules across sections and
// warnings come last; every error of the file is returned at once, sorted
// by line.
//
// Thread-safety: pure (reads the key table, the environment and secret
// files); a VipsdConfig is a value. Failure: INVALID_ARGUMENT (NOT_FOUND
// for a missing file) whose message holds one "file:line: key: what" per
// line; yaml-cpp exceptions are caught here and never leave config/.
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <filesystem>
#include <sstream>

#include "config/checks.h"
#include "config/config.h"
#include "config/keys.h"
#include "config/section.h"
#include "connectors/file/file_util.h"

namespace vipsd::config {

int VipsdConfig::line_of(const std::string& key) const {
  const auto it = lines.find(key);
  return it == lines.end() ? 0 : it->second;
}

namespace internal {
namespace {

// Reads the keys of the table whose section is `parent` from `section`.
void ReadSection(Section& section, std::string_view parent, VipsdConfig& config) {
  for (const Key& key : Keys()) {
    if (key.parent() != parent) continue;
    const std::string leaf(key.leaf());
    if (!key.removed.empty()) {
      section.NotHere(leaf, key.removed);
      continue;
    }
    if (key.when.has_value() && !key.when->Holds(ChoicesOf(config))) {
      section.NotHere(leaf, key.when->Refusal());
      continue;
    }
    if (key.derive != nullptr) key.derive(config);
    if (key.is_section) {
      // An absent section is walked too (its accessors do nothing), so
      // that its keys' derived defaults apply.
      Section child = section.Child(leaf, key.required(config));
      ReadSection(child, key.path, config);
      if (key.check != nullptr) key.check(child, config);
      child.Finish();
      continue;
    }
    key.field->Read(section, leaf, key.required(config), config);
    for (const ValueRule& rule : key.value_rules) {
      if (key.field->Show(config) == rule.value && !rule.needs.Holds(ChoicesOf(config))) {
        section.ErrorAt(leaf, rule.needs.Refusal());
      }
    }
    if (key.check != nullptr) key.check(section, config);
  }
}

// The source type decides which keys apply elsewhere: read it before the
// full pass, quietly (the full pass reports its errors).
SourceType PeekSourceType(const YAML::Node& root, const std::string& file) {
  VipsdConfig peek;
  peek.file = file;
  Diagnostics ignored;
  Section top(file, root, "", &peek.lines, &ignored);
  top.Check();
  Section source = top.Child("source", true);
  const Key* type = FindKey("source.type");
  type->field->Read(source, std::string(type->leaf()), true, peek);
  return peek.source_type;
}

// Problems of the text itself, found before YAML parsing (yaml-cpp reports
// them poorly or not at all).
std::vector<Diagnostics::Entry> TextProblems(std::string_view text, const std::string& file) {
  std::vector<Diagnostics::Entry> problems;
  if (std::all_of(text.begin(), text.end(),
                  [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; })) {
    problems.push_back({0, file + ": the file is empty (a configuration needs at least the "
                                  "model, privacy, schedule, source, sink, dead_letter and "
                                  "state sections; see config/vipsd.reference.yaml)"});
    return problems;
  }
  const size_t cr = text.find('\r');
  if (cr != std::string_view::npos && (cr + 1 == text.size() || text[cr + 1] != '\n') &&
      text.find('\n') == std::string_view::npos) {
    problems.push_back({1, file + ": lines end with CR only (classic Mac line ends); convert "
                                  "the file to LF line ends"});
    return problems;
  }
  int line = 1;
  bool at_line_start = true;
  for (char c : text) {
    if (c == '\n') {
      ++line;
      at_line_start = true;
      continue;
    }
    if (at_line_start && c == '\t') {
      problems.push_back({line, file + ":" + std::to_string(line) +
                                    ": a tab in the indentation; YAML indents with spaces only"});
      at_line_start = false;
      continue;
    }
    if (c != ' ') at_line_start = false;
  }
  return problems;
}

void SortByLine(std::vector<Diagnostics::Entry>& entries) {
  std::stable_sort(entries.begin(), entries.end(),
                   [](const auto& a, const auto& b) { return a.line < b.line; });
}

std::string Joined(std::vector<Diagnostics::Entry> entries) {
  SortByLine(entries);
  std::string out;
  for (const auto& entry : entries) out += (out.empty() ? "" : "\n") + entry.message;
  return out;
}

}  // namespace
}  // namespace internal

StatusOr<VipsdConfig> ParseConfig(std::string_view yaml_text, const std::string& file) {
  using namespace internal;
  const auto problems = TextProblems(yaml_text, file);
  if (!problems.empty()) return InvalidArgumentError(Joined(problems));
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml_text));
  } catch (const YAML::Exception& e) {
    std::ostringstream message;
    message << file << ":" << e.mark.line + 1 << ": YAML syntax error: " << e.msg;
    return InvalidArgumentError(message.str());
  }
  VipsdConfig config;
  config.file = file;
  Diagnostics diag;
  Section top(file, root, "", &config.lines, &diag);
  top.Check();
  if (!top.valid()) return InvalidArgumentError(Joined(diag.errors));
  config.source_type = PeekSourceType(root, file);
  ReadSection(top, "", config);
  top.Finish();
  CheckWholeFile(config, &diag);
  if (!diag.errors.empty()) return InvalidArgumentError(Joined(diag.errors));
  SortByLine(diag.warnings);
  for (const auto& warning : diag.warnings) config.warnings.push_back(warning.message);
  return config;
}

StatusOr<VipsdConfig> LoadConfigFile(const std::string& path) {
  std::error_code error;
  const auto status = std::filesystem::status(path, error);
  if (error || !std::filesystem::exists(status)) {
    return NotFoundError(path + ": cannot open the configuration file (it does not exist)");
  }
  if (std::filesystem::is_directory(status)) {
    return InvalidArgumentError(path + ": is a directory, not a configuration file");
  }
  if (!std::filesystem::is_regular_file(status)) {
    return InvalidArgumentError(path +
                                ": is not a regular file (a FIFO, socket or device); "
                                "give the path of a YAML file");
  }
  if (std::filesystem::file_size(path, error) > connectors::kMaxConfigFileBytes) {
    return InvalidArgumentError(path + ": is larger than 4 MiB; not a vipsd configuration");
  }
  // Opened without blocking and checked again: the path may have changed.
  VIPSD_ASSIGN_OR_RETURN(std::string text,
                         connectors::ReadRegularFile(path, connectors::kMaxConfigFileBytes));
  return ParseConfig(text, path);
}

}  // namespace vipsd::config
