#include "daemon/setup/federation.h"

#include <fcntl.h>
#include <sodium.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>

#include "core/base/format.h"
#include "core/release/release.h"

namespace vipsd::daemon {

StatusOr<std::vector<privacy::RosterEntry>> RosterOf(const config::FederationSettings& settings) {
  std::vector<privacy::RosterEntry> roster;
  for (const auto& [id, hex] : settings.holders) {  // a std::map: sorted by id
    auto key = privacy::ParsePublicKeyHex(hex);
    if (!key.ok()) {
      return InvalidArgumentError("federation.holders." + id + ": " +
                                  std::string(key.status().message()));
    }
    roster.push_back({id, *key});
  }
  const Status valid = privacy::ValidateRoster(roster);
  if (!valid.ok()) return InvalidArgumentError("federation.holders: " + std::string(valid.message()));
  return roster;
}

std::string RosterFingerprint(const std::vector<privacy::RosterEntry>& roster) {
  std::string text;
  for (const privacy::RosterEntry& entry : roster) {
    text += entry.id + ":" + privacy::PublicKeyHex(entry.public_key) + "\n";
  }
  return release::Blake2bHex(text);
}

std::string FederationTerms(const config::VipsdConfig& config, const std::string& record_settings) {
  std::string terms = record_settings;
  terms += "privacy.sampling_rate: " + ShortestNumber(config.driver.mechanism.sampling_rate) + "\n";
  terms += "privacy.noise_multiplier: " +
           ShortestNumber(config.driver.mechanism.noise_multiplier) + "\n";
  terms += std::string("privacy.noise: ") +
           (config.noise_mode == config::NoiseMode::kSecure ? "secure" : "fixed_seed") + "\n";
  auto roster = RosterOf(config.federation);
  terms += "federation.holders (BLAKE2b-256 of ids and keys): " +
           (roster.ok() ? RosterFingerprint(*roster) : std::string("invalid")) + "\n";
  return terms;
}

StatusOr<privacy::Masker> HolderMaskerOf(const config::FederationSettings& settings) {
  VIPSD_ASSIGN_OR_RETURN(auto roster, RosterOf(settings));
  const std::string& hex = settings.secret_key;
  std::array<uint8_t, privacy::kHolderKeyBytes> bytes{};
  size_t length = 0;
  const bool parsed = hex.size() == 2 * bytes.size() &&
                      sodium_hex2bin(bytes.data(), bytes.size(), hex.data(), hex.size(), nullptr,
                                     &length, nullptr) == 0 &&
                      length == bytes.size();
  if (!parsed) {
    sodium_memzero(bytes.data(), bytes.size());
    return InvalidArgumentError(
        "federation.secret_key: the file must hold the holder's X25519 secret key as 64 hex "
        "digits (`vipsd federation-keygen --out PATH` writes one)");
  }
  auto secret = privacy::HolderSecretKey::FromBytes(bytes);
  sodium_memzero(bytes.data(), bytes.size());
  if (!secret.ok()) return secret.status();
  auto masker = privacy::Masker::Create(*secret, settings.holder_id, roster);
  if (!masker.ok()) {
    return InvalidArgumentError("federation: holder '" + settings.holder_id +
                                "': " + std::string(masker.status().message()));
  }
  return masker;
}

StatusOr<std::string> WriteNewHolderKey(const std::string& path) {
  VIPSD_ASSIGN_OR_RETURN(auto secret, privacy::HolderSecretKey::Generate());
  std::array<char, 2 * privacy::kHolderKeyBytes + 1> hex{};
  sodium_bin2hex(hex.data(), hex.size(), secret.bytes().data(), secret.bytes().size());
  hex[hex.size() - 1] = '\n';  // replaces the terminating NUL
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    const int error = errno;
    sodium_memzero(hex.data(), hex.size());
    return InvalidArgumentError("cannot create " + path + ": " + std::strerror(error) +
                                (error == EEXIST ? " (an existing key is never overwritten)" : ""));
  }
  size_t written = 0;
  while (written < hex.size()) {
    const ssize_t n = ::write(fd, hex.data() + written, hex.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    written += static_cast<size_t>(n);
  }
  sodium_memzero(hex.data(), hex.size());
  const bool synced = written == hex.size() && ::fsync(fd) == 0;
  ::close(fd);
  if (!synced) {
    ::unlink(path.c_str());
    return InternalError("cannot write " + path);
  }
  return privacy::PublicKeyHex(secret.PublicKey());
}

}  // namespace vipsd::daemon
