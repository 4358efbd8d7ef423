// The key table: every configuration key, declared once.
//
// What it is: one row per key (config/keys.cc), with its dotted path, its
// Field (kind, allowed values, the VipsdConfig member it fills; default =
// that member's initializer unless the row says the default is derived),
// whether it is required, when it applies (model, source and sink type,
// kafka.embedded) and what its refusal says otherwise, what a reload does
// with a change of it, and the checks across keys that run after it is
// read. Everything else is derived from the rows:
//   the parser (config/parse.cc) walks the table, section by section, in
//     row order;
//   the reload diff (config/reload_diff.cc) compares every row's member
//     and refuses or applies a change as the row says;
//   the reference configuration (config/reference.cc) prints every row.
// Adding a key is adding a member to VipsdConfig (config/config.h) and a
// row here; parser, reload and reference then all know it.
//
// Ownership: the table is built once (thread-safe static initialisation)
// and immutable; rows and their Fields live as long as the process.
// Thread-safety: read-only after construction; safe from any thread.
// Failure: none at run time. A row that names no existing section, or a
// dimension key that is not in the table, is a programming error caught
// by an assert and by config_test (the reference would lack the key).
#pragma once

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "config/config.h"
#include "config/field.h"
#include "config/section.h"

namespace vipsd::config::internal {

enum class Need {
  kOptional,
  kRequired,
  // Required when privacy.noise_multiplier > 0 (read before it).
  kRequiredWhenPrivate,
};

// What a reload (SIGHUP) does with a changed value.
enum class Reload {
  kLive,  // the running daemon applies it
  // σ: live, but a change between 0 and > 0 is refused as kPrivacyMode.
  kLiveWithinPrivacyMode,
  kRestart,  // refused: a restart applies it
  // Refused: the state directory keeps it for good (daemon/state/ledger.h), so
  // it needs a restart with a new state directory.
  kStateDirectory,
  // As kStateDirectory, and one privacy mode per state directory: private
  // runs and non-private or fixed-seed runs refuse each other's.
  kPrivacyMode,
};
bool IsLive(Reload reload);

// The choices that decide which keys apply, in the order the reference
// names them ("only with model.type: lda, ...").
enum class Dimension { kModelType, kSourceType, kSinkType, kKafkaEmbedded };
inline constexpr std::array<Dimension, 4> kDimensions = {
    Dimension::kModelType, Dimension::kSourceType, Dimension::kSinkType, Dimension::kKafkaEmbedded};
// The value of each dimension, as a file spells it ("kafka", "true").
using Choices = std::array<std::string, kDimensions.size()>;

// The key that decides a dimension ("source.type").
std::string_view DimensionKey(Dimension dimension);
// The choices `config` has made (its dimension keys, as read so far).
Choices ChoicesOf(const VipsdConfig& config);

// A key applies only when a dimension has one value.
struct When {
  Dimension dimension;
  std::string value;
  // The error if the key is present when it does not apply; "" = "only
  // allowed with <dimension key>: <value>".
  std::string refusal;

  bool Holds(const Choices& choices) const;
  std::string Refusal() const;
};

// One value of a choice key that needs another choice ("sink.type: kafka"
// needs "source.type: kafka"): an error at the key otherwise.
struct ValueRule {
  std::string value;
  When needs;
};

// One row of the table. Rows are built with the helpers in keys.cc
// (Number(...).Required().Live()) and never change afterwards.
struct Key {
  std::string path;                    // "privacy.sampling_rate"
  std::shared_ptr<const Field> field;  // null for a section or a removed key
  bool is_section = false;
  std::string removed;  // non-empty: no longer a key; the error says why
  Need need = Need::kOptional;
  std::optional<When> when;  // unset: wherever its section applies
  std::vector<ValueRule> value_rules;
  std::optional<Reload> reload;  // unset: its section's (kRestart at the top)
  // The default depends on other keys or on the state directory (the
  // allowed text says how): the reference shows none.
  bool derived_default = false;
  // Sets the derived default before the key is read (a value in the file
  // replaces it).
  void (*derive)(VipsdConfig& config) = nullptr;
  // A check across keys, run after the key (a section: its keys) is read;
  // `section` is the key's section (a section: itself).
  void (*check)(Section& section, VipsdConfig& config) = nullptr;

  std::string_view leaf() const;    // "sampling_rate"
  std::string_view parent() const;  // "privacy" ("" at the top level)
  bool required(const VipsdConfig& config) const;

  // Builders, for the table.
  Key& Required() {
    need = Need::kRequired;
    return *this;
  }
  Key& RequiredWhenPrivate() {
    need = Need::kRequiredWhenPrivate;
    return *this;
  }
  Key& Only(Dimension dimension, std::string value, std::string refusal = "") {
    when = When{dimension, std::move(value), std::move(refusal)};
    return *this;
  }
  Key& ValueNeeds(std::string value, Dimension dimension, std::string needed, std::string refusal) {
    value_rules.push_back(
        {std::move(value), When{dimension, std::move(needed), std::move(refusal)}});
    return *this;
  }
  Key& Live() {
    reload = Reload::kLive;
    return *this;
  }
  Key& OnReload(Reload what) {
    reload = what;
    return *this;
  }
  Key& DerivedDefault(void (*set)(VipsdConfig&) = nullptr) {
    derived_default = true;
    derive = set;
    return *this;
  }
  Key& Check(void (*run)(Section&, VipsdConfig&)) {
    check = run;
    return *this;
  }
};

// Every key in table order: a section before its keys, a section's keys in
// the order the parser reads them (which is also the reference's order).
const std::vector<Key>& Keys();
// The row of `path`, or null.
const Key* FindKey(std::string_view path);
// The row's reload behaviour, or its nearest section's; kRestart if none.
Reload ReloadOf(const Key& key);
// Whether `key` and every section above it apply with `choices`.
bool AppliesWith(const Key& key, const Choices& choices);

}  // namespace vipsd::config::internal
