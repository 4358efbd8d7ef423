#include "core/text/vocabulary.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace vipsd::text {
namespace {

Vocabulary ParseOrDie(std::string_view text) {
  StatusOr<Vocabulary> vocabulary = Vocabulary::Parse(text);
  EXPECT_TRUE(vocabulary.ok()) << vocabulary.status().ToString();
  return std::move(vocabulary).value();
}

// Expects Parse to fail with INVALID_ARGUMENT naming `line` and `problem`.
void ExpectLineError(std::string_view text, int line, std::string_view problem) {
  StatusOr<Vocabulary> vocabulary = Vocabulary::Parse(text);
  ASSERT_FALSE(vocabulary.ok()) << "accepted: " << testing::PrintToString(std::string(text));
  EXPECT_EQ(vocabulary.status().code(), StatusCode::kInvalidArgument);
  const std::string& message = vocabulary.status().message();
  EXPECT_NE(message.find("vocabulary line " + std::to_string(line) + ":"), std::string::npos)
      << message;
  EXPECT_NE(message.find(problem), std::string::npos) << message;
}

TEST(VocabularyTest, IdsAreZeroBasedLineNumbers) {
  const Vocabulary vocabulary = ParseOrDie("alpha\nbeta\ngamma\n");
  ASSERT_EQ(vocabulary.size(), 3);
  EXPECT_EQ(vocabulary.term(0), "alpha");
  EXPECT_EQ(vocabulary.term(1), "beta");
  EXPECT_EQ(vocabulary.term(2), "gamma");
  EXPECT_EQ(vocabulary.Find("alpha"), 0);
  EXPECT_EQ(vocabulary.Find("gamma"), 2);
  EXPECT_EQ(vocabulary.Find("delta"), std::nullopt);
  EXPECT_EQ(vocabulary.Find("Beta"), std::nullopt);  // exact match only
  EXPECT_EQ(vocabulary.Find("bet"), std::nullopt);
  EXPECT_EQ(vocabulary.Find(""), std::nullopt);
  EXPECT_EQ(vocabulary.max_term_length(), 5u);
}

TEST(VocabularyTest, FinalLineEndIsOptionalAndCrlfIsAccepted) {
  const Vocabulary lf = ParseOrDie("alpha\nbeta\n");
  const Vocabulary no_final_end = ParseOrDie("alpha\nbeta");
  const Vocabulary crlf = ParseOrDie("alpha\r\nbeta\r\n");
  const Vocabulary mixed = ParseOrDie("alpha\r\nbeta");
  for (const Vocabulary* vocabulary : {&no_final_end, &crlf, &mixed}) {
    ASSERT_EQ(vocabulary->size(), 2);
    EXPECT_EQ(vocabulary->term(0), "alpha");
    EXPECT_EQ(vocabulary->term(1), "beta");
    EXPECT_EQ(vocabulary->Find("beta"), 1);
    // Same ids, so the same canonical text and fingerprint.
    EXPECT_EQ(vocabulary->Fingerprint(), lf.Fingerprint());
  }
}

TEST(VocabularyTest, DuplicateNamesBothLines) {
  ExpectLineError("alpha\nbeta\nalpha\n", 3, "duplicate of line 1");
}

TEST(VocabularyTest, UppercaseIsRejected) {
  ExpectLineError("alpha\nBeta\n", 2, "other than a-z");
}

TEST(VocabularyTest, EmptyLinesAreRejected) {
  ExpectLineError("alpha\n\nbeta\n", 2, "empty line");
  ExpectLineError("alpha\nbeta\n\n", 3, "empty line");  // blank line at the end
  ExpectLineError("\n", 1, "empty line");
  ExpectLineError("alpha\r\n\r\n", 2, "empty line");
}

TEST(VocabularyTest, NonLettersAreRejected) {
  ExpectLineError("alpha\nabc1\n", 2, "other than a-z");
  ExpectLineError("alpha\nbeta\ngam ma\n", 3, "other than a-z");
  ExpectLineError("alpha\nfoo_bar\n", 2, "other than a-z");
  ExpectLineError("caf\xc3\xa9\n", 1, "other than a-z");           // é
  ExpectLineError("\xef\xbb\xbf" "alpha\n", 1, "other than a-z");  // byte-order mark
  ExpectLineError("alpha\nbeta ", 2, "other than a-z");
  ExpectLineError("alpha\r", 1, "other than a-z");        // lone "\r" is not a line end
  ExpectLineError("alpha\r\r\nbeta", 1, "other than a-z");
  ExpectLineError("al\rpha\n", 1, "other than a-z");
  ExpectLineError(std::string_view("ab\0c\n", 5), 1, "other than a-z");
}

TEST(VocabularyTest, EmptyFileIsRejected) {
  StatusOr<Vocabulary> vocabulary = Vocabulary::Parse("");
  ASSERT_FALSE(vocabulary.ok());
  EXPECT_EQ(vocabulary.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(vocabulary.status().message().find("empty"), std::string::npos);
}

TEST(VocabularyTest, FingerprintIsBlake2b256OfCanonicalText) {
  // Expected values from an independent implementation (Python's
  // hashlib.blake2b(data, digest_size=32)).
  EXPECT_EQ(ParseOrDie("alpha\nbeta\n").Fingerprint(),
            "3e5d8fcc9b631a2d75cead98723e0be2aff0f0cce3700b8b58e9150f77f81023");
  EXPECT_EQ(ParseOrDie("beta\r\nalpha").Fingerprint(),
            "6f98b7c5703c73ef558815f9e57615860bc56a0af3b262ab99a8db41c333f858");
}

TEST(VocabularyTest, FingerprintIsStableAndChangesWithContent) {
  const std::string base = ParseOrDie("alpha\nbeta\ngamma\n").Fingerprint();
  EXPECT_EQ(base.size(), 64u);
  EXPECT_EQ(base.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(ParseOrDie("alpha\nbeta\ngamma\n").Fingerprint(), base);
  EXPECT_NE(ParseOrDie("alpha\ngamma\nbeta\n").Fingerprint(), base);  // order = ids
  EXPECT_NE(ParseOrDie("alpha\nbeta\ngammas\n").Fingerprint(), base);
  EXPECT_NE(ParseOrDie("alpha\nbeta\n").Fingerprint(), base);
  EXPECT_NE(ParseOrDie("alpha\nbeta\ngamma\ndelta\n").Fingerprint(), base);
  // Line ends are part of the canonical text: "ab" + "c" differs from "a" + "bc".
  EXPECT_NE(ParseOrDie("ab\nc\n").Fingerprint(), ParseOrDie("a\nbc\n").Fingerprint());
}

TEST(VocabularyTest, CopiesAreIndependentAndLookupsSurviveMoves) {
  Vocabulary original = ParseOrDie("alpha\nbeta\n");
  const Vocabulary copy = original;
  Vocabulary moved = std::move(original);
  EXPECT_EQ(copy.Find("beta"), 1);
  EXPECT_EQ(moved.Find("beta"), 1);
  EXPECT_EQ(moved.term(0), "alpha");
  EXPECT_EQ(copy.Fingerprint(), moved.Fingerprint());
}

TEST(VocabularyTest, LargeVocabularyRoundTrips) {
  std::string text;
  // All 26 * 26 * 26 three-letter terms, in order.
  for (char a = 'a'; a <= 'z'; ++a) {
    for (char b = 'a'; b <= 'z'; ++b) {
      for (char c = 'a'; c <= 'z'; ++c) text += std::string{a, b, c, '\n'};
    }
  }
  const Vocabulary vocabulary = ParseOrDie(text);
  ASSERT_EQ(vocabulary.size(), 26 * 26 * 26);
  for (int32_t id = 0; id < vocabulary.size(); ++id) {
    ASSERT_EQ(vocabulary.Find(vocabulary.term(id)), id);
  }
  EXPECT_EQ(vocabulary.Find("zzz"), 26 * 26 * 26 - 1);
  EXPECT_EQ(vocabulary.term(26 * 26 + 26 + 1), "bbb");
  EXPECT_EQ(vocabulary.Find("zz"), std::nullopt);
  EXPECT_EQ(vocabulary.Find("ABC"), std::nullopt);
}

TEST(VocabularyTest, TermsOfEveryLengthAreFoundAndNearMissesAreNot) {
  // Lengths 1..40 cover every tail size of the 8-byte hash loop; each length
  // has several terms that differ only in their first, middle or last byte.
  std::string text;
  std::vector<std::string> terms;
  for (size_t length = 1; length <= 40; ++length) {
    for (const size_t position : {size_t{0}, length / 2, length - 1}) {
      std::string term(length, 'm');
      term[position] = 'q';
      if (std::find(terms.begin(), terms.end(), term) != terms.end()) continue;
      terms.push_back(term);
      text += term + "\n";
    }
  }
  const Vocabulary vocabulary = ParseOrDie(text);
  ASSERT_EQ(vocabulary.size(), static_cast<int32_t>(terms.size()));
  EXPECT_EQ(vocabulary.max_term_length(), 40u);
  for (size_t id = 0; id < terms.size(); ++id) {
    EXPECT_EQ(vocabulary.Find(terms[id]), static_cast<int32_t>(id)) << terms[id];
    std::string near_miss = terms[id];
    near_miss.back() = near_miss.back() == 'm' ? 'n' : 'r';
    EXPECT_EQ(vocabulary.Find(near_miss), std::nullopt) << near_miss;
    EXPECT_EQ(vocabulary.Find(terms[id] + "q"), std::nullopt);  // two q: never a term
  }
  EXPECT_EQ(vocabulary.Find(std::string(40, 'm')), std::nullopt);  // no 'q' anywhere
}

TEST(VocabularyTest, FindComparesEveryByteOfShortAndLongTerms) {
  // The table keeps the first 8 bytes and the length inline: terms that
  // share them must still be told apart by their remaining bytes.
  const std::string text =
      "a\nab\nabc\nabcd\nabcde\nabcdef\nabcdefg\nabcdefgh\nabcdefghi\nabcdefghij\n"
      "abcdefghik\nabcdefghijklmnopq\nabcdefghijklmnopr\nbbcd\nabce\n";
  auto vocabulary = Vocabulary::Parse(text);
  ASSERT_TRUE(vocabulary.ok()) << vocabulary.status().ToString();
  for (int32_t id = 0; id < vocabulary->size(); ++id) {
    EXPECT_EQ(vocabulary->Find(vocabulary->term(id)), id) << vocabulary->term(id);
  }
  for (const char* absent : {"", "b", "abcdefghh", "abcdefghijk", "abcdefghijklmnopz",
                             "abcdefghijklmnop", "bbce", "abcf", "abcdefgi", "aa"}) {
    EXPECT_FALSE(vocabulary->Find(absent).has_value()) << absent;
  }
  // A word inside a longer buffer is read only within its bounds.
  const std::string buffer = "xxabcdyy";
  EXPECT_EQ(vocabulary->Find(std::string_view(buffer).substr(2, 4)), vocabulary->Find("abcd"));
}

}  // namespace
}  // namespace vipsd::text
