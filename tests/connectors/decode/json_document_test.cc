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

// The scanner behind DecodeJsonDocument must return exactly what the
// nlohmann reference returns: the same reason, or the same id and word ids.
void ExpectSameAsReference(std::string_view record, const text::Vocabulary& vocabulary) {
  const DecodeResult fast = DecodeJsonDocument(record, vocabulary);
  const DecodeResult reference = DecodeJsonDocumentReference(record, vocabulary);
  const std::string shown = testing::PrintToString(std::string(record));
  ASSERT_EQ(fast.index(), reference.index()) << shown;
  if (const auto* failure = std::get_if<DecodeFailure>(&reference)) {
    EXPECT_EQ(RejectReasonName(std::get<DecodeFailure>(fast).reason),
              RejectReasonName(failure->reason))
        << shown;
  } else {
    EXPECT_EQ(std::get<text::Document>(fast).id, std::get<text::Document>(reference).id) << shown;
    EXPECT_EQ(std::get<text::Document>(fast).word_ids,
              std::get<text::Document>(reference).word_ids)
        << shown;
  }
}

TEST(JsonDocumentTest, ScannerAgreesWithTheReferenceOnEdgeCases) {
  const text::Vocabulary vocabulary = TestVocabulary();
  using namespace std::string_literals;
  const std::vector<std::string> records = {
      "", " ", "{", "}", "{}", "[]", "null", "true", "false", "nul", "tru", "1", "-", "\"x\"",
      R"({"id": 1, "text": "alpha beta"})",
      R"(  {"id": 1, "text": "alpha beta"}  )",
      "\t\r\n{\"id\":1,\"text\":\"alpha\"}\r\n",
      R"({"id": 1, "text": "alpha"},)", R"({"id": 1, "text": "alpha"} x)",
      R"({"id": 1, "text": "alpha"}{})", R"({"id": 1, "text": "alpha",})",
      R"({"id": 1 "text": "alpha"})", R"({"id" 1, "text": "alpha"})", R"({id: 1})",
      R"({'id': 1})", R"({"id": 1, "text": "alpha"} // c)", R"(/*c*/{"id":1,"text":""})",
      // A byte order mark at the start only; a NUL after the value ends the input.
      "\xEF\xBB\xBF{\"id\":1,\"text\":\"alpha\"}", " \xEF\xBB\xBF{\"id\":1,\"text\":\"\"}",
      "\xEF\xBB{\"id\":1}", "\xEF\xBB\xBF", "{\"id\":1,\"text\":\"alpha\"}\0junk"s,
      "{\"id\":1,\"text\":\"alpha\"} \0"s, "{\"id\":1,\0\"text\":\"alpha\"}"s, "\0"s,
      "{\"id\":1,\"text\":\"al\0pha\"}"s, "{\"id\":1,\"text\":\"a\x01\"}", "{\"id\":1,\"text\":\"a\x7f\"}",
      "{\"id\":1,\"text\":\"tab\there\"}",
      // Numbers: grammar, integer ranges, overflow of a double.
      R"({"id": 01, "text": ""})", R"({"id": -0, "text": ""})", R"({"id": -, "text": ""})",
      R"({"id": 1., "text": ""})", R"({"id": .5, "text": ""})", R"({"id": 1e5, "text": ""})",
      R"({"id": 1E+5, "text": ""})", R"({"id": 1e, "text": ""})", R"({"id": 1.5e-3, "text": ""})",
      R"({"id": +1, "text": ""})", R"({"id": 0x10, "text": ""})", R"({"id": 1.0, "text": ""})",
      R"({"id": 9223372036854775807, "text": ""})", R"({"id": -9223372036854775808, "text": ""})",
      R"({"id": -9223372036854775809, "text": ""})", R"({"id": 18446744073709551615, "text": ""})",
      R"({"id": 18446744073709551616, "text": ""})", R"({"id": 000, "text": ""})",
      R"({"id": 00000000000000000001, "text": ""})", R"({"id": -00, "text": ""})",
      R"({"id": 1e308, "text": ""})", R"({"id": 1e309, "text": ""})", R"({"id": -1e400, "text": ""})",
      R"({"id": 1e-400, "text": ""})", R"({"id": "a", "text": "", "x": 2e308})",
      R"({"id": "a", "text": "", "x": 1.7976931348623157e308})",
      R"({"id": "a", "text": "", "x": 1.7976931348623159e308})",
      "{\"id\": 1" + std::string(400, '0') + ", \"text\": \"\"}",
      "{\"id\": 1" + std::string(300, '0') + ", \"text\": \"\"}",
      "{\"id\": 1" + std::string(308, '0') + ".5, \"text\": \"\"}",
      "{\"id\": 0." + std::string(400, '0') + "1e400, \"text\": \"\"}",
      // Strings and escapes.
      R"({"id": "", "text": ""})", R"({"id": "\u0000", "text": ""})", R"({"id": "\"", "text": ""})",
      R"({"id": "a", "text": "alpha\nbeta\tgamma\\don\/x\"y"})", R"({"id": "a", "text": "\q"})",
      R"({"id": "a", "text": "\u00"})", R"({"id": "a", "text": "\u00zz"})",
      R"({"id": "a", "text": "\u0041LPHA \u0062eta"})", R"({"id": "a", "text": "\ud83d\ude00alpha"})",
      R"({"id": "a", "text": "\ud83d alpha"})", R"({"id": "a", "text": "\ud83d\u0041"})",
      R"({"id": "a", "text": "\ude00"})", R"({"id": "a", "text": "\uDBFF\uDFFF"})",
      R"({"id": "a", "text": "\ud83d\"})", R"({"id": "a", "text": "x\"})", R"({"id": "a", "text": "x\)",
      R"({"id": "a", "text": "unterminated})", "{\"id\": \"a\", \"text\": \"caf\xc3\xa9 alpha\"}",
      // Keys: escapes, duplicates (the last wins), other keys ignored.
      R"({"\u0069d": 5, "te\u0078t": "beta"})", R"({"id": 1, "text": "alpha", "text": 3})",
      R"({"id": 1, "text": 3, "text": "alpha"})", R"({"id": [], "id": "z", "text": ""})",
      R"({"id": "z", "id": {}, "text": ""})", R"({"id": 1, "tokens": ["alpha"], "tokens": 2})",
      R"({"id": 1, "text": "a", "label": {"x": [1, 2, {"y": null}]}, "z": [[[]]]})",
      R"({"id": 1, "text": "a", "label": {"x": [1, 2, {"y": nul}]}})",
      R"({"id": 1, "text": "a", "label": [1, 2,]})", R"({"id": 1, "text": "a", "label": [1 2]})",
      R"({"id": 1, "text": "a", "label": {"k" 1}})", R"({"id": 1, "text": "a", "label": {"k": 1,}})",
      R"({"id": 1, "text": "a", "label": {1: 1}})", R"({"id": 1, "text": "a", "label": [}})",
      R"({"id": 1, "text": "a", "label": {]})", R"({"id": 1, "text": "a", "": ""})",
      // Every reason.
      R"({"text": "alpha"})", R"({"id": true, "text": "alpha"})", R"({"id": null, "text": "a"})",
      R"({"id": 1.5, "text": "alpha"})", R"({"id": 1})", R"({"id": 1, "text": ["alpha"]})",
      R"({"id": 1, "text": "a", "tokens": []})", R"({"id": 1, "tokens": "alpha"})",
      R"({"id": 1, "tokens": ["alpha", 3]})", R"({"id": 1, "tokens": ["alpha", ["beta"]]})",
      R"({"id": 1, "tokens": ["Alpha", "BETA", "al pha", "gamma!", "don", "\u0061lpha"]})",
      R"({"id": 1, "tokens": []})", R"({"id": 1, "tokens": [ ]})", R"({"id": 1, "tokens": {}})",
      R"({"id": 1, "tokens": null})", "[1, 2", "[1, 2]", "{\"a\": [1, 2]", "\xc3\x28",
  };
  for (const std::string& record : records) ExpectSameAsReference(record, vocabulary);
}

