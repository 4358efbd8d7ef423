// Section: one YAML mapping of a configuration file, read key by key.
//
// What it is: the parser's accessor of yaml-cpp nodes (yaml-cpp lives only
// in config/). The key table (config/keys.h) says which keys a section has;
// the parser (config/parse.cc) asks a Section for each of them with the
// accessor of its kind. Keys are consumed as they are read; whatever is
// left when Finish() runs is an unknown key (yaml-cpp 0.7 accepts unknown
// and duplicate keys silently; Check() and Finish() refuse both).
//
// Ownership: a Section holds a handle of its yaml-cpp node and borrows the
// line map and the Diagnostics of the file being parsed, which must outlive
// it. Every key read is recorded with its line in the line map
// (VipsdConfig::lines).
//
// Thread-safety: none; one parse owns its Sections.
//
// Failure: no accessor fails. Each error is recorded in the Diagnostics as
// "file:line: dotted.key: what" and parsing goes on, so that one run
// reports every problem of the file; a value that failed keeps what it
// held. A section that is not a mapping, or a required section that is
// missing, is invalid: its accessors do nothing.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/base/status.h"

namespace vipsd::config::internal {

// Every error and warning found in one file. Errors are reported all at
// once (sorted by line), not just the first.
struct Diagnostics {
  struct Entry {
    int line = 0;
    std::string message;  // "file:line: key: what"
  };
  std::vector<Entry> errors;
  std::vector<Entry> warnings;
};

class Section {
 public:
  Section(const std::string& file, YAML::Node node, std::string path,
          std::map<std::string, int>* lines, Diagnostics* diag);

  // A placeholder for a section that is missing: its accessors do nothing.
  static Section Absent(const std::string& file, std::string path,
                        std::map<std::string, int>* lines, Diagnostics* diag);

  // Checks that the node is a mapping of plain, unique keys and notes them
  // as unread. Call once, before any accessor.
  void Check();

  bool valid() const { return valid_; }
  // Whether `key` is present with a value other than null.
  bool Has(const std::string& key) const;
  // "path.key" (or "key" at the top level).
  std::string Join(const std::string& key) const;

  // The mapping under `key`, checked; Absent if it is missing (an error if
  // `required`) or if this section is invalid.
  Section Child(const std::string& key, bool required);

  // Scalars. `allowed` is the text of the error ("must be <allowed>, got
  // '<value>'").
  void Number(const std::string& key, bool required, const std::function<bool(double)>& ok,
              const std::string& allowed, double* out);
  void Integer(const std::string& key, bool required, int64_t low, int64_t high, int64_t* out);
  // A whole number in [low, high], or `keyword` (stored as keyword_value).
  void IntegerOrKeyword(const std::string& key, const std::string& keyword, int64_t keyword_value,
                        int64_t low, int64_t high, int64_t* out);
  // A non-empty string; one of `choices` unless it is empty.
  void String(const std::string& key, bool required, const std::vector<std::string>& choices,
              std::string* out);
  // A string that may be empty ("" or null disables a feature).
  void OptionalString(const std::string& key, std::string* out);
  void Bool(const std::string& key, bool* out);

  // Collections.
  // A non-empty sequence of distinct strings matching `ok`.
  void StringList(const std::string& key, bool required,
                  const std::function<bool(const std::string&)>& ok, const std::string& allowed,
                  std::vector<std::string>* out);
  // A sequence of numbers (possibly empty) each satisfying `ok`.
  void NumberList(const std::string& key, const std::function<bool(double)>& ok,
                  const std::string& allowed, std::vector<double>* out);
  // librdkafka properties: each value a plain string or a secret reference
  // {file: PATH} | {env: NAME} | {credential: NAME} (config/secrets.h).
  void PropertyMap(const std::string& key, std::map<std::string, std::string>* out);
  // federation.holders: holder id ([A-Za-z0-9._-], 1..64) -> X25519 public
  // key (64 hex digits, stored lower case); plain values only.
  void PublicKeyMap(const std::string& key, std::map<std::string, std::string>* out);
  // A secret that must not be written in the file: {file: PATH} or
  // {credential: NAME} only; a plain value is refused without being shown.
  void SecretReference(const std::string& key, std::string* out);

  // Unknown keys: everything not read, each with the closest known key.
  void Finish();

  // A key that is valid in general but not with the chosen options (or no
  // longer valid at all): an error if it is present.
  void NotHere(const std::string& key, const std::string& why);
  // An error about `key` found by a check across keys (at the key's line,
  // or the section's if it is absent).
  void ErrorAt(const std::string& key, const std::string& what);
  // A value that is allowed but unwise: "file:line: key: warning: what".
  void WarnAt(const std::string& key, const std::string& what);

 private:
  void Record(int line, std::string message);
  Status Error(const YAML::Node& node, const std::string& key, const std::string& what);
  Status Missing(const std::string& key);
  void Consume(const std::string& key);

  Status NumberImpl(const std::string& key, bool required, const std::function<bool(double)>& ok,
                    const std::string& allowed, double* out);
  Status BoundedInteger(const std::string& key, bool required, int64_t low, int64_t high,
                        const std::string& allowed, int64_t* out);
  Status StringListImpl(const std::string& key, bool required,
                        const std::function<bool(const std::string&)>& ok,
                        const std::string& allowed, std::vector<std::string>* out);
  Status NumberListImpl(const std::string& key, const std::function<bool(double)>& ok,
                        const std::string& allowed, std::vector<double>* out);
  Status ParseNumber(const YAML::Node& value, const std::string& key,
                     const std::function<bool(double)>& ok, const std::string& allowed,
                     double* out);
  Status ParseString(const YAML::Node& value, const std::string& key,
                     const std::vector<std::string>& choices, std::string* out);

  std::string file_;
  YAML::Node node_;
  std::string path_;
  std::map<std::string, int>* lines_;
  Diagnostics* diag_;
  bool valid_ = true;
  std::map<std::string, int> unread_;  // key → line
  std::set<std::string> known_;        // keys the parser asked for
};

// "a whole number in [low, high]": the allowed text of an integer key.
std::string RangeText(int64_t low, int64_t high);

}  // namespace vipsd::config::internal
