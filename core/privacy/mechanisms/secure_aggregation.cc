#include "core/privacy/mechanisms/secure_aggregation.h"

#include <sodium.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <string_view>

#include "core/base/format.h"

namespace vipsd::privacy {
namespace {

constexpr std::string_view kPairKeyLabel = "vipsd federated pair key v1";
constexpr std::string_view kJobKeyLabel = "vipsd federated job pad key v1";
constexpr std::string_view kIncarnationKeyLabel = "vipsd federated incarnation pad key v1";

void HashWithLength(crypto_generichash_state* state, std::string_view text) {
  uint8_t length[8];
  for (size_t b = 0; b < 8; ++b) length[b] = static_cast<uint8_t>(text.size() >> (8 * b));
  crypto_generichash_update(state, length, sizeof length);
  crypto_generichash_update(state, reinterpret_cast<const uint8_t*>(text.data()), text.size());
}
// Keystream words generated per ChaCha20 call (a multiple of the 8 words of
// one 64-byte block).
constexpr size_t kChunkWords = 4096;
constexpr size_t kWordsPerBlock = 8;

Status InitSodium() {
  if (sodium_init() < 0) return InternalError("libsodium could not be initialised");
  return Status::Ok();
}

bool ValidId(std::string_view id) {
  if (id.empty() || id.size() > 64) return false;
  return std::all_of(id.begin(), id.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '.' || c == '_' || c == '-';
  });
}

uint64_t LoadLittleEndian(const uint8_t* p) {
  uint64_t v = 0;
  for (int b = 7; b >= 0; --b) v = (v << 8) | p[b];
  return v;
}

}  // namespace

StatusOr<HolderSecretKey> HolderSecretKey::FromBytes(std::span<const uint8_t> bytes) {
  if (bytes.size() != kHolderKeyBytes) {
    return InvalidArgumentError("a holder secret key is " + std::to_string(kHolderKeyBytes) +
                                " bytes, got " + std::to_string(bytes.size()));
  }
  VIPSD_RETURN_IF_ERROR(InitSodium());
  HolderSecretKey key;
  std::copy(bytes.begin(), bytes.end(), key.key_.begin());
  return key;
}

StatusOr<HolderSecretKey> HolderSecretKey::Generate() {
  VIPSD_RETURN_IF_ERROR(InitSodium());
  HolderSecretKey key;
  randombytes_buf(key.key_.data(), key.key_.size());
  return key;
}

HolderSecretKey::HolderSecretKey(HolderSecretKey&& other) noexcept : key_(other.key_) {
  sodium_memzero(other.key_.data(), other.key_.size());
}

HolderSecretKey& HolderSecretKey::operator=(HolderSecretKey&& other) noexcept {
  if (this != &other) {
    key_ = other.key_;
    sodium_memzero(other.key_.data(), other.key_.size());
  }
  return *this;
}

HolderSecretKey::~HolderSecretKey() { sodium_memzero(key_.data(), key_.size()); }

HolderPublicKey HolderSecretKey::PublicKey() const {
  HolderPublicKey pk{};
  crypto_scalarmult_base(pk.data(), key_.data());
  return pk;
}

std::string PublicKeyHex(const HolderPublicKey& key) { return LowerHex(key); }

StatusOr<HolderPublicKey> ParsePublicKeyHex(std::string_view hex) {
  if (hex.size() != 2 * kHolderKeyBytes) {
    return InvalidArgumentError("a holder public key is " + std::to_string(2 * kHolderKeyBytes) +
                                " hex digits, got " + std::to_string(hex.size()) + " characters");
  }
  const auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  HolderPublicKey key{};
  for (size_t i = 0; i < key.size(); ++i) {
    const int hi = digit(hex[2 * i]);
    const int lo = digit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) {
      return InvalidArgumentError("a holder public key has a non-hex character at position " +
                                  std::to_string(hi < 0 ? 2 * i + 1 : 2 * i + 2));
    }
    key[i] = static_cast<uint8_t>(hi * 16 + lo);
  }
  return key;
}

Status ValidateRoster(std::span<const RosterEntry> roster) {
  VIPSD_RETURN_IF_ERROR(InitSodium());
  std::set<std::string> ids;
  std::set<HolderPublicKey> keys;
  // Any valid secret scalar: a public key is rejected if X25519 with it is
  // the all-zero point (a low-order point), which libsodium reports.
  std::array<uint8_t, kHolderKeyBytes> probe{};
  probe[0] = 9;
  for (const RosterEntry& entry : roster) {
    if (!ValidId(entry.id)) {
      return InvalidArgumentError("holder id '" + entry.id.substr(0, 64) +
                                  "' must be 1 to 64 characters of [A-Za-z0-9._-]");
    }
    if (!ids.insert(entry.id).second) {
      return InvalidArgumentError("holder id '" + entry.id + "' is listed twice");
    }
    if (!keys.insert(entry.public_key).second) {
      return InvalidArgumentError("holder '" + entry.id +
                                  "' has the same public key as another holder");
    }
    std::array<uint8_t, crypto_scalarmult_BYTES> shared{};
    const int rc = crypto_scalarmult(shared.data(), probe.data(), entry.public_key.data());
    sodium_memzero(shared.data(), shared.size());
    if (rc != 0) {
      return InvalidArgumentError("holder '" + entry.id +
                                  "' has an invalid public key (a low-order point)");
    }
  }
  return Status::Ok();
}