TEST(JsonDocumentTest, ScannerAgreesWithTheReferenceOnMutatedRecords) {
  // Every one-byte change (from a set of JSON-significant bytes), deletion
  // and truncation of a few valid records.
  const text::Vocabulary vocabulary = TestVocabulary();
  const std::vector<std::string> seeds = {
      R"({"id": "doc-1", "text": "Alpha beta, \"gamma\"\n don\u00e9 \ud83d\ude00"})",
      R"({"id": -12, "tokens": ["alpha", "Beta", "x\ty"], "label": [1.5e3, true, null, {}]})",
      R"([{"id": 1}, 0.25, "s"])",
  };
  const std::string bytes = "{}[]\",:\\ 0123456789-+.eEuUtfn\t\n\r\x01\x7f/abx\xc3\xa9";
  size_t checked = 0;
  for (const std::string& seed : seeds) {
    for (size_t i = 0; i <= seed.size(); ++i) {
      ExpectSameAsReference(seed.substr(0, i), vocabulary);
      if (i == seed.size()) break;
      std::string deleted = seed;
      deleted.erase(i, 1);
      ExpectSameAsReference(deleted, vocabulary);
      for (const char b : bytes) {
        std::string changed = seed;
        changed[i] = b;
        ExpectSameAsReference(changed, vocabulary);
        std::string inserted = seed;
        inserted.insert(i, 1, b);
        ExpectSameAsReference(inserted, vocabulary);
        checked += 2;
      }
    }
  }
  EXPECT_GT(checked, 1000u);
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
