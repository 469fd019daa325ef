#include "worker/plan/plan_verdict.h"

#include <gtest/gtest.h>

#include "worker/core/bytes.h"

namespace pstar {
namespace {

Config Parse(const std::vector<std::string>& overrides) {
  auto c = ParseConfig("model: {preset: tiny}\ntrain: {batch_size: 2, seq_len: 32}\n", "test", overrides);
  EXPECT_TRUE(c.ok()) << c.status().message();
  return *c;
}

MemoryPlan Plan(const Config& c, int world_size = 1) {
  auto p = PlanMemory(c, world_size);
  EXPECT_TRUE(p.ok()) << p.status().message();
  return *p;
}

bool Mentions(const std::vector<std::string>& lines, const std::string& text) {
  for (const std::string& l : lines) {
    if (l.find(text) != std::string::npos) return true;
  }
  return false;
}

TEST(PlanVerdict, FitsExactlyAtTheMinimumsAndNotAByteBelow) {
  Config c = Parse({});
  const MemoryPlan probe = Plan(c);
  c.runtime.device_memory = probe.min_device_bytes;
  const MemoryPlan p = Plan(c);
  auto v = JudgePlan(c, 1, p, {p.min_host_bytes, "config"}, c.runtime.device_memory);
  EXPECT_TRUE(v.fits());
  EXPECT_TRUE(v.changes.empty());
  ASSERT_EQ(v.checked.size(), 2u);
  EXPECT_EQ(v.checked[0].tier, "device");
  EXPECT_EQ(v.checked[0].need, p.min_device_bytes);
  EXPECT_EQ(v.checked[1].tier, "host");
  EXPECT_NE(FormatVerdict(v).find("verdict: fits: device needs "), std::string::npos) << FormatVerdict(v);

  auto short_host = JudgePlan(c, 1, p, {p.min_host_bytes - 1, "config"}, c.runtime.device_memory);
  EXPECT_FALSE(short_host.fits());
  EXPECT_TRUE(Mentions(short_host.changes, "runtime.host_memory: at least " + FormatBytes(p.min_host_bytes)));
  const std::string text = FormatVerdict(short_host);
  EXPECT_NE(text.find("verdict: does not fit: "), std::string::npos) << text;
  EXPECT_NE(text.find("short by 1 B"), std::string::npos) << text;
  EXPECT_NE(text.find("\n  change: runtime.host_memory"), std::string::npos) << text;

  c.runtime.device_memory = probe.min_device_bytes - 1;
  const MemoryPlan tight = Plan(c);
  auto short_device = JudgePlan(c, 1, tight, {int64_t(1) << 40, "config"}, c.runtime.device_memory);
  EXPECT_FALSE(short_device.fits());
  EXPECT_FALSE(short_device.checked[0].fits());
  EXPECT_TRUE(short_device.checked[1].fits());
  EXPECT_TRUE(Mentions(short_device.changes, "runtime.device_memory: at least " + FormatBytes(tight.min_device_bytes)));
  EXPECT_TRUE(Mentions(short_device.changes, "train.activation_checkpointing: true"));
}

TEST(PlanVerdict, AShortHostIsToldWhatTheDiskTierAndMoreRanksWouldNeed) {
  // bf16 with 16-bit gradients at the device minimum: the moments and fp32
  // masters are homed on the host, where the disk tier can take them.
  Config c = Parse({"train.precision=bf16", "train.grad_precision=16bit"});
  c.runtime.device_memory = Plan(c).min_device_bytes;
  const MemoryPlan p = Plan(c);
  Config disk = c;
  disk.runtime.nvme_path = "/nvme";
  disk.runtime.nvme_spill = DiskSpill::kAll;
  const MemoryPlan on_disk = Plan(disk);
  ASSERT_LT(on_disk.min_host_bytes, p.min_host_bytes);
  // A budget the disk tier's plan fits and the plain one does not.
  const int64_t have = on_disk.min_host_bytes;
  auto v = JudgePlan(c, 1, p, {have, "config"}, c.runtime.device_memory);
  EXPECT_FALSE(v.fits());
  EXPECT_TRUE(Mentions(v.changes, "the disk tier (runtime.nvme_path"));
  EXPECT_TRUE(Mentions(v.changes, "the host then needs " + FormatBytes(on_disk.min_host_bytes) + ", which fits"));
  // The world size it names is the smallest power of two whose plan fits.
  int fitting = 0;
  for (int n = 2; n <= 65536 && fitting == 0; n *= 2) {
    if (Plan(c, n).min_host_bytes <= have) fitting = n;
  }
  ASSERT_GT(fitting, 0);
  EXPECT_TRUE(Mentions(v.changes, "more ranks: at " + std::to_string(fitting) + " ranks, one per host, each needs " +
                                       FormatBytes(Plan(c, fitting).min_host_bytes)));
  // A detected budget asks for the host memory whose share would do.
  auto detected = JudgePlan(c, 1, p, {have, "physical RAM x overall_cpu_mem_ratio 0.8"}, c.runtime.device_memory);
  EXPECT_TRUE(Mentions(detected.changes, "a host (or pod memory limit) of at least "));
  EXPECT_FALSE(Mentions(detected.changes, "runtime.host_memory"));
  // A budget nothing closes names only the host memory to give.
  auto hopeless = JudgePlan(c, 1, p, {1, "config"}, c.runtime.device_memory);
  EXPECT_TRUE(Mentions(hopeless.changes, "runtime.host_memory"));
  EXPECT_TRUE(Mentions(hopeless.changes, "still short by"));
  EXPECT_FALSE(Mentions(hopeless.changes, "more ranks"));
}

TEST(PlanVerdict, ACudaJobWithoutAGpuHereLeavesTheDeviceUnchecked) {
  const Config c = Parse({"runtime.device=cuda"});
  const MemoryPlan p = Plan(c);
  auto unseen = JudgePlan(c, 1, p, {int64_t(1) << 40, "config"}, 0);
  EXPECT_TRUE(unseen.fits());
  ASSERT_EQ(unseen.checked.size(), 1u);  // the host only
  ASSERT_EQ(unseen.unchecked.size(), 1u);
  EXPECT_NE(unseen.unchecked[0].find("no GPU seen here"), std::string::npos) << unseen.unchecked[0];
  EXPECT_NE(FormatVerdict(unseen).find("\n  unchecked: device: no GPU seen here"), std::string::npos);
  // A GPU whose share is below the minimum does not fit.
  auto small_gpu = JudgePlan(c, 1, p, {int64_t(1) << 40, "config"}, p.min_device_bytes - 1);
  EXPECT_FALSE(small_gpu.fits());
  EXPECT_NE(small_gpu.checked[0].source.find("of the GPU's memory"), std::string::npos);
  EXPECT_TRUE(Mentions(small_gpu.changes, "on a GPU with that much free"));
}

TEST(PlanVerdict, ADetectedHostBudgetKeepsItsRatioAndIsSplitAmongLocalRanks) {
  const HostBudget configured = RankHostBudget({1000, "config"}, 0.5, 4);
  EXPECT_EQ(configured.bytes, 1000);
  EXPECT_EQ(configured.source, "config");
  const HostBudget detected = RankHostBudget({1000, "physical RAM"}, 0.8, 1);
  EXPECT_EQ(detected.bytes, 800);
  EXPECT_EQ(detected.source, "physical RAM x overall_cpu_mem_ratio 0.8");
  const HostBudget shared = RankHostBudget({1000, "physical RAM"}, 0.8, 3);
  EXPECT_EQ(shared.bytes, 266);
  EXPECT_EQ(shared.source, "physical RAM x overall_cpu_mem_ratio 0.8 / 3 local ranks");
}

}  // namespace
}  // namespace pstar
