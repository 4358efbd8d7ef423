// Field: where the value of one configuration key lives in VipsdConfig, and
// how it is read from YAML, spelt and compared.
//
// What it is: the typed half of a key-table row (config/keys.h). A row
// names the key, its rules and its reload behaviour; its Field binds the
// key to the VipsdConfig member it fills (an accessor, `[](auto& c) ->
// auto& { return c.member; }`) so that one declaration serves the parser
// (Read), the reload diff (Same, Show) and the reference configuration
// (kind, allowed, DefaultText). Show spells every value as a configuration
// file does — enums by their names ("adaptive", never 1), booleans as
// true/false, numbers in their shortest round-trip form — so that no
// message prints an enum as a number.
//
// Ownership: a Field is immutable and owned (shared) by its table row; it
// holds no configuration, only the accessor and the rules.
// Thread-safety: all methods are const and thread-safe.
// Failure: Read records errors in the Section's Diagnostics (never throws
// and never returns one); the other methods cannot fail.
#pragma once

#include <concepts>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "config/config.h"
#include "config/section.h"

namespace vipsd::config::internal {

class Field {
 public:
  virtual ~Field() = default;

  // Reads `leaf` of `section` into `config` (errors go to the section's
  // Diagnostics; a value that fails keeps what the member held).
  virtual void Read(Section& section, const std::string& leaf, bool required,
                    VipsdConfig& config) const = 0;

  // For the reference: "number", "integer", "string", "bool", "list" or
  // "map"; the allowed values; the YAML text of the value `config` holds
  // ("" where the kind shows no default).
  virtual std::string_view kind() const = 0;
  virtual std::string allowed() const = 0;
  virtual std::string DefaultText(const VipsdConfig& config) const = 0;

  // The value `config` holds, spelt as a configuration file spells it.
  virtual std::string Show(const VipsdConfig& config) const = 0;
  virtual bool Same(const VipsdConfig& a, const VipsdConfig& b) const = 0;
  // Whether Show may reveal a credential (librdkafka properties): then no
  // message shows the value.
  virtual bool secret() const { return false; }
  // The values a choice key allows, as spelt in a file (empty otherwise).
  virtual std::vector<std::string> choices() const { return {}; }
};

// Values spelt as a configuration file spells them.
std::string ShowValue(double value);
std::string ShowValue(bool value);
std::string ShowValue(const std::string& value);
std::string ShowValue(const std::vector<double>& values);
std::string ShowValue(const std::vector<std::string>& values);
std::string ShowValue(const std::map<std::string, std::string>& values);
template <std::integral T>
requires(!std::same_as<T, bool>) std::string ShowValue(T value) { return std::to_string(value); }

// `path` relative to the directory of the configuration file `file`.
std::string ResolvePath(const std::string& file, const std::string& path);

// A predicate on a number; it may depend on keys read before it.
using NumberRule = std::function<bool(double value, const VipsdConfig& config)>;

// One value of an enum as a configuration file spells it.
template <typename E>
struct Named {
  std::string_view name;
  E value;
};

namespace field_detail {

// The member an accessor reaches, without reference or const.
template <typename Get>
using MemberOf = std::remove_cvref_t<decltype(std::declval<Get>()(std::declval<VipsdConfig&>()))>;

// Same and Show for every member type ShowValue spells.
template <typename Get>
class MemberField : public Field {
 public:
  explicit MemberField(Get get) : get_(std::move(get)) {}
  bool Same(const VipsdConfig& a, const VipsdConfig& b) const override {
    return get_(a) == get_(b);
  }
  std::string Show(const VipsdConfig& config) const override { return ShowValue(get_(config)); }
  // The reference shows a default as a file would spell it.
  std::string DefaultText(const VipsdConfig& config) const override { return Show(config); }

 protected:
  Get get_;
};

}  // namespace field_detail

template <typename Get>
class NumberField final : public field_detail::MemberField<Get> {
 public:
  NumberField(Get get, NumberRule ok, std::string allowed)
      : field_detail::MemberField<Get>(std::move(get)),
        ok_(std::move(ok)),
        allowed_(std::move(allowed)) {}
  void Read(Section& section, const std::string& leaf, bool required,
            VipsdConfig& config) const override {
    const VipsdConfig& read_so_far = config;
    section.Number(
        leaf, required, [&](double x) { return ok_(x, read_so_far); }, allowed_,
        &this->get_(config));
  }
  std::string_view kind() const override { return "number"; }
  std::string allowed() const override { return allowed_; }

