#include "config/config.h"

#include <cassert>

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>
#include <vector>

#include "connectors/file/file_util.h"
#include "core/base/format.h"

namespace vipsd::config {
namespace {

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

// Levenshtein distance, for "did you mean" suggestions.
size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// The closest of `candidates` to `word`, if it is close enough to be a typo.
std::optional<std::string> Closest(const std::string& word,
                                   const std::set<std::string>& candidates) {
  std::optional<std::string> best;
  size_t best_distance = std::max<size_t>(1, word.size() / 4) + 1;
  for (const std::string& candidate : candidates) {
    const size_t distance = EditDistance(word, candidate);
    if (distance < best_distance) {
      best_distance = distance;
      best = candidate;
    }
  }
  return best;
}

// The value of a secret reference in a librdkafka property, read when the
// file is loaded so that the YAML itself holds no credential:
//   {file: PATH}        a file (relative to the configuration file; at most
//                       64 KiB; one trailing line end is dropped);
//   {env: NAME}         an environment variable;
//   {credential: NAME}  systemd's LoadCredential=NAME:… —
//                       $CREDENTIALS_DIRECTORY/NAME.
// Errors name the reference, never any content.
StatusOr<std::string> SecretValue(const std::string& kind, const std::string& reference,
                                  const std::string& config_file) {
  std::string path;
  if (kind == "env") {
    const char* value = std::getenv(reference.c_str());
    if (reference.empty() || value == nullptr || *value == '\0') {
      return InvalidArgumentError("the environment variable " + reference +
                                  " is not set or empty");
    }
    return std::string(value);
  }
  if (kind == "credential") {
    const char* directory = std::getenv("CREDENTIALS_DIRECTORY");
    if (directory == nullptr || *directory == '\0') {
      return InvalidArgumentError("credential " + reference +
                                  ": CREDENTIALS_DIRECTORY is not set (systemd sets it for a "
                                  "unit with LoadCredential=" + reference + ":PATH)");
    }
    if (reference.empty() || reference.find('/') != std::string::npos || reference == "." ||
        reference == "..") {
      return InvalidArgumentError("a credential name is a plain file name, got '" + reference +
                                  "'");
    }
    path = std::string(directory) + "/" + reference;
  } else if (kind == "file") {
    if (reference.empty()) return InvalidArgumentError("the secret file path is empty");
    const std::filesystem::path p(reference);
    path = p.is_absolute()
               ? reference
               : (std::filesystem::path(config_file).parent_path() / p).lexically_normal().string();
  } else {
    return InvalidArgumentError("unknown secret reference '" + kind +
                                "' (allowed: file, env, credential)");
  }
  auto read = connectors::ReadRegularFile(path, connectors::kMaxSecretFileBytes);
  if (!read.ok()) {
    return InvalidArgumentError("the secret file " + std::string(read.status().message()));
  }
  std::string value = std::move(*read);
  if (!value.empty() && value.back() == '\n') value.pop_back();
  if (!value.empty() && value.back() == '\r') value.pop_back();
  if (value.empty()) return InvalidArgumentError("the secret file " + path + " is empty");
  return value;
}

// The schema as the parser sees it: every key an accessor is asked for,
// with its kind, default, allowed values and whether it is required. Filled
// only while ReferenceConfig() parses its covering files.
struct SchemaKey {
  std::string path;
  std::string kind;  // "section", "number", "integer", "string", "bool", "list", "map"
  bool required = false;
  std::string default_text;  // YAML text of the default ("" for none)
  std::string allowed;
};
thread_local std::vector<SchemaKey>* schema_log = nullptr;

// A mapping node with its path, whose keys are consumed as they are read;
// whatever is left at the end is an unknown key. Every key read is recorded
// with its line in `lines`. Errors are recorded in the Diagnostics and
// parsing goes on, so that one run reports every problem of the file; the
// public methods therefore always return OK (a value that failed keeps its
// default). A section that is not a mapping, or a required section that is
// missing, is "invalid": its accessors do nothing.
class Section {
 public:
  Section(const std::string& file, YAML::Node node, std::string path,
          std::map<std::string, int>* lines, Diagnostics* diag)
      : file_(file), node_(std::move(node)), path_(std::move(path)), lines_(lines), diag_(diag) {}

  // A placeholder for a required section that is missing.
  static Section Absent(const std::string& file, std::string path,
                        std::map<std::string, int>* lines, Diagnostics* diag) {
    Section section(file, YAML::Node(), std::move(path), lines, diag);
    section.valid_ = false;
    return section;
  }

  Status Check() {
    if (!node_.IsMap()) {
      valid_ = false;
      return Swallow(Error(node_, path_.empty() ? "the file" : path_, "must be a mapping"));
    }
    std::set<std::string> seen;
    for (const auto& entry : node_) {
      if (!entry.first.IsScalar()) {
        (void)Error(entry.first, path_.empty() ? "the file" : path_, "keys must be plain names");
        continue;
      }
      const std::string key = entry.first.Scalar();
      if (!seen.insert(key).second) {
        (void)Error(entry.first, Join(key), "duplicate key");
        continue;
      }
      unread_[key] = entry.first.Mark().line + 1;
    }
    return Status::Ok();
  }

  bool valid() const { return valid_; }
  bool Has(const std::string& key) const {
    return valid_ && node_[key].IsDefined() && !node_[key].IsNull();
  }

  // The next key's default depends on other keys or on the state directory
  // (its allowed text says how): the reference shows no value for it.
  void NextDefaultIsDerived() { derived_default_ = true; }

  // Records a key of the schema (ReferenceConfig only).
  void Note(const std::string& key, const std::string& kind, bool required,
            std::string default_text, std::string allowed) {
    if (derived_default_) {
      default_text = "~";
      derived_default_ = false;
    }
    if (schema_log == nullptr) return;
    const std::string path = Join(key);
    for (const SchemaKey& known : *schema_log) {
      if (known.path == path) return;
    }
    schema_log->push_back({path, kind, required, std::move(default_text), std::move(allowed)});
  }

  Status Sub(const std::string& key, bool required, std::optional<Section>* out) {
    Note(key, "section", required, "", "");
    if (!valid_) {
      if (required) out->emplace(Absent(file_, Join(key), lines_, diag_));
      return Status::Ok();
    }
    Consume(key);
    if (!Has(key)) {
      if (required) {
        (void)Missing(key);
        out->emplace(Absent(file_, Join(key), lines_, diag_));
      }
      return Status::Ok();
    }
    out->emplace(file_, node_[key], Join(key), lines_, diag_);
    return (*out)->Check();
  }

  Status Number(const std::string& key, bool required, const std::function<bool(double)>& ok,
                const std::string& allowed, double* out) {
    Note(key, "number", required, required ? "" : ShortestNumber(*out), allowed);
    return Swallow(NumberImpl(key, required, ok, allowed, out));
  }

  Status Integer(const std::string& key, bool required, int64_t low, int64_t high,
                 int64_t* out) {
    Note(key, "integer", required, required ? "" : std::to_string(*out), RangeText(low, high));
    return Swallow(BoundedInteger(key, required, low, high, RangeText(low, high), out));
  }

  Status String(const std::string& key, bool required, const std::vector<std::string>& choices,
                std::string* out) {
    std::string allowed;
    for (const auto& choice : choices) allowed += (allowed.empty() ? "" : " | ") + choice;
    Note(key, "string", required, required ? "" : *out,
         allowed.empty() ? "a non-empty string" : allowed);
    if (!valid_) return Status::Ok();
    Consume(key);
    if (!Has(key)) return required ? Swallow(Missing(key)) : Status::Ok();
    return Swallow(ParseString(node_[key], Join(key), choices, out));
  }

  // A whole number in [low, high], or `keyword` (stored as keyword_value).
  Status IntegerOrKeyword(const std::string& key, const std::string& keyword,
                          int64_t keyword_value, int64_t low, int64_t high, int64_t* out) {
    Note(key, "integer", false, *out == keyword_value ? keyword : std::to_string(*out),
         keyword + " or " + RangeText(low, high));
    if (Has(key) && node_[key].IsScalar() && node_[key].Scalar() == keyword) {
      Consume(key);
      *out = keyword_value;
      return Status::Ok();
    }
    return Swallow(
        BoundedInteger(key, false, low, high, keyword + " or " + RangeText(low, high), out));
  }

  // A string that may be empty ("" disables a feature).
  Status OptionalString(const std::string& key, std::string* out) {
    Note(key, "string", false, *out, "a string (\"\" or absent: off)");
    if (!valid_) return Status::Ok();
    Consume(key);
    if (!node_[key].IsDefined()) return Status::Ok();
    const YAML::Node value = node_[key];
    if (value.IsNull()) {
      out->clear();
      return Status::Ok();
    }
    if (!value.IsScalar()) return Swallow(Error(value, Join(key), "must be a string"));
    *out = value.Scalar();
    return Status::Ok();
  }

  Status Bool(const std::string& key, bool* out) {
    Note(key, "bool", false, *out ? "true" : "false", "true | false");
    if (!valid_) return Status::Ok();
    Consume(key);
    if (!Has(key)) return Status::Ok();
    const YAML::Node value = node_[key];
    if (value.IsScalar() && (value.Scalar() == "true" || value.Scalar() == "false")) {
      *out = value.Scalar() == "true";
      return Status::Ok();
    }
    return Swallow(Error(value, Join(key),
                         "must be true or false, got '" +
                             (value.IsScalar() ? value.Scalar() : "?") + "'"));
  }

