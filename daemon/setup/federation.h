// Federated mode (issue 31; docs/federation.md): the configuration's roster
// of data holders, a holder's secret key, and the key generator.
//
// The roster (federation.holders: id -> X25519 public key) is public; every
// process of a federation must have the same one (plans carry its
// fingerprint and a holder refuses a plan of another roster). A holder's
// secret key comes from federation.secret_key, which the configuration
// reads from a file or a systemd credential only (config/section.h
// SecretReference), never from the YAML itself.
//
// Thread-safety: pure functions, except WriteNewHolderKey (filesystem).
// Failure: INVALID_ARGUMENT naming what is wrong; messages never show a
// secret key.
#pragma once

#include <string>
#include <vector>

#include "config/config.h"
#include "core/base/status.h"
#include "core/privacy/mechanisms/secure_aggregation.h"

namespace vipsd::daemon {

// federation.holders as a validated roster, sorted by id.
StatusOr<std::vector<privacy::RosterEntry>> RosterOf(const config::FederationSettings& settings);

// BLAKE2b-256 (hex) of "id:public key\n" for every holder in id order.
std::string RosterFingerprint(const std::vector<privacy::RosterEntry>& roster);

// What every process of a federation must share, as "key: value" lines
// (compared key by key with SettingsDifference, model_setup.h): the record
// settings (model.*, the vocabulary's fingerprint, source.max_record_bytes,
// source.timestamps, the privacy unit and its cap), privacy.sampling_rate,
// privacy.noise_multiplier, privacy.noise and the roster's fingerprint. A
// holder's join carries its terms and a plan the aggregator's: a join whose
// terms differ is refused before any round names it (nothing is charged).
// Public values only.
std::string FederationTerms(const config::VipsdConfig& config, const std::string& record_settings);

// The holder's masker: its secret key (64 hex digits, the file's content)
// checked against the roster's entry for federation.holder_id. A key whose
// public key is not that entry is refused ("unknown key").
StatusOr<privacy::Masker> HolderMaskerOf(const config::FederationSettings& settings);

// A new key pair from the OS CSPRNG: the secret key (64 hex digits and a
// line end) goes to `path`, created with mode 0600 (an existing file is
// never overwritten) and synced; returns the public key (64 hex digits).
StatusOr<std::string> WriteNewHolderKey(const std::string& path);

}  // namespace vipsd::daemon