 private:
  NumberRule ok_;
  std::string allowed_;
};

// A whole number in [low, high] (any integral member), or a keyword that
// stands for one value ("all" for schedule.window_steps).
template <typename Get>
class IntegerField final : public field_detail::MemberField<Get> {
  using Member = field_detail::MemberOf<Get>;

 public:
  IntegerField(Get get, int64_t low, int64_t high, std::optional<std::string> keyword = {},
               int64_t keyword_value = 0)
      : field_detail::MemberField<Get>(std::move(get)),
        low_(low),
        high_(high),
        keyword_(std::move(keyword)),
        keyword_value_(keyword_value) {}
  void Read(Section& section, const std::string& leaf, bool required,
            VipsdConfig& config) const override {
    int64_t value = static_cast<int64_t>(this->get_(config));
    if (keyword_.has_value()) {
      section.IntegerOrKeyword(leaf, *keyword_, keyword_value_, low_, high_, &value);
    } else {
      section.Integer(leaf, required, low_, high_, &value);
    }
    this->get_(config) = static_cast<Member>(value);
  }
  std::string_view kind() const override { return "integer"; }
  std::string allowed() const override {
    return keyword_.has_value() ? *keyword_ + " or " + RangeText(low_, high_)
                                : RangeText(low_, high_);
  }
  std::string Show(const VipsdConfig& config) const override {
    const int64_t value = static_cast<int64_t>(this->get_(config));
    return keyword_.has_value() && value == keyword_value_ ? *keyword_ : ShowValue(value);
  }

 private:
  int64_t low_, high_;
  std::optional<std::string> keyword_;
  int64_t keyword_value_;
};

// A non-empty string: one of `choices` if there are any; a path resolved
// against the configuration file's directory if `is_path`; matching
// `rule` (else "must be <rule_text>") if there is one.
template <typename Get>
class StringField final : public field_detail::MemberField<Get> {
 public:
  struct Options {
    std::vector<std::string> choices;
    bool is_path = false;
    std::function<bool(const std::string&)> rule;
    std::string rule_text;
  };
  StringField(Get get, Options options)
      : field_detail::MemberField<Get>(std::move(get)), options_(std::move(options)) {}
  void Read(Section& section, const std::string& leaf, bool required,
            VipsdConfig& config) const override {
    std::string& value = this->get_(config);
    section.String(leaf, required, options_.choices, &value);
    if (value.empty()) return;
    if (options_.is_path) value = ResolvePath(config.file, value);
    if (options_.rule && !options_.rule(value)) {
      section.ErrorAt(leaf, "must be " + options_.rule_text);
    }
  }
  std::string_view kind() const override { return "string"; }
  std::string allowed() const override {
    if (options_.choices.empty()) return "a non-empty string";
    std::string text;
    for (const auto& choice : options_.choices) text += (text.empty() ? "" : " | ") + choice;
    return text;
  }
  std::vector<std::string> choices() const override { return options_.choices; }

 private:
  Options options_;
};

// A string that may be empty: "" or absent turns a feature off.
template <typename Get>
class OptionalStringField final : public field_detail::MemberField<Get> {
 public:
  OptionalStringField(Get get, bool is_path)
      : field_detail::MemberField<Get>(std::move(get)), is_path_(is_path) {}
  void Read(Section& section, const std::string& leaf, bool /*required*/,
            VipsdConfig& config) const override {
    std::string& value = this->get_(config);
    section.OptionalString(leaf, &value);
    if (is_path_ && !value.empty()) value = ResolvePath(config.file, value);
  }
  std::string_view kind() const override { return "string"; }
  std::string allowed() const override { return "a string (\"\" or absent: off)"; }

 private:
  bool is_path_;
};

// An enum member (or an optional one: unset until the file names a value)
// read and shown by the names in `names`.
template <typename Get, typename E>
class ChoiceField final : public Field {
  using Member = field_detail::MemberOf<Get>;
  static constexpr bool kOptional = std::is_same_v<Member, std::optional<E>>;
  static_assert(kOptional || std::is_same_v<Member, E>);

