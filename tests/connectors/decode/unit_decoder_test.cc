// The unit decoder (unit_decoder.h): the model's decoding first, then the
// unit id from the message key or a named field, kept only as its digest;
// a record without a usable unit id is rejected with its own reason.
#include "connectors/decode/unit_decoder.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "connectors/decode/blr_record_decoder.h"
#include "core/svi/step_randomness.h"

namespace vipsd::connectors {
namespace {

std::unique_ptr<RecordDecoder> Blr() { return NewBlrRecordDecoder(2, NormRule::kRescale); }

RejectReason Reason(const RecordDecodeResult& result) {
  EXPECT_TRUE(std::holds_alternative<DecodeFailure>(result));
  return std::holds_alternative<DecodeFailure>(result) ? std::get<DecodeFailure>(result).reason
                                                        : RejectReason::kInvalidJson;
}

TEST(UnitDecoderTest, TheMessageKeyIsTheUnit) {
  auto decoder = NewUnitDecoder(Blr(), UnitSource::kKey);
  const std::string record = R"({"x": [0.1, 0.2], "y": 1})";
  auto a = decoder->DecodeKeyed(record, "patient-7");
  ASSERT_TRUE(std::holds_alternative<model::Record>(a));
  EXPECT_EQ(std::get<model::Record>(a).unit, svi::UnitDigest("patient-7"));
  EXPECT_EQ(std::get<model::Record>(a).features, (std::vector<double>{0.1, 0.2}));
  // No key, or no key at all (a file record): no unit.
  EXPECT_EQ(Reason(decoder->DecodeKeyed(record, "")), RejectReason::kMissingUnit);
  EXPECT_EQ(Reason(decoder->Decode(record)), RejectReason::kMissingUnit);
  // The model's own reason comes first.
  EXPECT_EQ(Reason(decoder->DecodeKeyed(R"({"x": [0.1, 0.2]})", "patient-7")),
            RejectReason::kMissingLabel);
}

TEST(UnitDecoderTest, ANamedFieldIsTheUnitAsAStringOrAnInteger) {
  auto decoder = NewUnitDecoder(Blr(), UnitSource::kField, "person");
  auto text = decoder->Decode(R"({"x": [1, 0], "y": 0, "person": "ann"})");
  ASSERT_TRUE(std::holds_alternative<model::Record>(text));
  EXPECT_EQ(std::get<model::Record>(text).unit, svi::UnitDigest("ann"));
  auto number = decoder->Decode(R"({"x": [1, 0], "y": 0, "person": 42})");
  ASSERT_TRUE(std::holds_alternative<model::Record>(number));
  EXPECT_EQ(std::get<model::Record>(number).unit, svi::UnitDigest("42"));
  // The message key is not the unit in field mode.
  auto keyed = decoder->DecodeKeyed(R"({"x": [1, 0], "y": 0, "person": "ann"})", "bob");
  ASSERT_TRUE(std::holds_alternative<model::Record>(keyed));
  EXPECT_EQ(std::get<model::Record>(keyed).unit, svi::UnitDigest("ann"));

  EXPECT_EQ(Reason(decoder->Decode(R"({"x": [1, 0], "y": 0})")), RejectReason::kMissingUnit);
  EXPECT_EQ(Reason(decoder->Decode(R"({"x": [1, 0], "y": 0, "person": null})")),
            RejectReason::kMissingUnit);
  for (const char* bad : {R"("")", "1.5", "true", "[1]", R"({"a": 1})"}) {
    EXPECT_EQ(Reason(decoder->Decode(std::string(R"({"x": [1, 0], "y": 0, "person": )") + bad +
                                     "}")),
              RejectReason::kBadUnit)
        << bad;
  }
}

TEST(UnitDecoderTest, TheReasonsHaveStableNamesAndNameNoValue) {
  EXPECT_EQ(RejectReasonName(RejectReason::kMissingUnit), "missing_unit");
  EXPECT_EQ(RejectReasonName(RejectReason::kBadUnit), "bad_unit");
  for (const std::string model : {"lda", "blr", "sbn"}) {
    EXPECT_TRUE(RejectReasonApplies(RejectReason::kMissingUnit, model, /*per_unit=*/true));
    EXPECT_TRUE(RejectReasonApplies(RejectReason::kBadUnit, model, /*per_unit=*/true));
    EXPECT_FALSE(RejectReasonApplies(RejectReason::kMissingUnit, model));
    EXPECT_FALSE(RejectReasonApplies(RejectReason::kBadUnit, model));
  }
}

}  // namespace
}  // namespace vipsd::connectors
