#include "connectors/file/release_file_sink.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <bit>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace vipsd::connectors {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// Debian's interpreter: scripts/setup.sh installs python3-numpy for it.
constexpr char kPython[] = "/usr/bin/python3";

std::string Decoder() { return std::string(VIPSD_SOURCE_DIR) + "/tools/decode_release.py"; }

std::string TestDir() {
  const testing::TestInfo* info = testing::UnitTest::GetInstance()->current_test_info();
  const std::string dir = testing::TempDir() + "release_file_sink_test_" + info->name();
  fs::remove_all(dir);
  return dir;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

std::set<std::string> Listing(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.insert(entry.path().filename());
  return names;
}

struct CommandResult {
  int exit_code = -1;
  std::string output;
};

CommandResult RunCommand(const std::string& command) {
  CommandResult result;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) result.output.append(buffer, n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

release::Release MakeRelease(const std::string& id) {
  release::Release r;
  release::ReleaseMetadata& m = r.metadata;
  m.release_id = id;
  m.model_type = "lda";
  m.step = 42;
  m.rho = 0.0625;
  m.epsilon_spent = 1.25;
  m.delta = 1e-5;
  m.noise_multiplier = 0.9;
  m.sampling_rate = 0.02;
  m.accountant = "rdp";
  m.schedule = "fixed";
  m.conversion = "rdp_improved";
  m.clip_bounds = {{"topic_word", 50.0}};
  m.dimensions = {{"K", 3}, {"V", 4}, {"N", 500}};
  m.vocabulary_fingerprint = std::string(64, 'a');
  m.config_fingerprint = std::string(64, 'b');
  m.is_private = true;
  m.noise_description = "chacha20-os-seeded";
  m.created_at_utc = "2026-11-23T00:10:00Z";
  // Values that a lossy path (text, float32) would change.
  r.arrays.push_back({"lambda",
                      {3, 4},
                      {0.1, -0.0, 1e308, std::numeric_limits<double>::denorm_min(), 1.0 / 3.0,
                       2.0, 1e-300, -7.25, 123456789.123456789, 0.0, 1e308, 6.5}});
  r.arrays.push_back({"alpha", {2}, {0.5, 0.25}});
  return r;
}

TEST(ReleaseFileSinkTest, WritesArraysAndManifestWithMatchingHashes) {
  const std::string dir = TestDir();
  auto sink = ReleaseFileSink::Open(dir + "/releases");
  ASSERT_TRUE(sink.ok()) << sink.status().message();
  const release::Release release = MakeRelease("run1-step-42");
  ASSERT_TRUE(sink->Write(release).ok());

  // Nothing but the release: no temporary directory left behind.
  EXPECT_EQ(Listing(dir + "/releases"), std::set<std::string>{"run1-step-42"});
  const std::string out = dir + "/releases/run1-step-42";
  EXPECT_EQ(Listing(out), (std::set<std::string>{"manifest.json", "lambda.npy", "alpha.npy"}));

  const nlohmann::json manifest = nlohmann::json::parse(ReadFile(out + "/manifest.json"));
  EXPECT_EQ(manifest["release_id"], "run1-step-42");
  EXPECT_EQ(manifest["step"], 42);
  ASSERT_EQ(manifest["arrays"].size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const nlohmann::json& entry = manifest["arrays"][i];
    const std::string bytes = ReadFile(out + "/" + entry["file"].get<std::string>());
    EXPECT_EQ(bytes, release::EncodeNpy(release.arrays[i]));
    EXPECT_EQ(entry["bytes"], bytes.size());
    EXPECT_EQ(entry["blake2b"], release::Blake2bHex(bytes));
  }
  // Releases are public: consumers running as other users must read them.
  for (const char* name : {"manifest.json", "lambda.npy"}) {
    const auto perms = std::filesystem::status(out + "/" + name).permissions();
    EXPECT_NE(perms & std::filesystem::perms::others_read, std::filesystem::perms::none) << name;
  }
  auto encoded = release::EncodeRelease(release);
  ASSERT_TRUE(encoded.ok());
  EXPECT_EQ(ReadFile(out + "/manifest.json"), encoded->files.back().bytes);
}

TEST(ReleaseFileSinkTest, SameReleaseIdTwiceFailsAndNeverOverwrites) {
  const std::string dir = TestDir();
  auto sink = ReleaseFileSink::Open(dir);
  ASSERT_TRUE(sink.ok());
  const release::Release first = MakeRelease("step-1");
  ASSERT_TRUE(sink->Write(first).ok());
  const std::string manifest_before = ReadFile(dir + "/step-1/manifest.json");
  const std::string lambda_before = ReadFile(dir + "/step-1/lambda.npy");

  release::Release second = MakeRelease("step-1");
  second.arrays[0].data[0] = 99.0;
  const Status status = sink->Write(second);
  EXPECT_EQ(status.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("release step-1 already exists"));
  EXPECT_EQ(ReadFile(dir + "/step-1/manifest.json"), manifest_before);
  EXPECT_EQ(ReadFile(dir + "/step-1/lambda.npy"), lambda_before);

  // A fresh sink on the same directory refuses too, and even an empty
  // directory of that name is not replaced.
  auto reopened = ReleaseFileSink::Open(dir);
  ASSERT_TRUE(reopened.ok());
  EXPECT_EQ(reopened->Write(second).code(), StatusCode::kFailedPrecondition);
  fs::create_directory(dir + "/step-2");
  EXPECT_EQ(reopened->Write(MakeRelease("step-2")).code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(fs::is_empty(dir + "/step-2"));

  EXPECT_TRUE(reopened->Write(MakeRelease("step-3")).ok());
  EXPECT_EQ(Listing(dir), (std::set<std::string>{"step-1", "step-2", "step-3"}));
}

TEST(ReleaseFileSinkTest, InvalidReleaseWritesNothing) {
  const std::string dir = TestDir();
  fs::create_directories(dir);
  auto sink = ReleaseFileSink::Open(dir);
  ASSERT_TRUE(sink.ok());
  release::Release bad = MakeRelease("step-5");
  bad.arrays[1].data[1] = std::numeric_limits<double>::infinity();
  const Status status = sink->Write(bad);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("alpha"));
  release::Release escaping = MakeRelease("../outside");
  EXPECT_EQ(sink->Write(escaping).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(fs::is_empty(dir));
  EXPECT_FALSE(fs::exists(testing::TempDir() + "outside"));
}

TEST(ReleaseFileSinkTest, CrashLeftoversAreRemovedAndNeverVisible) {
  const std::string dir = TestDir();
  fs::create_directories(dir + "/.step-7.tmp");
  std::ofstream(dir + "/.step-7.tmp/lambda.npy") << "half a file";
  fs::create_directories(dir + "/.step-8.tmp");
  std::ofstream(dir + "/unrelated.txt") << "kept";
  auto sink = ReleaseFileSink::Open(dir);
  ASSERT_TRUE(sink.ok());
  EXPECT_EQ(Listing(dir), std::set<std::string>{"unrelated.txt"});

  // A leftover for the id being written (crash after Open) is replaced too.
  fs::create_directories(dir + "/.step-7.tmp");
  std::ofstream(dir + "/.step-7.tmp/manifest.json") << "{}";
  ASSERT_TRUE(sink->Write(MakeRelease("step-7")).ok());
  EXPECT_EQ(Listing(dir), (std::set<std::string>{"unrelated.txt", "step-7"}));
  EXPECT_EQ(Listing(dir + "/step-7"),
            (std::set<std::string>{"manifest.json", "lambda.npy", "alpha.npy"}));
}

// A run refused at start-up must leave nothing behind (issue 27): Open
// creates nothing, the first Write creates the directory and its parents.
TEST(ReleaseFileSinkTest, OpenCreatesNothingTheFirstWriteCreatesTheDirectory) {
  const std::string dir = TestDir() + "/nested/releases";
  auto sink = ReleaseFileSink::Open(dir);
  ASSERT_TRUE(sink.ok()) << sink.status().ToString();
  EXPECT_FALSE(fs::exists(TestDir() + "/nested"));
  ASSERT_TRUE(sink->Write(MakeRelease("step-1")).ok());
  EXPECT_TRUE(fs::is_directory(dir + "/step-1"));
}

TEST(ReleaseFileSinkTest, OpenFailsOnAFile) {
  const std::string dir = TestDir();
  fs::create_directories(dir);
  std::ofstream(dir + "/file") << "x";
  auto sink = ReleaseFileSink::Open(dir + "/file");
  EXPECT_EQ(sink.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(sink.status().message(), HasSubstr(dir + "/file"));
  EXPECT_EQ(ReleaseFileSink::Open("").status().code(), StatusCode::kInvalidArgument);
}

// The reference decoder reads the sink's real output back through numpy.
TEST(ReleaseFileSinkTest, ReferenceDecoderReadsWhatWasWrittenBitForBit) {
  const std::string dir = TestDir();
  auto sink = ReleaseFileSink::Open(dir);
  ASSERT_TRUE(sink.ok());
  const release::Release release = MakeRelease("step-42");
  ASSERT_TRUE(sink->Write(release).ok());
  const std::string out = dir + "/step-42";

  // Run by path: the script is executable and names its interpreter.
  const CommandResult decoded = RunCommand(Decoder() + " " + out + " --json --values");
  ASSERT_EQ(decoded.exit_code, 0) << decoded.output;
  const nlohmann::json summary = nlohmann::json::parse(decoded.output);
  const release::ReleaseMetadata& m = release.metadata;
  EXPECT_EQ(summary["release_id"], m.release_id);
  EXPECT_EQ(summary["step"], m.step);
  EXPECT_EQ(summary["rho"].get<double>(), m.rho);
  EXPECT_EQ(summary["epsilon_spent"].get<double>(), m.epsilon_spent);
  EXPECT_EQ(summary["delta"].get<double>(), m.delta);
  EXPECT_EQ(summary["is_private"], true);
  EXPECT_EQ(summary["dimensions"]["V"], 4);
  EXPECT_EQ(summary["clip_bounds"]["topic_word"].get<double>(), 50.0);
  ASSERT_EQ(summary["arrays"].size(), 2u);
  for (const release::ReleaseArray& array : release.arrays) {
    const nlohmann::json& info = summary["arrays"][array.name];
    EXPECT_EQ(info["shape"].get<std::vector<int64_t>>(), array.shape) << array.name;
    EXPECT_EQ(info["dtype"], "<f8");
    EXPECT_EQ(info["blake2b"], release::Blake2bHex(release::EncodeNpy(array)));
    const auto values = info["values"].get<std::vector<double>>();
    ASSERT_EQ(values.size(), array.data.size());
    for (size_t i = 0; i < values.size(); ++i) {
      EXPECT_EQ(std::bit_cast<uint64_t>(values[i]), std::bit_cast<uint64_t>(array.data[i]))
          << array.name << "[" << i << "]";
    }
  }
  EXPECT_EQ(summary["arrays"]["lambda"]["max"].get<double>(), 1e308);
  EXPECT_EQ(summary["arrays"]["lambda"]["min"].get<double>(), -7.25);
  // 1e308 + 1e308 overflows: reported as null, never as an invalid JSON Infinity.
  EXPECT_TRUE(summary["arrays"]["lambda"]["sum"].is_null());
  EXPECT_EQ(summary["arrays"]["alpha"]["sum"].get<double>(), 0.75);

  // Text mode, and use as a module.
  const CommandResult text = RunCommand(std::string(kPython) + " " + Decoder() + " " + out);
  ASSERT_EQ(text.exit_code, 0) << text.output;
  EXPECT_THAT(text.output, HasSubstr("array lambda"));
  EXPECT_THAT(text.output, HasSubstr("shape=[3, 4]"));
  const CommandResult module = RunCommand(
      std::string(kPython) + " -c \"import sys; sys.path.insert(0, '" + VIPSD_SOURCE_DIR +
      "/tools'); import decode_release as d; m, a = d.load_release('" + out +
      "'); print(m['step'], list(a), a['lambda'].shape, repr(a['alpha'][1]))\"");
  ASSERT_EQ(module.exit_code, 0) << module.output;
  EXPECT_EQ(module.output, "42 ['lambda', 'alpha'] (3, 4) 0.25\n");
}

TEST(ReleaseFileSinkTest, ReferenceDecoderFailsOnAnyMismatch) {
  const std::string dir = TestDir();
  auto sink = ReleaseFileSink::Open(dir);
  ASSERT_TRUE(sink.ok());
  ASSERT_TRUE(sink->Write(MakeRelease("good")).ok());
  auto decode = [](const std::string& release_dir) {
    return RunCommand(std::string(kPython) + " " + Decoder() + " " + release_dir + " --json 2>&1");
  };
  ASSERT_EQ(decode(dir + "/good").exit_code, 0);

  struct Corruption {
    const char* id;
    void (*apply)(const std::string& release_dir);
    const char* message_part;
  };
  const std::vector<Corruption> corruptions = {
      {"flipped",
       [](const std::string& d) {
         std::string bytes = ReadFile(d + "/lambda.npy");
         bytes[bytes.size() - 3] ^= 0x01;  // same size, one bit of data
         std::ofstream(d + "/lambda.npy", std::ios::binary | std::ios::trunc) << bytes;
       },
       "BLAKE2b-256 does not match"},
      {"appended",
       [](const std::string& d) { std::ofstream(d + "/alpha.npy", std::ios::app) << "x"; },
       "bytes, manifest says"},
      {"missing",
       [](const std::string& d) { fs::remove(d + "/alpha.npy"); }, "cannot read"},
      {"shape",
       [](const std::string& d) {
         auto manifest = nlohmann::json::parse(ReadFile(d + "/manifest.json"));
         manifest["arrays"][0]["shape"] = {4, 3};
         std::ofstream(d + "/manifest.json", std::ios::trunc) << manifest.dump();
       },
       "manifest says [4, 3]"},
      {"schema",
       [](const std::string& d) {
         auto manifest = nlohmann::json::parse(ReadFile(d + "/manifest.json"));
         manifest["schema_version"] = 2;
         std::ofstream(d + "/manifest.json", std::ios::trunc) << manifest.dump();
       },
       "schema_version 2 is not supported"},
      {"path",
       [](const std::string& d) {
         auto manifest = nlohmann::json::parse(ReadFile(d + "/manifest.json"));
         manifest["arrays"][1]["file"] = "../good/alpha.npy";
         std::ofstream(d + "/manifest.json", std::ios::trunc) << manifest.dump();
       },
       "is not 'alpha.npy'"},
      {"field",
       [](const std::string& d) {
         auto manifest = nlohmann::json::parse(ReadFile(d + "/manifest.json"));
         manifest.erase("epsilon_spent");
         std::ofstream(d + "/manifest.json", std::ios::trunc) << manifest.dump();
       },
       "missing field 'epsilon_spent'"},
      {"manifest",
       [](const std::string& d) { std::ofstream(d + "/manifest.json", std::ios::trunc) << "{"; },
       "cannot read"},
  };
  for (const Corruption& corruption : corruptions) {
    ASSERT_TRUE(sink->Write(MakeRelease(corruption.id)).ok());
    const std::string release_dir = dir + "/" + corruption.id;
    ASSERT_EQ(decode(release_dir).exit_code, 0) << corruption.id;
    corruption.apply(release_dir);
    const CommandResult result = decode(release_dir);
    EXPECT_EQ(result.exit_code, 1) << corruption.id << ": " << result.output;
    EXPECT_THAT(result.output, HasSubstr(corruption.message_part)) << corruption.id;
    // One line: "decode_release: <what>\n", no traceback.
    EXPECT_TRUE(result.output.starts_with("decode_release: ")) << result.output;
    EXPECT_EQ(result.output.find('\n'), result.output.size() - 1) << result.output;
  }
}

}  // namespace
}  // namespace vipsd::connectors
