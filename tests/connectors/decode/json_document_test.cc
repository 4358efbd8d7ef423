#include "connectors/decode/json_document.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

namespace vipsd::connectors {
namespace {

using Ids = std::vector<int32_t>;

text::Vocabulary TestVocabulary() {
  // ids: 0 alpha, 1 beta, 2 gamma, 3 don
  StatusOr<text::Vocabulary> vocabulary = text::Vocabulary::Parse("alpha\nbeta\ngamma\ndon\n");
  EXPECT_TRUE(vocabulary.ok());
  return std::move(vocabulary).value();
}

text::Document ExpectDocument(std::string_view record, const text::Vocabulary& vocabulary) {
  DecodeResult result = DecodeJsonDocument(record, vocabulary);
  if (const auto* failure = std::get_if<DecodeFailure>(&result)) {
    ADD_FAILURE() << "rejected as " << RejectReasonName(failure->reason) << ": " << record;
    return {};
  }
  return std::get<text::Document>(std::move(result));
}

void ExpectRejected(std::string_view record, RejectReason reason,
                    const text::Vocabulary& vocabulary) {
  DecodeResult result = DecodeJsonDocument(record, vocabulary);
  const auto* failure = std::get_if<DecodeFailure>(&result);
  ASSERT_NE(failure, nullptr) << "accepted: " << testing::PrintToString(std::string(record));
  EXPECT_EQ(failure->reason, reason)
      << "got " << RejectReasonName(failure->reason) << " for "
      << testing::PrintToString(std::string(record));
}

TEST(JsonDocumentTest, TextRecord) {
  const text::Vocabulary vocabulary = TestVocabulary();
  const text::Document document = ExpectDocument(
      R"({"id": "doc-1", "label": "ignored", "text": "Alpha, BETA; alpha-gamma Don't delta"})",
      vocabulary);
  EXPECT_EQ(document.id, "doc-1");
  EXPECT_EQ(document.word_ids, (Ids{0, 1, 0, 2, 3}));
}

TEST(JsonDocumentTest, TextEscapesAreDecodedBeforeTokenizing) {
  const text::Vocabulary vocabulary = TestVocabulary();
  // \u0041 is "A"; \u00e9 is é (non-ASCII, a separator); \n separates.
  const text::Document document =
      ExpectDocument(R"({"id": "e", "text": "\u0041lpha\u00e9beta\ngamma"})", vocabulary);
  EXPECT_EQ(document.word_ids, (Ids{0, 1, 2}));
}

TEST(JsonDocumentTest, TokensRecord) {
  const text::Vocabulary vocabulary = TestVocabulary();
  const text::Document document = ExpectDocument(
      R"({"id": "t", "tokens": ["GAMMA", "alpha", "delta", "alpha-beta", "a", "Beta", "alpha"]})",
      vocabulary);
  EXPECT_EQ(document.word_ids, (Ids{2, 0, 1, 0}));
}

TEST(JsonDocumentTest, IntegerIdsAreKeptInDecimal) {
  const text::Vocabulary vocabulary = TestVocabulary();
  EXPECT_EQ(ExpectDocument(R"({"id": 17, "text": "alpha"})", vocabulary).id, "17");
  EXPECT_EQ(ExpectDocument(R"({"id": 0, "text": ""})", vocabulary).id, "0");
  EXPECT_EQ(ExpectDocument(R"({"id": -5, "text": ""})", vocabulary).id, "-5");
  EXPECT_EQ(ExpectDocument(R"({"id": 18446744073709551615, "text": ""})", vocabulary).id,
            "18446744073709551615");
}

TEST(JsonDocumentTest, RecordsWithoutVocabularyWordsAreValidAndEmpty) {
  const text::Vocabulary vocabulary = TestVocabulary();
  const text::Document from_text =
      ExpectDocument(R"({"id": "x", "text": "nothing here 123"})", vocabulary);
  EXPECT_EQ(from_text.id, "x");
  EXPECT_TRUE(from_text.word_ids.empty());
  EXPECT_TRUE(ExpectDocument(R"({"id": "y", "tokens": []})", vocabulary).word_ids.empty());
  EXPECT_TRUE(ExpectDocument(R"({"id": "z", "text": ""})", vocabulary).word_ids.empty());
}

TEST(JsonDocumentTest, DuplicateKeysKeepTheLastValue) {
  const text::Vocabulary vocabulary = TestVocabulary();
  const text::Document document =
      ExpectDocument(R"({"id": "a", "text": "alpha", "id": "b", "text": "beta"})", vocabulary);
  EXPECT_EQ(document.id, "b");
  EXPECT_EQ(document.word_ids, (Ids{1}));
}

TEST(JsonDocumentTest, EveryRejectionReason) {
  const text::Vocabulary vocabulary = TestVocabulary();
  ExpectRejected(R"({"id": 1, "text": "alpha")", RejectReason::kInvalidJson, vocabulary);
  ExpectRejected(R"({"id": 1,, "text": "alpha"})", RejectReason::kInvalidJson, vocabulary);
  ExpectRejected(R"({"id": 1, "text": "alpha"} x)", RejectReason::kInvalidJson, vocabulary);
  ExpectRejected(R"({"id": 1, "text": "alpha"} {})", RejectReason::kInvalidJson, vocabulary);
  ExpectRejected(R"(/* c */ {"id": 1, "text": "a"})", RejectReason::kInvalidJson, vocabulary);
  ExpectRejected(R"({'id': 1})", RejectReason::kInvalidJson, vocabulary);
  ExpectRejected(R"({"id": 1, "text": "\ud800"})", RejectReason::kInvalidJson, vocabulary);
  ExpectRejected("{\"id\": 1, \"text\": \"tab\there\"}", RejectReason::kInvalidJson,
                 vocabulary);  // raw control character in a string
  ExpectRejected("", RejectReason::kInvalidJson, vocabulary);

  ExpectRejected(R"([{"id": 1, "text": "alpha"}])", RejectReason::kNotAnObject, vocabulary);
  ExpectRejected(R"("alpha")", RejectReason::kNotAnObject, vocabulary);
  ExpectRejected("42", RejectReason::kNotAnObject, vocabulary);
  ExpectRejected("null", RejectReason::kNotAnObject, vocabulary);

  ExpectRejected(R"({"text": "alpha"})", RejectReason::kMissingId, vocabulary);
  ExpectRejected(R"({"ID": 1, "text": "alpha"})", RejectReason::kMissingId, vocabulary);

  ExpectRejected(R"({"id": "", "text": "alpha"})", RejectReason::kBadId, vocabulary);
  ExpectRejected(R"({"id": 1.5, "text": "alpha"})", RejectReason::kBadId, vocabulary);
  ExpectRejected(R"({"id": 1.0, "text": "alpha"})", RejectReason::kBadId, vocabulary);
  ExpectRejected(R"({"id": null, "text": "alpha"})", RejectReason::kBadId, vocabulary);
  ExpectRejected(R"({"id": true, "text": "alpha"})", RejectReason::kBadId, vocabulary);
  ExpectRejected(R"({"id": ["a"], "text": "alpha"})", RejectReason::kBadId, vocabulary);
  ExpectRejected(R"({"id": {}, "text": "alpha"})", RejectReason::kBadId, vocabulary);

  ExpectRejected(R"({"id": 1})", RejectReason::kMissingText, vocabulary);
  ExpectRejected(R"({"id": 1, "body": "alpha"})", RejectReason::kMissingText, vocabulary);

  ExpectRejected(R"({"id": 1, "text": 5})", RejectReason::kBadText, vocabulary);
  ExpectRejected(R"({"id": 1, "text": null})", RejectReason::kBadText, vocabulary);
  ExpectRejected(R"({"id": 1, "text": ["alpha"]})", RejectReason::kBadText, vocabulary);

  ExpectRejected(R"({"id": 1, "tokens": "alpha beta"})", RejectReason::kBadTokens, vocabulary);
  ExpectRejected(R"({"id": 1, "tokens": ["alpha", 2]})", RejectReason::kBadTokens, vocabulary);
  ExpectRejected(R"({"id": 1, "tokens": ["alpha", null]})", RejectReason::kBadTokens,
                 vocabulary);
  ExpectRejected(R"({"id": 1, "tokens": [["alpha"]]})", RejectReason::kBadTokens, vocabulary);
  ExpectRejected(R"({"id": 1, "tokens": {"alpha": 1}})", RejectReason::kBadTokens, vocabulary);

  ExpectRejected(R"({"id": 1, "text": "alpha", "tokens": ["alpha"]})",
                 RejectReason::kBothTextAndTokens, vocabulary);
  ExpectRejected(R"({"id": 1, "text": null, "tokens": null})", RejectReason::kBothTextAndTokens,
                 vocabulary);

  ExpectRejected("{\"id\": 1, \"text\": \"alpha\xff\"}", RejectReason::kInvalidUtf8, vocabulary);
  ExpectRejected("{\"id\": 1, \"text\": \"\xc0\xaf\"}", RejectReason::kInvalidUtf8, vocabulary);
  // The id check precedes the text check, and a missing id precedes both.
  ExpectRejected(R"({"text": 5, "tokens": 6})", RejectReason::kMissingId, vocabulary);
  ExpectRejected(R"({"id": 2.5, "text": 5})", RejectReason::kBadId, vocabulary);
}

TEST(JsonDocumentTest, DeepNestingIsRejectedWithoutCrashing) {
  const text::Vocabulary vocabulary = TestVocabulary();
  const std::string deep_array = std::string(100000, '[') + std::string(100000, ']');
  ExpectRejected(deep_array, RejectReason::kNotAnObject, vocabulary);
  const std::string deep_id =
      R"({"id": )" + std::string(100000, '[') + std::string(100000, ']') + R"(, "text": ""})";
  ExpectRejected(deep_id, RejectReason::kBadId, vocabulary);
}

TEST(JsonDocumentTest, Utf8Validation) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("plain ascii that is longer than eight bytes"));
  EXPECT_TRUE(IsValidUtf8("caf\xc3\xa9"));              // U+00E9
  EXPECT_TRUE(IsValidUtf8("\xe2\x84\xaa"));             // U+212A
  EXPECT_TRUE(IsValidUtf8("\xed\x9f\xbf"));             // U+D7FF, last before surrogates
  EXPECT_TRUE(IsValidUtf8("\xee\x80\x80"));             // U+E000, first after
  EXPECT_TRUE(IsValidUtf8("\xf0\x9f\x98\x80 ok"));      // U+1F600
  EXPECT_TRUE(IsValidUtf8("\xf4\x8f\xbf\xbf"));         // U+10FFFF
  EXPECT_TRUE(IsValidUtf8(std::string_view("a\0b", 3)));
  EXPECT_FALSE(IsValidUtf8("\x80"));                    // lone continuation
  EXPECT_FALSE(IsValidUtf8("abcdefgh\xbf"));            // after the 8-byte fast path
  EXPECT_FALSE(IsValidUtf8("\xc0\xaf"));                // overlong '/'
  EXPECT_FALSE(IsValidUtf8("\xc1\xbf"));                // overlong
  EXPECT_FALSE(IsValidUtf8("\xe0\x9f\xbf"));            // overlong 3-byte
  EXPECT_FALSE(IsValidUtf8("\xed\xa0\x80"));            // U+D800 surrogate
  EXPECT_FALSE(IsValidUtf8("\xf0\x8f\xbf\xbf"));        // overlong 4-byte
  EXPECT_FALSE(IsValidUtf8("\xf4\x90\x80\x80"));        // U+110000
  EXPECT_FALSE(IsValidUtf8("\xf5\x80\x80\x80"));
  EXPECT_FALSE(IsValidUtf8("\xff"));
  EXPECT_FALSE(IsValidUtf8("caf\xc3"));                 // truncated at the end
  EXPECT_FALSE(IsValidUtf8("\xe2\x84"));
  EXPECT_FALSE(IsValidUtf8("\xe2\x84z"));               // bad continuation
  EXPECT_FALSE(IsValidUtf8("\xf0\x9f\x98z"));
}

TEST(JsonDocumentTest, ReasonNamesAreDistinctSnakeCaseAndDescriptionsNameOnlyKeys) {
  std::set<std::string_view> names;
  for (size_t i = 0; i < kNumRejectReasons; ++i) {
    const auto reason = static_cast<RejectReason>(i);
    const std::string_view name = RejectReasonName(reason);
    EXPECT_NE(name, "unknown");
    EXPECT_EQ(name.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_"), std::string_view::npos)
        << name;
    names.insert(name);
    EXPECT_NE(RejectReasonDescription(reason), "unknown reason");
  }
  EXPECT_EQ(names.size(), kNumRejectReasons);
  EXPECT_EQ(RejectReasonName(RejectReason::kBothTextAndTokens), "both_text_and_tokens");
  EXPECT_NE(RejectReasonDescription(RejectReason::kBadTokens).find("\"tokens\""),
            std::string_view::npos);
}

}  // namespace
}  // namespace vipsd::connectors
