// The C++ release reader (connectors/file/release_reader.h) and the
// reference decoder (tools/decode_release.py) give the same verdict on the
// same release directories: a valid release is read by both, and every
// damaged one — including each defect found from outside — is refused by
// both with one line and a non-zero status (never a traceback or an abort).
#include "connectors/file/release_reader.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "connectors/file/file_util.h"
#include "connectors/file/release_file_sink.h"
#include "core/release/release.h"

namespace vipsd::connectors {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

release::Release GoodRelease() {
  release::Release r;
  release::ReleaseMetadata& m = r.metadata;
  m.release_id = "step-8";
  m.model_type = "lda";
  m.step = 8;
  m.rho = 0.25;
  m.epsilon_spent = 1.5;
  m.delta = 1e-5;
  m.noise_multiplier = 1.1;
  m.sampling_rate = 0.5;
  m.accountant = "fixed_pld";
  m.schedule = "fixed";
  m.conversion = "pld_pessimistic";
  m.clip_bounds = {{"topic_word", 2.0}};
  m.dimensions = {{"K", 2}, {"V", 3}, {"N", 20}};
  m.vocabulary_source = "/srv/vocab.txt";
  m.public_prior_fingerprint = std::string(64, 'c');
  m.public_prior_source = "/srv/public/topics";
  m.public_prior_weight = 0.25;
  m.hyperparameters = {{"alpha", 0.5}, {"eta", 0.1}};
  m.vocabulary_fingerprint = std::string(64, 'a');
  m.config_fingerprint = std::string(64, 'b');
  m.is_private = true;
  m.noise_description = "chacha20-os-seeded";
  m.created_at_utc = "2026-11-25T00:00:00Z";
  r.arrays.push_back({"lambda", {2, 3}, {1, 2, 3, 4, 5, 6}});
  r.arrays.push_back({"rho_t", {}, {0.25}});
  return r;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void Spit(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

struct PythonVerdict {
  int status = 0;
  std::string output;
};

PythonVerdict RunPython(const std::string& directory) {
  const std::string command = "/usr/bin/python3 " + std::string(VIPSD_SOURCE_DIR) +
                              "/tools/decode_release.py " + directory + " 2>&1";
  PythonVerdict verdict;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return {-1, "popen failed"};
  char buffer[4096];
  size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) verdict.output.append(buffer, n);
  verdict.status = ::pclose(pipe);
  return verdict;
}

// Replaces the first `from` in the manifest text by `to`.
std::function<void(const std::string&)> InManifest(std::string from, std::string to) {
  return [from, to](const std::string& dir) {
    std::string text = Slurp(dir + "/manifest.json");
    const size_t at = text.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    text.replace(at, from.size(), to);
    Spit(dir + "/manifest.json", text);
  };
}

// Rewrites lambda.npy with `change`, then fixes the manifest's size and
// hash, so that the check behind them is reached.
std::function<void(const std::string&)> InNpy(std::function<void(std::string&)> change) {
  return [change](const std::string& dir) {
    std::string npy = Slurp(dir + "/lambda.npy");
    const std::string old_hash = release::Blake2bHex(npy);
    const std::string old_size = "\"bytes\": " + std::to_string(npy.size());
    change(npy);
    Spit(dir + "/lambda.npy", npy);
    std::string text = Slurp(dir + "/manifest.json");
    text.replace(text.find(old_hash), old_hash.size(), release::Blake2bHex(npy));
    text.replace(text.find(old_size), old_size.size(),
                 "\"bytes\": " + std::to_string(npy.size()));
    Spit(dir + "/manifest.json", text);
  };
}

struct Case {
  std::string name;
  std::function<void(const std::string&)> damage;
};

TEST(ReleaseReadersAgreeTest, BothReadAValidReleaseAndBothRefuseEveryDamagedOne) {
  const std::string root = ::testing::TempDir() + "release_readers_agree";
  fs::remove_all(root);
  fs::create_directories(root);
  const std::string deep(200000, '[');
  const std::vector<Case> cases = {
      {"valid", nullptr},
      {"not an object", [](const std::string& d) { Spit(d + "/manifest.json", "[1, 2]"); }},
      {"step is a string", InManifest("\"step\": 8", "\"step\": \"8\"")},
      {"step is 1e30", InManifest("\"step\": 8", "\"step\": 1e30")},
      {"step is -5", InManifest("\"step\": 8", "\"step\": -5")},
      {"step is 10^30", InManifest("\"step\": 8", "\"step\": 1000000000000000000000000000000")},
      {"epsilon_spent is a string", InManifest("\"epsilon_spent\": 1.5", "\"epsilon_spent\": \"1.5\"")},
      {"epsilon_spent is NaN", InManifest("\"epsilon_spent\": 1.5", "\"epsilon_spent\": NaN")},
      {"epsilon_spent is Infinity", InManifest("\"epsilon_spent\": 1.5", "\"epsilon_spent\": Infinity")},
      {"epsilon_spent is -1", InManifest("\"epsilon_spent\": 1.5", "\"epsilon_spent\": -1.0")},
      {"delta is 2", InManifest("\"delta\": 1e-05", "\"delta\": 2.0")},
      {"unknown model_type", InManifest("\"model_type\": \"lda\"", "\"model_type\": \"cnn\"")},
      {"K is 0", InManifest("\"K\": 2", "\"K\": 0")},
      {"schema_version 2", InManifest("\"schema_version\": 1", "\"schema_version\": 2")},
      {"duplicate key", InManifest("\"step\": 8", "\"step\": 8, \"step\": 9")},
      {"deeply nested", [deep](const std::string& d) { Spit(d + "/manifest.json", deep); }},
      {"file escapes the directory",
       InManifest("\"file\": \"lambda.npy\"", "\"file\": \"../../../../etc/passwd\"")},
      {"wrong dtype", InManifest("\"dtype\": \"<f8\"", "\"dtype\": \"<f4\"")},
      {"wrong shape", InManifest("\"shape\": [2, 3]", "\"shape\": [3, 2]")},
      {"stale hash",
       [](const std::string& d) {
         std::string npy = Slurp(d + "/lambda.npy");
         npy.back() ^= 1;
         Spit(d + "/lambda.npy", npy);
       }},
      {"missing array file", [](const std::string& d) { fs::remove(d + "/lambda.npy"); }},
      {"duplicate array",
       InManifest("\"name\": \"rho_t\"", "\"name\": \"lambda\"")},
      {"trailing bytes after the data", InNpy([](std::string& npy) { npy += "garbage!"; })},
      {"corrupt npy header",
       InNpy([](std::string& npy) {
         const size_t at = npy.find("'shape'");
         npy.replace(at, 7, "'sha\"((");
       })},
      {"hyperparameter alpha -1", InManifest("\"alpha\": 0.5", "\"alpha\": -1.0")},
      {"hyperparameter alpha a string", InManifest("\"alpha\": 0.5", "\"alpha\": \"0.5\"")},
      {"hyperparameters not an object",
       InManifest("\"hyperparameters\": {\"alpha\": 0.5, \"eta\": 0.1}", "\"hyperparameters\": [0.5]")},
      {"vocabulary_source not ASCII",
       InManifest("\"vocabulary_source\": \"/srv/vocab.txt\"", "\"vocabulary_source\": \"/srv/v\\u00f6cab.txt\"")},
      {"public_prior_fingerprint not hex",
       InManifest("\"public_prior_fingerprint\": \"cccc", "\"public_prior_fingerprint\": \"Xccc")},
      {"public_prior_source without a fingerprint",
       InManifest("\"public_prior_fingerprint\": \"" + std::string(64, 'c') + "\"",
                  "\"public_prior_fingerprint\": \"\"")},
      {"public_prior_weight above 1",
       InManifest("\"public_prior_weight\": 0.25", "\"public_prior_weight\": 1.5")},
      {"public_prior_weight a string",
       InManifest("\"public_prior_weight\": 0.25", "\"public_prior_weight\": \"0.25\"")},
      {"private without noise", InManifest("\"noise_multiplier\": 1.1", "\"noise_multiplier\": 0.0")},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string dir = root + "/" + std::to_string(&c - cases.data());
    auto sink = ReleaseFileSink::Open(dir);
    ASSERT_TRUE(sink.ok());
    ASSERT_TRUE(sink->Write(GoodRelease()).ok());
    const std::string release_dir = dir + "/step-8";
    if (c.damage) c.damage(release_dir);
    auto cpp = ReadReleaseDirectory(release_dir);
    const PythonVerdict python = RunPython(release_dir);
    if (!c.damage) {
      ASSERT_TRUE(cpp.ok()) << cpp.status().ToString();
      EXPECT_EQ(cpp->metadata.step, 8);
      EXPECT_EQ(cpp->arrays[0].data, GoodRelease().arrays[0].data);
      EXPECT_EQ(python.status, 0) << python.output;
      continue;
    }
    EXPECT_FALSE(cpp.ok()) << "the C++ reader accepted it";
    EXPECT_NE(python.status, 0) << "the reference decoder accepted it: " << python.output;
    // One clear line, no traceback.
    EXPECT_THAT(python.output, Not(HasSubstr("Traceback"))) << python.output;
    EXPECT_EQ(std::count(python.output.begin(), python.output.end(), '\n'), 1) << python.output;
    // Says what is wrong, never a Python tuple or a bound it does not break
    // (issue 27: a corrupt .npy header showed a tokenizer tuple, step 10^30
    // was "step must be >= 0").
    EXPECT_THAT(python.output, Not(HasSubstr("('"))) << python.output;
    EXPECT_THAT(python.output, Not(HasSubstr("must be >= 0"))) << python.output;
  }
}

// The privacy unit's manifest fields (written only for a unit): both readers
// read them, and both refuse every inconsistent combination.
TEST(ReleaseReadersAgreeTest, BothReadThePrivacyUnitAndRefuseInconsistentOnes) {
  const std::string root = ::testing::TempDir() + "release_readers_agree_unit";
  fs::remove_all(root);
  fs::create_directories(root);
  release::Release keyed = GoodRelease();
  keyed.metadata.privacy_unit = "key";
  keyed.metadata.max_records_per_unit = 20;
  const std::string unit_fields = "\"privacy_unit\": \"key\",\n  \"max_records_per_unit\": 20,";
  const std::vector<Case> cases = {
      {"valid", nullptr},
      {"record spelt out", InManifest("\"privacy_unit\": \"key\"", "\"privacy_unit\": \"record\"")},
      {"unknown unit", InManifest("\"privacy_unit\": \"key\"", "\"privacy_unit\": \"person\"")},
      {"cap 0", InManifest("\"max_records_per_unit\": 20", "\"max_records_per_unit\": 0")},
      {"cap too large",
       InManifest("\"max_records_per_unit\": 20", "\"max_records_per_unit\": 1000001")},
      {"cap a string", InManifest("\"max_records_per_unit\": 20", "\"max_records_per_unit\": \"20\"")},
      {"cap without a unit", InManifest(unit_fields, "\"max_records_per_unit\": 20,")},
      {"a unit without a cap", InManifest(unit_fields, "\"privacy_unit\": \"key\",")},
      {"a field with unit key",
       InManifest("\"privacy_unit\": \"key\"", "\"privacy_unit\": \"key\", \"unit_field\": \"a\"")},
      {"unit field without its name",
       InManifest("\"privacy_unit\": \"key\"", "\"privacy_unit\": \"field\"")},
      {"a field name with a space",
       InManifest("\"privacy_unit\": \"key\"",
                  "\"privacy_unit\": \"field\", \"unit_field\": \"a b\"")},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string dir = root + "/" + std::to_string(&c - cases.data());
    auto sink = ReleaseFileSink::Open(dir);
    ASSERT_TRUE(sink.ok());
    ASSERT_TRUE(sink->Write(keyed).ok());
    const std::string release_dir = dir + "/step-8";
    ASSERT_NE(Slurp(release_dir + "/manifest.json").find(unit_fields), std::string::npos);
    if (c.damage) c.damage(release_dir);
    auto cpp = ReadReleaseDirectory(release_dir);
    const PythonVerdict python = RunPython(release_dir);
    if (!c.damage) {
      ASSERT_TRUE(cpp.ok()) << cpp.status().ToString();
      EXPECT_EQ(cpp->metadata.privacy_unit, "key");
      EXPECT_EQ(cpp->metadata.max_records_per_unit, 20);
      EXPECT_EQ(python.status, 0) << python.output;
      continue;
    }
    EXPECT_FALSE(cpp.ok()) << "the C++ reader accepted it";
    EXPECT_NE(python.status, 0) << "the reference decoder accepted it: " << python.output;
    EXPECT_THAT(python.output, Not(HasSubstr("Traceback"))) << python.output;
  }
  // A record-level release carries none of the three fields.
  auto sink = ReleaseFileSink::Open(root + "/record");
  ASSERT_TRUE(sink.ok());
  ASSERT_TRUE(sink->Write(GoodRelease()).ok());
  const std::string manifest = Slurp(root + "/record/step-8/manifest.json");
  EXPECT_EQ(manifest.find("privacy_unit"), std::string::npos);
  EXPECT_EQ(manifest.find("max_records_per_unit"), std::string::npos);
}

}  // namespace
}  // namespace vipsd::connectors
