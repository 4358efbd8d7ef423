#include "connectors/file/jsonl_source.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <set>
#include <fstream>
#include <string>
#include <vector>

namespace vipsd::connectors {
namespace {

using Ids = std::vector<int32_t>;

constexpr char kSecret[] = "SECRETMARKERq7x";

text::Vocabulary TestVocabulary() {
  // ids: 0 alpha, 1 beta, 2 gamma
  StatusOr<text::Vocabulary> vocabulary = text::Vocabulary::Parse("alpha\nbeta\ngamma\n");
  EXPECT_TRUE(vocabulary.ok());
  return std::move(vocabulary).value();
}

// Writes `contents` to a fresh file named after the running test.
std::string WriteTempFile(const std::string& contents) {
  const testing::TestInfo* info = testing::UnitTest::GetInstance()->current_test_info();
  const std::string path =
      testing::TempDir() + "jsonl_source_test_" + info->name() + ".jsonl";
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << contents;
  out.close();
  EXPECT_TRUE(out.good());
  return path;
}

JsonlDocumentSource OpenOrDie(const std::string& path, const text::Vocabulary& vocabulary,
                              JsonlSourceOptions options = {}) {
  StatusOr<JsonlDocumentSource> source = JsonlDocumentSource::Open(path, vocabulary, options);
  EXPECT_TRUE(source.ok()) << source.status().ToString();
  return std::move(source).value();
}

// Reads everything; fails the test on a read error.
std::vector<DecodedLine> ReadAll(JsonlDocumentSource& source) {
  std::vector<DecodedLine> lines;
  while (true) {
    StatusOr<std::optional<DecodedLine>> next = source.Next();
    EXPECT_TRUE(next.ok()) << next.status().ToString();
    if (!next.ok() || !next->has_value()) break;
    lines.push_back(std::move(**next));
  }
  return lines;
}

const text::Document& AsDocument(const DecodedLine& line) {
  const auto* document = std::get_if<text::Document>(&line);
  EXPECT_NE(document, nullptr) << "expected a document, got: "
                               << std::get<Rejection>(line).reason;
  static const text::Document kNone;
  return document == nullptr ? kNone : *document;
}

const Rejection& AsRejection(const DecodedLine& line) {
  const auto* rejection = std::get_if<Rejection>(&line);
  EXPECT_NE(rejection, nullptr) << "expected a rejection";
  static const Rejection kNone;
  return rejection == nullptr ? kNone : *rejection;
}

TEST(JsonlSourceTest, DecodesTextAndTokensAndSkipsBlankLines) {
  const text::Vocabulary vocabulary = TestVocabulary();
  const std::string path = WriteTempFile(
      "{\"id\": \"a\", \"text\": \"Alpha beta, ALPHA!\"}\n"  // line 1
      "\n"                                                   // 2 (blank)
      "   \t\r\n"                                            // 3 (blank)
      "{\"id\": 7, \"tokens\": [\"GAMMA\", \"delta\", \"beta\"]}\r\n"  // 4, CRLF
      "{\"id\": \"empty\", \"text\": \"no known words\"}\n"  // 5
      "{\"id\": -3, \"text\": \"gamma\"}");                   // 6, no final "\n"
  JsonlDocumentSource source = OpenOrDie(path, vocabulary);
  EXPECT_EQ(source.line_number(), 0);

  StatusOr<std::optional<DecodedLine>> first = source.Next();
  ASSERT_TRUE(first.ok() && first->has_value());
  EXPECT_EQ(AsDocument(**first).id, "a");
  EXPECT_EQ(AsDocument(**first).word_ids, (Ids{0, 1, 0}));
  EXPECT_EQ(source.line_number(), 1);

  StatusOr<std::optional<DecodedLine>> second = source.Next();
  ASSERT_TRUE(second.ok() && second->has_value());
  EXPECT_EQ(AsDocument(**second).id, "7");
  EXPECT_EQ(AsDocument(**second).word_ids, (Ids{2, 1}));
  EXPECT_EQ(source.line_number(), 4);  // blank lines still count

  std::vector<DecodedLine> rest = ReadAll(source);
  ASSERT_EQ(rest.size(), 2u);
  EXPECT_EQ(AsDocument(rest[0]).id, "empty");
  EXPECT_TRUE(AsDocument(rest[0]).word_ids.empty());
  EXPECT_EQ(AsDocument(rest[1]).id, "-3");
  EXPECT_EQ(AsDocument(rest[1]).word_ids, (Ids{2}));
  EXPECT_EQ(source.line_number(), 6);

  // End of file is sticky.
  for (int i = 0; i < 3; ++i) {
    StatusOr<std::optional<DecodedLine>> end = source.Next();
    ASSERT_TRUE(end.ok());
    EXPECT_FALSE(end->has_value());
  }
  const JsonlSourceStats& stats = source.stats();
  EXPECT_EQ(stats.lines, 6);
  EXPECT_EQ(stats.blank_lines, 2);
  EXPECT_EQ(stats.documents, 4);
  EXPECT_EQ(stats.empty_documents, 1);
  EXPECT_EQ(stats.rejections, 0);
}

TEST(JsonlSourceTest, EmptyFileEndsImmediately) {
  const text::Vocabulary vocabulary = TestVocabulary();
  JsonlDocumentSource source = OpenOrDie(WriteTempFile(""), vocabulary);
  StatusOr<std::optional<DecodedLine>> end = source.Next();
  ASSERT_TRUE(end.ok());
  EXPECT_FALSE(end->has_value());
  EXPECT_EQ(source.stats().lines, 0);
}

TEST(JsonlSourceTest, EveryRejectionReasonWithLineNumbers) {
  const text::Vocabulary vocabulary = TestVocabulary();
  JsonlSourceOptions options;
  options.max_line_bytes = 200;
  struct Case {
    std::string line;
    RejectReason reason;
  };
  const std::vector<Case> cases = {
      {"{\"id\": 1, \"text\": \"alpha\"", RejectReason::kInvalidJson},
      {"[1, 2]", RejectReason::kNotAnObject},
      {"{\"text\": \"alpha\"}", RejectReason::kMissingId},
      {"{\"id\": 1.5, \"text\": \"alpha\"}", RejectReason::kBadId},
      {"{\"id\": 1}", RejectReason::kMissingText},
      {"{\"id\": 1, \"text\": 3}", RejectReason::kBadText},
      {"{\"id\": 1, \"tokens\": [\"alpha\", 3]}", RejectReason::kBadTokens},
      {"{\"id\": 1, \"text\": \"a\", \"tokens\": []}", RejectReason::kBothTextAndTokens},
      {"{\"id\": 1, \"text\": \"" + std::string(300, 'a') + "\"}", RejectReason::kLineTooLong},
      {"{\"id\": 1, \"text\": \"\xff\"}", RejectReason::kInvalidUtf8},
  };
  ASSERT_EQ(cases.size(), kNumDocumentRejectReasons);
  std::string contents;
  for (const Case& c : cases) contents += c.line + "\n" + "{\"id\": \"ok\", \"text\": \"beta\"}\n";
  JsonlDocumentSource source = OpenOrDie(WriteTempFile(contents), vocabulary, options);
  const std::vector<DecodedLine> lines = ReadAll(source);
  ASSERT_EQ(lines.size(), 2 * cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    const Rejection& rejection = AsRejection(lines[2 * i]);
    const int64_t line_number = static_cast<int64_t>(2 * i + 1);
    EXPECT_EQ(rejection.line_number, line_number);
    EXPECT_EQ(rejection.reason_code, cases[i].reason) << rejection.reason;
    EXPECT_EQ(rejection.reason, "line " + std::to_string(line_number) + ": " +
                                    std::string(RejectReasonName(cases[i].reason)) + ": " +
                                    std::string(RejectReasonDescription(cases[i].reason)));
    // The next line decodes normally: a rejection never desynchronises lines.
    EXPECT_EQ(AsDocument(lines[2 * i + 1]).word_ids, (Ids{1}));
  }
  EXPECT_EQ(source.stats().rejections, static_cast<int64_t>(cases.size()));
  EXPECT_EQ(source.stats().documents, static_cast<int64_t>(cases.size()));
}

TEST(JsonlSourceTest, RejectionsNeverContainRecordContent) {
  const text::Vocabulary vocabulary = TestVocabulary();
  const std::string s = kSecret;
  // The marker sits in the id, the text, the tokens, a key and at the exact
  // spot where a JSON parser reports its error.
  const std::vector<std::string> lines = {
      "{\"id\": \"" + s + "\", \"text\": \"" + s,
      "{\"id\": \"" + s + "\", \"text\": \"alpha\"} " + s,
      "[\"" + s + "\"]",
      "{\"" + s + "\": 1, \"text\": \"" + s + "\"}",
      "{\"id\": [\"" + s + "\"], \"text\": \"" + s + "\"}",
      "{\"id\": \"" + s + "\", \"body\": \"" + s + "\"}",
      "{\"id\": \"" + s + "\", \"text\": {\"" + s + "\": 1}}",
      "{\"id\": \"" + s + "\", \"tokens\": [\"" + s + "\", 1]}",
      "{\"id\": \"" + s + "\", \"text\": \"" + s + "\", \"tokens\": [\"" + s + "\"]}",
      "{\"id\": \"" + s + "\", \"text\": \"" + s + std::string(500, 'x') + "\"}",
      "{\"id\": \"" + s + "\", \"text\": \"" + s + "\xc3\x28\"}",
      s,
  };
  std::string contents;
  for (const std::string& line : lines) contents += line + "\n";
  JsonlSourceOptions options;
  options.max_line_bytes = 300;
  JsonlDocumentSource source = OpenOrDie(WriteTempFile(contents), vocabulary, options);
  const std::vector<DecodedLine> decoded = ReadAll(source);
  ASSERT_EQ(decoded.size(), lines.size());
  std::set<RejectReason> reasons_seen;
  for (const DecodedLine& line : decoded) {
    const Rejection& rejection = AsRejection(line);
    reasons_seen.insert(rejection.reason_code);
    EXPECT_EQ(rejection.reason.find("SECRET"), std::string::npos) << rejection.reason;
    EXPECT_EQ(rejection.reason.find("q7x"), std::string::npos) << rejection.reason;
  }
  EXPECT_EQ(reasons_seen.size(), kNumDocumentRejectReasons);  // every reason was exercised
}

TEST(JsonlSourceTest, LongLinesAreRejectedAndReadingContinues) {
  const text::Vocabulary vocabulary = TestVocabulary();
  JsonlSourceOptions options;
  options.max_line_bytes = 100 << 10;  // 100 KiB, longer than one 64 KiB read
  const std::string at_limit_prefix = "{\"id\": \"l\", \"text\": \"alpha ";
  std::string at_limit = at_limit_prefix + std::string(options.max_line_bytes - at_limit_prefix.size() - 2, ' ') + "\"}";
  ASSERT_EQ(at_limit.size(), options.max_line_bytes);
  const std::string over_limit = at_limit + " ";
  const std::string huge = "{\"id\": 1, \"text\": \"" + std::string(1 << 20, 'b') + "\"}";
  const std::string contents = at_limit + "\n" + over_limit + "\n" + huge + "\r\n" +
                               "{\"id\": 2, \"text\": \"gamma\"}\n" + huge;  // last line: no "\n"
  JsonlDocumentSource source = OpenOrDie(WriteTempFile(contents), vocabulary, options);
  const std::vector<DecodedLine> lines = ReadAll(source);
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_EQ(AsDocument(lines[0]).word_ids, (Ids{0}));  // exactly at the limit: accepted
  EXPECT_EQ(AsRejection(lines[1]).reason_code, RejectReason::kLineTooLong);
  EXPECT_EQ(AsRejection(lines[1]).line_number, 2);
  EXPECT_EQ(AsRejection(lines[2]).reason_code, RejectReason::kLineTooLong);
  EXPECT_EQ(AsRejection(lines[2]).line_number, 3);
  EXPECT_EQ(AsDocument(lines[3]).id, "2");
  EXPECT_EQ(AsDocument(lines[3]).word_ids, (Ids{2}));
  EXPECT_EQ(AsRejection(lines[4]).reason_code, RejectReason::kLineTooLong);
  EXPECT_EQ(AsRejection(lines[4]).line_number, 5);
}

TEST(JsonlSourceTest, LinesSpanningManyReadBuffersDecode) {
  const text::Vocabulary vocabulary = TestVocabulary();
  std::string text;
  Ids expected;
  for (int i = 0; i < 60000; ++i) {
    text += (i % 3 == 0) ? "alpha " : (i % 3 == 1) ? "Beta " : "x ";
    if (i % 3 != 2) expected.push_back(i % 3);
  }
  const std::string contents = "{\"id\": \"big\", \"text\": \"" + text + "\"}\n" +
                               "{\"id\": \"small\", \"text\": \"gamma\"}\n";
  ASSERT_GT(contents.size(), size_t{3} * 65536);
  JsonlDocumentSource source = OpenOrDie(WriteTempFile(contents), vocabulary);
  const std::vector<DecodedLine> lines = ReadAll(source);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(AsDocument(lines[0]).word_ids, expected);
  EXPECT_EQ(AsDocument(lines[1]).word_ids, (Ids{2}));
}

TEST(JsonlSourceTest, OpenErrors) {
  const text::Vocabulary vocabulary = TestVocabulary();
  const std::string missing = testing::TempDir() + "jsonl_source_test_does_not_exist.jsonl";
  std::filesystem::remove(missing);
  StatusOr<JsonlDocumentSource> absent = JsonlDocumentSource::Open(missing, vocabulary);
  ASSERT_FALSE(absent.ok());
  EXPECT_EQ(absent.status().code(), StatusCode::kNotFound);
  EXPECT_NE(absent.status().message().find(missing), std::string::npos);

  StatusOr<JsonlDocumentSource> directory =
      JsonlDocumentSource::Open(testing::TempDir(), vocabulary);
  ASSERT_FALSE(directory.ok());
  EXPECT_EQ(directory.status().code(), StatusCode::kInvalidArgument);

  JsonlSourceOptions zero;
  zero.max_line_bytes = 0;
  StatusOr<JsonlDocumentSource> bad_options =
      JsonlDocumentSource::Open(WriteTempFile("{}\n"), vocabulary, zero);
  ASSERT_FALSE(bad_options.ok());
  EXPECT_EQ(bad_options.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad_options.status().message().find("max_line_bytes"), std::string::npos);
}

TEST(JsonlSourceTest, SourceCanBeMovedMidStream) {
  const text::Vocabulary vocabulary = TestVocabulary();
  JsonlDocumentSource source = OpenOrDie(
      WriteTempFile("{\"id\": 1, \"text\": \"alpha\"}\n{\"id\": 2, \"text\": \"beta\"}\n"),
      vocabulary);
  StatusOr<std::optional<DecodedLine>> first = source.Next();
  ASSERT_TRUE(first.ok() && first->has_value());
  JsonlDocumentSource moved = std::move(source);
  const std::vector<DecodedLine> rest = ReadAll(moved);
  ASSERT_EQ(rest.size(), 1u);
  EXPECT_EQ(AsDocument(rest[0]).id, "2");
  EXPECT_EQ(moved.line_number(), 2);
}

}  // namespace
}  // namespace vipsd::connectors
