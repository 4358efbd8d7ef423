#include "connectors/file/dead_letter_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "connectors/file/jsonl_source.h"

namespace vipsd::connectors {
namespace {

constexpr char kSecret[] = "SECRETMARKERq7x";

std::string TestPath(const std::string& suffix) {
  const testing::TestInfo* info = testing::UnitTest::GetInstance()->current_test_info();
  return testing::TempDir() + "dead_letter_file_test_" + info->name() + suffix;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

std::vector<nlohmann::json> ReadJsonLines(const std::string& path) {
  std::vector<nlohmann::json> lines;
  std::istringstream in(ReadFile(path));
  std::string line;
  while (std::getline(in, line)) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

Rejection MakeRejection(int64_t line_number, RejectReason reason) {
  return Rejection{line_number, reason, "line " + std::to_string(line_number) + ": " + kSecret};
}

TEST(DeadLetterFileTest, AppendsOneJsonLinePerRejectionWithOnlyThreeKeys) {
  const std::string path = TestPath(".dead");
  std::filesystem::remove(path);
  StatusOr<DeadLetterFile> dead_letters = DeadLetterFile::Open(path, "train.jsonl");
  ASSERT_TRUE(dead_letters.ok()) << dead_letters.status().ToString();
  ASSERT_TRUE(dead_letters->Append(MakeRejection(3, RejectReason::kBadText)).ok());
  ASSERT_TRUE(dead_letters->Append(MakeRejection(9, RejectReason::kInvalidJson)).ok());
  ASSERT_TRUE(dead_letters->Append(MakeRejection(12, RejectReason::kBadText)).ok());
  ASSERT_TRUE(dead_letters->Sync().ok());

  const std::vector<nlohmann::json> lines = ReadJsonLines(path);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], nlohmann::json::parse(
                          R"({"line": 3, "reason": "bad_text", "source": "train.jsonl"})"));
  EXPECT_EQ(lines[1]["line"], 9);
  EXPECT_EQ(lines[1]["reason"], "invalid_json");
  EXPECT_EQ(lines[2]["line"], 12);
  for (const nlohmann::json& line : lines) EXPECT_EQ(line.size(), 3u);
  // The free-text reason (which a caller might have filled carelessly) is
  // never written: only the code is.
  EXPECT_EQ(ReadFile(path).find("SECRET"), std::string::npos);

  const std::map<RejectReason, int64_t> expected = {{RejectReason::kBadText, 2},
                                                    {RejectReason::kInvalidJson, 1}};
  EXPECT_EQ(dead_letters->counts_by_reason(), expected);
  EXPECT_EQ(dead_letters->total(), 3);

  struct stat info {};
  ASSERT_EQ(::stat(path.c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0600u);
}

TEST(DeadLetterFileTest, AppendsToAnExistingFileAndEscapesTheSourceName) {
  const std::string path = TestPath(".dead");
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << "{\"line\": 1, \"reason\": \"bad_id\", \"source\": \"old\"}\n";
  }
  StatusOr<DeadLetterFile> dead_letters = DeadLetterFile::Open(path, "we\"ird\\name\n.jsonl");
  ASSERT_TRUE(dead_letters.ok());
  ASSERT_TRUE(dead_letters->Append(MakeRejection(5, RejectReason::kMissingId)).ok());
  const std::vector<nlohmann::json> lines = ReadJsonLines(path);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0]["source"], "old");
  EXPECT_EQ(lines[1]["source"], "we\"ird\\name\n.jsonl");
  EXPECT_EQ(lines[1]["reason"], "missing_id");
  // Only this object's appends are counted.
  EXPECT_EQ(dead_letters->total(), 1);
  EXPECT_EQ(dead_letters->counts_by_reason().at(RejectReason::kMissingId), 1);
  EXPECT_EQ(dead_letters->counts_by_reason().count(RejectReason::kBadId), 0u);
}