 public:
  ChoiceField(Get get, std::span<const Named<E>> names) : get_(std::move(get)), names_(names) {}
  void Read(Section& section, const std::string& leaf, bool required,
            VipsdConfig& config) const override {
    std::string text = Name(this->get_(config));
    section.String(leaf, required, choices(), &text);
    for (const Named<E>& named : names_) {
      if (named.name == text) this->get_(config) = named.value;
    }
  }
  std::string_view kind() const override { return "string"; }
  std::string allowed() const override {
    std::string text;
    for (const Named<E>& named : names_)
      text += (text.empty() ? "" : " | ") + std::string(named.name);
    return text;
  }
  std::string DefaultText(const VipsdConfig& config) const override {
    return Name(this->get_(config));
  }
  std::string Show(const VipsdConfig& config) const override {
    const std::string name = Name(this->get_(config));
    return name.empty() ? "not set" : name;
  }
  bool Same(const VipsdConfig& a, const VipsdConfig& b) const override {
    return get_(a) == get_(b);
  }
  std::vector<std::string> choices() const override {
    std::vector<std::string> out;
    for (const Named<E>& named : names_) out.emplace_back(named.name);
    return out;
  }

 private:
  // "" for an unset optional.
  std::string Name(const Member& value) const {
    if constexpr (kOptional) {
      return value.has_value() ? NameOf(*value) : "";
    } else {
      return NameOf(value);
    }
  }
  std::string NameOf(const E& value) const {
    for (const Named<E>& named : names_) {
      if (named.value == value) return std::string(named.name);
    }
    return "";
  }

  Get get_;
  std::span<const Named<E>> names_;
};

// A non-empty list of distinct strings, each matching `rule`.
template <typename Get>
class StringListField final : public field_detail::MemberField<Get> {
 public:
  StringListField(Get get, std::function<bool(const std::string&)> rule, std::string rule_text)
      : field_detail::MemberField<Get>(std::move(get)),
        rule_(std::move(rule)),
        rule_text_(std::move(rule_text)) {}
  void Read(Section& section, const std::string& leaf, bool required,
            VipsdConfig& config) const override {
    section.StringList(leaf, required, rule_, rule_text_, &this->get_(config));
  }
  std::string_view kind() const override { return "list"; }
  std::string allowed() const override { return "a non-empty list of " + rule_text_; }
  std::string DefaultText(const VipsdConfig&) const override { return ""; }

 private:
  std::function<bool(const std::string&)> rule_;
  std::string rule_text_;
};

// A list of numbers (possibly empty), each matching `rule`.
template <typename Get>
class NumberListField final : public field_detail::MemberField<Get> {
 public:
  NumberListField(Get get, std::function<bool(double)> rule, std::string rule_text)
      : field_detail::MemberField<Get>(std::move(get)),
        rule_(std::move(rule)),
        rule_text_(std::move(rule_text)) {}
  void Read(Section& section, const std::string& leaf, bool /*required*/,
            VipsdConfig& config) const override {
    section.NumberList(leaf, rule_, rule_text_, &this->get_(config));
  }
  std::string_view kind() const override { return "list"; }
  std::string allowed() const override { return "a list of " + rule_text_; }

 private:
  std::function<bool(double)> rule_;
  std::string rule_text_;
};

// A member read by a Section accessor that takes only the key and the
// member (Bool, PropertyMap); what the reference says of it is data.
template <typename Get>
class PlainField final : public field_detail::MemberField<Get> {
  using Member = field_detail::MemberOf<Get>;

 public:
  struct Traits {
    void (Section::*read)(const std::string& key, Member* out) = nullptr;
    std::string_view kind;
    std::string allowed;
    std::optional<std::string> default_text;  // unset: Show
    bool secret = false;                      // librdkafka properties
    std::vector<std::string> choices;
  };
  PlainField(Get get, Traits traits)
      : field_detail::MemberField<Get>(std::move(get)), traits_(std::move(traits)) {}
  void Read(Section& section, const std::string& leaf, bool /*required*/,
            VipsdConfig& config) const override {
    (section.*traits_.read)(leaf, &this->get_(config));
  }
  std::string_view kind() const override { return traits_.kind; }
  std::string allowed() const override { return traits_.allowed; }
  std::string DefaultText(const VipsdConfig& config) const override {
    return traits_.default_text.value_or(this->Show(config));
  }
  bool secret() const override { return traits_.secret; }
  std::vector<std::string> choices() const override { return traits_.choices; }

 private:
  Traits traits_;
};

}  // namespace vipsd::config::internal
