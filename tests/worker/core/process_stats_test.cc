#include "worker/core/process_stats.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

namespace pstar {
namespace {

TEST(ProcessStats, ReadsThisProcess) {
  auto before = ReadProcessStats();
  ASSERT_TRUE(before.has_value());
  // Burn a little CPU and memory: the readings follow.
  std::vector<char> touched(64 << 20, 1);
  volatile double x = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
  while (std::chrono::steady_clock::now() < until) x = x + 1;
  auto after = ReadProcessStats();
  ASSERT_TRUE(after.has_value());
  EXPECT_GE(after->cpu_seconds, before->cpu_seconds + 0.05);
  EXPECT_GT(after->resident_bytes, double(60 << 20)) << "the 64 MiB just touched";
  EXPECT_GE(after->virtual_bytes, after->resident_bytes);
  EXPECT_GE(after->open_fds, 3);  // stdin, stdout, stderr
  EXPECT_GE(after->threads, 1);
  const double now = double(
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count());
  EXPECT_LE(after->start_time_seconds, now + 2);
  EXPECT_GT(after->start_time_seconds, now - 3600) << "this test started within the hour";
  EXPECT_EQ(after->start_time_seconds, before->start_time_seconds);
  touched[0] = static_cast<char>(static_cast<int64_t>(x) % 100);  // keeps both alive
}

}  // namespace
}  // namespace pstar
