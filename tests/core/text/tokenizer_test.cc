#include "core/text/tokenizer.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace vipsd::text {
namespace {

using Ids = std::vector<int32_t>;

// ids:                     0    1     2    3    4    5  6  7  8  9      10     11   12    13   14
constexpr char kTerms[] = "don\nmail\ncaf\nabc\ndef\nx\nr\ne\nt\nhello\nworld\nab\nkab\nthe\ncafe\n";

Vocabulary TestVocabulary() {
  StatusOr<Vocabulary> vocabulary = Vocabulary::Parse(kTerms);
  EXPECT_TRUE(vocabulary.ok());
  return std::move(vocabulary).value();
}

TEST(TokenizerTest, SpecificationExamples) {
  const Vocabulary vocabulary = TestVocabulary();
  // One-letter terms ("t", "x", "r", "e") are in the vocabulary on purpose:
  // rule 4 must drop them anyway.
  EXPECT_EQ(TokenizeToIds("Don't", vocabulary), (Ids{0}));
  EXPECT_EQ(TokenizeToIds("X11R5", vocabulary), (Ids{}));
  EXPECT_EQ(TokenizeToIds("e-mail", vocabulary), (Ids{1}));
  EXPECT_EQ(TokenizeToIds("caf\xc3\xa9", vocabulary), (Ids{2}));  // "café" → caf, not cafe
  EXPECT_EQ(TokenizeToIds("abc123DEF", vocabulary), (Ids{3, 4}));
}

TEST(TokenizerTest, HandComputedDocument) {
  const Vocabulary vocabulary = TestVocabulary();
  // Runs, left to right: Hello WORLD The world s ABC def hello HELLO xx caf e
  // mail abc def Don t THE the tHe ab worldly. The Kelvin sign U+212A
  // (E2 84 AA) is not an ASCII letter, so "\u212Aab" gives "ab", not "kab".
  const std::string text =
      "Hello, WORLD! The_world's ABC-def; hello\tHELLO\nxx caf\xc3\xa9 e-mail abc123def "
      "Don't THE the tHe\xe2\x84\xaa" "ab worldly";
  EXPECT_EQ(TokenizeToIds(text, vocabulary),
            (Ids{9, 10, 13, 10, 3, 4, 9, 9, 2, 1, 3, 4, 0, 13, 13, 13, 11}));
}

TEST(TokenizerTest, EdgesOfTheText) {
  const Vocabulary vocabulary = TestVocabulary();
  EXPECT_EQ(TokenizeToIds("", vocabulary), (Ids{}));
  EXPECT_EQ(TokenizeToIds("   ...  ", vocabulary), (Ids{}));
  EXPECT_EQ(TokenizeToIds("abc", vocabulary), (Ids{3}));  // run at both ends
  EXPECT_EQ(TokenizeToIds("x", vocabulary), (Ids{}));
  EXPECT_EQ(TokenizeToIds(" def", vocabulary), (Ids{4}));
  EXPECT_EQ(TokenizeToIds("def ", vocabulary), (Ids{4}));
  // NUL and every other byte outside [A-Za-z] separates.
  EXPECT_EQ(TokenizeToIds(std::string_view("abc\0def", 7), vocabulary), (Ids{3, 4}));
  EXPECT_EQ(TokenizeToIds("abc@def[the`hello{world", vocabulary), (Ids{3, 4, 13, 9, 10}));
  // Runs longer than any term never match, even when a prefix is a term.
  EXPECT_EQ(TokenizeToIds("abcdef helloworld thethe", vocabulary), (Ids{}));
}

TEST(TokenizerTest, InvalidUtf8BytesOnlySeparate) {
  const Vocabulary vocabulary = TestVocabulary();
  EXPECT_EQ(TokenizeToIds("ab\xff" "cd\x80" "def\xc3", vocabulary), (Ids{11, 4}));
}

TEST(TokenizerTest, LongUppercaseRunsUseTheHeapBuffer) {
  const std::string term(35, 'a');
  const std::string long_term = term + std::string(35, 'b');  // 70 letters > stack buffer
  StatusOr<Vocabulary> vocabulary = Vocabulary::Parse("ab\n" + long_term + "\n");
  ASSERT_TRUE(vocabulary.ok());
  std::string upper = long_term;
  for (char& c : upper) c = static_cast<char>(c - 'a' + 'A');
  upper[3] = 'a';  // mixed case
  EXPECT_EQ(TokenizeToIds(upper + " AB " + long_term, *vocabulary), (Ids{1, 0, 1}));
  EXPECT_EQ(TokenizeToIds(upper + "B", *vocabulary), (Ids{}));  // 71 letters
  EXPECT_EQ(FindWordId(upper, *vocabulary), 1);
}

TEST(TokenizerTest, AppendKeepsExistingIds) {
  const Vocabulary vocabulary = TestVocabulary();
  Ids ids = {7, 7};
  AppendTokenIds("the mail", vocabulary, ids);
  EXPECT_EQ(ids, (Ids{7, 7, 13, 1}));
}

TEST(TokenizerTest, FindWordIdAppliesRulesThreeToFive) {
  const Vocabulary vocabulary = TestVocabulary();
  EXPECT_EQ(FindWordId("mail", vocabulary), 1);
  EXPECT_EQ(FindWordId("MaIL", vocabulary), 1);
  EXPECT_EQ(FindWordId("X", vocabulary), std::nullopt);   // too short, though "x" is a term
  EXPECT_EQ(FindWordId("t", vocabulary), std::nullopt);
  EXPECT_EQ(FindWordId("", vocabulary), std::nullopt);
  EXPECT_EQ(FindWordId("e-mail", vocabulary), std::nullopt);  // not split
  EXPECT_EQ(FindWordId("abc123", vocabulary), std::nullopt);
  EXPECT_EQ(FindWordId("caf\xc3\xa9", vocabulary), std::nullopt);
  EXPECT_EQ(FindWordId("mails", vocabulary), std::nullopt);
  EXPECT_EQ(FindWordId(" the", vocabulary), std::nullopt);
}

// An independent, deliberately naive statement of rules 2–5 for the
// randomized comparison below.
Ids NaiveTokenize(const std::string& text, const Vocabulary& vocabulary) {
  Ids ids;
  std::string run;
  auto flush = [&] {
    if (run.size() >= 2) {
      if (auto id = vocabulary.Find(run)) ids.push_back(*id);
    }
    run.clear();
  };
  for (const char c : text) {
    if (c >= 'a' && c <= 'z') {
      run.push_back(c);
    } else if (c >= 'A' && c <= 'Z') {
      run.push_back(static_cast<char>(c + ('a' - 'A')));
    } else {
      flush();
    }
  }
  flush();
  return ids;
}

TEST(TokenizerTest, MatchesNaiveReferenceOnRandomText) {
  const Vocabulary vocabulary = TestVocabulary();
  std::mt19937 rng(20240607);
  // Texts are random sequences of pieces: a term in random case (so matches
  // are frequent), a single random letter (which may glue onto a neighbour),
  // or a separator byte, including ASCII neighbours of the letter ranges and
  // non-ASCII bytes.
  const std::string letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
  const std::string separators = " -'_1@[`{\n\t\xc3\xa9\xff\x80";
  std::uniform_int_distribution<int32_t> term(0, vocabulary.size() - 1);
  std::uniform_int_distribution<size_t> letter(0, letters.size() - 1);
  std::uniform_int_distribution<size_t> separator(0, separators.size() - 1);
  std::uniform_int_distribution<int> piece_kind(0, 2);
  std::uniform_int_distribution<int> pieces(0, 60);
  std::bernoulli_distribution upper(0.3);
  size_t total_ids = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::string text;
    for (int p = pieces(rng); p > 0; --p) {
      switch (piece_kind(rng)) {
        case 0:
          for (char c : vocabulary.term(term(rng))) {
            text += upper(rng) ? static_cast<char>(c - 'a' + 'A') : c;
          }
          break;
        case 1: text += letters[letter(rng)]; break;
        default: text += separators[separator(rng)]; break;
      }
    }
    const Ids expected = NaiveTokenize(text, vocabulary);
    ASSERT_EQ(TokenizeToIds(text, vocabulary), expected) << testing::PrintToString(text);
    total_ids += expected.size();
  }
  EXPECT_GT(total_ids, 1500u);  // the comparison exercised many real matches
}

TEST(TokenizerTest, PreSplitWordsTokenizeLikeTheJoinedText) {
  const Vocabulary vocabulary = TestVocabulary();
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> term(0, vocabulary.size() - 1);
  std::bernoulli_distribution upper(0.3);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<std::string> words(static_cast<size_t>(trial % 17));
    std::string joined;
    Ids from_words;
    for (std::string& word : words) {
      word = vocabulary.term(term(rng));
      for (char& c : word) {
        if (upper(rng)) c = static_cast<char>(c - 'a' + 'A');
      }
      joined += word + " ";
      if (auto id = FindWordId(word, vocabulary)) from_words.push_back(*id);
    }
    EXPECT_EQ(TokenizeToIds(joined, vocabulary), from_words) << joined;
  }
}

}  // namespace
}  // namespace vipsd::text
