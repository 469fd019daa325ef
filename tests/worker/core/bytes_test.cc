#include "worker/core/bytes.h"

#include <gtest/gtest.h>

namespace pstar {
namespace {

TEST(Bytes, ParsesCountsAndUnits) {
  EXPECT_EQ(*ParseBytes("1048576"), 1048576);
  EXPECT_EQ(*ParseBytes("512MiB"), int64_t(512) << 20);
  EXPECT_EQ(*ParseBytes("1.5 GiB"), int64_t(3) << 29);
  EXPECT_EQ(*ParseBytes("2GB"), 2000000000);
  EXPECT_EQ(*ParseBytes("64 B"), 64);
  EXPECT_FALSE(ParseBytes("lots").ok());
  EXPECT_FALSE(ParseBytes("-1").ok());
  auto bad = ParseBytes("3 parsecs");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("unknown unit 'parsecs'"), std::string::npos);
}

TEST(Bytes, FormatsInBinaryUnits) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(1023), "1023 B");
  EXPECT_EQ(FormatBytes(1536), "1.5 KiB");
  EXPECT_EQ(FormatBytes(int64_t(3) << 30), "3.0 GiB");
}

}  // namespace
}  // namespace pstar