  // A non-empty sequence of strings matching `ok`.
  Status StringList(const std::string& key, bool required,
                    const std::function<bool(const std::string&)>& ok, const std::string& allowed,
                    std::vector<std::string>* out) {
    Note(key, "list", required, "", "a non-empty list of " + allowed);
    return Swallow(StringListImpl(key, required, ok, allowed, out));
  }

  // A sequence of numbers (possibly empty) each satisfying `ok`.
  Status NumberList(const std::string& key, const std::function<bool(double)>& ok,
                    const std::string& allowed, std::vector<double>* out) {
    std::string text = "[";
    for (double value : *out) text += (text.size() > 1 ? ", " : "") + ShortestNumber(value);
    Note(key, "list", false, text + "]", "a list of " + allowed);
    return Swallow(NumberListImpl(key, ok, allowed, out));
  }

  // librdkafka properties: each value a plain string or a secret reference
  // {file: PATH} | {env: NAME} | {credential: NAME} (SecretValue above).
  Status PropertyMap(const std::string& key, std::map<std::string, std::string>* out) {
    Note(key, "map", false, "{}",
         "librdkafka properties, name: value or {file: PATH} | {env: NAME} | "
         "{credential: NAME}");
    if (!valid_) return Status::Ok();
    Consume(key);
    if (!Has(key)) return Status::Ok();
    Section map(file_, node_[key], Join(key), lines_, diag_);
    (void)map.Check();
    if (!map.valid()) return Status::Ok();
    for (const auto& entry : node_[key]) {
      if (!entry.first.IsScalar()) continue;  // reported by Check
      const std::string name = Join(key) + "." + entry.first.Scalar();
      (*lines_)[name] = entry.first.Mark().line + 1;
      if (entry.second.IsScalar()) {
        (*out)[entry.first.Scalar()] = entry.second.Scalar();
        continue;
      }
      if (!entry.second.IsMap() || entry.second.size() != 1 ||
          !entry.second.begin()->first.IsScalar() || !entry.second.begin()->second.IsScalar()) {
        (void)Error(entry.second, name,
                    "must be a plain value or one of {file: PATH}, {env: NAME}, "
                    "{credential: NAME}");
        continue;
      }
      const std::string kind = entry.second.begin()->first.Scalar();
      const std::string reference = entry.second.begin()->second.Scalar();
      auto value = SecretValue(kind, reference, file_);
      if (!value.ok()) {
        (void)Error(entry.second, name, std::string(value.status().message()));
        continue;
      }
      (*out)[entry.first.Scalar()] = std::move(*value);
    }
    return Status::Ok();
  }

  // Unknown keys: everything not read, each with the closest known key.
  Status Finish() {
    for (const auto& [key, line] : unread_) {
      std::string what = "unknown key";
      if (const auto close = Closest(key, known_)) what += "; did you mean '" + *close + "'?";
      Record(line, file_ + ":" + std::to_string(line) + ": " + Join(key) + ": " + what);
    }
    unread_.clear();
    return Status::Ok();
  }

  // A key that is valid in general but not with the chosen options.
  Status NotHere(const std::string& key, const std::string& why) {
    if (!valid_) return Status::Ok();
    known_.insert(key);
    if (!node_[key].IsDefined()) return Status::Ok();
    Consume(key);
    return Swallow(Error(node_[key], Join(key), why));
  }

  // An error about `key` found by a check across keys.
  Status ErrorAt(const std::string& key, const std::string& what) {
    if (!valid_) return Status::Ok();
    const YAML::Node value = node_[key];
    return Swallow(Error(value.IsDefined() ? value : node_, Join(key), what));
  }

  // A value that is allowed but unwise.
  void WarnAt(const std::string& key, const std::string& what) {
    if (!valid_) return;
    const YAML::Node value = node_[key];
    const int line = (value.IsDefined() ? value : node_).Mark().line + 1;
    diag_->warnings.push_back({line, file_ + ":" + std::to_string(line) + ": " + Join(key) +
                                         ": warning: " + what});
  }

  std::string Join(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

 private:
  // Errors were recorded where they were made; public methods report OK so
  // that parsing goes on.
  static Status Swallow(const Status&) { return Status::Ok(); }

  void Record(int line, std::string message) {
    diag_->errors.push_back({line, std::move(message)});
  }

  Status Error(const YAML::Node& node, const std::string& key, const std::string& what) {
    const int line = node.Mark().line + 1;
    std::string message = file_ + ":" + std::to_string(line) + ": " + key + ": " + what;
    Record(line, message);
    return InvalidArgumentError(message);
  }

  Status Missing(const std::string& key) {
    const int line = node_.Mark().line + 1;
    std::string message = file_ + ":" + std::to_string(line) + ": " + Join(key) +
                          ": required key is missing";
    // A present key that looks like a typo of the missing one.
    std::set<std::string> present;
    for (const auto& [name, at] : unread_) present.insert(name);
    if (const auto close = Closest(key, present)) {
      message += " (line " + std::to_string(unread_.at(*close)) + " has '" + *close +
                 "': did you mean '" + key + "'?)";
    }
    Record(line, message);
    return InvalidArgumentError(message);
  }

  void Consume(const std::string& key) {
    known_.insert(key);
    const auto it = unread_.find(key);
    if (it != unread_.end()) {
      (*lines_)[Join(key)] = it->second;
      unread_.erase(it);
    }
  }

  static std::string RangeText(int64_t low, int64_t high) {
    return "a whole number in [" + std::to_string(low) + ", " + std::to_string(high) + "]";
  }

  Status NumberImpl(const std::string& key, bool required, const std::function<bool(double)>& ok,
                    const std::string& allowed, double* out) {
    if (!valid_) return Status::Ok();
    Consume(key);
    if (!Has(key)) return required ? Missing(key) : Status::Ok();
    return ParseNumber(node_[key], Join(key), ok, allowed, out);
  }

  Status BoundedInteger(const std::string& key, bool required, int64_t low, int64_t high,
                        const std::string& allowed, int64_t* out) {
    double value = static_cast<double>(*out);
    VIPSD_RETURN_IF_ERROR(NumberImpl(
        key, required,
        [&](double x) {
          return std::floor(x) == x && x >= static_cast<double>(low) &&
                 x <= static_cast<double>(high);
        },
        allowed, &value));
    *out = static_cast<int64_t>(value);
    return Status::Ok();
  }

  Status StringListImpl(const std::string& key, bool required,
                        const std::function<bool(const std::string&)>& ok,
                        const std::string& allowed, std::vector<std::string>* out) {
    if (!valid_) return Status::Ok();
    Consume(key);
    if (!Has(key)) return required ? Missing(key) : Status::Ok();
    const YAML::Node value = node_[key];
    if (!value.IsSequence() || value.size() == 0) {
      return Error(value, Join(key), "must be a non-empty list of " + allowed);
    }
    std::vector<std::string> items;
    for (const auto& item : value) {
      if (!item.IsScalar() || !ok(item.Scalar())) {
        return Error(item, Join(key),
                     "every entry must be " + allowed + ", got '" +
                         (item.IsScalar() ? item.Scalar() : "?") + "'");
      }
      if (std::find(items.begin(), items.end(), item.Scalar()) != items.end()) {
        return Error(item, Join(key), "duplicate entry '" + item.Scalar() + "'");
      }
      items.push_back(item.Scalar());
    }
    *out = std::move(items);
    return Status::Ok();
  }

  Status NumberListImpl(const std::string& key, const std::function<bool(double)>& ok,
                        const std::string& allowed, std::vector<double>* out) {
    if (!valid_) return Status::Ok();
    Consume(key);
    if (!node_[key].IsDefined()) return Status::Ok();
    const YAML::Node value = node_[key];
    if (value.IsNull()) {
      out->clear();
      return Status::Ok();
    }
    if (!value.IsSequence()) return Error(value, Join(key), "must be a list of " + allowed);
    std::vector<double> items;
    for (const auto& item : value) {
      double parsed = 0;
      VIPSD_RETURN_IF_ERROR(ParseNumber(item, Join(key), ok, allowed, &parsed));
      items.push_back(parsed);
    }
    *out = std::move(items);
    return Status::Ok();
  }

  Status ParseNumber(const YAML::Node& value, const std::string& key,
                     const std::function<bool(double)>& ok, const std::string& allowed,
                     double* out) {
    if (!value.IsScalar()) return Error(value, key, "must be " + allowed);
    const std::string text = value.Scalar();
    char* end = nullptr;
    errno = 0;
    const double parsed = std::strtod(text.c_str(), &end);
    if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE ||
        !std::isfinite(parsed) || !ok(parsed)) {
      return Error(value, key, "must be " + allowed + ", got '" + text + "'");
    }
    *out = parsed;
    return Status::Ok();
  }

