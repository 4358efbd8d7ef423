#include "core/privacy/mechanisms/secure_aggregation.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace vipsd::privacy {
namespace {

HolderSecretKey KeyFromSeed(uint8_t seed) {
  std::array<uint8_t, kHolderKeyBytes> bytes{};
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(seed * 31 + i * 7 + 1);
  auto key = HolderSecretKey::FromBytes(bytes);
  EXPECT_TRUE(key.ok());
  return std::move(*key);
}

struct Federation {
  std::vector<std::string> ids;
  std::vector<RosterEntry> roster;
  std::vector<Masker> maskers;
};

Federation MakeFederation(size_t n, const std::string& job = "job-1") {
  Federation f;
  std::vector<HolderSecretKey> keys;
  for (size_t i = 0; i < n; ++i) {
    f.ids.push_back("hospital-" + std::string(1, static_cast<char>('a' + i)));
    keys.push_back(KeyFromSeed(static_cast<uint8_t>(i + 1)));
    f.roster.push_back({f.ids.back(), keys.back().PublicKey()});
  }
  for (size_t i = 0; i < n; ++i) {
    auto masker = Masker::Create(keys[i], f.ids[i], f.roster);
    EXPECT_TRUE(masker.ok()) << masker.status().message();
    EXPECT_TRUE(masker->Bind(job).ok());
    f.maskers.push_back(std::move(*masker));
  }
  return f;
}

std::vector<int64_t> RandomValues(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> value(-(int64_t{1} << 60), int64_t{1} << 60);
  std::vector<int64_t> out(n);
  for (int64_t& v : out) v = value(rng);
  return out;
}

TEST(SecureAggregationTest, MasksCancelInTheSumOfThreeHolders) {
  Federation f = MakeFederation(3);
  const size_t length = 10007;  // not a multiple of a ChaCha20 block or chunk
  std::vector<std::vector<int64_t>> values;
  std::vector<std::vector<uint64_t>> messages(3, std::vector<uint64_t>(length));
  for (size_t i = 0; i < 3; ++i) {
    values.push_back(RandomValues(length, 100 + i));
    ASSERT_TRUE(f.maskers[i].Mask(1, f.ids, values[i], messages[i]).ok());
    // The message is not the value.
    size_t equal = 0;
    for (size_t c = 0; c < length; ++c) equal += messages[i][c] == static_cast<uint64_t>(values[i][c]);
    EXPECT_EQ(equal, 0u);
  }
  std::vector<std::span<const uint64_t>> views(messages.begin(), messages.end());
  auto total = SumMasked(views);
  ASSERT_TRUE(total.ok());
  for (size_t c = 0; c < length; ++c) {
    ASSERT_EQ((*total)[c], values[0][c] + values[1][c] + values[2][c]) << c;
  }
}

TEST(SecureAggregationTest, ARoundAmongASubsetCancelsAndAMissingMessageLeavesNoise) {
  Federation f = MakeFederation(4);
  const std::vector<std::string> present = {f.ids[0], f.ids[2], f.ids[3]};
  const size_t length = 64;
  std::vector<std::vector<uint64_t>> messages(4, std::vector<uint64_t>(length));
  const std::vector<int64_t> zeros(length, 0);
  for (size_t i : {0u, 2u, 3u}) ASSERT_TRUE(f.maskers[i].Mask(7, present, zeros, messages[i]).ok());
  {
    std::vector<std::span<const uint64_t>> views = {messages[0], messages[2], messages[3]};
    auto total = SumMasked(views);
    ASSERT_TRUE(total.ok());
    for (int64_t v : *total) EXPECT_EQ(v, 0);
  }
  // One participant's message never arrives: the rest sum to a pad.
  std::vector<std::span<const uint64_t>> views = {messages[0], messages[2]};
  auto partial = SumMasked(views);
  ASSERT_TRUE(partial.ok());
  size_t zero = 0;
  for (int64_t v : *partial) zero += v == 0;
  EXPECT_EQ(zero, 0u);
}

// Chi-square over the 16 values of a 4-bit field of 64-bit words. With
// 15 degrees of freedom, P(χ² > 45) ≈ 7·10^-5: fixed keys make the test
// deterministic, and a masked word that leaked its value would be far out.
double ChiSquare16(const std::vector<uint64_t>& words, int shift) {
  std::array<double, 16> counts{};
  for (uint64_t w : words) counts[(w >> shift) & 15] += 1;
  const double expected = words.size() / 16.0;
  double chi = 0;
  for (double c : counts) chi += (c - expected) * (c - expected) / expected;
  return chi;
}

// The aggregator's view of one holder's messages: whatever the holder's
// values (all zero, or a fixed secret pattern), its masked words over many
// rounds are uniform in every bit field and uncorrelated with the values.
TEST(SecureAggregationTest, TheAggregatorsViewOfAHoldersMessageIsUniformWhateverItsValues) {
  Federation f = MakeFederation(3);
  const size_t length = 32;
  const size_t rounds = 1500;
  const std::vector<int64_t> zeros(length, 0);
  std::vector<int64_t> pattern(length);
  for (size_t c = 0; c < length; ++c) pattern[c] = (c % 2 == 0) ? 123456789 : -(int64_t{1} << 40);
  const std::vector<std::string> everyone = f.ids;
  for (const std::vector<int64_t>* values : std::vector<const std::vector<int64_t>*>{&zeros, &pattern}) {
    std::vector<uint64_t> words;
    std::vector<uint64_t> message(length);
    double sum_top = 0, sum_top_times_sign = 0;
    for (size_t r = 0; r < rounds; ++r) {
      const uint64_t round = f.maskers[1].last_round() + 1;
      ASSERT_TRUE(f.maskers[1].Mask(round, everyone, *values, message).ok());
      for (size_t c = 0; c < length; ++c) {
        words.push_back(message[c]);
        const double top = static_cast<double>(message[c] >> 63);
        sum_top += top;
        sum_top_times_sign += (top - 0.5) * ((*values)[c] < 0 ? 1.0 : -1.0);
      }
    }
    for (int shift : {0, 4, 28, 32, 60}) {
      EXPECT_LT(ChiSquare16(words, shift), 45.0) << "bits " << shift << ".." << shift + 3;
    }
    // The top bit is a fair coin (5 sd of a binomial with 48,000 trials) and
    // does not follow the values' signs.
    const double n = static_cast<double>(words.size());
    EXPECT_NEAR(sum_top / n, 0.5, 5 * 0.5 / std::sqrt(n));
    EXPECT_NEAR(sum_top_times_sign / n, 0.0, 5 * 0.5 / std::sqrt(n));
  }
}

TEST(SecureAggregationTest, ARoundIsMaskedOnceAndARestoredLastRoundIsHonoured) {
  Federation f = MakeFederation(2);
  std::vector<uint64_t> out(4);
  const std::vector<int64_t> values = {1, 2, 3, 4};
  ASSERT_TRUE(f.maskers[0].Mask(5, f.ids, values, out).ok());
  const Status again = f.maskers[0].Mask(5, f.ids, values, out);
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.message().find("used once"), std::string::npos);
  for (uint64_t w : out) EXPECT_EQ(w, 0u);  // nothing written on refusal
  EXPECT_FALSE(f.maskers[0].Mask(4, f.ids, values, out).ok());
  f.maskers[1].set_last_round(9);  // as restored from a holder's ledger
  EXPECT_FALSE(f.maskers[1].Mask(9, f.ids, values, out).ok());
  EXPECT_TRUE(f.maskers[1].Mask(10, f.ids, values, out).ok());
  // Different rounds give unrelated pads for the same values.
  std::vector<uint64_t> a(4), b(4);
  ASSERT_TRUE(f.maskers[0].Mask(11, f.ids, values, a).ok());
  ASSERT_TRUE(f.maskers[0].Mask(12, f.ids, values, b).ok());
  for (size_t c = 0; c < 4; ++c) EXPECT_NE(a[c], b[c]);
}

