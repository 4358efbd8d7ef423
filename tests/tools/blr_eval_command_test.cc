// Tests of `vipsd-eval RELEASE_DIR --test FILE` for BLR releases
// (tools/eval/blr_eval_command.h): a release encoded by core/release and
// written to disk is scored exactly as EvaluateBlr scores the model's own
// arrays; non-BLR manifests are left to the caller; bad flags exit 2.
#include "tools/eval/blr_eval_command.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "core/models/blr.h"
#include "core/models/blr_eval.h"
#include "core/release/release.h"

namespace vipsd::tools {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class BlrEvalCommandTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/blr_eval_command_test.XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A trained 3-d model's release in dir_/release; returns its arrays.
  std::vector<model::NamedArray> WriteRelease(const std::string& model_type = "blr",
                                              const std::string& name = "release",
                                              double sigma = 0.0) {
    models::BlrConfig config;
    config.dim = 3;
    auto model = models::BlrModel::Create(config);
    EXPECT_TRUE(model.ok());
    Eigen::VectorXd sum(9);
    sum << 2.0, -1.0, 0.5, 3.0, 0.2, 2.0, 0.1, 0.3, 1.5;
    EXPECT_TRUE((*model)->MStep(sum, {0.1, sigma}, 0.8).ok());
    release::Release r;
    auto& m = r.metadata;
    m.release_id = "step-7";
    m.model_type = model_type;
    m.step = 7;
    m.rho = 0.5;
    m.sampling_rate = 0.1;
    m.accountant = "none";
    m.clip_bounds = {{"s1", 0.5}, {"s2", 0.25}};
    m.dimensions = {{"d", 3}};
    m.config_fingerprint = std::string(64, 'a');
    m.noise_description = "none (sigma = 0, NOT PRIVATE)";
    m.created_at_utc = "2026-11-23T00:10:00Z";
    const auto arrays = (*model)->ReleaseArrays();
    for (const auto& array : arrays) r.arrays.push_back({array.name, array.shape, array.data});
    auto encoded = release::EncodeRelease(r);
    EXPECT_TRUE(encoded.ok()) << encoded.status().ToString();
    fs::create_directories(dir_ + "/" + name);
    for (const auto& file : encoded->files) {
      std::ofstream(dir_ + "/" + name + "/" + file.name, std::ios::binary) << file.bytes;
    }
    return arrays;
  }

  std::string WriteTest(const std::string& text) {
    const std::string path = dir_ + "/test.jsonl";
    std::ofstream(path) << text;
    return path;
  }

  std::string dir_;
};

TEST_F(BlrEvalCommandTest, ScoresAReleaseOnDiskLikeTheLibrary) {
  const auto arrays = WriteRelease();
  std::mt19937_64 gen(1);
  std::normal_distribution<double> normal;
  std::ostringstream lines;
  std::vector<std::vector<double>> x;
  std::vector<double> y;
  lines.precision(17);
  for (int n = 0; n < 200; ++n) {
    std::vector<double> row = {0.4 * normal(gen), 0.3 * normal(gen), 0.2 * normal(gen)};
    if (models::FeatureSquaredNorm(row) > 1) continue;
    const double label = n % 3 == 0 ? 1.0 : 0.0;
    lines << "{\"id\": " << n << ", \"x\": [" << row[0] << ", " << row[1] << ", " << row[2]
          << "], \"y\": " << label << "}\n";
    x.push_back(row);
    y.push_back(label);
  }
  lines << "\n{\"x\": [0.9, 0.9, 0.9], \"y\": 1}\nnot json\n";  // 2 rejected, 1 empty
  const std::string test = WriteTest(lines.str());
  std::ostringstream out, err;
  const auto status = MaybeRunBlrEval(dir_ + "/release", {{"--test", test}}, out, err);
  ASSERT_TRUE(status.has_value());
  ASSERT_EQ(*status, 0) << err.str();
  const auto json = nlohmann::json::parse(out.str());
  auto posterior = models::BlrPosteriorFromArrays(arrays);
  ASSERT_TRUE(posterior.ok());
  auto expected = models::EvaluateBlr(*posterior, x, y);
  ASSERT_TRUE(expected.ok());
  EXPECT_EQ(json["model_type"], "blr");
  EXPECT_EQ(json["release_id"], "step-7");
  EXPECT_EQ(json["step"], 7);
  EXPECT_EQ(json["predictive"], "probit_approximation");
  EXPECT_DOUBLE_EQ(json["auc"].get<double>(), expected->auc);
  EXPECT_DOUBLE_EQ(json["log_loss"].get<double>(), expected->log_loss);
  EXPECT_EQ(json["records"], static_cast<int64_t>(x.size()));
  EXPECT_EQ(json["rejected_records"], 2);

  // Rescaling instead of rejecting keeps the over-long record.
  std::ostringstream out2, err2;
  ASSERT_EQ(MaybeRunBlrEval(dir_ + "/release", {{"--test", test}, {"--norm-rule", "rescale"}},
                            out2, err2),
            0);
  EXPECT_EQ(nlohmann::json::parse(out2.str())["rejected_records"], 1);
}

