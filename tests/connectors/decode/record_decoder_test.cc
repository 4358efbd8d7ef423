#include "connectors/decode/record_decoder.h"

#include <gtest/gtest.h>

#include <string>
#include <variant>

namespace vipsd::connectors {
namespace {

text::Vocabulary TestVocabulary() {
  auto vocabulary = text::Vocabulary::Parse("alpha\nbeta\ngamma\n");
  EXPECT_TRUE(vocabulary.ok());
  return std::move(*vocabulary);
}

TEST(LdaRecordDecoderTest, DecodesWordIdsInTextOrder) {
  const text::Vocabulary vocabulary = TestVocabulary();
  auto decoder = NewLdaRecordDecoder(vocabulary);
  RecordDecodeResult result = decoder->Decode(R"({"id": 1, "text": "Gamma alpha, zeta gamma"})");
  ASSERT_TRUE(std::holds_alternative<model::Record>(result));
  const model::Record& record = std::get<model::Record>(result);
  EXPECT_EQ(record.word_ids, (std::vector<int32_t>{2, 0, 2}));
  EXPECT_TRUE(record.features.empty());
}

TEST(LdaRecordDecoderTest, AWellFormedDocumentWithoutVocabularyWordsIsARecord) {
  // Whether a document has vocabulary words is its content: it is pooled
  // (zero statistic), never rejected outside the mechanism.
  const text::Vocabulary vocabulary = TestVocabulary();
  auto decoder = NewLdaRecordDecoder(vocabulary);
  for (const std::string input : {R"({"id": 1, "text": "zeta eta theta"})",
                                  R"({"id": 1, "text": ""})", R"({"id": 1, "tokens": []})"}) {
    RecordDecodeResult result = decoder->Decode(input);
    ASSERT_TRUE(std::holds_alternative<model::Record>(result)) << input;
    EXPECT_TRUE(std::get<model::Record>(result).word_ids.empty());
  }
}

TEST(LdaRecordDecoderTest, MalformedRecordsKeepTheDocumentDecodersReason) {
  const text::Vocabulary vocabulary = TestVocabulary();
  auto decoder = NewLdaRecordDecoder(vocabulary);
  RecordDecodeResult result = decoder->Decode(R"({"id": 1, "text": 3})");
  ASSERT_TRUE(std::holds_alternative<DecodeFailure>(result));
  EXPECT_EQ(std::get<DecodeFailure>(result).reason, RejectReason::kBadText);
  result = decoder->Decode("not json");
  ASSERT_TRUE(std::holds_alternative<DecodeFailure>(result));
  EXPECT_EQ(std::get<DecodeFailure>(result).reason, RejectReason::kInvalidJson);
}

}  // namespace
}  // namespace vipsd::connectors
