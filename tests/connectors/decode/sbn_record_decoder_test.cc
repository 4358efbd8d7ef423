#include "connectors/decode/sbn_record_decoder.h"

#include <gtest/gtest.h>

#include <string>
#include <type_traits>
#include <variant>
#include <vector>

namespace vipsd::connectors {
namespace {

RejectReason ReasonOf(const RecordDecodeResult& result) {
  EXPECT_TRUE(std::holds_alternative<DecodeFailure>(result));
  return std::get<DecodeFailure>(result).reason;
}

TEST(SbnRecordDecoderTest, DecodesObservationsAsZeroOneDoubles) {
  auto decoder = NewSbnRecordDecoder(4);
  for (const std::string input :
       {R"({"y": [0, 1, 1, 0]})", R"({"y": [0.0, 1.0, 1e0, -0.0], "id": "a", "label": 3})",
        R"({"id": 7, "y": [0,1,1,0]})"}) {
    RecordDecodeResult result = decoder->Decode(input);
    ASSERT_TRUE(std::holds_alternative<model::Record>(result)) << input;
    const model::Record& record = std::get<model::Record>(result);
    EXPECT_EQ(record.features, (std::vector<double>{0, 1, 1, 0})) << input;
    EXPECT_FALSE(std::signbit(record.features[3]));
    EXPECT_TRUE(record.word_ids.empty());
    EXPECT_EQ(record.label, 0);
  }
}

TEST(SbnRecordDecoderTest, RejectsWithTheDocumentedReason) {
  auto decoder = NewSbnRecordDecoder(3);
  const std::vector<std::pair<std::string, RejectReason>> cases = {
      {"\xff{}", RejectReason::kInvalidUtf8},
      {"not json", RejectReason::kInvalidJson},
      {R"({"y": [0, 1, 1]} trailing)", RejectReason::kInvalidJson},
      {R"({"y": [0, 1, 1e400]})", RejectReason::kInvalidJson},
      {R"([0, 1, 1])", RejectReason::kNotAnObject},
      {R"("y")", RejectReason::kNotAnObject},
      {R"({"x": [0, 1, 1]})", RejectReason::kMissingFeatures},
      {R"({"y": "011"})", RejectReason::kBadFeatures},
      {R"({"y": {"0": 1}})", RejectReason::kBadFeatures},
      {R"({"y": 1})", RejectReason::kBadFeatures},
      {R"({"y": [0, true, 1]})", RejectReason::kBadFeatures},
      {R"({"y": [0, "1", 1]})", RejectReason::kBadFeatures},
      {R"({"y": [0, null, 1]})", RejectReason::kBadFeatures},
      {R"({"y": [0, [1], 1]})", RejectReason::kBadFeatures},
      {R"({"y": [0, 1, 1, "x"]})", RejectReason::kBadFeatures},
      {R"({"y": [0, 1]})", RejectReason::kWrongDimension},
      {R"({"y": [0, 1, 1, 0]})", RejectReason::kWrongDimension},
      {R"({"y": []})", RejectReason::kWrongDimension},
      {R"({"y": [0, 1, 2, 5]})", RejectReason::kWrongDimension},
      {R"({"y": [0, 2, 1]})", RejectReason::kNotBinary},
      {R"({"y": [0, 0.5, 1]})", RejectReason::kNotBinary},
      {R"({"y": [-1, 0, 1]})", RejectReason::kNotBinary},
      {R"({"y": [1e-300, 0, 1]})", RejectReason::kNotBinary},
      {R"({"y": [0, 1, 1.0000000001]})", RejectReason::kNotBinary},
  };
  for (const auto& [input, reason] : cases) {
    EXPECT_EQ(ReasonOf(decoder->Decode(input)), reason) << input;
  }
}

TEST(SbnRecordDecoderTest, NonPositiveDimensionRejectsEverything) {
  auto decoder = NewSbnRecordDecoder(0);
  EXPECT_EQ(ReasonOf(decoder->Decode(R"({"y": []})")), RejectReason::kWrongDimension);
  EXPECT_EQ(ReasonOf(decoder->Decode(R"({"y": [1]})")), RejectReason::kWrongDimension);
}

TEST(SbnRecordDecoderTest, FailuresCarryNoRecordContent) {
  // A failure is a reason code and nothing else.
  static_assert(std::is_same_v<decltype(DecodeFailure::reason), RejectReason>);
  static_assert(sizeof(DecodeFailure) == sizeof(RejectReason));
  auto decoder = NewSbnRecordDecoder(3);
  for (const std::string input :
       {R"({"id": "secret-4711", "y": [0, 0.4711, 1]})", R"({"id": "secret-4711", "y": [0, 1]})",
        R"({"id": "secret-4711", "y": [0, "secret", 1]})", R"({"id": "secret-4711"})"}) {
    const RejectReason reason = ReasonOf(decoder->Decode(input));
    for (std::string_view text : {RejectReasonName(reason), RejectReasonDescription(reason)}) {
      EXPECT_EQ(text.find("4711"), std::string_view::npos) << text;
      EXPECT_EQ(text.find("secret"), std::string_view::npos) << text;
    }
  }
}

}  // namespace
}  // namespace vipsd::connectors
