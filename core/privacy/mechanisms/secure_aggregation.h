// Pairwise-mask secure aggregation (issue 31, federated mode; Bonawitz et
// al., "Practical Secure Aggregation for Privacy-Preserving Machine
// Learning", CCS 2017, without its secret-shared dropout recovery: a round
// that loses a holder is abandoned instead, see below).
//
// Each data holder i has an X25519 key pair; the roster (public: the
// federated configuration) names every holder and its public key. Holders i
// and j agree on a pair key
//     k_ij = BLAKE2b-256("vipsd federated pair key v1" ‖ X25519(sk_i, pk_j)
//                        ‖ id_lo ‖ pk_lo ‖ id_hi ‖ pk_hi)
// (lo/hi: the two holders ordered by id, so k_ij = k_ji), bind it to the job
//     k_ij^J = BLAKE2b-256("vipsd federated job pad key v1" ‖ k_ij ‖ len(J) ‖ J)
// (J: the job binding, Bind — the daemon uses the aggregator's run id, drawn
// at random when its state directory was created, and the roster's
// fingerprint), and for round r expand k_ij^J with ChaCha20 (64-bit nonce r,
// libsodium's crypto_stream_chacha20) into one 64-bit word m_ij[c] per
// coordinate c. The
// holder's message for round r is
//     y_i[c] = x_i[c] + Σ_{j > i} m_ij[c] − Σ_{j < i} m_ij[c]   (mod 2^64)
// over the round's participants j, x_i its integer vector (noised partial
// sum, two's complement). Summed over all participants the masks cancel:
// Σ_i y_i = Σ_i x_i (mod 2^64), which SumMasked interprets as int64.
//
// What the aggregator learns. If at least one pair key of holder i is unknown
// to it (some other participant is honest), y_i is x_i plus a word of a
// ChaCha20 keystream it cannot predict, i.e. computationally
// indistinguishable from uniform on 2^64 whatever x_i is. Only the sum of
// all participants' messages is meaningful.
//
// One-time pads. A pair key with the same round must never mask two
// different vectors (their difference would leave the masks). The job
// binding makes the pads of two jobs (or of an aggregator whose state was
// reset, whose rounds start at 1 again) different even when holders reuse
// their key files; within a job, Masker refuses a round that is not above
// every round it masked before, and a holder that restarts must persist its
// last round and its job (its ledger) and restore them (set_last_round,
// Bind) before masking again. A Masker is bound once: another binding is
// refused, and Mask refuses until it is bound.
//
// Dropouts. If a participant's message never arrives, the masks shared with
// it do not cancel and the sum is uniformly random: the aggregator learns
// nothing from the round, and the round is abandoned (and charged by the
// caller: the sent messages carry noise shares of sampled data). The next
// round names the remaining participants; a holder never re-sends a round.
//
// Key handling. The roster must list distinct ids and distinct, valid public
// keys (32 bytes, not a low-order point: X25519 with it must not give zero).
// A Masker is created from a holder's secret key and its id; Create refuses
// a secret key whose public key is not the roster's entry for that id, and a
// roster that does not contain the id. Secret keys are wiped on destruction.
// Loading them (from files or systemd credentials, never from YAML) is the
// caller's business: core does no I/O.
//
// Thread-safety: a Masker is not thread-safe (it holds the last round).
// SumMasked is a pure function.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/status.h"

namespace vipsd::privacy {

inline constexpr size_t kHolderKeyBytes = 32;
using HolderPublicKey = std::array<uint8_t, kHolderKeyBytes>;

struct RosterEntry {
  std::string id;  // 1..64 characters [A-Za-z0-9._-]
  HolderPublicKey public_key{};
};

// A secret X25519 key, wiped when destroyed. Not copyable.
class HolderSecretKey {
 public:
  // From exactly 32 bytes (InvalidArgument otherwise).
  static StatusOr<HolderSecretKey> FromBytes(std::span<const uint8_t> bytes);
  // A fresh key from the OS CSPRNG (libsodium's randombytes).
  static StatusOr<HolderSecretKey> Generate();