// Issue 49: the same key files in two jobs (or an aggregator reset, whose
// rounds start at 1 again) must not mask one round with the same pad: the
// difference of two such messages would be the difference of the values.
// With the job binding it is a difference of independent keystreams:
// uniform, whatever the values.
TEST(SecureAggregationTest, TwoJobsWithTheSameKeysMaskTheSameRoundWithIndependentPads) {
  Federation one = MakeFederation(3, "job-one");
  Federation two = MakeFederation(3, "job-two");  // the same keys and roster
  const size_t length = 32;
  std::vector<int64_t> x1(length), x2(length);
  for (size_t c = 0; c < length; ++c) {
    x1[c] = 1000 + static_cast<int64_t>(c);
    x2[c] = -7 * static_cast<int64_t>(c);
  }
  std::vector<uint64_t> words;
  std::vector<uint64_t> a(length), b(length);
  size_t equal_to_values = 0;
  for (uint64_t round = 1; round <= 1500; ++round) {
    ASSERT_TRUE(one.maskers[1].Mask(round, one.ids, x1, a).ok());
    ASSERT_TRUE(two.maskers[1].Mask(round, two.ids, x2, b).ok());
    for (size_t c = 0; c < length; ++c) {
      const uint64_t difference = a[c] - b[c];
      equal_to_values += difference == static_cast<uint64_t>(x1[c] - x2[c]);
      words.push_back(difference);
    }
  }
  EXPECT_EQ(equal_to_values, 0u);
  for (int shift : {0, 4, 28, 32, 60}) {
    EXPECT_LT(ChiSquare16(words, shift), 45.0) << "bits " << shift << ".." << shift + 3;
  }
  // Within one job the masks still cancel.
  std::vector<std::vector<uint64_t>> messages(3, std::vector<uint64_t>(length));
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(two.maskers[i].Mask(2000, two.ids, x2, messages[i]).ok());
  }
  std::vector<std::span<const uint64_t>> spans(messages.begin(), messages.end());
  auto total = SumMasked(spans);
  ASSERT_TRUE(total.ok());
  for (size_t c = 0; c < length; ++c) EXPECT_EQ((*total)[c], 3 * x2[c]);
}