  Status ParseString(const YAML::Node& value, const std::string& key,
                     const std::vector<std::string>& choices, std::string* out) {
    std::string allowed;
    for (const auto& choice : choices) allowed += (allowed.empty() ? "" : ", ") + choice;
    if (!value.IsScalar() || value.Scalar().empty()) {
      return Error(value, key,
                   choices.empty() ? "must be a non-empty string" : "must be one of " + allowed);
    }
    if (!choices.empty() &&
        std::find(choices.begin(), choices.end(), value.Scalar()) == choices.end()) {
      std::string what = "must be one of " + allowed + ", got '" + value.Scalar() + "'";
      const std::set<std::string> options(choices.begin(), choices.end());
      if (const auto close = Closest(value.Scalar(), options)) {
        what += "; did you mean '" + *close + "'?";
      }
      return Error(value, key, what);
    }
    *out = value.Scalar();
    return Status::Ok();
  }

  std::string file_;
  YAML::Node node_;
  std::string path_;
  std::map<std::string, int>* lines_;
  Diagnostics* diag_;
  bool valid_ = true;
  std::map<std::string, int> unread_;  // key → line
  std::set<std::string> known_;        // keys the parser asked for
  bool derived_default_ = false;       // NextDefaultIsDerived
};

auto Positive = [](double x) { return x > 0; };
auto NonNegative = [](double x) { return x >= 0; };

// Kafka topic names: 1..249 of [a-zA-Z0-9._-] (Kafka's own rule).
bool IsTopicName(const std::string& name) {
  if (name.empty() || name.size() > 249 || name == "." || name == "..") return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '.' || c == '_' || c == '-';
  });
}
constexpr const char* kTopicRule = "a Kafka topic name (1-249 of a-z A-Z 0-9 . _ -)";

std::string Resolve(const std::string& file, const std::string& path) {
  const std::filesystem::path p(path);
  if (p.is_absolute()) return path;
  return (std::filesystem::path(file).parent_path() / p).lexically_normal().string();
}

Status ParseLda(Section& lda, VipsdConfig& config) {
  models::LdaConfig& l = config.lda;
  VIPSD_RETURN_IF_ERROR(lda.Integer("topics", true, 1, 100000, &l.num_topics));
  VIPSD_RETURN_IF_ERROR(lda.String("vocabulary", true, {}, &config.vocabulary_path));
  config.vocabulary_path = Resolve(config.file, config.vocabulary_path);
  VIPSD_RETURN_IF_ERROR(lda.Number("alpha", true, Positive, "a number > 0", &l.alpha));
  VIPSD_RETURN_IF_ERROR(lda.Number("eta", true, Positive, "a number > 0", &l.eta));
  VIPSD_RETURN_IF_ERROR(lda.Integer("resample_length", false, 0, 1000000, &l.resample_length));
  VIPSD_RETURN_IF_ERROR(lda.Number("clip_fraction", false,
                                   [](double x) { return x > 0 && x <= 1; }, "a number in (0, 1]",
                                   &l.clip_fraction));
  int64_t iterations = l.estep_max_iterations;
  VIPSD_RETURN_IF_ERROR(lda.Integer("estep_max_iterations", false, 1, 100000, &iterations));
  l.estep_max_iterations = static_cast<int>(iterations);
  VIPSD_RETURN_IF_ERROR(lda.Number("estep_tolerance", false, Positive, "a number > 0",
                                   &l.estep_tolerance));
  int64_t init_seed = 0;
  VIPSD_RETURN_IF_ERROR(lda.Integer("init_seed", false, 0, int64_t{1} << 53, &init_seed));
  l.init_seed = static_cast<uint64_t>(init_seed);
  VIPSD_RETURN_IF_ERROR(lda.Finish());
  if (config.is_private() && config.lda.resample_length == 0) {
    return lda.ErrorAt("resample_length",
                       "must be >= 1 when privacy.noise_multiplier > 0 (0 has no "
                       "sensitivity bound)");
  }
  return Status::Ok();
}

Status ParseBlr(Section& blr, VipsdConfig& config) {
  models::BlrConfig& b = config.blr;
  VIPSD_RETURN_IF_ERROR(blr.Integer("dimension", true, 1, 1024, &b.dim));
  VIPSD_RETURN_IF_ERROR(blr.Number("prior_shape", false, Positive, "a number > 0 (a0)",
                                   &b.prior_shape));
  VIPSD_RETURN_IF_ERROR(blr.Number("prior_rate", false, Positive, "a number > 0 (b0)",
                                   &b.prior_rate));
  VIPSD_RETURN_IF_ERROR(blr.Number("eigenvalue_floor", false,
                                   [](double x) { return x > 0 && x <= 1e6; },
                                   "a number in (0, 1e6]", &b.eigenvalue_floor));
  VIPSD_RETURN_IF_ERROR(blr.String("norm_rule", false, {"rescale", "reject"},
                                   &config.blr_norm_rule));
  if (config.is_private() && config.blr_norm_rule == "reject") {
    (void)blr.ErrorAt(
        "norm_rule",
        "reject is not allowed when privacy.noise_multiplier > 0: it would drop well-formed "
        "records for their content, outside the mechanism; use rescale (the default), which "
        "keeps every record and bounds ||x|| <= 1");
  }
  return blr.Finish();
}

Status ParseSbn(Section& sbn, VipsdConfig& config) {
  models::SbnConfig& c = config.sbn;
  auto positive_precision = [](double x) { return x > 0; };
  VIPSD_RETURN_IF_ERROR(sbn.Integer("visible", true, 1, 65536, &c.visible));
  VIPSD_RETURN_IF_ERROR(sbn.Integer("hidden", true, 1, 1024, &c.hidden));
  VIPSD_RETURN_IF_ERROR(sbn.Number("weight_prior_precision", false, positive_precision,
                                   "a number > 0", &c.weight_prior_precision));
  VIPSD_RETURN_IF_ERROR(sbn.Number("visible_bias_prior_precision", false, positive_precision,
                                   "a number > 0", &c.visible_bias_prior_precision));
  VIPSD_RETURN_IF_ERROR(sbn.Number("hidden_bias_prior_precision", false, positive_precision,
                                   "a number > 0", &c.hidden_bias_prior_precision));
  VIPSD_RETURN_IF_ERROR(sbn.Number("init_weight_std", false, NonNegative, "a number >= 0",
                                   &c.init_weight_std));
  VIPSD_RETURN_IF_ERROR(sbn.Number("init_variance", false,
                                   [](double x) { return x > 0 && x <= 1e6; },
                                   "a number in (0, 1e6]", &c.init_variance));
  int64_t iterations = c.estep_max_iterations;
  VIPSD_RETURN_IF_ERROR(sbn.Integer("estep_max_iterations", false, 1, 100000, &iterations));
  c.estep_max_iterations = static_cast<int>(iterations);
  VIPSD_RETURN_IF_ERROR(sbn.Number("estep_tolerance", false, Positive, "a number > 0",
                                   &c.estep_tolerance));
  int64_t init_seed = 0;
  VIPSD_RETURN_IF_ERROR(sbn.Integer("init_seed", false, 0, int64_t{1} << 53, &init_seed));
  c.init_seed = static_cast<uint64_t>(init_seed);
  std::optional<Section> clip;
  VIPSD_RETURN_IF_ERROR(sbn.Sub("clip_fractions", false, &clip));
  if (clip.has_value()) {
    auto fraction = [](double x) { return x > 0 && x <= 1; };
    const std::string allowed = "a number in (0, 1] (fraction of the block's proven bound)";
    models::SbnClipFractions& f = c.clip_fractions;
    for (auto [key, value] : {std::pair<const char*, double*>{"count", &f.count},
                              {"z", &f.z}, {"y", &f.y}, {"xi", &f.xi}, {"xi_z", &f.xi_z},
                              {"y_z", &f.y_z}, {"xi_zz", &f.xi_zz}}) {
      VIPSD_RETURN_IF_ERROR(clip->Number(key, false, fraction, allowed, value));
    }
    VIPSD_RETURN_IF_ERROR(clip->Finish());
  }
  const Status valid = models::ValidateSbnConfig(c);
  if (!valid.ok()) (void)sbn.ErrorAt("hidden", std::string(valid.message()));
  return sbn.Finish();
}

Status ParseModel(Section& top, VipsdConfig& config) {
  const std::vector<std::string> types = {"lda", "blr", "sbn"};
  std::optional<Section> model, section;
  VIPSD_RETURN_IF_ERROR(top.Sub("model", true, &model));
  VIPSD_RETURN_IF_ERROR(model->String("type", true, types, &config.model_type));
  for (const auto& other : types) {
    if (other != config.model_type) {
      VIPSD_RETURN_IF_ERROR(
          model->NotHere(other, "only allowed with model.type: " + other));
    }
  }
  VIPSD_RETURN_IF_ERROR(model->Sub(config.model_type, true, &section));
  if (config.model_type == "lda") {
    VIPSD_RETURN_IF_ERROR(ParseLda(*section, config));
  } else if (config.model_type == "blr") {
    VIPSD_RETURN_IF_ERROR(ParseBlr(*section, config));
  } else {
    VIPSD_RETURN_IF_ERROR(ParseSbn(*section, config));
  }
  return model->Finish();
}

