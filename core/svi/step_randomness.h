// StepRandomness: the secret randomness of one step, keyed per record
// (issue 16; docs/privacy_accounting.md §1).
//
// A step draws one 256-bit key from the NoiseSource (secure in production).
// Every decision the step makes about a record — whether Poisson sampling
// includes it, and the seed of its E-step — is a word of a ChaCha20
// keystream at a position fixed by the record's own identity:
//
//   stream key  k_s  = BLAKE2b-256(key = step key,
//                                  message = "vipsd-step-stream-v1" ‖ 0 ‖ s)
//   word(s, o, n)    = 64-bit little-endian word (o mod 8) of ChaCha20 block
//                      ⌊o / 8⌋ of the keystream under (k_s, nonce n)
//   sampled(s, o)    ⇔ word(s, o, 0) < ⌊q · 2^64⌋      (q < 1; q = 1: always)
//   E-step seed      = word(s, o, 1)
//
// Unit-level privacy (privacy.unit; docs/privacy_accounting.md "The privacy
// unit") samples units instead of records, and ranks a kept unit's records:
//
//   unit digest d(u) = BLAKE2b-128(message = "vipsd-unit-v1" ‖ 0 ‖ u)
//                      (unkeyed; computed when the record is decoded)
//   unit word  w(u)  = 64-bit little-endian prefix of
//                      BLAKE2b-256(key = step key,
//                                  message = "vipsd-step-unit-v1" ‖ 0 ‖ d(u))
//   kept(u)          ⇔ w(u) < ⌊q · 2^64⌋       (q < 1; q = 1: always)
//   rank(s, o)       = word(s, o, 2)
//
// where s is the record's stream (a Kafka partition's canonical name, or
// the offline run's file) and o its offset in that stream.
//
// Why. (1) Privacy: distinct (s, o) are distinct keystream positions (or
// distinct keys), so under the standard assumption that ChaCha20 with a
// uniformly random secret key is indistinguishable from random, the
// inclusion bits of a step's candidates are independent Bernoulli(q) draws
// with P = ⌊q·2^64⌋/2^64 ≤ q — exactly Poisson sampling, as the accountant
// assumes — and fresh in every step (a fresh key). (2) Splitting: a
// record's decisions depend on the step key and on (s, o) only, not on
// which other records are in the pool, in which order, or in which process.
// Several processes that hold the same step key and disjoint sets of
// streams therefore make exactly the decisions one process would make
// holding every stream (docs/privacy_accounting.md, "Scale-out").
//
// For units the same argument holds with BLAKE2b keyed by the step key as
// the pseudorandom function: distinct digests give independent Bernoulli(q)
// inclusion, decided by the step key and the unit alone. Two unit ids with
// one digest would be treated as one unit (probability about n²/2^129 for
// n units: negligible, like a keystream collision).
//
// What is private: the step key (it determines the sample; anyone who holds
// it and the records knows which records the step used — that would void
// the amplification by sampling, not the Gaussian noise) and every word.
// The key lives in memory for one step; in a scale-out deployment it
// travels only on the internal topics that carry un-noised partial sums.
//
// Thread-safety: pure functions.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "core/base/status.h"
#include "core/privacy/mechanisms/noise_source.h"

namespace vipsd::svi {

struct StepKey {
  std::array<uint8_t, 32> bytes{};
  bool operator==(const StepKey& other) const = default;
};

// Four 64-bit words from `noise`, little-endian.
StepKey DrawStepKey(privacy::NoiseSource& noise);

// Keystream nonces: which decision a word makes.
inline constexpr uint64_t kSampleNonce = 0;
inline constexpr uint64_t kEStepSeedNonce = 1;
inline constexpr uint64_t kUnitRankNonce = 2;

// d(u) above: the digest a record of unit `unit_id` carries (model::Record::unit).
std::array<uint8_t, 16> UnitDigest(std::string_view unit_id);
// w(u) above.
uint64_t UnitWord(const StepKey& key, const std::array<uint8_t, 16>& digest);

// The stream key k_s above.
std::array<uint8_t, 32> DeriveStreamKey(const StepKey& key, std::string_view stream);

// word(s, o, nonce) for every offset in `offsets` (each in [0, 2^62), and
// strictly increasing; INVALID_ARGUMENT otherwise), into `out` (resized).
// Contiguous offsets cost one keystream pass; gaps of more than 64 offsets
// are skipped rather than generated.
Status KeyedWords(const std::array<uint8_t, 32>& stream_key, uint64_t nonce,
                  std::span<const int64_t> offsets, std::vector<uint64_t>& out);

// ⌊q · 2^64⌋ (q in (0, 1)): a word below it means "sampled".
uint64_t SampleThreshold(double q);

}  // namespace vipsd::svi