StatusOr<Masker> Masker::Create(const HolderSecretKey& secret, const std::string& own_id,
                                std::span<const RosterEntry> roster) {
  VIPSD_RETURN_IF_ERROR(ValidateRoster(roster));
  const auto own = std::find_if(roster.begin(), roster.end(),
                                [&](const RosterEntry& e) { return e.id == own_id; });
  if (own == roster.end()) {
    return InvalidArgumentError("holder '" + own_id + "' is not in the roster");
  }
  const HolderPublicKey own_public = secret.PublicKey();
  if (sodium_memcmp(own_public.data(), own->public_key.data(), own_public.size()) != 0) {
    return InvalidArgumentError("unknown key: holder '" + own_id + "' has public key " +
                                PublicKeyHex(own_public) + ", but the roster lists " +
                                PublicKeyHex(own->public_key));
  }
  Masker masker;
  masker.own_id_ = own_id;
  for (const RosterEntry& peer : roster) {
    if (peer.id == own_id) continue;
    std::array<uint8_t, crypto_scalarmult_BYTES> shared{};
    if (crypto_scalarmult(shared.data(), secret.bytes().data(), peer.public_key.data()) != 0) {
      return InvalidArgumentError("holder '" + peer.id + "' has an invalid public key");
    }
    Pair pair;
    pair.peer_id = peer.id;
    pair.add = own_id < peer.id;
    const RosterEntry& lo = pair.add ? *own : peer;
    const RosterEntry& hi = pair.add ? peer : *own;
    crypto_generichash_state state;
    crypto_generichash_init(&state, nullptr, 0, pair.key.size());
    crypto_generichash_update(&state, reinterpret_cast<const uint8_t*>(kPairKeyLabel.data()),
                              kPairKeyLabel.size());
    crypto_generichash_update(&state, shared.data(), shared.size());
    for (const RosterEntry* e : {&lo, &hi}) {
      const uint8_t length = static_cast<uint8_t>(e->id.size());
      crypto_generichash_update(&state, &length, 1);
      crypto_generichash_update(&state, reinterpret_cast<const uint8_t*>(e->id.data()),
                                e->id.size());
      crypto_generichash_update(&state, e->public_key.data(), e->public_key.size());
    }
    crypto_generichash_final(&state, pair.key.data(), pair.key.size());
    sodium_memzero(shared.data(), shared.size());
    sodium_memzero(&state, sizeof state);
    masker.pairs_.push_back(std::move(pair));
  }
  return masker;
}

Masker::~Masker() {
  for (Pair& pair : pairs_) {
    sodium_memzero(pair.key.data(), pair.key.size());
    sodium_memzero(pair.bound.data(), pair.bound.size());
  }
}

Status Masker::Bind(std::string_view binding) {
  if (binding.empty()) return InvalidArgumentError("mask: an empty job binding");
  if (binding_.has_value()) {
    if (*binding_ == binding) return Status::Ok();
    return FailedPreconditionError(
        "mask: this holder's pads are bound to another job; a masker serves one job");
  }
  for (Pair& pair : pairs_) {
    crypto_generichash_state state;
    crypto_generichash_init(&state, nullptr, 0, pair.bound.size());
    crypto_generichash_update(&state, reinterpret_cast<const uint8_t*>(kJobKeyLabel.data()),
                              kJobKeyLabel.size());
    crypto_generichash_update(&state, pair.key.data(), pair.key.size());
    HashWithLength(&state, binding);
    crypto_generichash_final(&state, pair.bound.data(), pair.bound.size());
    sodium_memzero(&state, sizeof state);
  }
  binding_ = std::string(binding);
  return Status::Ok();
}

