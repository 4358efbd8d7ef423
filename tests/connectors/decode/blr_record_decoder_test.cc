// Tests of the BLR record decoder (connectors/decode/blr_record_decoder.h):
// dense and sparse forms, every reject reason, the label forms, both norm
// rules (rescale lands inside the unit ball even for adversarial inputs and
// leaves in-ball records untouched), and that failures carry no content.
#include "connectors/decode/blr_record_decoder.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

#include "core/models/blr.h"

namespace vipsd::connectors {
namespace {

RecordDecodeResult Decode(const std::string& input, int64_t dim = 3,
                          NormRule rule = NormRule::kReject) {
  return NewBlrRecordDecoder(dim, rule)->Decode(input);
}

model::Record Accepted(const std::string& input, int64_t dim = 3,
                       NormRule rule = NormRule::kReject) {
  RecordDecodeResult result = Decode(input, dim, rule);
  EXPECT_TRUE(std::holds_alternative<model::Record>(result))
      << input << " -> "
      << (std::holds_alternative<DecodeFailure>(result)
              ? RejectReasonName(std::get<DecodeFailure>(result).reason)
              : "");
  return std::holds_alternative<model::Record>(result) ? std::get<model::Record>(result)
                                                       : model::Record{};
}

std::optional<RejectReason> Reason(const std::string& input, int64_t dim = 3,
                                   NormRule rule = NormRule::kReject) {
  RecordDecodeResult result = Decode(input, dim, rule);
  if (auto* failure = std::get_if<DecodeFailure>(&result)) return failure->reason;
  return std::nullopt;
}

std::string DenseJson(const std::vector<double>& x, int y) {
  std::ostringstream out;
  out.precision(17);
  out << "{\"x\": [";
  for (size_t i = 0; i < x.size(); ++i) out << (i ? ", " : "") << x[i];
  out << "], \"y\": " << y << "}";
  return out.str();
}

TEST(BlrRecordDecoderTest, DecodesDenseRecordsAndIgnoresOtherKeys) {
  const model::Record record =
      Accepted(R"({"id": "adult-train-00001", "x": [0.5, -0.25, 0], "y": 1})");
  EXPECT_EQ(record.features, (std::vector<double>{0.5, -0.25, 0.0}));
  EXPECT_EQ(record.label, 1.0);
  EXPECT_TRUE(record.word_ids.empty());
  EXPECT_EQ(Accepted(R"({"x": [0.5, 0.1, 0.2], "dim": 3, "y": 0})").label, 0.0);
}

TEST(BlrRecordDecoderTest, DecodesSparseRecordsInAnyIndexOrder) {
  const model::Record record =
      Accepted(R"({"x": {"indices": [4, 0], "values": [0.6, -0.8]}, "dim": 5, "y": 0})", 5);
  EXPECT_EQ(record.features, (std::vector<double>{-0.8, 0, 0, 0, 0.6}));
  EXPECT_EQ(record.label, 0.0);
  const model::Record empty = Accepted(R"({"x": {"indices": [], "values": []}, "dim": 3, "y": 1})");
  EXPECT_EQ(empty.features, (std::vector<double>{0, 0, 0}));
}

TEST(BlrRecordDecoderTest, LabelForms) {
  EXPECT_EQ(Accepted(R"({"x": [0, 0, 0], "y": 1.0})").label, 1.0);
  EXPECT_EQ(Accepted(R"({"x": [0, 0, 0], "y": 0.0})").label, 0.0);
  const model::Record negative_zero = Accepted(R"({"x": [0, 0, 0], "y": -0.0})");
  EXPECT_EQ(negative_zero.label, 0.0);
  EXPECT_FALSE(std::signbit(negative_zero.label));
  for (const std::string label : {"true", "false", "\"1\"", "2", "-1", "0.5", "1e-300", "null",
                                  "[1]", "18446744073709551615"}) {
    EXPECT_EQ(Reason(R"({"x": [0, 0, 0], "y": )" + label + "}"), RejectReason::kBadLabel) << label;
  }
  EXPECT_EQ(Reason(R"({"x": [0, 0, 0]})"), RejectReason::kMissingLabel);
}

TEST(BlrRecordDecoderTest, EveryMalformedShapeHasItsReason) {
  struct Case {
    std::string input;
    RejectReason reason;
  };
  const std::vector<Case> cases = {
      {"\xff\xfe", RejectReason::kInvalidUtf8},
      {"{\"x\": [0, 0, 0], \"y\": 1", RejectReason::kInvalidJson},
      {"{\"x\": [0, 0, 0], \"y\": 1} trailing", RejectReason::kInvalidJson},
      {"[0, 0, 0]", RejectReason::kNotAnObject},
      {R"({"y": 1})", RejectReason::kMissingFeatures},
      {R"({"x": "0,0,0", "y": 1})", RejectReason::kBadFeatures},
      {R"({"x": [0, "0", 0], "y": 1})", RejectReason::kBadFeatures},
      {R"({"x": [0, true, 0], "y": 1})", RejectReason::kBadFeatures},
      {R"({"x": [0, null, 0], "y": 1})", RejectReason::kBadFeatures},
      // nlohmann/json refuses number literals that overflow a double.
      {R"({"x": [0, 1e400, 0], "y": 1})", RejectReason::kInvalidJson},
      {R"({"x": [0, -1e400, 0], "y": 1})", RejectReason::kInvalidJson},
      {R"({"x": [0, 0], "y": 1})", RejectReason::kWrongDimension},
      {R"({"x": [0, 0, 0, 0], "y": 1})", RejectReason::kWrongDimension},
      {R"({"x": [0, 0, 0], "dim": 4, "y": 1})", RejectReason::kWrongDimension},
      {R"({"x": [0, 0, 0], "dim": 3.0, "y": 1})", RejectReason::kBadFeatures},
      {R"({"x": {"indices": [0], "values": [0.5]}, "y": 1})", RejectReason::kBadFeatures},
      {R"({"x": {"indices": [0], "values": [0.5]}, "dim": 4, "y": 1})",
       RejectReason::kWrongDimension},
      {R"({"x": {"indices": [3], "values": [0.5]}, "dim": 3, "y": 1})",
       RejectReason::kWrongDimension},
      {R"({"x": {"indices": [-1], "values": [0.5]}, "dim": 3, "y": 1})",
       RejectReason::kWrongDimension},
      {R"({"x": {"indices": [1, 1], "values": [0.1, 0.1]}, "dim": 3, "y": 1})",
       RejectReason::kBadFeatures},
      {R"({"x": {"indices": [1.0], "values": [0.1]}, "dim": 3, "y": 1})",
       RejectReason::kBadFeatures},
      {R"({"x": {"indices": [0, 1], "values": [0.1]}, "dim": 3, "y": 1})",
       RejectReason::kBadFeatures},
      {R"({"x": {"indices": [0]}, "dim": 3, "y": 1})", RejectReason::kBadFeatures},
      {R"({"x": {"indices": [0], "values": [NaN]}, "dim": 3, "y": 1})",
       RejectReason::kInvalidJson},
      {R"({"x": {"indices": [0], "values": [1e999]}, "dim": 3, "y": 1})",
       RejectReason::kInvalidJson},
      {R"({"x": [0.8, 0.8, 0], "y": 1})", RejectReason::kNormTooLarge},
      {R"({"x": [1.0000000000000002, 0, 0], "y": 1})", RejectReason::kNormTooLarge},
  };
  for (const Case& c : cases) EXPECT_EQ(Reason(c.input), c.reason) << c.input;
  // A model dimension outside BlrConfig's range never decodes.
  EXPECT_EQ(Reason(R"({"x": [], "y": 1})", 0), RejectReason::kWrongDimension);
}

TEST(BlrRecordDecoderTest, NormExactlyOneIsAcceptedUnchanged) {
  for (NormRule rule : {NormRule::kReject, NormRule::kRescale}) {
    EXPECT_EQ(Accepted(R"({"x": [0, -1, 0], "y": 1})", 3, rule).features,
              (std::vector<double>{0, -1, 0}));
    EXPECT_EQ(Accepted(R"({"x": [0.6, 0.8, 0], "y": 1})", 3, rule).features,
              (std::vector<double>{0.6, 0.8, 0}));
  }
}

TEST(BlrRecordDecoderTest, RescaleKeepsTheDirectionAndLandsInsideTheBall) {
  const model::Record record = Accepted(R"({"x": [3, 4, 0], "y": 0})", 3, NormRule::kRescale);
  EXPECT_NEAR(record.features[0], 0.6, 1e-15);
  EXPECT_NEAR(record.features[1], 0.8, 1e-15);
  EXPECT_LE(models::FeatureSquaredNorm(record.features), 1.0);
  // Values so large that their squares overflow.
  const model::Record huge =
      Accepted(R"({"x": [1e300, -1e300, 1e-300], "y": 1})", 3, NormRule::kRescale);
  EXPECT_LE(models::FeatureSquaredNorm(huge.features), 1.0);
  EXPECT_NEAR(huge.features[0], std::sqrt(0.5), 1e-15);
  EXPECT_NEAR(huge.features[1], -std::sqrt(0.5), 1e-15);

  // Adversarial: random vectors just above the ball, of every length and
  // many dimensions, with values printed to 17 digits.
  std::mt19937_64 gen(8);
  std::normal_distribution<double> normal;
  std::uniform_real_distribution<double> excess(0.0, 1e-12);
  for (int trial = 0; trial < 2000; ++trial) {
    const int dim = 1 + trial % 64;
    std::vector<double> x(dim);
    double norm = 0;
    for (double& v : x) {
      v = normal(gen);
      norm += v * v;
    }
    const double target = trial % 3 == 0 ? 1.0 + excess(gen) : 1.0 + 1e3 * excess(gen) * trial;
    for (double& v : x) v *= target / std::sqrt(norm);
    const std::string input = DenseJson(x, trial % 2);
    RecordDecodeResult result = Decode(input, dim, NormRule::kRescale);
    ASSERT_TRUE(std::holds_alternative<model::Record>(result)) << input;
    const auto& features = std::get<model::Record>(result).features;
    EXPECT_LE(models::FeatureSquaredNorm(features), 1.0) << input;
    EXPECT_GT(models::FeatureSquaredNorm(features), 1.0 - 1e-12) << input;
  }
}

TEST(BlrRecordDecoderTest, InBallRecordsAreBitForBitUnchangedUnderRescale) {
  std::mt19937_64 gen(9);
  std::uniform_real_distribution<double> value(-0.3, 0.3);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<double> x(5);
    for (double& v : x) v = value(gen);
    const std::string input = DenseJson(x, 1);
    EXPECT_EQ(Accepted(input, 5, NormRule::kRescale).features,
              Accepted(input, 5, NormRule::kReject).features);
  }
}

// A failure is only a reason code; its name and description are fixed
// strings, so no value, index or id of the record can appear in them.
TEST(BlrRecordDecoderTest, NoRecordContentInFailures) {
  const std::vector<std::string> secret_inputs = {
      R"({"id": "patient-31337", "x": [0.8123, 0.8123, 0], "y": 1})",
      R"({"id": "patient-31337", "x": [0.8123, 0.1], "y": 1})",
      R"({"id": "patient-31337", "x": {"indices": [31337], "values": [0.8123]}, "dim": 3, "y": 1})",
      R"({"id": "patient-31337", "x": [0.8123, 0.1, 0], "y": 31337})",
      R"({"id": "patient-31337", "x": [0.8123, "31337", 0], "y": 1})",
      "{\"id\": \"patient-31337\", \"x\": [0.8123",
  };
  for (const std::string& input : secret_inputs) {
    RecordDecodeResult result = Decode(input);
    ASSERT_TRUE(std::holds_alternative<DecodeFailure>(result)) << input;
    const RejectReason reason = std::get<DecodeFailure>(result).reason;
    for (const std::string_view text : {RejectReasonName(reason), RejectReasonDescription(reason)}) {
      EXPECT_EQ(text.find("31337"), std::string_view::npos) << text;
      EXPECT_EQ(text.find("8123"), std::string_view::npos) << text;
      EXPECT_EQ(text.find("patient"), std::string_view::npos) << text;
    }
  }
  static_assert(sizeof(DecodeFailure) == sizeof(RejectReason),
                "a DecodeFailure must hold nothing but its reason");
}

TEST(NormRuleTest, NamesRoundTrip) {
  for (NormRule rule : {NormRule::kReject, NormRule::kRescale}) {
    EXPECT_EQ(ParseNormRule(NormRuleName(rule)), rule);
  }
  EXPECT_FALSE(ParseNormRule("clip").has_value());
}

}  // namespace
}  // namespace vipsd::connectors
