#include "config/section.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "config/secrets.h"
#include "config/suggest.h"
#include "config/where.h"

namespace vipsd::config::internal {

std::string RangeText(int64_t low, int64_t high) {
  return "a whole number in [" + std::to_string(low) + ", " + std::to_string(high) + "]";
}

Section::Section(const std::string& file, YAML::Node node, std::string path,
                 std::map<std::string, int>* lines, Diagnostics* diag)
    : file_(file), node_(std::move(node)), path_(std::move(path)), lines_(lines), diag_(diag) {}

Section Section::Absent(const std::string& file, std::string path,
                        std::map<std::string, int>* lines, Diagnostics* diag) {
  Section section(file, YAML::Node(), std::move(path), lines, diag);
  section.valid_ = false;
  return section;
}

void Section::Check() {
  if (!node_.IsMap()) {
    valid_ = false;
    (void)Error(node_, path_.empty() ? "the file" : path_, "must be a mapping");
    return;
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
}

bool Section::Has(const std::string& key) const {
  return valid_ && node_[key].IsDefined() && !node_[key].IsNull();
}

std::string Section::Join(const std::string& key) const {
  return path_.empty() ? key : path_ + "." + key;
}

Section Section::Child(const std::string& key, bool required) {
  if (!valid_) return Absent(file_, Join(key), lines_, diag_);
  Consume(key);
  if (!Has(key)) {
    if (required) (void)Missing(key);
    return Absent(file_, Join(key), lines_, diag_);
  }
  Section child(file_, node_[key], Join(key), lines_, diag_);
  child.Check();
  return child;
}

void Section::Number(const std::string& key, bool required, const std::function<bool(double)>& ok,
                     const std::string& allowed, double* out) {
  (void)NumberImpl(key, required, ok, allowed, out);
}

void Section::Integer(const std::string& key, bool required, int64_t low, int64_t high,
                      int64_t* out) {
  (void)BoundedInteger(key, required, low, high, RangeText(low, high), out);
}

void Section::IntegerOrKeyword(const std::string& key, const std::string& keyword,
                               int64_t keyword_value, int64_t low, int64_t high, int64_t* out) {
  if (Has(key) && node_[key].IsScalar() && node_[key].Scalar() == keyword) {
    Consume(key);
    *out = keyword_value;
    return;
  }
  (void)BoundedInteger(key, false, low, high, keyword + " or " + RangeText(low, high), out);
}

void Section::String(const std::string& key, bool required, const std::vector<std::string>& choices,
                     std::string* out) {
  if (!valid_) return;
  Consume(key);
  if (!Has(key)) {
    if (required) (void)Missing(key);
    return;
  }
  (void)ParseString(node_[key], Join(key), choices, out);
}

void Section::OptionalString(const std::string& key, std::string* out) {
  if (!valid_) return;
  Consume(key);
  if (!node_[key].IsDefined()) return;
  const YAML::Node value = node_[key];
  if (value.IsNull()) {
    out->clear();
    return;
  }
  if (!value.IsScalar()) {
    (void)Error(value, Join(key), "must be a string");
    return;
  }
  *out = value.Scalar();
}

void Section::Bool(const std::string& key, bool* out) {
  if (!valid_) return;
  Consume(key);
  if (!Has(key)) return;
  const YAML::Node value = node_[key];
  if (value.IsScalar() && (value.Scalar() == "true" || value.Scalar() == "false")) {
    *out = value.Scalar() == "true";
    return;
  }
  (void)Error(value, Join(key),
              "must be true or false, got '" + (value.IsScalar() ? value.Scalar() : "?") + "'");
}

void Section::StringList(const std::string& key, bool required,
                         const std::function<bool(const std::string&)>& ok,
                         const std::string& allowed, std::vector<std::string>* out) {
  (void)StringListImpl(key, required, ok, allowed, out);
}

void Section::NumberList(const std::string& key, const std::function<bool(double)>& ok,
                         const std::string& allowed, std::vector<double>* out) {
  (void)NumberListImpl(key, ok, allowed, out);
}

void Section::PropertyMap(const std::string& key, std::map<std::string, std::string>* out) {
  if (!valid_) return;
  Consume(key);
  if (!Has(key)) return;
  Section map(file_, node_[key], Join(key), lines_, diag_);
  map.Check();
  if (!map.valid()) return;
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
}

void Section::PublicKeyMap(const std::string& key, std::map<std::string, std::string>* out) {
  if (!valid_) return;
  Consume(key);
  if (!Has(key)) return;
  Section map(file_, node_[key], Join(key), lines_, diag_);
  map.Check();
  if (!map.valid()) return;
  for (const auto& entry : node_[key]) {
    if (!entry.first.IsScalar()) continue;  // reported by Check
    const std::string id = entry.first.Scalar();
    const std::string name = Join(key) + "." + id;
    (*lines_)[name] = entry.first.Mark().line + 1;
    bool id_ok = !id.empty() && id.size() <= 64;
    for (char c : id) {
      id_ok = id_ok && (std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '.' ||
                        c == '_' || c == '-');
    }
    if (!id_ok) {
      (void)Error(entry.first, name, "a holder id must be 1-64 of a-z A-Z 0-9 . _ -");
      continue;
    }
    std::string hex = entry.second.IsScalar() ? entry.second.Scalar() : std::string();
    bool hex_ok = hex.size() == 64;
    for (char& c : hex) {
      c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      hex_ok = hex_ok && std::isxdigit(static_cast<unsigned char>(c)) != 0;
    }
    if (!hex_ok) {
      (void)Error(entry.second, name,
                  "must be the holder's X25519 public key, 64 hex digits (`vipsd federation-keygen` "
                  "prints it)");
      continue;
    }
    (*out)[id] = std::move(hex);
  }
}

void Section::SecretReference(const std::string& key, std::string* out) {
  if (!valid_) return;
  Consume(key);
  if (!Has(key)) return;
  const YAML::Node value = node_[key];
  if (value.IsScalar()) {
    (void)Error(value, Join(key),
                "a secret key is never written in the configuration file: use {file: PATH} "
                "(mode 0600) or {credential: NAME} (systemd LoadCredential=)");
    return;
  }
  if (!value.IsMap() || value.size() != 1 || !value.begin()->first.IsScalar() ||
      !value.begin()->second.IsScalar()) {
    (void)Error(value, Join(key), "must be one of {file: PATH}, {credential: NAME}");
    return;
  }
  const std::string kind = value.begin()->first.Scalar();
  if (kind != "file" && kind != "credential") {
    (void)Error(value, Join(key),
                "must be one of {file: PATH}, {credential: NAME} (got '" + kind +
                    "': an environment variable is readable by every process of the user)");
    return;
  }
  auto secret = SecretValue(kind, value.begin()->second.Scalar(), file_);
  if (!secret.ok()) {
    (void)Error(value, Join(key), std::string(secret.status().message()));
    return;
  }
  *out = std::move(*secret);
}

void Section::Finish() {
  for (const auto& [key, line] : unread_) {
    std::string what = "unknown key";
    if (const auto close = Closest(key, known_)) what += "; did you mean '" + *close + "'?";
    Record(line, KeyWhere(file_, line, Join(key)) + what);
  }
  unread_.clear();
}

void Section::NotHere(const std::string& key, const std::string& why) {
  if (!valid_) return;
  known_.insert(key);
  if (!node_[key].IsDefined()) return;
  Consume(key);
  (void)Error(node_[key], Join(key), why);
}

void Section::ErrorAt(const std::string& key, const std::string& what) {
  if (!valid_) return;
  const YAML::Node value = node_[key];
  (void)Error(value.IsDefined() ? value : node_, Join(key), what);
}

void Section::WarnAt(const std::string& key, const std::string& what) {
  if (!valid_) return;
  const YAML::Node value = node_[key];
  const int line = (value.IsDefined() ? value : node_).Mark().line + 1;
  diag_->warnings.push_back(
      {line, KeyWhere(file_, line, Join(key)) + "warning: " + what});
}

void Section::Record(int line, std::string message) {
  diag_->errors.push_back({line, std::move(message)});
}

Status Section::Error(const YAML::Node& node, const std::string& key, const std::string& what) {
  const int line = node.Mark().line + 1;
  std::string message = KeyWhere(file_, line, key) + what;
  Record(line, message);
  return InvalidArgumentError(message);
}

Status Section::Missing(const std::string& key) {
  const int line = node_.Mark().line + 1;
  std::string message = KeyWhere(file_, line, Join(key)) + "required key is missing";
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

void Section::Consume(const std::string& key) {
  known_.insert(key);
  const auto it = unread_.find(key);
  if (it != unread_.end()) {
    (*lines_)[Join(key)] = it->second;
    unread_.erase(it);
  }
}

Status Section::NumberImpl(const std::string& key, bool required,
                           const std::function<bool(double)>& ok, const std::string& allowed,
                           double* out) {
  if (!valid_) return Status::Ok();
  Consume(key);
  if (!Has(key)) return required ? Missing(key) : Status::Ok();
  return ParseNumber(node_[key], Join(key), ok, allowed, out);
}

Status Section::BoundedInteger(const std::string& key, bool required, int64_t low, int64_t high,
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

Status Section::StringListImpl(const std::string& key, bool required,
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

Status Section::NumberListImpl(const std::string& key, const std::function<bool(double)>& ok,
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

Status Section::ParseNumber(const YAML::Node& value, const std::string& key,
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

Status Section::ParseString(const YAML::Node& value, const std::string& key,
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

}  // namespace vipsd::config::internal