TEST(DeadLetterFileTest, OpenFailureNamesThePath) {
  const std::string path = TestPath("/no/such/dir/dead");
  StatusOr<DeadLetterFile> dead_letters = DeadLetterFile::Open(path, "x");
  ASSERT_FALSE(dead_letters.ok());
  EXPECT_EQ(dead_letters.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(dead_letters.status().message().find(path), std::string::npos);
}

TEST(DeadLetterFileTest, MovedFromObjectRefusesAndMovedToKeepsCounting) {
  const std::string path = TestPath(".dead");
  std::filesystem::remove(path);
  StatusOr<DeadLetterFile> opened = DeadLetterFile::Open(path, "s");
  ASSERT_TRUE(opened.ok());
  DeadLetterFile first = std::move(opened).value();
  ASSERT_TRUE(first.Append(MakeRejection(1, RejectReason::kBadId)).ok());
  DeadLetterFile second = std::move(first);
  EXPECT_EQ(first.Append(MakeRejection(2, RejectReason::kBadId)).code(),  // NOLINT: use after move
            StatusCode::kFailedPrecondition);
  ASSERT_TRUE(second.Append(MakeRejection(3, RejectReason::kBadId)).ok());
  EXPECT_EQ(second.total(), 2);
  EXPECT_EQ(ReadJsonLines(path).size(), 2u);
}

// End to end: a source full of bad records carrying a secret marker in every
// field; the dead-letter file must hold line numbers and codes only.
TEST(DeadLetterFileTest, SourceToDeadLetterFileNeverWritesRecordContent) {
  StatusOr<text::Vocabulary> vocabulary = text::Vocabulary::Parse("alpha\n");
  ASSERT_TRUE(vocabulary.ok());
  const std::string s = kSecret;
  const std::string contents =
      "{\"id\": \"" + s + "\", \"text\": \"" + s + "\"\n" +          // 1 invalid_json
      "{\"id\": \"" + s + "\", \"text\": \"alpha " + s + "\"}\n" +   // 2 ok
      "{\"id\": \"" + s + "\", \"tokens\": [\"" + s + "\", {}]}\n" +  // 3 bad_tokens
      "{\"id\": \"" + s + "\", \"text\": \"" + s + std::string(200, 'z') + "\"}\n" +  // 4 long
      "{\"id\": \"" + s + "\xed\xa0\x80\", \"text\": \"x\"}\n";        // 5 invalid_utf8
  const std::string source_path = TestPath(".jsonl");
  {
    std::ofstream out(source_path, std::ios::binary | std::ios::trunc);
    out << contents;
  }
  JsonlSourceOptions options;
  options.max_line_bytes = 150;
  StatusOr<JsonlDocumentSource> source =
      JsonlDocumentSource::Open(source_path, *vocabulary, options);
  ASSERT_TRUE(source.ok());
  const std::string dead_path = TestPath(".dead");
  std::filesystem::remove(dead_path);
  StatusOr<DeadLetterFile> dead_letters = DeadLetterFile::Open(dead_path, "input.jsonl");
  ASSERT_TRUE(dead_letters.ok());
  int documents = 0;
  while (true) {
    StatusOr<std::optional<DecodedLine>> next = source->Next();
    ASSERT_TRUE(next.ok());
    if (!next->has_value()) break;
    if (const auto* rejection = std::get_if<Rejection>(&**next)) {
      ASSERT_TRUE(dead_letters->Append(*rejection).ok());
    } else {
      ++documents;
    }
  }
  EXPECT_EQ(documents, 1);
  const std::string written = ReadFile(dead_path);
  EXPECT_EQ(written.find("SECRET"), std::string::npos) << written;
  EXPECT_EQ(written.find("q7x"), std::string::npos) << written;
  const std::vector<nlohmann::json> lines = ReadJsonLines(dead_path);
  ASSERT_EQ(lines.size(), 4u);
  const std::vector<std::pair<int, std::string>> expected = {
      {1, "invalid_json"}, {3, "bad_tokens"}, {4, "line_too_long"}, {5, "invalid_utf8"}};
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(lines[i]["line"], expected[i].first);
    EXPECT_EQ(lines[i]["reason"], expected[i].second);
    EXPECT_EQ(lines[i]["source"], "input.jsonl");
  }
  EXPECT_EQ(dead_letters->total(), 4);
}

}  // namespace
}  // namespace vipsd::connectors
