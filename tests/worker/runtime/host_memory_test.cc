#include "worker/runtime/host_memory.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "tests/test_util.h"

namespace pstar {
namespace {

// A fake /proc and /sys/fs/cgroup in a temporary folder.
struct FakeHost {
  test::TempDir dir{"host_budget"};
  HostMemoryFiles files;
  FakeHost() {
    files = {dir.path() + "/cgroup", dir.path() + "/sys", dir.path() + "/meminfo"};
    test::WriteText(files.meminfo, "MemFree:  100 kB\nMemTotal:       2097152 kB\n");  // 2 GiB
  }
  void Write(const std::string& rel, const std::string& text) {
    std::filesystem::create_directories(std::filesystem::path(files.cgroup_root + rel).parent_path());
    test::WriteText(files.cgroup_root + rel, text);
  }
};

TEST(HostBudget, ConfigThenCgroupV2ThenRam) {
  FakeHost h;
  h.Write("/cgroup.controllers", "cpu memory\n");
  h.Write("/memory.max", "max\n");
  test::WriteText(h.files.proc_self_cgroup, "0::/\n");
  auto ram = DetectHostBudget(0, h.files);
  ASSERT_TRUE(ram.ok()) << ram.status().message();
  EXPECT_EQ(ram->bytes, int64_t(2) << 30);
  EXPECT_EQ(ram->source, "physical RAM");

  // A container with its own cgroup namespace: the root is its cgroup.
  h.Write("/memory.max", "1073741824\n");
  auto limited = DetectHostBudget(0, h.files);
  ASSERT_TRUE(limited.ok());
  EXPECT_EQ(limited->bytes, int64_t(1) << 30);
  EXPECT_NE(limited->source.find("cgroup v2 limit"), std::string::npos) << limited->source;

  // A process in a nested cgroup: its own limit, not the root's.
  test::WriteText(h.files.proc_self_cgroup, "0::/kubepods/pod1/ctr\n");
  h.Write("/kubepods/pod1/ctr/memory.max", "536870912\n");
  auto nested = DetectHostBudget(0, h.files);
  ASSERT_TRUE(nested.ok());
  EXPECT_EQ(nested->bytes, int64_t(512) << 20);
  EXPECT_NE(nested->source.find("/kubepods/pod1/ctr/memory.max"), std::string::npos) << nested->source;

  auto configured = DetectHostBudget(12345, h.files);
  ASSERT_TRUE(configured.ok());
  EXPECT_EQ(configured->bytes, 12345);
  EXPECT_EQ(configured->source, "config");
}

// cgroup v1 (Docker's cgroupfs driver): the memory controller's
// limit_in_bytes; "unlimited" is a number near 2^63 and limits nothing.
TEST(HostBudget, CgroupV1LimitBelowRam) {
  FakeHost h;
  test::WriteText(h.files.proc_self_cgroup, "9:pids:/docker/abc\n7:memory:/docker/abc\n1:name=systemd:/\n");
  h.Write("/memory/memory.limit_in_bytes", "9223372036854771712\n");
  auto unlimited = DetectHostBudget(0, h.files);
  ASSERT_TRUE(unlimited.ok());
  EXPECT_EQ(unlimited->source, "physical RAM");
  // Inside the container the mount shows its own cgroup at the root.
  h.Write("/memory/memory.limit_in_bytes", "805306368\n");
  auto limited = DetectHostBudget(0, h.files);
  ASSERT_TRUE(limited.ok());
  EXPECT_EQ(limited->bytes, int64_t(768) << 20);
  EXPECT_NE(limited->source.find("cgroup v1 limit"), std::string::npos) << limited->source;
  // Seen from the host, the container's path under the mount wins.
  h.Write("/memory/docker/abc/memory.limit_in_bytes", "268435456\n");
  auto host_view = DetectHostBudget(0, h.files);
  ASSERT_TRUE(host_view.ok());
  EXPECT_EQ(host_view->bytes, int64_t(256) << 20);
  // A limit above the machine's memory is no limit.
  h.Write("/memory/docker/abc/memory.limit_in_bytes", "4294967296\n");
  h.Write("/memory/memory.limit_in_bytes", "4294967296\n");
  auto above = DetectHostBudget(0, h.files);
  ASSERT_TRUE(above.ok());
  EXPECT_EQ(above->source, "physical RAM");
}

// A limit file that is garbage, truncated, negative or too long for int64
// limits nothing: the budget falls back to RAM, never to a wrong number.
TEST(HostBudget, AGarbledLimitFileFallsBackToRam) {
  FakeHost h;
  h.Write("/cgroup.controllers", "memory\n");
  test::WriteText(h.files.proc_self_cgroup, "0::/\n");
  for (const char* text : {"12abc\n", "", "-5\n", "99999999999999999999999\n", "0\n", " 1024\n"}) {
    h.Write("/memory.max", text);
    auto b = DetectHostBudget(0, h.files);
    ASSERT_TRUE(b.ok()) << text;
    EXPECT_EQ(b->source, "physical RAM") << text;
    EXPECT_EQ(b->bytes, int64_t(2) << 30) << text;
  }
  test::WriteText(h.files.proc_self_cgroup, "garbage without colons\n0:\n");
  h.Write("/memory.max", "1048576\n");
  auto root = DetectHostBudget(0, h.files);
  ASSERT_TRUE(root.ok());
  EXPECT_EQ(root->bytes, 1048576);
}

TEST(HostBudget, NothingReadableIsAnError) {
  test::TempDir dir("host_budget");
  auto none = DetectHostBudget(0, {dir.path() + "/a", dir.path() + "/b", dir.path() + "/c"});
  EXPECT_FALSE(none.ok());
}

TEST(HostBudget, ThisMachineHasOne) {
  auto b = DetectHostBudget(0);
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_GT(b->bytes, int64_t(64) << 20);
}

}  // namespace
}  // namespace pstar
