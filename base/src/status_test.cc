#include "meshlearn/base/status.h"

#include <gtest/gtest.h>

namespace meshlearn {
namespace {

Result<int> Half(int x) {
  if (x % 2 != 0) return InvalidArgument("x must be even, got " + std::to_string(x));
  return x / 2;
}

Status Quarter(int x, int* out) {
  ML_ASSIGN_OR_RETURN(int h, Half(x));
  ML_ASSIGN_OR_RETURN(int q, Half(h));
  *out = q;
  return Status::Ok();
}

TEST(Status, OkAndError) {
  EXPECT_TRUE(Status::Ok().ok());
  Status s = NotFound("key 'x'");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.ToString(), "NotFound: key 'x'");
  EXPECT_EQ(s.WithPrefix("genesis.toml").message(), "genesis.toml: key 'x'");
}

TEST(Result, ValueAndPropagation) {
  int out = 0;
  EXPECT_TRUE(Quarter(8, &out).ok());
  EXPECT_EQ(out, 2);
  Status s = Quarter(6, &out);  // 6/2 = 3 is odd
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "x must be even, got 3");
}

TEST(ResultDeathTest, ValueOfErrorAborts) {
  Result<int> r = Internal("boom");
  EXPECT_DEATH((void)r.value(), "boom");
}

TEST(CheckDeathTest, ReportsFileAndCondition) {
  int n = 3;
  EXPECT_DEATH(CHECK_EQ(n, 4) << "extra", "status_test.cc.*CHECK failed.*n = 3.*extra");
}

}  // namespace
}  // namespace meshlearn
