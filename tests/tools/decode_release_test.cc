// tools/decode_release.py --kcat: the reference decoder's Kafka mode on
// dumps written in the documented kcat format. The dumps are built here byte
// for byte (kafka_producer_test.cc checks the same decoder on a dump that
// kcat itself wrote from a mock cluster).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/release/release.h"
#include "tests/connectors/kafka/kafka_test_util.h"

namespace vipsd {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using Headers = std::vector<std::pair<std::string, std::string>>;
using connectors::testing_kafka::ReadFile;
using connectors::testing_kafka::RunCommand;
using connectors::testing_kafka::WriteFile;

constexpr char kPython[] = "/usr/bin/python3";

std::string Decoder() { return std::string(VIPSD_SOURCE_DIR) + "/tools/decode_release.py"; }

std::string TestDir() {
  const testing::TestInfo* info = testing::UnitTest::GetInstance()->current_test_info();
  const std::string dir = testing::TempDir() + "decode_release_test_" + info->name();
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// One record as kcat -f 'vipsd-kcat %p %o %K %S\n%k\n%h\n%s\n' writes it.
std::string KcatRecord(int64_t offset, const std::string& key, const Headers& headers,
                       const std::string& value) {
  std::string h;
  for (const auto& [name, v] : headers) h += (h.empty() ? "" : ",") + name + "=" + v;
  return "vipsd-kcat 0 " + std::to_string(offset) + " " + std::to_string(key.size()) + " " +
         std::to_string(value.size()) + "\n" + key + "\n" + h + "\n" + value + "\n";
}

release::Release MakeRelease(const std::string& id, double fill) {
  release::Release r;
  release::ReleaseMetadata& m = r.metadata;
  m.release_id = id;
  m.model_type = "lda";
  m.step = 8;
  m.rho = 0.25;
  m.accountant = "none";
  m.sampling_rate = 0.5;
  m.dimensions = {{"K", 2}, {"V", 3000}};
  m.config_fingerprint = std::string(64, 'f');
  m.noise_description = "none";
  m.created_at_utc = "2026-01-31T12:00:00Z";
  release::ReleaseArray lambda{"lambda", {2, 3000}, std::vector<double>(6000, fill)};
  // Bytes that look like a record boundary inside a chunk must not confuse
  // the reader: it trusts the lengths, not the content.
  const char trap[] = "\nvipsd-kcat 0 9 1 1\nx\n\n";
  std::memcpy(lambda.data.data() + 100, trap, sizeof(trap) - 1);
  r.arrays.push_back(std::move(lambda));
  r.arrays.push_back({"alpha", {2}, {0.5, fill}});
  return r;
}

// The release's messages, chunked at chunk_bytes, starting at `offset`.
std::string Dump(const release::EncodedRelease& e, int64_t& offset, size_t chunk_bytes,
                 bool with_manifest = true) {
  std::string out;
  for (size_t f = 0; f + 1 < e.files.size(); ++f) {
    const auto pieces = release::ChunkBytes(e.files[f].bytes, chunk_bytes);
    for (size_t c = 0; c < pieces.size(); ++c) {
      out += KcatRecord(offset++, e.release_id,
                        {{"vipsd-release-id", e.release_id},
                         {"vipsd-file", e.files[f].name},
                         {"vipsd-chunk", std::to_string(c)},
                         {"vipsd-chunks", std::to_string(pieces.size())}},
                        pieces[c]);
    }
  }
  if (with_manifest) {
    out += KcatRecord(offset++, e.release_id,
                      {{"vipsd-release-id", e.release_id}, {"vipsd-file", "manifest.json"}},
                      e.files.back().bytes);
  }
  return out;
}

release::EncodedRelease Encode(const std::string& id, double fill) {
  auto encoded = release::EncodeRelease(MakeRelease(id, fill));
  EXPECT_TRUE(encoded.ok()) << encoded.status().message();
  return std::move(encoded).value();
}

struct Decoded {
  int exit_code = -1;
  std::vector<nlohmann::json> releases;  // stdout, one JSON object per line
  std::string errors;                    // stderr
};

Decoded Decode(const std::string& dir, const std::string& args) {
  Decoded d;
  const auto result = RunCommand(std::string(kPython) + " " + Decoder() + " --kcat " + dir +
                                     "/dump --json " + args + " 2>" + dir + "/stderr",
                                 /*merge_stderr=*/false);
  d.exit_code = result.exit_code;
  std::istringstream lines(result.output);
  for (std::string line; std::getline(lines, line);) {
    d.releases.push_back(nlohmann::json::parse(line, nullptr, false));
  }
  d.errors = ReadFile(dir + "/stderr");
  return d;
}

TEST(DecodeReleaseTest, ReassemblesEveryCompleteReleaseOfADump) {
  const std::string dir = TestDir();
  const release::EncodedRelease a = Encode("step-1", 1.5);
  const release::EncodedRelease b = Encode("step-2", 2.5);
  const release::EncodedRelease orphan = Encode("step-0", 9.0);
  int64_t offset = 0;
  std::string dump = Dump(orphan, offset, 10000, /*with_manifest=*/false);
  dump += KcatRecord(offset++, "", {}, "not a release");
  dump += Dump(a, offset, 10000);
  dump += Dump(b, offset, 7000);
  WriteFile(dir + "/dump", dump);

  const Decoded all = Decode(dir, "--extract " + dir + "/out");
  EXPECT_EQ(all.exit_code, 0) << all.errors;
  ASSERT_EQ(all.releases.size(), 2u);
  EXPECT_EQ(all.releases[0]["release_id"], "step-1");
  EXPECT_EQ(all.releases[1]["release_id"], "step-2");
  EXPECT_EQ(all.releases[1]["arrays"]["alpha"]["max"], 2.5);
  EXPECT_EQ(all.releases[0]["arrays"]["lambda"]["blake2b"], release::Blake2bHex(a.files[0].bytes));
  EXPECT_THAT(all.errors, HasSubstr("warning: release step-0 incomplete"));
  EXPECT_THAT(all.errors, HasSubstr("not a release message"));
  for (const release::ReleaseFile& file : b.files) {
    EXPECT_TRUE(ReadFile(dir + "/out/step-2/" + file.name) == file.bytes) << file.name;
  }
  // The extracted directory is a release directory for the directory mode.
  const auto again = RunCommand(std::string(kPython) + " " + Decoder() + " " + dir + "/out/step-1");
  EXPECT_EQ(again.exit_code, 0) << again.output;

  const Decoded one = Decode(dir, "--release-id step-2 --values");
  EXPECT_EQ(one.exit_code, 0);
  ASSERT_EQ(one.releases.size(), 1u);
  EXPECT_EQ(one.releases[0]["arrays"]["alpha"]["values"], (std::vector<double>{0.5, 2.5}));
  const Decoded missing = Decode(dir, "--release-id step-0");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_THAT(missing.errors, HasSubstr("release step-0: no complete, verified copy"));
}

TEST(DecodeReleaseTest, DropsReleasesThatDoNotVerifyButKeepsTheOthers) {
  const std::string dir = TestDir();
  const release::EncodedRelease good = Encode("good", 1.0);
  release::EncodedRelease bad = Encode("bad", 2.0);
  bad.files[0].bytes[5000] ^= 0x01;  // one bit of lambda after encoding
  release::EncodedRelease gap = Encode("gap", 3.0);
  int64_t gap_offset = 0;
  std::string gap_dump = Dump(gap, gap_offset, 10000);
  // Remove gap's second lambda chunk (the second record).
  const size_t first_end = gap_dump.find("vipsd-kcat 0 1 ");
  const size_t second_end = gap_dump.find("vipsd-kcat 0 2 ");
  gap_dump.erase(first_end, second_end - first_end);
  int64_t offset = 100;
  std::string dump = Dump(bad, offset, 10000) + gap_dump + Dump(good, offset, 10000);
  WriteFile(dir + "/dump", dump);
  const Decoded d = Decode(dir, "");
  EXPECT_EQ(d.exit_code, 1);
  ASSERT_EQ(d.releases.size(), 1u);
  EXPECT_EQ(d.releases[0]["release_id"], "good");
  EXPECT_THAT(d.errors, HasSubstr("release bad dropped: lambda.npy: BLAKE2b-256 does not match"));
  EXPECT_THAT(d.errors, HasSubstr("release gap dropped: lambda.npy: chunk 1 of"));
}

TEST(DecodeReleaseTest, MalformedDumpIsOneClearError) {
  const std::string dir = TestDir();
  int64_t offset = 0;
  std::string dump = Dump(Encode("x", 1.0), offset, 10000);
  WriteFile(dir + "/dump", dump.substr(0, dump.size() - 500));  // truncated value
  Decoded d = Decode(dir, "");
  EXPECT_EQ(d.exit_code, 1);
  EXPECT_TRUE(d.releases.empty());
  EXPECT_THAT(d.errors, HasSubstr("truncated"));
  EXPECT_EQ(d.errors.find('\n'), d.errors.size() - 1) << d.errors;  // one line

  WriteFile(dir + "/dump", "offset 0: hello\n");  // kcat's default format
  d = Decode(dir, "");
  EXPECT_EQ(d.exit_code, 1);
  EXPECT_THAT(d.errors, HasSubstr("expected a 'vipsd-kcat P O K S' line"));

  // Directory and --kcat are exclusive.
  const auto both = RunCommand(std::string(kPython) + " " + Decoder() + " " + dir + " --kcat " +
                               dir + "/dump");
  EXPECT_EQ(both.exit_code, 2) << both.output;
}

}  // namespace
}  // namespace vipsd
