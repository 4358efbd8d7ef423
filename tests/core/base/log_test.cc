// The default log sink's two line formats: logfmt and one JSON object per
// line with stable field names, any message text escaped.
#include "core/base/log.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>

namespace vipsd {
namespace {

TEST(LogFormatTest, JsonLinesAreOneObjectWithStableFieldsWhateverTheMessage) {
  const std::string nasty = "quote \" backslash \\ newline \n tab \t bell \x07 end";
  const std::string line =
      FormatLogLine(LogFormat::kJson, "2026-11-25T01:02:03.004Z", LogLevel::kWarning, "daemon",
                    nasty);
  ASSERT_EQ(line.back(), '\n');
  EXPECT_EQ(line.find('\n'), line.size() - 1);  // one line
  const nlohmann::json object = nlohmann::json::parse(line);
  ASSERT_TRUE(object.is_object());
  EXPECT_EQ(object.size(), 4u);
  EXPECT_EQ(object["ts"], "2026-11-25T01:02:03.004Z");
  EXPECT_EQ(object["level"], "warning");
  EXPECT_EQ(object["component"], "daemon");
  EXPECT_EQ(object["msg"], nasty);  // round-trips exactly
}

TEST(LogFormatTest, LogfmtLinesQuoteTheMessageAndStayOnOneLine) {
  const std::string line = FormatLogLine(LogFormat::kLogfmt, "2026-11-25T01:02:03.004Z",
                                         LogLevel::kInfo, "kafka", "a \"b\"\nc");
  EXPECT_EQ(line,
            "ts=2026-11-25T01:02:03.004Z level=info component=kafka msg=\"a \\\"b\\\" c\"\n");
}

TEST(LogFormatTest, TheFormatIsProcessWideAndSwitchable) {
  EXPECT_EQ(CurrentLogFormat(), LogFormat::kLogfmt);
  SetLogFormat(LogFormat::kJson);
  EXPECT_EQ(CurrentLogFormat(), LogFormat::kJson);
  SetLogFormat(LogFormat::kLogfmt);
}

}  // namespace
}  // namespace vipsd
