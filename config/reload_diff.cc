// The reload diff: ChangedReloadableKeys and LiveReloadKeys
// (config/config.h).
//
// Every key of the table (config/keys.h) is compared between the running
// configuration and the file; each row's Reload says whether a change is
// applied live or refused, and what the refusal says. Values are shown as a
// configuration file spells them (Field::Show: enums by name, never as
// numbers), except librdkafka properties, which may hold credentials and
// are never shown.
//
// Thread-safety: pure. Failure: INVALID_ARGUMENT naming the first refused
// key in table order, its line in the new file and both values.
#include "config/config.h"
#include "config/keys.h"

namespace vipsd::config {
namespace {

using internal::Key;
using internal::Reload;

// The line of `key` in `next` or, for a key it leaves out (its default
// applies), of the nearest section that is present.
int LineOf(const VipsdConfig& next, std::string key) {
  for (;;) {
    if (const int line = next.line_of(key); line > 0) return line;
    const size_t dot = key.rfind('.');
    if (dot == std::string::npos) return 0;
    key.resize(dot);
  }
}

// `what` qualifies the change (" between private (> 0) and non-private
// (0)"); `reload` says what a restart needs.
Status Refusal(const VipsdConfig& running, const VipsdConfig& next, const Key& key,
               const std::string& what, Reload reload) {
  const bool privacy_mode =
      reload == Reload::kPrivacyMode || reload == Reload::kLiveWithinPrivacyMode;
  const bool state_bound = privacy_mode || reload == Reload::kStateDirectory;
  const std::string values =
      key.field->secret()
          ? std::string("the values are not shown: they may hold credentials")
          : "running: " + key.field->Show(running) + ", file: " + key.field->Show(next);
  return InvalidArgumentError(
      KeyWhere(next.file, LineOf(next, key.path), key.path) + "cannot change on reload" + what +
      " (" + values +
      "); the old configuration keeps running. Changing it needs a restart" +
      (state_bound ? " with a new state directory" : "") +
      (privacy_mode ? " (one privacy mode per state directory: private runs and non-private or "
                      "fixed-seed runs refuse each other's directories)"
                    : ""));
}

}  // namespace

StatusOr<std::vector<std::string>> ChangedReloadableKeys(const VipsdConfig& running,
                                                         const VipsdConfig& next,
                                                         std::vector<std::string>* described) {
  std::vector<std::string> changed, lines;
  for (const Key& key : internal::Keys()) {
    if (key.field == nullptr || key.field->Same(running, next)) continue;
    const Reload reload = internal::ReloadOf(key);
    if (reload == Reload::kLiveWithinPrivacyMode && running.is_private() != next.is_private()) {
      return Refusal(running, next, key, " between private (> 0) and non-private (0)", reload);
    }
    if (!internal::IsLive(reload)) return Refusal(running, next, key, "", reload);
    changed.push_back(key.path);
    lines.push_back(key.path + ": " + key.field->Show(running) + " -> " + key.field->Show(next));
  }
  if (described != nullptr) *described = std::move(lines);
  return changed;
}

const std::vector<std::string>& LiveReloadKeys() {
  static const std::vector<std::string> live = [] {
    std::vector<std::string> keys;
    for (const Key& key : internal::Keys()) {
      if (key.field != nullptr && internal::IsLive(internal::ReloadOf(key)))
        keys.push_back(key.path);
    }
    return keys;
  }();
  return live;
}

}  // namespace vipsd::config