Status ParsePrivacy(Section& top, VipsdConfig& config) {
  std::optional<Section> privacy;
  svi::DriverConfig& d = config.driver;
  VIPSD_RETURN_IF_ERROR(top.Sub("privacy", true, &privacy));
  VIPSD_RETURN_IF_ERROR(privacy->Number("noise_multiplier", true,
                                        [](double x) { return x >= 0; },
                                        "a number >= 0 (0 = non-private)", &d.noise_multiplier));
  VIPSD_RETURN_IF_ERROR(privacy->Number("sampling_rate", true,
                                        [](double x) { return x > 0 && x <= 1; },
                                        "a number in (0, 1]", &d.sampling_rate));
  VIPSD_RETURN_IF_ERROR(privacy->Number("delta", config.is_private(),
                                        [](double x) { return x > 0 && x < 1; },
                                        "a number in (0, 1)", &d.delta));
  VIPSD_RETURN_IF_ERROR(privacy->Number("epsilon_ceiling", config.is_private(), Positive,
                                        "a number > 0", &d.epsilon_ceiling));
  std::string noise = "secure";
  VIPSD_RETURN_IF_ERROR(privacy->String("noise", false, {"secure", "fixed_seed"}, &noise));
  config.noise_mode = noise == "secure" ? NoiseMode::kSecure : NoiseMode::kFixedSeed;
  int64_t noise_seed = 0;
  VIPSD_RETURN_IF_ERROR(privacy->Integer("noise_seed", false, 0, int64_t{1} << 53, &noise_seed));
  config.noise_seed = static_cast<uint64_t>(noise_seed);
  if (privacy->Has("noise_seed") && config.noise_mode == NoiseMode::kSecure) {
    (void)privacy->ErrorAt("noise_seed", "only allowed with noise: fixed_seed");
  }
  std::string accounting = "global";
  VIPSD_RETURN_IF_ERROR(privacy->String("accounting", false, {"global", "residency"}, &accounting));
  config.accounting = accounting == "global" ? Accounting::kGlobal : Accounting::kResidency;
  std::string schedule;  // absent: the ledger's, or fixed for a new state directory
  privacy->NextDefaultIsDerived();
  VIPSD_RETURN_IF_ERROR(privacy->String("schedule", false, {"fixed", "adaptive"}, &schedule));
  if (!schedule.empty()) {
    // Ignored by a non-private run (nothing is charged), like delta.
    config.schedule = schedule == "fixed" ? Schedule::kFixed : Schedule::kAdaptive;
  }
  VIPSD_RETURN_IF_ERROR(privacy->NotHere(
      "residency_steps",
      "no longer a key: a record is a candidate in exactly the steps of its window, so its "
      "residency M is schedule.window_steps (set that instead)"));
  if (config.accounting == Accounting::kResidency && !config.is_private()) {
    (void)privacy->ErrorAt("accounting",
                            "residency accounting needs noise_multiplier > 0 (a non-private "
                            "run has no budget)");
  }
  std::string on_ceiling = "halt";
  VIPSD_RETURN_IF_ERROR(privacy->String("on_ceiling", false, {"halt", "exit"}, &on_ceiling));
  config.on_ceiling = on_ceiling == "halt" ? CeilingAction::kHalt : CeilingAction::kExit;
  VIPSD_RETURN_IF_ERROR(privacy->NumberList(
      "warn_at", [](double x) { return x > 0 && x < 1; },
      "numbers in (0, 1) (fractions of the ceiling)", &config.warn_at));
  if (!std::is_sorted(config.warn_at.begin(), config.warn_at.end()) ||
      std::adjacent_find(config.warn_at.begin(), config.warn_at.end()) != config.warn_at.end()) {
    (void)privacy->ErrorAt("warn_at", "must be strictly increasing");
  }
  return privacy->Finish();
}

Status ParseSchedule(Section& top, VipsdConfig& config) {
  std::optional<Section> schedule;
  svi::DriverConfig& d = config.driver;
  const bool kafka = config.source_type == SourceType::kKafka;
  VIPSD_RETURN_IF_ERROR(top.Sub("schedule", true, &schedule));
  VIPSD_RETURN_IF_ERROR(schedule->Number("tau0", false, NonNegative, "a number >= 0", &d.tau0));
  VIPSD_RETURN_IF_ERROR(schedule->Number("kappa", false,
                                         [](double x) { return x > 0.5 && x <= 1; },
                                         "a number in (0.5, 1]", &d.kappa));
  int64_t threads = d.threads;
  VIPSD_RETURN_IF_ERROR(schedule->Integer("threads", false, 1, 256, &threads));
  d.threads = static_cast<int>(threads);
  VIPSD_RETURN_IF_ERROR(schedule->Integer("max_steps", false, 0, int64_t{1} << 40,
                                          &config.max_steps));
  // Count-based triggers made one record's presence move every later step
  // (add/remove adjacency became substitution); steps now run on a public
  // clock only, in every mode.
  static const char* kCountTrigger =
      "removed: a step triggered by a record count lets one record shift which records every "
      "later step sees, which breaks the add/remove privacy claim; steps run on the public "
      "clock schedule.interval_seconds, and a step's candidates are the records of its "
      "window (schedule.window_steps)";
  VIPSD_RETURN_IF_ERROR(schedule->NotHere("min_new_records", kCountTrigger));
  VIPSD_RETURN_IF_ERROR(schedule->NotHere("min_pool_records", kCountTrigger));
  if (kafka) {
    VIPSD_RETURN_IF_ERROR(schedule->NotHere("max_epochs", "only allowed with source.type: file"));
    VIPSD_RETURN_IF_ERROR(schedule->Number("interval_seconds", true,
                                           [](double x) { return x >= 0.01 && x <= 86400 * 7; },
                                           "a number of seconds in [0.01, 604800] (slot k is "
                                           "due at start_time + k * interval_seconds)",
                                           &config.step_interval_seconds));
    VIPSD_RETURN_IF_ERROR(schedule->IntegerOrKeyword("window_steps", "all", svi::kWindowAll, 1,
                                                     int64_t{1} << 40, &config.window_steps));
    config.release_delay_seconds = config.step_interval_seconds;
    schedule->NextDefaultIsDerived();
    VIPSD_RETURN_IF_ERROR(schedule->Number(
        "release_delay_seconds", false,
        [&](double x) { return x >= 0 && x <= 10 * config.step_interval_seconds; },
        "a number of seconds in [0, 10 * interval_seconds] (a step's release leaves at its "
        "slot time plus this; default interval_seconds)",
        &config.release_delay_seconds));
    schedule->NextDefaultIsDerived();
    VIPSD_RETURN_IF_ERROR(schedule->Number("start_time", false,
                                           [](double x) { return x >= 1e9 && x <= 1e11; },
                                           "unix seconds in [1e9, 1e11] (the time of slot 0 of "
                                           "a new state directory; default: when it is "
                                           "created)",
                                           &config.start_time));
  } else {
    for (const char* key : {"interval_seconds", "window_steps", "release_delay_seconds",
                            "start_time"}) {
      VIPSD_RETURN_IF_ERROR(schedule->NotHere(
          key, "only allowed with source.type: kafka (a file run steps over the whole file, "
               "one step after the other)"));
    }
    VIPSD_RETURN_IF_ERROR(schedule->Number("max_epochs", false, NonNegative,
                                           "a number >= 0 (0 = no limit)", &config.max_epochs));
    if (config.max_epochs / config.driver.sampling_rate > 1e12) {
      (void)schedule->ErrorAt(
          "max_epochs", "max_epochs / privacy.sampling_rate is " +
                            ShortestNumber(config.max_epochs / config.driver.sampling_rate) +
                            " steps; at most 1e12 steps are allowed (one epoch is 1/q steps)");
    }
    if (config.max_steps == 0 && config.max_epochs == 0 && !config.is_private()) {
      (void)schedule->ErrorAt("max_steps",
                               "a non-private run needs max_steps or max_epochs > 0 (no "
                               "privacy ceiling stops it)");
    }
  }
  return schedule->Finish();
}

