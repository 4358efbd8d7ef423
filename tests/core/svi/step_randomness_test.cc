#include "core/svi/step_randomness.h"

#include <gtest/gtest.h>
#include <sodium.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/privacy/mechanisms/secure_noise.h"

namespace vipsd::svi {
namespace {

StepKey Key(uint8_t fill) {
  StepKey key;
  for (size_t i = 0; i < key.bytes.size(); ++i) key.bytes[i] = static_cast<uint8_t>(fill + 7 * i);
  return key;
}

// Independent oracle: the keystream from block 0, one libsodium call, read
// as little-endian words; word o is the record at offset o.
std::vector<uint64_t> WholeKeystream(const std::array<uint8_t, 32>& key, uint64_t nonce,
                                     size_t words) {
  std::vector<unsigned char> bytes(words * 8);
  unsigned char n[8];
  for (int b = 0; b < 8; ++b) n[b] = static_cast<unsigned char>(nonce >> (8 * b));
  crypto_stream_chacha20(bytes.data(), bytes.size(), n, key.data());
  std::vector<uint64_t> out(words);
  for (size_t w = 0; w < words; ++w) {
    uint64_t v = 0;
    for (int b = 7; b >= 0; --b) v = (v << 8) | bytes[w * 8 + b];
    out[w] = v;
  }
  return out;
}

TEST(StepRandomnessTest, WordsAreTheKeystreamAtEachRecordsOwnOffset) {
  ASSERT_GE(sodium_init(), 0);
  const auto stream_key = DeriveStreamKey(Key(1), "input/0");
  const std::vector<uint64_t> oracle = WholeKeystream(stream_key, kSampleNonce, 4096);
  // Contiguous offsets, small gaps, a gap larger than a run, and one offset
  // alone in its block.
  const std::vector<int64_t> offsets = {0, 1, 2, 7, 8, 9, 63, 64, 65, 300, 301, 1000, 4095};
  std::vector<uint64_t> words;
  ASSERT_TRUE(KeyedWords(stream_key, kSampleNonce, offsets, words).ok());
  ASSERT_EQ(words.size(), offsets.size());
  for (size_t i = 0; i < offsets.size(); ++i) {
    EXPECT_EQ(words[i], oracle[static_cast<size_t>(offsets[i])]) << "offset " << offsets[i];
  }
}

TEST(StepRandomnessTest, ARecordsWordsDoNotDependOnTheOtherRecords) {
  // The per-record property that makes a split step equal to the whole one:
  // the word of offset o is the same whether o is asked alone, with its
  // neighbours, or with a record added anywhere else.
  ASSERT_GE(sodium_init(), 0);
  const auto stream_key = DeriveStreamKey(Key(2), "events/3");
  std::vector<int64_t> all;
  for (int64_t o = 10; o < 2000; o += 3) all.push_back(o);
  all.push_back(int64_t{1} << 40);  // a huge gap: skipped, not generated
  std::vector<uint64_t> whole;
  ASSERT_TRUE(KeyedWords(stream_key, kEStepSeedNonce, all, whole).ok());
  for (size_t i = 0; i < all.size(); i += 37) {
    std::vector<uint64_t> one;
    ASSERT_TRUE(KeyedWords(stream_key, kEStepSeedNonce, std::vector<int64_t>{all[i]}, one).ok());
    EXPECT_EQ(one[0], whole[i]);
  }
  std::vector<int64_t> with_added = all;
  with_added.insert(with_added.begin() + 5, 24);  // between 22 and 25
  std::vector<uint64_t> added;
  ASSERT_TRUE(KeyedWords(stream_key, kEStepSeedNonce, with_added, added).ok());
  for (size_t i = 0, j = 0; i < with_added.size(); ++i) {
    if (with_added[i] == 24) continue;
    EXPECT_EQ(added[i], whole[j++]);
  }
}

TEST(StepRandomnessTest, StreamsNoncesAndKeysGiveDifferentWords) {
  ASSERT_GE(sodium_init(), 0);
  const std::vector<int64_t> offsets = {0, 1, 2, 3};
  std::vector<uint64_t> a, b, c, d;
  ASSERT_TRUE(KeyedWords(DeriveStreamKey(Key(1), "t/0"), kSampleNonce, offsets, a).ok());
  ASSERT_TRUE(KeyedWords(DeriveStreamKey(Key(1), "t/1"), kSampleNonce, offsets, b).ok());
  ASSERT_TRUE(KeyedWords(DeriveStreamKey(Key(1), "t/0"), kEStepSeedNonce, offsets, c).ok());
  ASSERT_TRUE(KeyedWords(DeriveStreamKey(Key(9), "t/0"), kSampleNonce, offsets, d).ok());
  for (size_t i = 0; i < offsets.size(); ++i) {
    EXPECT_NE(a[i], b[i]);
    EXPECT_NE(a[i], c[i]);
    EXPECT_NE(a[i], d[i]);
  }
  // The stream name is framed: "t/0" under key 1 is not a prefix game.
  EXPECT_NE(DeriveStreamKey(Key(1), "t/0"), DeriveStreamKey(Key(1), "t/00"));
  EXPECT_NE(DeriveStreamKey(Key(1), ""), DeriveStreamKey(Key(1), std::string_view("\0", 1)));
}

TEST(StepRandomnessTest, RefusesOffsetsThatWouldShareAWord) {
  const auto stream_key = DeriveStreamKey(Key(3), "s");
  std::vector<uint64_t> words;
  EXPECT_EQ(KeyedWords(stream_key, 0, std::vector<int64_t>{4, 4}, words).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(KeyedWords(stream_key, 0, std::vector<int64_t>{5, 4}, words).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(KeyedWords(stream_key, 0, std::vector<int64_t>{-1}, words).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(KeyedWords(stream_key, 0, std::vector<int64_t>{int64_t{1} << 62}, words).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(KeyedWords(stream_key, 0, std::vector<int64_t>{}, words).ok());
  EXPECT_TRUE(words.empty());
}

TEST(StepRandomnessTest, SamplingRateIsQAndFreshPerStep) {
  // Under a fresh key per step the inclusion bits are Bernoulli(q): the
  // sampled fraction over 200,000 records is within 5 standard errors of q,
  // and two steps' samples overlap like independent draws (q² ± 5 s.e.).
  auto noise = privacy::SecureNoiseSource::Create();
  ASSERT_TRUE(noise.ok());
  const double q = 0.3;
  const uint64_t threshold = SampleThreshold(q);
  std::vector<int64_t> offsets(200000);
  for (size_t i = 0; i < offsets.size(); ++i) offsets[i] = static_cast<int64_t>(i);
  std::vector<uint64_t> first, second;
  ASSERT_TRUE(KeyedWords(DeriveStreamKey(DrawStepKey(**noise), "p"), kSampleNonce, offsets, first).ok());
  ASSERT_TRUE(KeyedWords(DeriveStreamKey(DrawStepKey(**noise), "p"), kSampleNonce, offsets, second).ok());
  double in_first = 0, in_both = 0;
  for (size_t i = 0; i < offsets.size(); ++i) {
    in_first += first[i] < threshold;
    in_both += (first[i] < threshold) && (second[i] < threshold);
  }
  const double n = static_cast<double>(offsets.size());
  EXPECT_NEAR(in_first / n, q, 5 * std::sqrt(q * (1 - q) / n));
  EXPECT_NEAR(in_both / n, q * q, 5 * std::sqrt(q * q * (1 - q * q) / n));
  EXPECT_EQ(SampleThreshold(0.5), uint64_t{1} << 63);
}

}  // namespace
}  // namespace vipsd::svi
