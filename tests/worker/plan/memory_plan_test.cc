#include "worker/plan/memory_plan.h"

#include <gtest/gtest.h>

#include "worker/model/gpt.h"

namespace pstar {
namespace {

Config Parse(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  auto c = ParseConfig(yaml, "test", overrides);
  EXPECT_TRUE(c.ok()) << c.status().message();
  return *c;
}

// The tier a rank gets is the plan's input: a GPU's share plans as the same
// runtime.device_memory written in the config would, and 0 holds every chunk.
TEST(MemoryPlan, TheDeviceTierIsAnInputNotARewrittenConfig) {
  const Config c = Parse("model: {preset: tiny}\ntrain: {batch_size: 2, seq_len: 32}\nruntime: {device: cuda}\n");
  ASSERT_EQ(c.runtime.device_memory, 0);
  auto roomy = PlanMemory(c, 1, 0);
  ASSERT_TRUE(roomy.ok()) << roomy.status().message();
  const int64_t tier = roomy->all_resident_device_bytes - 3 * roomy->chunk_bytes;
  auto share = PlanMemory(c, 1, tier);
  ASSERT_TRUE(share.ok()) << share.status().message();
  Config written = c;
  written.runtime.device_memory = tier;
  auto as_written = PlanMemory(written);
  ASSERT_TRUE(as_written.ok()) << as_written.status().message();
  EXPECT_EQ(share->device_bytes, as_written->device_bytes);
  EXPECT_EQ(share->device_slots, as_written->device_slots);
  EXPECT_EQ(share->device_adam_chunks, as_written->device_adam_chunks);
  EXPECT_EQ(share->gelu_outputs_kept, as_written->gelu_outputs_kept);
  EXPECT_EQ(share->runtime.device_capacity_bytes, tier);
  EXPECT_LT(share->device_bytes, roomy->device_bytes);
  EXPECT_EQ(GpuTierBytes(c, 1000), int64_t(1000 * c.mem_tracer.overall_gpu_mem_ratio));
}

TEST(MemoryPlan, CountsEveryKindAndTier) {
  Config c = Parse("model: {preset: tiny}\ntrain: {batch_size: 2, seq_len: 32}\n");
  auto p = PlanMemory(c);
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p->parameters, c.model.gpt.NumParameters());
  ASSERT_EQ(p->kinds.size(), 4u);
  for (const KindPlan& k : p->kinds) EXPECT_EQ(k.bytes, int64_t(p->num_chunks) * p->chunk_bytes);
  EXPECT_EQ(p->model_bytes, 4 * int64_t(p->num_chunks) * p->chunk_bytes);
  EXPECT_EQ(p->activation_bytes, Gpt::ActivationBytes(c.model.gpt, 2, 32, false));
  EXPECT_EQ(p->activation_format, "fp32");
  // A 16-bit run plans its activations in 16 bits.
  auto half = PlanMemory(Parse("model: {preset: tiny}\ntrain: {batch_size: 2, seq_len: 32, precision: bf16}\n"));
  ASSERT_TRUE(half.ok()) << half.status().message();
  EXPECT_EQ(half->activation_format, "bf16");
  EXPECT_EQ(half->activation_bytes,
            Gpt::ActivationBytes(c.model.gpt, 2, 32, false, {ComputeDevice::kCpu, Precision::kBf16}));
  EXPECT_LT(half->activation_bytes, p->activation_bytes);
  EXPECT_EQ(p->max_chunks_per_moment >= 2 && p->max_chunks_per_moment <= 4, true);
  EXPECT_EQ(p->min_device_bytes, p->activation_bytes + p->max_chunks_per_moment * p->chunk_bytes);
  EXPECT_EQ(p->all_resident_device_bytes, p->activation_bytes + p->model_bytes);
  EXPECT_EQ(p->device_bytes, p->all_resident_device_bytes);  // device_memory 0: all resident
  EXPECT_EQ(p->device_adam_chunks, p->num_chunks);  // sized for everything: all Adam on the device
  EXPECT_EQ(p->device_home_bytes, p->model_bytes / 2);  // every moment lives on the device
  EXPECT_EQ(p->host_chunk_bytes, p->model_bytes / 2);   // params and grads only
  c.runtime.device_memory = p->device_bytes - 2 * p->chunk_bytes;  // two slots short: the margin applies
  auto short_two = PlanMemory(c);
  ASSERT_TRUE(short_two.ok());
  const int64_t n = p->num_chunks;
  const int64_t spare = 4 * n - 2 - TierLayout::StreamingReserve(p->num_chunks, short_two->runtime);
  EXPECT_EQ(short_two->device_adam_chunks, std::min<int64_t>(int64_t(double(spare) * 0.8) / 2, n));
  EXPECT_EQ(short_two->device_home_bytes, 2 * short_two->device_adam_chunks * p->chunk_bytes);
  EXPECT_EQ(short_two->host_chunk_bytes, (4 * n - 2 * short_two->device_adam_chunks) * p->chunk_bytes);
  EXPECT_EQ(p->min_host_bytes,
            p->host_chunk_bytes + p->host_data_bytes + p->host_overhead_bytes + p->device_bytes);
}

// Room for no more than the chunks streaming needs (one moment's, and one
// more per moment of prefetch) and one slot: the moments stay on the host.
TEST(MemoryPlan, ABudgetWithinTheStreamingReserveKeepsAdamOnTheHost) {
  Config c = Parse("model: {preset: tiny}\ntrain: {batch_size: 2, seq_len: 32}\n");
  auto full = PlanMemory(c);
  ASSERT_TRUE(full.ok());
  const int64_t reserve = TierLayout::StreamingReserve(full->num_chunks, full->runtime);
  ASSERT_LT(reserve + 1, 2 * full->num_chunks) << "the reserve leaves params and grads streaming";
  c.runtime.device_memory = full->activation_bytes + (reserve + 1) * full->chunk_bytes;
  auto p = PlanMemory(c);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->device_bytes, c.runtime.device_memory);
  EXPECT_EQ(p->device_adam_chunks, 0);
  EXPECT_EQ(p->host_chunk_bytes, p->model_bytes);
  EXPECT_LT(p->device_slots, 2 * p->num_chunks);
  // Twice the reserve: the room beyond it homes some chunks' moments.
  c.runtime.device_memory = full->activation_bytes + 2 * reserve * full->chunk_bytes;
  auto more = PlanMemory(c);
  ASSERT_TRUE(more.ok());
  EXPECT_GT(more->device_adam_chunks, 0);
}