Status Masker::Mask(uint64_t round, std::span<const std::string> participants,
                    std::span<const int64_t> values, std::span<uint64_t> out,
                    std::span<const std::string> incarnations) {
  std::fill(out.begin(), out.end(), 0);
  if (values.size() != out.size()) {
    return InvalidArgumentError("mask: " + std::to_string(values.size()) + " values but room for " +
                                std::to_string(out.size()));
  }
  if (!incarnations.empty() && incarnations.size() != participants.size()) {
    return InvalidArgumentError("mask: " + std::to_string(incarnations.size()) +
                                " incarnations for " + std::to_string(participants.size()) +
                                " participants");
  }
  std::set<std::string> named;
  std::vector<const Pair*> peers;
  std::vector<std::string_view> peer_incarnations;
  std::string_view own_incarnation;
  bool own_present = false;
  for (size_t p = 0; p < participants.size(); ++p) {
    const std::string& id = participants[p];
    if (!incarnations.empty() && incarnations[p].empty()) {
      return InvalidArgumentError("mask: participant '" + id + "' has an empty incarnation");
    }
    if (!named.insert(id).second) {
      return InvalidArgumentError("mask: participant '" + id + "' is named twice");
    }
    if (id == own_id_) {
      own_present = true;
      if (!incarnations.empty()) own_incarnation = incarnations[p];
      continue;
    }
    const auto it = std::find_if(pairs_.begin(), pairs_.end(),
                                 [&](const Pair& pair) { return pair.peer_id == id; });
    if (it == pairs_.end()) {
      return InvalidArgumentError("mask: participant '" + id + "' is not in the roster");
    }
    peers.push_back(&*it);
    peer_incarnations.push_back(incarnations.empty() ? std::string_view() : incarnations[p]);
  }
  if (!own_present) {
    return InvalidArgumentError("mask: the participants do not include this holder ('" +
                                own_id_ + "')");
  }
  if (!binding_.has_value()) {
    return FailedPreconditionError("mask: not bound to a job (Bind): pads of unbound pair keys "
                                   "would repeat across jobs");
  }
  if (round <= last_round_) {
    return FailedPreconditionError("mask: round " + std::to_string(round) +
                                   " is not above the last round masked (" +
                                   std::to_string(last_round_) +
                                   "): a pair key's pad is used once");
  }
  last_round_ = round;
  for (size_t i = 0; i < values.size(); ++i) out[i] = static_cast<uint64_t>(values[i]);
  std::array<uint8_t, crypto_stream_chacha20_NONCEBYTES> nonce{};
  static_assert(crypto_stream_chacha20_NONCEBYTES == 8);
  for (size_t b = 0; b < nonce.size(); ++b) nonce[b] = static_cast<uint8_t>(round >> (8 * b));
  // Buffers of one chunk, or of the whole vector (rounded up to a block)
  // when it is shorter.
  const size_t chunk_words =
      std::min(kChunkWords, (out.size() + kWordsPerBlock - 1) / kWordsPerBlock * kWordsPerBlock);
  std::vector<uint8_t> zeros(chunk_words * 8, 0);
  std::vector<uint8_t> stream(chunk_words * 8);
  std::array<uint8_t, 32> key{};
  for (size_t p = 0; p < peers.size(); ++p) {
    const Pair* pair = peers[p];
    key = pair->bound;
    if (!incarnations.empty()) {
      // Bound to both holders' incarnations, lower id first (k_ij = k_ji).
      crypto_generichash_state state;
      crypto_generichash_init(&state, nullptr, 0, key.size());
      crypto_generichash_update(&state,
                                reinterpret_cast<const uint8_t*>(kIncarnationKeyLabel.data()),
                                kIncarnationKeyLabel.size());
      crypto_generichash_update(&state, pair->bound.data(), pair->bound.size());
      HashWithLength(&state, pair->add ? own_incarnation : peer_incarnations[p]);
      HashWithLength(&state, pair->add ? peer_incarnations[p] : own_incarnation);
      crypto_generichash_final(&state, key.data(), key.size());
      sodium_memzero(&state, sizeof state);
    }
    for (size_t start = 0; start < out.size(); start += kChunkWords) {
      const size_t words = std::min(kChunkWords, out.size() - start);
      const size_t bytes = ((words + kWordsPerBlock - 1) / kWordsPerBlock) * kWordsPerBlock * 8;
      crypto_stream_chacha20_xor_ic(stream.data(), zeros.data(), bytes, nonce.data(),
                                    start / kWordsPerBlock, key.data());
      for (size_t w = 0; w < words; ++w) {
        const uint64_t mask = LoadLittleEndian(stream.data() + 8 * w);
        out[start + w] = pair->add ? out[start + w] + mask : out[start + w] - mask;
      }
    }
  }
  sodium_memzero(stream.data(), stream.size());
  sodium_memzero(key.data(), key.size());
  return Status::Ok();
}

StatusOr<std::vector<int64_t>> SumMasked(std::span<const std::span<const uint64_t>> messages) {
  if (messages.empty()) return InvalidArgumentError("no masked messages to sum");
  const size_t length = messages[0].size();
  std::vector<uint64_t> total(length, 0);
  for (const std::span<const uint64_t>& message : messages) {
    if (message.size() != length) {
      return InvalidArgumentError("masked messages of different lengths (" +
                                  std::to_string(length) + " and " +
                                  std::to_string(message.size()) + ")");
    }
    for (size_t i = 0; i < length; ++i) total[i] += message[i];
  }
  std::vector<int64_t> out(length);
  for (size_t i = 0; i < length; ++i) out[i] = static_cast<int64_t>(total[i]);
  return out;
}

}  // namespace vipsd::privacy