// A holder whose state directory was reset (its last masked round lost)
// joins with a new incarnation: its pads with every peer change, while the
// masks of one round still cancel when every participant names the same
// incarnations.
TEST(SecureAggregationTest, PadsAreBoundToEveryParticipantsIncarnation) {
  Federation f = MakeFederation(3);
  const size_t length = 64;
  const std::vector<int64_t> values(length, 5);
  const std::vector<std::string> before = {std::string(32, 'a'), std::string(32, 'b'),
                                           std::string(32, 'c')};
  std::vector<std::string> after = before;
  after[0] = std::string(32, 'd');  // hospital-a was reset
  std::vector<uint64_t> old_message(length), new_message(length);
  ASSERT_TRUE(f.maskers[1].Mask(7, f.ids, values, old_message, before).ok());
  f.maskers[1].set_last_round(6);  // as a reset holder would, had it lost its round
  ASSERT_TRUE(f.maskers[1].Mask(7, f.ids, values, new_message, after).ok());
  size_t same = 0;
  for (size_t c = 0; c < length; ++c) same += old_message[c] == new_message[c];
  EXPECT_EQ(same, 0u) << "hospital-b reused a pad with hospital-c or with a's new incarnation";
  std::vector<std::vector<uint64_t>> messages(3, std::vector<uint64_t>(length));
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(f.maskers[i].Mask(8, f.ids, values, messages[i], after).ok());
  }
  std::vector<std::span<const uint64_t>> spans(messages.begin(), messages.end());
  auto total = SumMasked(spans);
  ASSERT_TRUE(total.ok());
  for (size_t c = 0; c < length; ++c) EXPECT_EQ((*total)[c], 15);
  // Malformed incarnation lists are refused.
  std::vector<uint64_t> out(length);
  EXPECT_EQ(f.maskers[0].Mask(9, f.ids, values, out, std::vector<std::string>{"x"}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(f.maskers[0].Mask(9, f.ids, values, out, std::vector<std::string>{"a", "", "c"}).code(),
            StatusCode::kInvalidArgument);
}

TEST(SecureAggregationTest, AMaskerMasksNothingUnboundAndServesOneJob) {
  std::vector<HolderSecretKey> keys;
  keys.push_back(KeyFromSeed(1));
  keys.push_back(KeyFromSeed(2));
  const std::vector<RosterEntry> roster = {{"a", keys[0].PublicKey()}, {"b", keys[1].PublicKey()}};
  auto masker = Masker::Create(keys[0], "a", roster);
  ASSERT_TRUE(masker.ok());
  const std::vector<std::string> ids = {"a", "b"};
  const std::vector<int64_t> values = {1, 2};
  std::vector<uint64_t> out(2);
  const Status unbound = masker->Mask(1, ids, values, out);
  EXPECT_EQ(unbound.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(unbound.message().find("not bound to a job"), std::string::npos);
  EXPECT_EQ(masker->last_round(), 0u);  // the refusal used no round
  EXPECT_EQ(masker->Bind("").code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(masker->Bind("job-a").ok());
  EXPECT_TRUE(masker->Bind("job-a").ok());  // the same job again
  EXPECT_EQ(masker->Bind("job-b").code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(masker->Mask(1, ids, values, out).ok());
}

TEST(SecureAggregationTest, MaskRefusesBadParticipantsAndLengthsNamingTheProblem) {
  Federation f = MakeFederation(3);
  std::vector<uint64_t> out(2);
  const std::vector<int64_t> values = {1, 2};
  const auto message_of = [&](std::vector<std::string> participants, size_t room) {
    std::vector<uint64_t> o(room);
    return f.maskers[0].Mask(1, participants, values, o).message();
  };
  EXPECT_NE(message_of({f.ids[0], "stranger"}, 2).find("'stranger' is not in the roster"),
            std::string::npos);
  EXPECT_NE(message_of({f.ids[1], f.ids[2]}, 2).find("do not include this holder"),
            std::string::npos);
  EXPECT_NE(message_of({f.ids[0], f.ids[1], f.ids[1]}, 2).find("named twice"), std::string::npos);
  EXPECT_NE(message_of(f.ids, 3).find("2 values but room for 3"), std::string::npos);
  EXPECT_EQ(f.maskers[0].last_round(), 0u);  // refusals consume no round
}

TEST(SecureAggregationTest, AHolderWhoseKeyTheRosterDoesNotListIsRefused) {
  Federation f = MakeFederation(3);
  const HolderSecretKey impostor = KeyFromSeed(99);
  auto refused = Masker::Create(impostor, f.ids[1], f.roster);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("unknown key"), std::string::npos);
  EXPECT_NE(refused.status().message().find(PublicKeyHex(f.roster[1].public_key)),
            std::string::npos);
  auto absent = Masker::Create(KeyFromSeed(1), "hospital-z", f.roster);
  ASSERT_FALSE(absent.ok());
  EXPECT_NE(absent.status().message().find("not in the roster"), std::string::npos);
}

TEST(SecureAggregationTest, ARosterWithRepeatedOrInvalidEntriesIsRefused) {
  Federation f = MakeFederation(3);
  std::vector<RosterEntry> roster = f.roster;
  roster[2].id = roster[0].id;
  EXPECT_NE(ValidateRoster(roster).message().find("listed twice"), std::string::npos);
  roster = f.roster;
  roster[2].public_key = roster[0].public_key;
  EXPECT_NE(ValidateRoster(roster).message().find("same public key"), std::string::npos);
  roster = f.roster;
  roster[1].public_key = HolderPublicKey{};  // the all-zero point has low order
  EXPECT_NE(ValidateRoster(roster).message().find("low-order point"), std::string::npos);
  roster = f.roster;
  roster[1].id = "bad id";
  EXPECT_NE(ValidateRoster(roster).message().find("[A-Za-z0-9._-]"), std::string::npos);
  EXPECT_TRUE(ValidateRoster(f.roster).ok());
}

TEST(SecureAggregationTest, PublicKeysRoundTripThroughHexAndBadHexIsNamed) {
  const HolderPublicKey key = KeyFromSeed(3).PublicKey();
  auto parsed = ParsePublicKeyHex(PublicKeyHex(key));
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(*parsed, key);
  EXPECT_NE(ParsePublicKeyHex("abc").status().message().find("64 hex digits"), std::string::npos);
  std::string bad = PublicKeyHex(key);
  bad[10] = 'g';
  EXPECT_NE(ParsePublicKeyHex(bad).status().message().find("position 11"), std::string::npos);
  EXPECT_FALSE(HolderSecretKey::FromBytes(std::vector<uint8_t>(31, 1)).ok());
  auto fresh = HolderSecretKey::Generate();
  ASSERT_TRUE(fresh.ok());
  EXPECT_NE(fresh->PublicKey(), key);
}

TEST(SecureAggregationTest, SumMaskedRefusesNothingAndUnequalLengths) {
  EXPECT_FALSE(SumMasked({}).ok());
  const std::vector<uint64_t> a(3), b(4);
  std::vector<std::span<const uint64_t>> views = {a, b};
  EXPECT_FALSE(SumMasked(views).ok());
}

}  // namespace
}  // namespace vipsd::privacy