Status ParseIo(Section& top, VipsdConfig& config) {
  const std::string& file = config.file;
  const bool kafka_source = config.source_type == SourceType::kKafka;
  std::optional<Section> source, sink, state, dead_letter, pool, kafka, alerts, metrics, log;
  std::string type;

  // source (its type was read first, in ParseConfig)
  VIPSD_RETURN_IF_ERROR(top.Sub("source", true, &source));
  VIPSD_RETURN_IF_ERROR(source->String("type", true, {"file", "kafka"}, &type));
  if (kafka_source) {
    VIPSD_RETURN_IF_ERROR(source->NotHere("path", "only allowed with source.type: file"));
    VIPSD_RETURN_IF_ERROR(source->StringList("topics", true, IsTopicName, kTopicRule,
                                             &config.source_topics));
    VIPSD_RETURN_IF_ERROR(source->String("group_id", false, {}, &config.group_id));
    VIPSD_RETURN_IF_ERROR(source->String("start_position", false, {"earliest", "latest"},
                                         &config.start_position));
    VIPSD_RETURN_IF_ERROR(source->Integer("max_record_bytes", false, 1, int64_t{1} << 30,
                                          &config.max_record_bytes));
  } else {
    VIPSD_RETURN_IF_ERROR(source->String("path", true, {}, &config.source_path));
    config.source_path = Resolve(file, config.source_path);
    for (const char* key : {"topics", "group_id", "start_position", "max_record_bytes"}) {
      VIPSD_RETURN_IF_ERROR(source->NotHere(key, "only allowed with source.type: kafka"));
    }
  }
  VIPSD_RETURN_IF_ERROR(source->Finish());

  // sink
  VIPSD_RETURN_IF_ERROR(top.Sub("sink", true, &sink));
  VIPSD_RETURN_IF_ERROR(sink->String("type", true, {"file", "kafka"}, &type));
  config.sink_type = type == "file" ? SinkType::kFile : SinkType::kKafka;
  if (config.sink_type == SinkType::kKafka) {
    if (!kafka_source) {
      (void)sink->ErrorAt("type", "kafka sinks need source.type: kafka (the offline file run "
                                  "writes releases to a directory)");
    }
    VIPSD_RETURN_IF_ERROR(sink->String("topic", true, {}, &config.release_topic));
    if (!config.release_topic.empty() && !IsTopicName(config.release_topic)) {
      (void)sink->ErrorAt("topic", std::string("must be ") + kTopicRule);
    }
    VIPSD_RETURN_IF_ERROR(sink->Number("publish_timeout_seconds", false,
                                       [](double x) { return x >= 1 && x <= 3600; },
                                       "a number of seconds in [1, 3600]",
                                       &config.publish_timeout_seconds));
    VIPSD_RETURN_IF_ERROR(sink->NotHere("directory", "only allowed with sink.type: file"));
    VIPSD_RETURN_IF_ERROR(sink->OptionalString("mirror_directory", &config.sink_mirror_directory));
    if (!config.sink_mirror_directory.empty()) {
      config.sink_mirror_directory = Resolve(file, config.sink_mirror_directory);
    }
  } else {
    VIPSD_RETURN_IF_ERROR(sink->String("directory", true, {}, &config.sink_directory));
    config.sink_directory = Resolve(file, config.sink_directory);
    VIPSD_RETURN_IF_ERROR(sink->NotHere("topic", "only allowed with sink.type: kafka"));
    VIPSD_RETURN_IF_ERROR(sink->NotHere("mirror_directory", "only allowed with sink.type: kafka"));
    VIPSD_RETURN_IF_ERROR(sink->NotHere("publish_timeout_seconds",
                                        "only allowed with sink.type: kafka"));
  }
  VIPSD_RETURN_IF_ERROR(sink->Integer("publish_every", false, 1, int64_t{1} << 40,
                                      &config.publish_every));
  VIPSD_RETURN_IF_ERROR(sink->Finish());

  // dead letters
  VIPSD_RETURN_IF_ERROR(top.Sub("dead_letter", true, &dead_letter));
  if (kafka_source) {
    VIPSD_RETURN_IF_ERROR(dead_letter->String("topic", true, {}, &config.dead_letter_topic));
    if (!config.dead_letter_topic.empty() && !IsTopicName(config.dead_letter_topic)) {
      (void)dead_letter->ErrorAt("topic", std::string("must be ") + kTopicRule);
    }
    VIPSD_RETURN_IF_ERROR(dead_letter->NotHere("path", "only allowed with source.type: file"));
  } else {
    VIPSD_RETURN_IF_ERROR(dead_letter->String("path", true, {}, &config.dead_letter_path));
    config.dead_letter_path = Resolve(file, config.dead_letter_path);
    VIPSD_RETURN_IF_ERROR(dead_letter->NotHere("topic", "only allowed with source.type: kafka"));
  }
  VIPSD_RETURN_IF_ERROR(dead_letter->Finish());

  // pool, kafka, alerts: Kafka runs only
  if (kafka_source) {
    VIPSD_RETURN_IF_ERROR(top.Sub("pool", false, &pool));
    if (pool.has_value()) {
      VIPSD_RETURN_IF_ERROR(pool->Integer("capacity", false, 1, int64_t{1} << 32,
                                          &config.pool_capacity));
      VIPSD_RETURN_IF_ERROR(pool->NotHere(
          "eviction",
          "removed: both policies let a count of other records decide a record's membership "
          "(oldest: a new record evicts an old one, so add/remove becomes substitution; "
          "refuse_new: a full pool leaves new records out of the steps they belong to); "
          "records leave the pool only when their window ends, and a window larger than "
          "pool.capacity stops stepping with an alert"));
      VIPSD_RETURN_IF_ERROR(pool->NotHere(
          "rebuild_lookback",
          "removed: capping a restart's re-read by a record count would drop records from "
          "windows depending on how many others arrived; a restart re-reads each window "
          "from its start"));
      VIPSD_RETURN_IF_ERROR(pool->Finish());
    }
    VIPSD_RETURN_IF_ERROR(top.Sub("kafka", true, &kafka));
    KafkaSettings& k = config.kafka;
    VIPSD_RETURN_IF_ERROR(kafka->Bool("embedded", &k.embedded));
    if (k.embedded) {
      VIPSD_RETURN_IF_ERROR(kafka->NotHere(
          "bootstrap_servers", "not allowed with embedded: true (the embedded cluster has "
                               "random ports; the daemon prints them)"));
      VIPSD_RETURN_IF_ERROR(kafka->String("demo_corpus", false, {}, &k.demo_corpus));
      if (!k.demo_corpus.empty()) k.demo_corpus = Resolve(file, k.demo_corpus);
      VIPSD_RETURN_IF_ERROR(kafka->Integer("partitions", false, 1, 256, &k.partitions));
    } else {
      VIPSD_RETURN_IF_ERROR(kafka->String("bootstrap_servers", true, {}, &k.bootstrap_servers));
      VIPSD_RETURN_IF_ERROR(kafka->NotHere("demo_corpus", "only allowed with embedded: true"));
      VIPSD_RETURN_IF_ERROR(kafka->NotHere("partitions", "only allowed with embedded: true"));
    }
    VIPSD_RETURN_IF_ERROR(kafka->String("client_id", false, {}, &k.client_id));
    VIPSD_RETURN_IF_ERROR(kafka->PropertyMap("properties", &k.properties));
    VIPSD_RETURN_IF_ERROR(kafka->PropertyMap("consumer_properties", &k.consumer_properties));
    VIPSD_RETURN_IF_ERROR(kafka->PropertyMap("producer_properties", &k.producer_properties));
    VIPSD_RETURN_IF_ERROR(kafka->Finish());
    VIPSD_RETURN_IF_ERROR(top.Sub("alerts", false, &alerts));
    if (alerts.has_value()) {
      VIPSD_RETURN_IF_ERROR(alerts->String("topic", true, {}, &config.alert_topic));
      if (!config.alert_topic.empty() && !IsTopicName(config.alert_topic)) {
        (void)alerts->ErrorAt("topic", std::string("must be ") + kTopicRule);
      }
      VIPSD_RETURN_IF_ERROR(alerts->Finish());
    }
  } else {
    for (const char* key : {"pool", "kafka", "alerts"}) {
      VIPSD_RETURN_IF_ERROR(top.NotHere(key, "only allowed with source.type: kafka"));
    }
  }

  // state
  VIPSD_RETURN_IF_ERROR(top.Sub("state", true, &state));
  VIPSD_RETURN_IF_ERROR(state->String("directory", true, {}, &config.state_directory));
  config.state_directory = Resolve(file, config.state_directory);
  VIPSD_RETURN_IF_ERROR(state->Integer("checkpoint_every", false, 1, int64_t{1} << 40,
                                       &config.checkpoint_every));
  if (config.source_type == SourceType::kKafka) {
    VIPSD_RETURN_IF_ERROR(state->String("ledger_topic", false, {}, &config.ledger_topic));
    if (!config.ledger_topic.empty() && !IsTopicName(config.ledger_topic)) {
      (void)state->ErrorAt("ledger_topic", std::string("must be ") + kTopicRule);
    }
    VIPSD_RETURN_IF_ERROR(state->String("ledger_key", false, {}, &config.ledger_key));
    if (config.ledger_key.empty()) {
      config.ledger_key = config.group_id;
    } else if (config.ledger_topic.empty()) {
      (void)state->ErrorAt("ledger_key", "only allowed together with state.ledger_topic");
    }
    VIPSD_RETURN_IF_ERROR(state->Number(
        "standby_takeover_seconds", false, [](double x) { return x >= 0 && x <= 86400; },
        "a number of seconds in [0, 86400] (0: take the job at start; otherwise stand by until "
        "the job's ledger topic has been silent this long)",
        &config.standby_takeover_seconds));
    if (config.standby_takeover_seconds > 0) {
      if (config.ledger_topic.empty()) {
        (void)state->ErrorAt("standby_takeover_seconds",
                             "only allowed together with state.ledger_topic");
      } else if (config.standby_takeover_seconds < 3 * config.step_interval_seconds + 5) {
        state->WarnAt("standby_takeover_seconds",
                      "below 3 * schedule.interval_seconds + 5 s: the running daemon commits once "
                      "per slot, and not at all while it starts (the consumer-group join takes "
                      "3 s and more), so a standby may take over (and fence it) while it is "
                      "healthy");
      }
    }
    VIPSD_RETURN_IF_ERROR(state->String("work_topic", false, {}, &config.work_topic));
    if (!config.work_topic.empty()) {
      if (!IsTopicName(config.work_topic)) {
        (void)state->ErrorAt("work_topic", std::string("must be ") + kTopicRule);
      } else if (config.ledger_topic.empty()) {
        (void)state->ErrorAt("work_topic",
                             "only allowed together with state.ledger_topic (the process that "
                             "owns the job's ledger coordinates; with "
                             "state.standby_takeover_seconds > 0 the others work for it)");
      } else if (config.work_topic == config.ledger_topic ||
                 std::find(config.source_topics.begin(), config.source_topics.end(),
                           config.work_topic) != config.source_topics.end()) {
        (void)state->ErrorAt("work_topic",
                             "must differ from state.ledger_topic and from the input topics");
      }
    }
  } else {
    for (const char* key :
         {"ledger_topic", "ledger_key", "standby_takeover_seconds", "work_topic"}) {
      VIPSD_RETURN_IF_ERROR(state->NotHere(key, "only allowed with source.type: kafka"));
    }
  }
  VIPSD_RETURN_IF_ERROR(state->Finish());

  // metrics, log
  VIPSD_RETURN_IF_ERROR(top.Sub("metrics", false, &metrics));
  config.expose_step_timing = !config.is_private();
  if (metrics.has_value()) {
    VIPSD_RETURN_IF_ERROR(metrics->OptionalString("listen", &config.metrics_listen));
    metrics->NextDefaultIsDerived();
    VIPSD_RETURN_IF_ERROR(metrics->Bool("expose_step_timing", &config.expose_step_timing));
    VIPSD_RETURN_IF_ERROR(metrics->Finish());
  }
  VIPSD_RETURN_IF_ERROR(top.Sub("log", false, &log));
  if (log.has_value()) {
    std::string level = "info";
    VIPSD_RETURN_IF_ERROR(log->String("level", false, {"debug", "info", "warning", "error"},
                                      &level));
    config.log_level = level == "debug"     ? LogLevel::kDebug
                       : level == "info"    ? LogLevel::kInfo
                       : level == "warning" ? LogLevel::kWarning
                                            : LogLevel::kError;
    std::string format = "logfmt";
    VIPSD_RETURN_IF_ERROR(log->String("format", false, {"logfmt", "json"}, &format));
    config.log_format = format == "json" ? LogFormat::kJson : LogFormat::kLogfmt;
    VIPSD_RETURN_IF_ERROR(log->Finish());
  }
  return Status::Ok();
}

}  // namespace

