// Tests of `vipsd-eval RELEASE_DIR --test FILE` for sigmoid belief network
// releases (tools/eval/sbn_eval_command.h): a release encoded by
// core/release and written to disk scores exactly as EvaluateSbnHeldOut
// scores the model's own expectations; the marginal baseline comes from
// --train or, flagged, from the test file; other manifests are left to the
// caller; bad flags exit 2 and broken inputs exit 1.
#include "tools/eval/sbn_eval_command.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "core/models/sbn.h"
#include "core/models/sbn_eval.h"
#include "core/release/release.h"

namespace vipsd::tools {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr int kVisible = 6;
constexpr int kHidden = 2;

class SbnEvalCommandTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/sbn_eval_command_test.XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    models::SbnConfig config;
    config.visible = kVisible;
    config.hidden = kHidden;
    config.init_weight_std = 1.5;
    config.init_variance = 0.2;
    auto model = models::SbnModel::Create(config);
    ASSERT_TRUE(model.ok());
    model_ = std::move(*model);
  }
  void TearDown() override { fs::remove_all(dir_); }

  void WriteRelease(const std::string& model_type = "sbn", int64_t j_in_manifest = kVisible) {
    release::Release r;
    auto& m = r.metadata;
    m.release_id = "step-3";
    m.model_type = model_type;
    m.step = 3;
    m.rho = 0.5;
    m.sampling_rate = 0.1;
    m.accountant = "none";
    for (size_t b = 0; b < models::kSbnNumBlocks; ++b) {
      m.clip_bounds.push_back({std::string(models::kSbnBlockNames[b]), model_->proven_bounds()[b]});
    }
    m.dimensions = {{"J", j_in_manifest}, {"K", kHidden}};
    m.config_fingerprint = std::string(64, 'b');
    m.noise_description = "none (sigma = 0, NOT PRIVATE)";
    m.created_at_utc = "2026-11-23T00:10:00Z";
    for (const auto& array : model_->ReleaseArrays()) {
      r.arrays.push_back({array.name, array.shape, array.data});
    }
    auto encoded = release::EncodeRelease(r);
    ASSERT_TRUE(encoded.ok()) << encoded.status().ToString();
    fs::create_directories(dir_ + "/release");
    for (const auto& file : encoded->files) {
      std::ofstream(dir_ + "/release/" + file.name, std::ios::binary) << file.bytes;
    }
  }

  // Writes records as JSONL (plus `extra` raw lines); returns the path.
  std::string WriteRecords(const std::string& name, const std::vector<std::vector<double>>& records,
                           const std::string& extra = "") {
    const std::string path = dir_ + "/" + name;
    std::ofstream file(path);
    for (const auto& y : records) file << nlohmann::json{{"y", y}}.dump() << "\n";
    file << extra;
    return path;
  }

  std::vector<std::vector<double>> RandomRecords(int n, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::bernoulli_distribution coin(0.35);
    std::vector<std::vector<double>> records(n, std::vector<double>(kVisible));
    for (auto& y : records) {
      for (auto& v : y) v = coin(rng) ? 1.0 : 0.0;
    }
    return records;
  }

  int Run(const std::map<std::string, std::string>& flags, nlohmann::json* result,
          std::string* error = nullptr) {
    std::ostringstream out, err;
    auto status = MaybeRunSbnEval(dir_ + "/release", flags, out, err);
    EXPECT_TRUE(status.has_value());
    if (error) *error = err.str();
    if (result && *status == 0) *result = nlohmann::json::parse(out.str());
    return status.value_or(-1);
  }

  std::string dir_;
  std::unique_ptr<models::SbnModel> model_;
};

