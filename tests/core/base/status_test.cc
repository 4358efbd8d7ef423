#include "core/base/status.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace vipsd {
namespace {

StatusOr<int> ParsePositive(int v) {
  if (v <= 0) return InvalidArgumentError("value must be > 0");
  return v;
}

Status UsesMacros(int v, int* out) {
  VIPSD_ASSIGN_OR_RETURN(int parsed, ParsePositive(v));
  VIPSD_RETURN_IF_ERROR(parsed > 100 ? OutOfRangeError("too big") : Status::Ok());
  *out = parsed;
  return Status::Ok();
}

TEST(StatusTest, OkAndErrorFormatting) {
  EXPECT_TRUE(Status::Ok().ok());
  EXPECT_EQ(Status::Ok().ToString(), "OK");
  Status s = InvalidArgumentError("--sampling-rate must be in (0, 1]");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.ToString(), "INVALID_ARGUMENT: --sampling-rate must be in (0, 1]");
}

TEST(StatusTest, MacrosPropagateErrorsAndValues) {
  int out = 0;
  EXPECT_TRUE(UsesMacros(7, &out).ok());
  EXPECT_EQ(out, 7);
  EXPECT_EQ(UsesMacros(-1, &out).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(UsesMacros(101, &out).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(out, 7);
}

TEST(StatusTest, StatusOrHoldsValueOrError) {
  auto good = ParsePositive(3);
  ASSERT_TRUE(good.ok());
  EXPECT_EQ(*good, 3);
  auto bad = ParsePositive(0);
  EXPECT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), ::testing::HasSubstr("must be > 0"));
}

}  // namespace
}  // namespace vipsd