  HolderSecretKey(HolderSecretKey&& other) noexcept;
  HolderSecretKey& operator=(HolderSecretKey&& other) noexcept;
  HolderSecretKey(const HolderSecretKey&) = delete;
  HolderSecretKey& operator=(const HolderSecretKey&) = delete;
  ~HolderSecretKey();

  // X25519 base-point multiplication.
  HolderPublicKey PublicKey() const;
  std::span<const uint8_t> bytes() const { return {key_.data(), key_.size()}; }

 private:
  HolderSecretKey() = default;
  std::array<uint8_t, kHolderKeyBytes> key_{};
};

// Lower-case hex of a public key, and back (InvalidArgument naming what is
// wrong: length, a non-hex character).
std::string PublicKeyHex(const HolderPublicKey& key);
StatusOr<HolderPublicKey> ParsePublicKeyHex(std::string_view hex);

// Checks ids (non-empty, ≤ 64 of [A-Za-z0-9._-], distinct) and keys
// (distinct, valid points); InvalidArgument naming the entry otherwise.
Status ValidateRoster(std::span<const RosterEntry> roster);

class Masker {
 public:
  // InvalidArgument: a bad roster (ValidateRoster), `own_id` not in it, or
  // `secret`'s public key is not the roster's key for own_id ("unknown
  // key"). The pair keys with every other roster entry are derived here.
  static StatusOr<Masker> Create(const HolderSecretKey& secret, const std::string& own_id,
                                 std::span<const RosterEntry> roster);

  Masker(Masker&& other) noexcept = default;
  Masker& operator=(Masker&& other) noexcept = default;
  Masker(const Masker&) = delete;
  Masker& operator=(const Masker&) = delete;
  ~Masker();

  // Binds the pads to a job (see above); FailedPrecondition for another
  // binding than the one it has, InvalidArgument for an empty one.
  Status Bind(std::string_view binding);
  bool bound() const { return binding_.has_value(); }

  // Masks `values` for `round` among `participants` (ids of the roster, own
  // id included, no duplicates) into `out` (same length). Errors (nothing
  // written but zeros):
  //   InvalidArgument     length mismatch, an unknown or repeated
  //                       participant, own id missing
  //   FailedPrecondition  not bound to a job, or round ≤ the last round
  //                       masked (one-time pads)
  // `incarnations`, if given (the daemon always gives them), names each
  // participant's incarnation in the same order — the run id of its state
  // directory — and the pair's pad is bound to both:
  //     k_ij^{J,a,b} = BLAKE2b-256("vipsd federated incarnation pad key v1"
  //                    ‖ k_ij^J ‖ len(a) ‖ a ‖ len(b) ‖ b)   (a: the lower id's)
  // so that a holder whose state (and last masked round) was lost masks
  // with pads it never used.
  Status Mask(uint64_t round, std::span<const std::string> participants,
              std::span<const int64_t> values, std::span<uint64_t> out,
              std::span<const std::string> incarnations = {});

  // The highest round masked so far (0: none); restore it after a restart.
  uint64_t last_round() const { return last_round_; }
  void set_last_round(uint64_t round) { last_round_ = round; }
  const std::string& own_id() const { return own_id_; }

 private:
  struct Pair {
    std::string peer_id;
    bool add = false;  // own id < peer id: this holder adds the pair's mask
    std::array<uint8_t, 32> key{};    // k_ij
    std::array<uint8_t, 32> bound{};  // k_ij^J once bound
  };
  Masker() = default;
  std::string own_id_;
  std::optional<std::string> binding_;
  std::vector<Pair> pairs_;
  uint64_t last_round_ = 0;
};

// Σ messages (mod 2^64) as int64: the exact total of the participants'
// values when it lies in [−2^63, 2^63). InvalidArgument for no messages or
// unequal lengths.
StatusOr<std::vector<int64_t>> SumMasked(std::span<const std::span<const uint64_t>> messages);

}  // namespace vipsd::privacy
