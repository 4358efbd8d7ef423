// The reference configuration: ReferenceConfig (config/config.h).
//
// Printed from the key table (config/keys.h), one line per key in table
// order: its default (the VipsdConfig member's initializer; ~ where there
// is none or it is derived), kind, allowed values, whether it is required,
// whether a reload applies it live, and "only with" the choices under
// which it applies. Those choices are found by enumerating every valid
// combination of the dimensions (model.type, source.type, sink.type,
// kafka.embedded) and asking the table in which ones the key applies, so
// that implied conditions are named too (sink.topic needs a kafka sink,
// which needs a kafka source).
//
// config/vipsd.reference.yaml is this output, kept equal by config_test.
// Thread-safety: pure. Failure: none.
#include <algorithm>
#include <cctype>
#include <numeric>
#include <set>

#include "config/config.h"
#include "config/keys.h"
#include "core/base/format.h"

namespace vipsd::config {
namespace {

using internal::Choices;
using internal::Key;

// Every combination of the dimensions' values that a valid file can have:
// each dimension key that does not apply there keeps its default, and
// every value rule (a kafka sink needs a kafka source) holds.
std::vector<Choices> ValidChoices() {
  const VipsdConfig defaults;
  const Choices fallback = internal::ChoicesOf(defaults);
  std::vector<Choices> all(1);
  for (size_t d = 0; d < internal::kDimensions.size(); ++d) {
    const Key* key = internal::FindKey(internal::DimensionKey(internal::kDimensions[d]));
    std::vector<Choices> next;
    for (const Choices& partial : all) {
      for (const std::string& value : key->field->choices()) {
        next.push_back(partial);
        next.back()[d] = value;
      }
    }
    all = std::move(next);
  }
  std::vector<Choices> valid;
  for (const Choices& choices : all) {
    bool ok = true;
    for (size_t d = 0; d < internal::kDimensions.size(); ++d) {
      const Key* key = internal::FindKey(internal::DimensionKey(internal::kDimensions[d]));
      if (!internal::AppliesWith(*key, choices) && choices[d] != fallback[d]) ok = false;
      for (const internal::ValueRule& rule : key->value_rules) {
        if (choices[d] == rule.value && !rule.needs.Holds(choices)) ok = false;
      }
    }
    if (ok) valid.push_back(choices);
  }
  return valid;
}

// "model.type: sbn, kafka.embedded: true": the dimensions the valid
// combinations in which a key applies (`seen`) agree on, named in order
// where the combinations matching those named so far do not.
std::string OnlyWith(const std::vector<Choices>& combinations, const std::vector<size_t>& seen) {
  std::vector<size_t> matching(combinations.size());
  std::iota(matching.begin(), matching.end(), 0);
  std::string out;
  for (size_t d = 0; d < internal::kDimensions.size(); ++d) {
    std::set<std::string> all, here;
    for (size_t i : matching) all.insert(combinations[i][d]);
    for (size_t i : seen) here.insert(combinations[i][d]);
    if (here.empty() || here.size() == all.size()) continue;
    std::string values;  // "lda" or, for a key of several values, "blr or lda"
    for (const std::string& value : here) values += (values.empty() ? "" : " or ") + value;
    out += (out.empty() ? "" : ", ") +
           std::string(internal::DimensionKey(internal::kDimensions[d])) + ": " + values;
    std::erase_if(matching, [&](size_t i) { return here.count(combinations[i][d]) == 0; });
  }
  return out;
}

// The value column: a default as YAML ("~": none or derived).
std::string YamlScalar(std::string_view kind, const std::string& text, bool required) {
  if (text == "~") return text;
  if (text.empty()) return kind == "string" && !required ? "\"\"" : "~";
  if (kind == "string") {
    const bool plain = std::all_of(text.begin(), text.end(), [](char ch) {
      return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '-' || ch == '.' ||
             ch == '/';
    });
    return plain ? text : JsonString(text);
  }
  return text;
}

// One line: "  key: value   # comment".
std::string Line(const Key& key, const std::string& only_with) {
  const size_t depth = static_cast<size_t>(std::count(key.path.begin(), key.path.end(), '.'));
  // Required when private counts as required: the reference describes a
  // private run.
  const bool required = key.need != internal::Need::kOptional;
  std::string line = std::string(2 * depth, ' ') + std::string(key.leaf()) + ":";
  std::string comment;
  if (key.is_section) {
    comment = std::string("section, ") + (required ? "required" : "optional");
  } else {
    const VipsdConfig defaults;
    const std::string text =
        key.derived_default ? "~" : (required ? "" : key.field->DefaultText(defaults));
    line += " " + YamlScalar(key.field->kind(), text, required);
    comment = std::string(key.field->kind()) + "; " + key.field->allowed() + "; " +
              (required ? "required" : "optional") + "; " +
              (internal::IsLive(internal::ReloadOf(key)) ? "reload: live" : "reload: restart");
  }
  if (!only_with.empty()) comment += "; only with " + only_with;
  line += std::string(line.size() < 40 ? 40 - line.size() : 1, ' ') + "# " + comment;
  return line + "\n";
}

}  // namespace

std::string ReferenceConfig() {
  const std::vector<Choices> combinations = ValidChoices();
  std::string out =
      "# vipsd reference configuration: every key the parser reads, generated from the\n"
      "# parser itself (`vipsd --print-reference-config`; a test keeps this file equal to\n"
      "# its output). It is a catalogue, not a configuration to run: keys of every model,\n"
      "# source and sink appear together. Values are the defaults (~: none).\n"
      "# Each comment: kind; allowed values; required or optional; whether a reload\n"
      "# (SIGHUP) applies it live or it needs a restart; and when the key applies.\n"
      "# privacy.delta and privacy.epsilon_ceiling are required for private runs\n"
      "# (noise_multiplier > 0). Relative paths are resolved against the file's directory.\n"
      "# Commented examples: config/examples/*.yaml.\n";
  // Depth first, each section's keys in table order.
  auto emit = [&](auto& self, std::string_view parent) -> void {
    for (const Key& key : internal::Keys()) {
      if (key.parent() != parent || !key.removed.empty()) continue;
      std::vector<size_t> seen;
      for (size_t i = 0; i < combinations.size(); ++i) {
        if (internal::AppliesWith(key, combinations[i])) seen.push_back(i);
      }
      out += Line(key, OnlyWith(combinations, seen));
      if (key.is_section) self(self, key.path);
    }
  };
  emit(emit, "");
  return out;
}

}  // namespace vipsd::config