// Every layer's GELU output is kept for its backward where the configured
// device tier holds it beside every chunk; never with activation
// checkpointing, nor without a configured tier.
TEST(MemoryPlan, KeepsGeluOutputsWhereTheTierHoldsThemBesideEveryChunk) {
  Config c = Parse("model: {preset: tiny}\ntrain: {batch_size: 2, seq_len: 32}\n");
  auto unset = PlanMemory(c);
  ASSERT_TRUE(unset.ok());
  EXPECT_FALSE(unset->gelu_outputs_kept) << "runtime.device_memory 0: the smallest activations";
  const int64_t without = Gpt::ActivationBytes(c.model.gpt, 2, 32, false);
  const int64_t with = Gpt::ActivationBytes(c.model.gpt, 2, 32, false, {}, true);
  const GptConfig& g = c.model.gpt;
  // 4C fp32 per token for every layer, less the one output all layers share otherwise.
  EXPECT_EQ(with - without, (g.n_layer - 1) * 4 * (2 * 32) * g.n_embd * 4);
  // Exactly room for every chunk beside the kept outputs: kept.
  c.runtime.device_memory = unset->all_resident_device_bytes - without + with;
  auto room = PlanMemory(c);
  ASSERT_TRUE(room.ok());
  EXPECT_TRUE(room->gelu_outputs_kept);
  EXPECT_EQ(room->activation_bytes, with);
  EXPECT_EQ(room->all_resident_device_bytes, c.runtime.device_memory);
  EXPECT_EQ(room->device_adam_chunks, room->num_chunks) << "the kept outputs take no room from Adam";
  // One byte less: every chunk stays resident, the outputs are recomputed.
  c.runtime.device_memory -= 1;
  auto short_one = PlanMemory(c);
  ASSERT_TRUE(short_one.ok());
  EXPECT_FALSE(short_one->gelu_outputs_kept);
  EXPECT_EQ(short_one->activation_bytes, without);
  // Activation checkpointing recomputes whole blocks: nothing is kept.
  c.runtime.device_memory = int64_t(1) << 34;
  c.train.activation_checkpointing = true;
  auto checkpointed = PlanMemory(c);
  ASSERT_TRUE(checkpointed.ok());
  EXPECT_FALSE(checkpointed->gelu_outputs_kept);
  EXPECT_EQ(checkpointed->activation_bytes, Gpt::ActivationBytes(c.model.gpt, 2, 32, true));
}

TEST(MemoryPlan, LargePresetsPlanWithoutAllocating) {
  Config c = Parse("model: {preset: gpt3-175b}\ntrain: {batch_size: 1, seq_len: 2048, activation_checkpointing: true}\n");
  auto p = PlanMemory(c);
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_GT(p->parameters, int64_t(170e9));
  EXPECT_GT(p->model_bytes, 16 * int64_t(170e9));
  const std::string text = FormatPlan(*p);
  EXPECT_NE(text.find("device: minimum"), std::string::npos);
  EXPECT_NE(text.find("host: minimum"), std::string::npos);
}

}  // namespace
}  // namespace pstar