TEST_F(SbnEvalCommandTest, ScoresAReleaseOnDiskLikeTheLibrary) {
  WriteRelease();
  const auto test = RandomRecords(40, 1);
  const auto train = RandomRecords(60, 2);
  nlohmann::json result;
  ASSERT_EQ(Run({{"--test", WriteRecords("test.jsonl", test, "\n{\"y\": [0, 1]}\nnot json\n")},
                 {"--train", WriteRecords("train.jsonl", train)},
                 {"--samples", "25"},
                 {"--seed", "4"}},
                &result),
            0);
  models::SbnEvalOptions options;
  options.importance_samples = 25;
  options.seed = 4;
  auto expected = models::EvaluateSbnHeldOut(model_->expectations(), test, options);
  ASSERT_TRUE(expected.ok());
  auto baseline = models::SbnMarginalBaseline(train, test);
  ASSERT_TRUE(baseline.ok());
  EXPECT_EQ(result["model_type"], "sbn");
  EXPECT_EQ(result["release_id"], "step-3");
  EXPECT_EQ(result["step"], 3);
  EXPECT_EQ(result["reconstruction"], "sampled_z");
  EXPECT_DOUBLE_EQ(result["reconstruction_accuracy"].get<double>(), expected->accuracy_sampled);
  EXPECT_DOUBLE_EQ(result["reconstruction_accuracy_mean_z"].get<double>(), expected->accuracy_mean);
  EXPECT_NEAR(result["heldout_loglik_per_record"].get<double>(), expected->loglik_per_record, 1e-12);
  EXPECT_EQ(result["loglik_estimator"], "importance_sampling_plugin");
  EXPECT_EQ(result["importance_samples"], 25);
  EXPECT_DOUBLE_EQ(result["marginal_baseline_accuracy"].get<double>(), baseline->accuracy);
  EXPECT_EQ(result["marginal_source"], "train");
  EXPECT_EQ(result["records"], 40);
  EXPECT_EQ(result["rejected_records"], 2);
  EXPECT_EQ(result["train_records"], 60);
}

TEST_F(SbnEvalCommandTest, MarginalFromTestWhenNoTrainAndNoLikelihoodWithZeroSamples) {
  WriteRelease();
  const auto test = RandomRecords(30, 3);
  nlohmann::json result;
  ASSERT_EQ(Run({{"--test", WriteRecords("test.jsonl", test)}, {"--samples", "0"}}, &result), 0);
  auto baseline = models::SbnMarginalBaseline(test, test);
  ASSERT_TRUE(baseline.ok());
  EXPECT_EQ(result["marginal_source"], "test");
  EXPECT_DOUBLE_EQ(result["marginal_baseline_accuracy"].get<double>(), baseline->accuracy);
  EXPECT_FALSE(result.contains("heldout_loglik_per_record"));
  EXPECT_EQ(result["train_records"], 0);
}

TEST_F(SbnEvalCommandTest, OtherModelTypesAreLeftToTheCaller) {
  WriteRelease("lda");
  std::ostringstream out, err;
  EXPECT_FALSE(MaybeRunSbnEval(dir_ + "/release", {{"--test", "x"}}, out, err).has_value());
  EXPECT_FALSE(MaybeRunSbnEval(dir_ + "/missing", {{"--test", "x"}}, out, err).has_value());
  EXPECT_TRUE(out.str().empty());
  EXPECT_TRUE(err.str().empty());
}

TEST_F(SbnEvalCommandTest, BadFlagsExitTwoAndBrokenInputsExitOne) {
  WriteRelease();
  const std::string test = WriteRecords("test.jsonl", RandomRecords(5, 4));
  std::string error;
  EXPECT_EQ(Run({{"--test", test}, {"--vocab", "v"}}, nullptr, &error), 2);
  EXPECT_THAT(error, HasSubstr("--vocab"));
  EXPECT_EQ(Run({}, nullptr, &error), 2);
  EXPECT_THAT(error, HasSubstr("--test"));
  EXPECT_EQ(Run({{"--test", test}, {"--samples", "-1"}}, nullptr, &error), 2);
  EXPECT_EQ(Run({{"--test", test}, {"--threads", "0"}}, nullptr, &error), 2);
  EXPECT_EQ(Run({{"--test", test}, {"--estep-tolerance", "abc"}}, nullptr, &error), 2);
  EXPECT_EQ(Run({{"--test", dir_ + "/nope.jsonl"}}, nullptr, &error), 1);
  EXPECT_THAT(error, HasSubstr("nope.jsonl"));
  // Only undecodable lines: no records to evaluate.
  EXPECT_EQ(Run({{"--test", WriteRecords("bad.jsonl", {}, "{\"y\": [2]}\n")}}, nullptr, &error), 1);
  fs::remove(dir_ + "/release/c_variance.npy");
  EXPECT_EQ(Run({{"--test", test}}, nullptr, &error), 1);
  EXPECT_THAT(error, HasSubstr("c_variance"));
}

TEST_F(SbnEvalCommandTest, ManifestDimensionsMustMatchTheArrays) {
  WriteRelease("sbn", kVisible + 1);
  std::string error;
  EXPECT_EQ(Run({{"--test", WriteRecords("test.jsonl", RandomRecords(5, 5))}}, nullptr, &error), 1);
  EXPECT_THAT(error, HasSubstr("dimensions"));
}

}  // namespace
}  // namespace vipsd::tools
