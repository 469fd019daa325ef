#include "worker/runtime/host_memory.h"

#include <gtest/gtest.h>

#include "tests/test_util.h"

namespace pstar {
namespace {

TEST(HostBudget, ConfigThenCgroupThenRam) {
  test::TempDir dir("host_budget");
  const std::string cgroup = dir.path() + "/memory.max", meminfo = dir.path() + "/meminfo";
  test::WriteText(meminfo, "MemFree:  100 kB\nMemTotal:       2048 kB\n");
  test::WriteText(cgroup, "max\n");
  auto ram = DetectHostBudget(0, cgroup, meminfo);
  ASSERT_TRUE(ram.ok()) << ram.status().message();
  EXPECT_EQ(ram->bytes, 2048 * 1024);
  EXPECT_EQ(ram->source, "physical RAM");

  test::WriteText(cgroup, "1073741824\n");
  auto limited = DetectHostBudget(0, cgroup, meminfo);
  ASSERT_TRUE(limited.ok());
  EXPECT_EQ(limited->bytes, 1073741824);
  EXPECT_NE(limited->source.find("cgroup v2"), std::string::npos);

  auto configured = DetectHostBudget(12345, cgroup, meminfo);
  ASSERT_TRUE(configured.ok());
  EXPECT_EQ(configured->bytes, 12345);
  EXPECT_EQ(configured->source, "config");

  auto none = DetectHostBudget(0, dir.path() + "/missing", dir.path() + "/missing");
  EXPECT_FALSE(none.ok());
}

TEST(HostBudget, ThisMachineHasOne) {
  auto b = DetectHostBudget(0);
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_GT(b->bytes, int64_t(64) << 20);
}

}  // namespace
}  // namespace pstar
