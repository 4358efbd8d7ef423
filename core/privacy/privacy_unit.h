// The privacy unit's public limits (privacy.unit; docs/privacy_accounting.md
// §6d), in one place for the configuration, the step driver, the ledger and
// the release manifest: the cap on a unit's records per step, and the form
// of a unit field's name.
//
// What is private: nothing (configuration only).
// Thread-safety: constants and a pure function.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string_view>

namespace vipsd::privacy {

// privacy.max_records_per_unit is in [1, kMaxRecordsPerUnit].
inline constexpr int64_t kMaxRecordsPerUnit = 1000000;

// privacy.unit_field: 1-128 characters of A-Z a-z 0-9 _ . - (a JSON key;
// one word in the ledger's unit line).
inline bool IsUnitFieldName(std::string_view name) {
  return !name.empty() && name.size() <= 128 && std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '_' || c == '.' || c == '-';
  });
}

}  // namespace vipsd::privacy