// --reference: the coverage of a reference release's mean by this
// release's intervals and the sd ratio, as models::CoverageOfReference.
TEST_F(BlrEvalCommandTest, ReportsCoverageOfAReferenceRelease) {
  const auto reference = WriteRelease("blr", "reference", 0.0);
  const auto noisy = WriteRelease("blr", "release", 0.5);
  const std::string test =
      WriteTest("{\"x\": [0.1, 0.2, 0], \"y\": 1}\n{\"x\": [-0.3, 0.1, 0.2], \"y\": 0}\n");
  std::ostringstream out, err;
  ASSERT_EQ(MaybeRunBlrEval(dir_ + "/release",
                            {{"--test", test}, {"--reference", dir_ + "/reference"}}, out, err),
            0)
      << err.str();
  const auto json = nlohmann::json::parse(out.str());
  auto expected = models::CoverageOfReference(*models::BlrPosteriorFromArrays(noisy),
                                              *models::BlrPosteriorFromArrays(reference));
  ASSERT_TRUE(expected.ok());
  EXPECT_EQ(json["reference"]["coefficients"], 3);
  EXPECT_DOUBLE_EQ(json["reference"]["coverage_95"].get<double>(), expected->coverage_95);
  EXPECT_DOUBLE_EQ(json["reference"]["coverage_50"].get<double>(), expected->coverage_50);
  EXPECT_DOUBLE_EQ(json["reference"]["sd_ratio_median"].get<double>(), expected->sd_ratio_median);
  // The same sums with noise counted: a wider posterior than the exact one.
  EXPECT_GT(expected->sd_ratio_median, 1.0);
  // A reference that is not there is named.
  std::ostringstream out2, err2;
  EXPECT_EQ(MaybeRunBlrEval(dir_ + "/release",
                            {{"--test", test}, {"--reference", dir_ + "/nowhere"}}, out2, err2),
            1);
  EXPECT_THAT(err2.str(), HasSubstr("nowhere"));
}

TEST(CoverageOfReferenceTest, CountsCoefficientsInsideTheIntervals) {
  models::BlrPosterior posterior{Eigen::Vector3d(0, 0, 0), Eigen::Matrix3d::Identity()};
  models::BlrPosterior reference{Eigen::Vector3d(0.5, 1.5, 3.0),
                                 Eigen::Matrix3d::Identity() * 0.25};
  auto coverage = models::CoverageOfReference(posterior, reference);
  ASSERT_TRUE(coverage.ok());
  EXPECT_DOUBLE_EQ(coverage->coverage_50, 1.0 / 3);  // 0.5 ≤ 0.674
  EXPECT_DOUBLE_EQ(coverage->coverage_95, 2.0 / 3);  // 1.5 ≤ 1.96 < 3
  EXPECT_DOUBLE_EQ(coverage->sd_ratio_median, 2.0);
  reference.mean = Eigen::Vector2d(0, 0);
  EXPECT_FALSE(models::CoverageOfReference(posterior, reference).ok());
}

TEST_F(BlrEvalCommandTest, OtherModelsAndMissingManifestsAreLeftToTheCaller) {
  std::ostringstream out, err;
  EXPECT_FALSE(MaybeRunBlrEval(dir_ + "/nowhere", {{"--test", "x"}}, out, err).has_value());
  WriteRelease("lda");
  EXPECT_FALSE(MaybeRunBlrEval(dir_ + "/release", {{"--test", "x"}}, out, err).has_value());
  EXPECT_TRUE(out.str().empty());
  EXPECT_TRUE(err.str().empty());
}

TEST_F(BlrEvalCommandTest, BadFlagsAndInputs) {
  WriteRelease();
  std::ostringstream out, err;
  EXPECT_EQ(MaybeRunBlrEval(dir_ + "/release", {}, out, err), 2);
  EXPECT_EQ(MaybeRunBlrEval(dir_ + "/release", {{"--test", "t"}, {"--vocab", "v"}}, out, err), 2);
  EXPECT_EQ(MaybeRunBlrEval(dir_ + "/release", {{"--test", "t"}, {"--norm-rule", "clip"}}, out,
                            err),
            2);
  EXPECT_EQ(MaybeRunBlrEval(dir_ + "/release", {{"--test", dir_ + "/missing.jsonl"}}, out, err),
            1);
  EXPECT_THAT(err.str(), HasSubstr("missing.jsonl"));
  // Only one class: AUC is undefined.
  const std::string one_class = WriteTest("{\"x\": [0.1, 0, 0], \"y\": 1}\n");
  EXPECT_EQ(MaybeRunBlrEval(dir_ + "/release", {{"--test", one_class}}, out, err), 1);
  // A corrupted array is refused, naming it.
  std::ofstream(dir_ + "/release/covariance.npy", std::ios::trunc) << "garbage";
  std::ostringstream err2;
  EXPECT_EQ(MaybeRunBlrEval(dir_ + "/release", {{"--test", one_class}}, out, err2), 1);
  EXPECT_THAT(err2.str(), HasSubstr("covariance"));
  EXPECT_TRUE(out.str().empty());
}

}  // namespace
}  // namespace vipsd::tools