int VipsdConfig::line_of(const std::string& key) const {
  const auto it = lines.find(key);
  return it == lines.end() ? 0 : it->second;
}

namespace {

// Problems of the text itself, found before YAML parsing (yaml-cpp reports
// them poorly or not at all).
std::vector<Diagnostics::Entry> TextProblems(std::string_view text, const std::string& file) {
  std::vector<Diagnostics::Entry> problems;
  bool blank = true;
  for (char c : text) {
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r') {
      blank = false;
      break;
    }
  }
  if (blank) {
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

std::string Joined(std::vector<Diagnostics::Entry> entries) {
  std::stable_sort(entries.begin(), entries.end(),
                   [](const auto& a, const auto& b) { return a.line < b.line; });
  std::string out;
  for (const auto& entry : entries) out += (out.empty() ? "" : "\n") + entry.message;
  return out;
}

}  // namespace

StatusOr<VipsdConfig> ParseConfig(std::string_view yaml_text, const std::string& file) {
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
  (void)top.Check();
  if (!top.valid()) return InvalidArgumentError(Joined(diag.errors));

  // The source type decides which keys apply elsewhere: read it first
  // (quietly: the full pass below reports its errors).
  {
    std::vector<SchemaKey>* const recording = schema_log;
    schema_log = nullptr;  // the full pass below records the schema
    std::map<std::string, int> ignored_lines;
    Diagnostics ignored;
    std::optional<Section> source;
    Section peek(file, root, "", &ignored_lines, &ignored);
    (void)peek.Check();
    (void)peek.Sub("source", true, &source);
    std::string type = "file";
    (void)source->String("type", true, {"file", "kafka"}, &type);
    config.source_type = type == "file" ? SourceType::kFile : SourceType::kKafka;
    schema_log = recording;
  }
  // Privacy before model (the model's checks depend on σ > 0).
  (void)ParsePrivacy(top, config);
  (void)ParseModel(top, config);
  (void)ParseSchedule(top, config);
  (void)ParseIo(top, config);
  (void)top.Finish();
  auto error_at = [&](const std::string& key, const std::string& what) {
    const int line = config.line_of(key);
    diag.errors.push_back({line, file + ":" + std::to_string(line) + ": " + key + ": " + what});
  };
  if (config.accounting == Accounting::kResidency && config.source_type != SourceType::kKafka) {
    error_at("privacy.accounting",
             "residency needs source.type: kafka (a file run has a fixed data set: use global)");
  }
  if (config.accounting == Accounting::kResidency && config.source_type == SourceType::kKafka &&
      config.window_steps == svi::kWindowAll) {
    error_at(config.line_of("schedule.window_steps") > 0 ? "schedule.window_steps"
                                                          : "privacy.accounting",
             "residency accounting needs a finite window (a whole number >= 1: each record is a "
             "candidate in at most that many steps), got all");
  }
  if (config.source_type == SourceType::kFile && !config.dead_letter_path.empty() &&
      std::filesystem::path(config.dead_letter_path).lexically_normal() ==
          std::filesystem::path(config.source_path).lexically_normal()) {
    error_at("dead_letter.path",
             "must not be the source file itself (dead letters would be appended to the input "
             "being read)");
  }
  // Legal but unwise values: warnings with the reason.
  if (config.is_private()) {
    if (config.driver.delta > 1e-3) {
      diag.warnings.push_back(
          {config.line_of("privacy.delta"),
           file + ":" + std::to_string(config.line_of("privacy.delta")) +
               ": privacy.delta: warning: " + ShortestNumber(config.driver.delta) +
               " is large; (epsilon, delta)-DP allows a delta-probability total failure, so "
               "delta should be well below 1/(number of records), typically 1e-5 or less"});
    }
    if (config.driver.epsilon_ceiling > 10) {
      diag.warnings.push_back(
          {config.line_of("privacy.epsilon_ceiling"),
           file + ":" + std::to_string(config.line_of("privacy.epsilon_ceiling")) +
               ": privacy.epsilon_ceiling: warning: an epsilon above 10 gives little "
               "protection (e^epsilon bounds how much a release may change an adversary's odds)"});
    }
    if (config.driver.noise_multiplier < 0.5) {
      diag.warnings.push_back(
          {config.line_of("privacy.noise_multiplier"),
           file + ":" + std::to_string(config.line_of("privacy.noise_multiplier")) +
               ": privacy.noise_multiplier: warning: below 0.5 each step spends a large epsilon "
               "(one step at q = 1 costs more than 10 at delta 1e-5)"});
    }
  }
  if (!diag.errors.empty()) return InvalidArgumentError(Joined(diag.errors));
  std::stable_sort(diag.warnings.begin(), diag.warnings.end(),
                   [](const auto& a, const auto& b) { return a.line < b.line; });
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
    return InvalidArgumentError(path + ": is not a regular file (a FIFO, socket or device); "
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

// ---------------------------------------------------------------------------
// Reload

namespace {

template <typename T>
std::string Show(const T& value) {
  std::ostringstream out;
  out.precision(17);
  out << value;
  return out.str();
}
std::string Show(double value) { return ShortestNumber(value); }
std::string Show(const std::vector<double>& values) {
  std::string out = "[";
  for (double value : values) out += (out.size() > 1 ? ", " : "") + ShortestNumber(value);
  return out + "]";
}
std::string Show(const std::vector<std::string>& values) {
  std::string out = "[";
  for (const auto& value : values) out += (out.size() > 1 ? ", " : "") + value;
  return out + "]";
}
std::string Show(const std::map<std::string, std::string>& values) {
  std::string out = "{";
  for (const auto& [key, value] : values) out += (out.size() > 1 ? ", " : "") + key + ": " + value;
  return out + "}";
}

// What a reload applies live; ReloadDiff::Live asserts its keys are here.
const std::vector<std::string> kLiveReloadKeys = {
    "privacy.noise_multiplier", "privacy.sampling_rate", "privacy.epsilon_ceiling",
    "privacy.on_ceiling", "privacy.warn_at", "schedule.tau0", "schedule.kappa",
    "schedule.threads", "schedule.interval_seconds", "schedule.window_steps",
    "schedule.release_delay_seconds", "schedule.max_steps", "schedule.max_epochs",
    "pool.capacity", "sink.publish_every", "state.checkpoint_every", "log.level", "log.format"};

class ReloadDiff {
 public:
  // `next` names the lines of refused keys.
  explicit ReloadDiff(const VipsdConfig& next) : next_(next) {}

  template <typename T>
  void Fixed(const std::string& key, const T& old_value, const T& new_value) {
    if (!status_.ok() || old_value == new_value) return;
    // librdkafka properties may hold credentials: never in a message.
    const bool secret = key.find("properties") != std::string::npos;
    Refuse(key, "",
           secret ? std::string("the values are not shown: they may hold credentials")
                  : "running: " + Show(old_value) + ", file: " + Show(new_value));
  }

  // privacy.noise_multiplier between 0 (non-private) and > 0 (private): the
  // value itself is live, the privacy mode is not.
  void PrivacyMode(double old_sigma, double new_sigma) {
    if (!status_.ok() || (old_sigma > 0) == (new_sigma > 0)) return;
    Refuse("privacy.noise_multiplier",
           " between private (> 0) and non-private (0)",
           "running: " + Show(old_sigma) + ", file: " + Show(new_sigma));
  }

  template <typename T>
  void Live(const std::string& key, const T& old_value, const T& new_value) {
    assert(std::find(kLiveReloadKeys.begin(), kLiveReloadKeys.end(), key) !=
           kLiveReloadKeys.end());
    if (old_value == new_value) return;
    changed_.push_back(key);
    described_.push_back(key + ": " + Show(old_value) + " -> " + Show(new_value));
  }

  Status status() const { return status_; }
  std::vector<std::string> changed() const { return changed_; }
  std::vector<std::string> described() const { return described_; }

 private:
  // The line of `key` in the new file or, for a key it leaves out (its
  // default applies), of the nearest section that is present.
  int LineOf(std::string key) const {
    for (;;) {
      if (const int line = next_.line_of(key); line > 0) return line;
      const size_t dot = key.rfind('.');
      if (dot == std::string::npos) return 0;
      key.resize(dot);
    }
  }

  void Refuse(const std::string& key, const std::string& what, const std::string& values) {
    // A state directory keeps its model, accounting, schedule and privacy
    // mode for good (daemon/ledger.h): a restart with a different one on the
    // same directory is refused.
    const bool state_bound = key.rfind("model", 0) == 0 || key == "privacy.accounting" ||
                             key == "privacy.schedule" || key == "privacy.noise" ||
                             key == "privacy.noise_multiplier";
    const bool privacy_mode = key == "privacy.noise" || key == "privacy.noise_multiplier";
    status_ = InvalidArgumentError(
        next_.file + ":" + std::to_string(LineOf(key)) + ": " + key + ": cannot change on reload" +
        what + " (" + values + "); the old configuration keeps running. Changing it needs a " +
        "restart" + (state_bound ? " with a new state directory" : "") +
        (privacy_mode ? " (one privacy mode per state directory: private runs and "
                        "non-private or fixed-seed runs refuse each other's directories)"
                      : ""));
  }

  const VipsdConfig& next_;
  Status status_ = Status::Ok();
  std::vector<std::string> changed_;
  std::vector<std::string> described_;
};

}  // namespace

StatusOr<std::vector<std::string>> ChangedReloadableKeys(const VipsdConfig& a,
                                                         const VipsdConfig& b,
                                                         std::vector<std::string>* described) {
  ReloadDiff diff(b);
  // Fixed for the life of a state directory or of the process.
  diff.Fixed("model.type", a.model_type, b.model_type);
  diff.Fixed("model.lda.topics", a.lda.num_topics, b.lda.num_topics);
  diff.Fixed("model.lda.vocabulary", a.vocabulary_path, b.vocabulary_path);
  diff.Fixed("model.lda.alpha", a.lda.alpha, b.lda.alpha);
  diff.Fixed("model.lda.eta", a.lda.eta, b.lda.eta);
  diff.Fixed("model.lda.resample_length", a.lda.resample_length, b.lda.resample_length);
  diff.Fixed("model.lda.clip_fraction", a.lda.clip_fraction, b.lda.clip_fraction);
  diff.Fixed("model.lda.estep_max_iterations", a.lda.estep_max_iterations,
             b.lda.estep_max_iterations);
  diff.Fixed("model.lda.estep_tolerance", a.lda.estep_tolerance, b.lda.estep_tolerance);
  diff.Fixed("model.lda.init_seed", a.lda.init_seed, b.lda.init_seed);
  diff.Fixed("model.blr.dimension", a.blr.dim, b.blr.dim);
  diff.Fixed("model.blr.prior_shape", a.blr.prior_shape, b.blr.prior_shape);
  diff.Fixed("model.blr.prior_rate", a.blr.prior_rate, b.blr.prior_rate);
  diff.Fixed("model.blr.eigenvalue_floor", a.blr.eigenvalue_floor, b.blr.eigenvalue_floor);
  diff.Fixed("model.blr.norm_rule", a.blr_norm_rule, b.blr_norm_rule);
  diff.Fixed("model.sbn.visible", a.sbn.visible, b.sbn.visible);
  diff.Fixed("model.sbn.hidden", a.sbn.hidden, b.sbn.hidden);
  diff.Fixed("model.sbn.weight_prior_precision", a.sbn.weight_prior_precision,
             b.sbn.weight_prior_precision);
  diff.Fixed("model.sbn.visible_bias_prior_precision", a.sbn.visible_bias_prior_precision,
             b.sbn.visible_bias_prior_precision);
  diff.Fixed("model.sbn.hidden_bias_prior_precision", a.sbn.hidden_bias_prior_precision,
             b.sbn.hidden_bias_prior_precision);
  diff.Fixed("model.sbn.init_weight_std", a.sbn.init_weight_std, b.sbn.init_weight_std);
  diff.Fixed("model.sbn.init_variance", a.sbn.init_variance, b.sbn.init_variance);
  diff.Fixed("model.sbn.estep_max_iterations", a.sbn.estep_max_iterations,
             b.sbn.estep_max_iterations);
  diff.Fixed("model.sbn.estep_tolerance", a.sbn.estep_tolerance, b.sbn.estep_tolerance);
  diff.Fixed("model.sbn.init_seed", a.sbn.init_seed, b.sbn.init_seed);
  for (auto [key, x, y] :
       {std::tuple<const char*, double, double>{"count", a.sbn.clip_fractions.count,
                                                b.sbn.clip_fractions.count},
        {"z", a.sbn.clip_fractions.z, b.sbn.clip_fractions.z},
        {"y", a.sbn.clip_fractions.y, b.sbn.clip_fractions.y},
        {"xi", a.sbn.clip_fractions.xi, b.sbn.clip_fractions.xi},
        {"xi_z", a.sbn.clip_fractions.xi_z, b.sbn.clip_fractions.xi_z},
        {"y_z", a.sbn.clip_fractions.y_z, b.sbn.clip_fractions.y_z},
        {"xi_zz", a.sbn.clip_fractions.xi_zz, b.sbn.clip_fractions.xi_zz}}) {
    diff.Fixed(std::string("model.sbn.clip_fractions.") + key, x, y);
  }
  diff.Fixed("privacy.delta", a.driver.delta, b.driver.delta);
  auto noise_name = [](NoiseMode mode) {
    return std::string(mode == NoiseMode::kSecure ? "secure" : "fixed_seed");
  };
  diff.Fixed("privacy.noise", noise_name(a.noise_mode), noise_name(b.noise_mode));
  diff.Fixed("privacy.noise_seed", a.noise_seed, b.noise_seed);
  diff.Fixed("privacy.schedule", a.schedule.has_value() ? static_cast<int>(*a.schedule) : -1,
             b.schedule.has_value() ? static_cast<int>(*b.schedule) : -1);
  diff.Fixed("privacy.accounting", static_cast<int>(a.accounting),
             static_cast<int>(b.accounting));
  diff.PrivacyMode(a.driver.noise_multiplier, b.driver.noise_multiplier);
  diff.Fixed("source.type", static_cast<int>(a.source_type), static_cast<int>(b.source_type));
  diff.Fixed("source.path", a.source_path, b.source_path);
  diff.Fixed("source.topics", a.source_topics, b.source_topics);
  diff.Fixed("source.group_id", a.group_id, b.group_id);
  diff.Fixed("source.start_position", a.start_position, b.start_position);
  diff.Fixed("source.max_record_bytes", a.max_record_bytes, b.max_record_bytes);
  diff.Fixed("sink.type", static_cast<int>(a.sink_type), static_cast<int>(b.sink_type));
  diff.Fixed("sink.directory", a.sink_directory, b.sink_directory);
  diff.Fixed("sink.topic", a.release_topic, b.release_topic);
  diff.Fixed("sink.mirror_directory", a.sink_mirror_directory, b.sink_mirror_directory);
  diff.Fixed("sink.publish_timeout_seconds", a.publish_timeout_seconds,
             b.publish_timeout_seconds);
  diff.Fixed("dead_letter.path", a.dead_letter_path, b.dead_letter_path);
  diff.Fixed("dead_letter.topic", a.dead_letter_topic, b.dead_letter_topic);
  diff.Fixed("alerts.topic", a.alert_topic, b.alert_topic);
  diff.Fixed("kafka.embedded", a.kafka.embedded, b.kafka.embedded);
  diff.Fixed("kafka.bootstrap_servers", a.kafka.bootstrap_servers, b.kafka.bootstrap_servers);
  diff.Fixed("kafka.client_id", a.kafka.client_id, b.kafka.client_id);
  diff.Fixed("kafka.properties", a.kafka.properties, b.kafka.properties);
  diff.Fixed("kafka.consumer_properties", a.kafka.consumer_properties,
             b.kafka.consumer_properties);
  diff.Fixed("kafka.producer_properties", a.kafka.producer_properties,
             b.kafka.producer_properties);
  diff.Fixed("kafka.demo_corpus", a.kafka.demo_corpus, b.kafka.demo_corpus);
  diff.Fixed("kafka.partitions", a.kafka.partitions, b.kafka.partitions);
  diff.Fixed("state.directory", a.state_directory, b.state_directory);
  diff.Fixed("state.ledger_topic", a.ledger_topic, b.ledger_topic);
  diff.Fixed("state.ledger_key", a.ledger_key, b.ledger_key);
  diff.Fixed("state.standby_takeover_seconds", a.standby_takeover_seconds,
             b.standby_takeover_seconds);
  diff.Fixed("state.work_topic", a.work_topic, b.work_topic);
  diff.Fixed("metrics.listen", a.metrics_listen, b.metrics_listen);
  diff.Fixed("metrics.expose_step_timing", a.expose_step_timing, b.expose_step_timing);
  diff.Fixed("schedule.start_time", a.start_time, b.start_time);
  VIPSD_RETURN_IF_ERROR(diff.status());
  // Live.
  diff.Live("privacy.noise_multiplier", a.driver.noise_multiplier, b.driver.noise_multiplier);
  diff.Live("privacy.sampling_rate", a.driver.sampling_rate, b.driver.sampling_rate);
  diff.Live("privacy.epsilon_ceiling", a.driver.epsilon_ceiling, b.driver.epsilon_ceiling);
  diff.Live("privacy.on_ceiling", static_cast<int>(a.on_ceiling), static_cast<int>(b.on_ceiling));
  diff.Live("privacy.warn_at", a.warn_at, b.warn_at);
  diff.Live("schedule.tau0", a.driver.tau0, b.driver.tau0);
  diff.Live("schedule.kappa", a.driver.kappa, b.driver.kappa);
  diff.Live("schedule.threads", a.driver.threads, b.driver.threads);
  diff.Live("schedule.interval_seconds", a.step_interval_seconds, b.step_interval_seconds);
  diff.Live("schedule.window_steps", a.window_steps, b.window_steps);
  diff.Live("schedule.release_delay_seconds", a.release_delay_seconds, b.release_delay_seconds);
  diff.Live("schedule.max_steps", a.max_steps, b.max_steps);
  diff.Live("schedule.max_epochs", a.max_epochs, b.max_epochs);
  diff.Live("pool.capacity", a.pool_capacity, b.pool_capacity);
  diff.Live("sink.publish_every", a.publish_every, b.publish_every);
  diff.Live("state.checkpoint_every", a.checkpoint_every, b.checkpoint_every);
  diff.Live("log.level", std::string(LogLevelName(a.log_level)),
            std::string(LogLevelName(b.log_level)));
  diff.Live("log.format", std::string(a.log_format == LogFormat::kJson ? "json" : "logfmt"),
            std::string(b.log_format == LogFormat::kJson ? "json" : "logfmt"));
  if (described != nullptr) *described = diff.described();
  return diff.changed();
}

const std::vector<std::string>& LiveReloadKeys() { return kLiveReloadKeys; }

namespace {

// One covering configuration per combination that changes which keys are
// read; every optional section present so that its keys are visited.
struct Cover {
  std::string model, source, sink;
  bool embedded = false;
};

std::string CoveringYaml(const Cover& c) {
  std::string y = "model:\n  type: " + c.model + "\n  " + c.model + ":\n";
  if (c.model == "lda") y += "    topics: 2\n    vocabulary: v.txt\n";
  if (c.model == "blr") y += "    dimension: 2\n";
  if (c.model == "sbn") y += "    visible: 4\n    hidden: 2\n    clip_fractions: {}\n";
  y += "privacy:\n  noise_multiplier: 1\n  sampling_rate: 0.1\n  delta: 1.0e-5\n"
       "  epsilon_ceiling: 1\nschedule:\n  interval_seconds: 1\n";
  y += "source:\n  type: " + c.source + "\n";
  y += c.source == "kafka" ? "  topics: [t]\n" : "  path: in.jsonl\n";
  y += "sink:\n  type: " + c.sink + "\n";
  y += c.sink == "kafka" ? "  topic: r\n" : "  directory: out\n";
  y += c.source == "kafka" ? "dead_letter:\n  topic: d\n" : "dead_letter:\n  path: dead.jsonl\n";
  if (c.source == "kafka") {
    y += "pool: {}\nalerts:\n  topic: a\nkafka:\n";
    y += c.embedded ? "  embedded: true\n" : "  bootstrap_servers: b:9092\n";
  }
  y += "state:\n  directory: s\nmetrics: {}\nlog: {}\n";
  return y;
}

struct ReferenceNode {
  std::string name;
  const SchemaKey* key = nullptr;
  std::vector<int> covers;  // covering configurations that read it
  std::vector<std::unique_ptr<ReferenceNode>> children;
  ReferenceNode* Child(const std::string& child) {
    for (auto& c : children) {
      if (c->name == child) return c.get();
    }
    children.push_back(std::make_unique<ReferenceNode>());
    children.back()->name = child;
    return children.back().get();
  }
};

std::string YamlScalar(const std::string& kind, const std::string& text, bool required) {
  if (kind == "section") return "";
  if (text == "~") return text;  // a default derived from other keys
  if (text.empty()) return kind == "string" && !required ? "\"\"" : "~";
  if (kind == "string") {
    const bool plain = std::all_of(text.begin(), text.end(), [](char ch) {
      return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '-' ||
             ch == '.' || ch == '/';
    });
    return plain ? text : JsonString(text);
  }
  return text;
}

}  // namespace

std::string ReferenceConfig() {
  const std::vector<Cover> covers = {
      {"lda", "kafka", "kafka", false}, {"lda", "kafka", "kafka", true},
      {"lda", "kafka", "file", false},  {"lda", "file", "file", false},
      {"blr", "kafka", "kafka", false}, {"blr", "file", "file", false},
      {"sbn", "kafka", "kafka", false}, {"sbn", "file", "file", false},
      {"lda", "kafka", "file", true},   {"blr", "kafka", "kafka", true},
      {"sbn", "kafka", "kafka", true}};
  std::vector<std::vector<SchemaKey>> logs(covers.size());
  for (size_t i = 0; i < covers.size(); ++i) {
    schema_log = &logs[i];
    (void)ParseConfig(CoveringYaml(covers[i]), "reference.yaml");
    schema_log = nullptr;
  }
  ReferenceNode root;
  for (size_t i = 0; i < logs.size(); ++i) {
    for (const SchemaKey& key : logs[i]) {
      ReferenceNode* node = &root;
      size_t start = 0;
      for (;;) {
        const size_t dot = key.path.find('.', start);
        node = node->Child(key.path.substr(start, dot - start));
        if (dot == std::string::npos) break;
        start = dot + 1;
      }
      if (node->key == nullptr) node->key = &key;
      node->covers.push_back(static_cast<int>(i));
    }
  }
  // "only with" conditions: a dimension whose values among the covering
  // configurations that read the key are one value of several.
  auto condition = [&](const std::vector<int>& seen) {
    // Dimensions in order; one is named when the covering configurations
    // that read the key agree on its value while those matching the
    // conditions named so far do not.
    using ValueOf = std::function<std::string(const Cover&)>;
    const std::vector<std::pair<std::string, ValueOf>> dimensions = {
        {"model.type", [](const Cover& c) { return c.model; }},
        {"source.type", [](const Cover& c) { return c.source; }},
        {"sink.type", [](const Cover& c) { return c.sink; }},
        {"kafka.embedded",
         [](const Cover& c) { return std::string(c.embedded ? "true" : "false"); }}};
    std::vector<size_t> matching(covers.size());
    std::iota(matching.begin(), matching.end(), 0);
    std::string out;
    for (const auto& dimension : dimensions) {
      // (not a structured binding: clang 14 cannot capture one in a lambda)
      const std::string& name = dimension.first;
      const ValueOf& value_of = dimension.second;
      std::set<std::string> all, here;
      for (size_t i : matching) all.insert(value_of(covers[i]));
      for (int i : seen) here.insert(value_of(covers[static_cast<size_t>(i)]));
      if (here.size() != 1 || all.size() < 2) continue;
      out += (out.empty() ? "" : ", ") + name + ": " + *here.begin();
      std::erase_if(matching, [&](size_t i) { return value_of(covers[i]) != *here.begin(); });
    }
    return out;
  };
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
  std::function<void(const ReferenceNode&, int)> emit = [&](const ReferenceNode& node,
                                                            int depth) {
    for (const auto& child : node.children) {
      const SchemaKey* key = child->key;
      const std::string indent(static_cast<size_t>(2 * depth), ' ');
      std::string line = indent + child->name + ":";
      std::string comment;
      if (key == nullptr || key->kind == "section") {
        comment = std::string("section, ") + (key != nullptr && key->required ? "required" : "optional");
      } else {
        const std::string value = YamlScalar(key->kind, key->default_text, key->required);
        line += " " + value;
        const bool live = std::find(kLiveReloadKeys.begin(), kLiveReloadKeys.end(), key->path) !=
                          kLiveReloadKeys.end();
        comment = key->kind + "; " + key->allowed + "; " +
                  (key->required ? "required" : "optional") + "; " +
                  (live ? "reload: live" : "reload: restart");
      }
      const std::string when = condition(child->covers);
      if (!when.empty()) comment += "; only with " + when;
      line += std::string(line.size() < 40 ? 40 - line.size() : 1, ' ') + "# " + comment;
      out += line + "\n";
      emit(*child, depth + 1);
    }
  };
  emit(root, 0);
  return out;
}

}  // namespace vipsd::config
