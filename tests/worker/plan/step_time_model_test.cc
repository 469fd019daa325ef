// The step-time model of `pstar plan --scale`: its terms follow the plan and
// the rates given (compute per token, ring collectives' bytes and the
// network they cross, copies, host Adam), overlap never makes a step
// slower, more GPUs fit larger models, the measured rates cite rows that
// exist, and bad cluster flags are refused naming the flag.
#include "worker/plan/step_time_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "tests/test_util.h"
#include "worker/plan/memory_plan.h"
#include "worker/train/step_payload.h"

namespace pstar {
namespace {

Config Job(const std::vector<std::string>& more = {}) {
  std::vector<std::string> o = {"model.preset=gpt2-1.5b", "model.max_seq_len=2048", "train.seq_len=2048",
                                "train.batch_size=1", "runtime.device=cuda", "train.activation_checkpointing=true"};
  o.insert(o.end(), more.begin(), more.end());
  auto c = ParseConfig("", "test", o);
  EXPECT_TRUE(c.ok()) << c.status().message();
  return *c;
}

TEST(StepTimeModel, BadClusterFlagsAreRefusedNamingTheFlag) {
  auto bad = [](ClusterSpec s, const std::string& flag) {
    const Status st = ValidateClusterSpec(s);
    EXPECT_FALSE(st.ok()) << flag;
    EXPECT_NE(st.message().find(flag), std::string::npos) << st.message();
  };
  ClusterSpec s;
  s.inter_node_gbits_per_s = 0;
  bad(s, "--inter-bw");
  s = ClusterSpec{};
  s.intra_node_gbytes_per_s = -1;
  bad(s, "--intra-bw");
  s = ClusterSpec{};
  s.nodes = 131073;  // x 8 > 1,048,576
  bad(s, "--nodes x --gpus-per-node");
  s = ClusterSpec{};
  s.compute_tflops = -1;
  bad(s, "--tflops");
  EXPECT_TRUE(ValidateClusterSpec(ClusterSpec{}).ok());
}

// Small GPUs and hosts, so the largest models stay small and quick to plan.
ClusterSpec SmallCluster(int64_t nodes) {
  ClusterSpec spec;
  spec.nodes = nodes;
  spec.gpu_memory_bytes = int64_t(24) << 30;
  spec.host_memory_bytes = int64_t(24) << 30;
  return spec;
}

// The plan the model makes for `gpus` ranks of `spec`: the GPU's and the
// host's memory as the job's budgets.
Result<MemoryPlan> PlanOnCluster(const Config& c, const ClusterSpec& spec, int gpus) {
  Config r = c;
  r.runtime.device_memory = int64_t(double(spec.gpu_memory_bytes) * c.mem_tracer.overall_gpu_mem_ratio);
  r.runtime.host_memory = spec.host_memory_bytes;
  return PlanMemory(r, gpus);
}

TEST(StepTimeModel, TermsFollowThePlanAndTheRates) {
  ClusterSpec spec = SmallCluster(4);
  spec.compute_tflops = 100;
  const Config c = Job();
  auto one = PredictStep(c, spec, 1);
  auto eight = PredictStep(c, spec, 8);
  auto sixteen = PredictStep(c, spec, 16);
  ASSERT_TRUE(one.ok() && eight.ok() && sixteen.ok());
  // Compute: 8 N + 8 L C T FLOP per token (checkpointing), tokens per GPU.
  const double fpt = 8.0 * double(one->parameters) + 8.0 * 48 * 1600 * 2048;
  EXPECT_NEAR(one->compute_s, 2048 * fpt / 100e12, 1e-9);
  EXPECT_DOUBLE_EQ(eight->compute_s, one->compute_s) << "batch is per GPU";
  EXPECT_EQ(one->gather_bytes, 0.0);
  EXPECT_EQ(one->collective_s, 0.0);
  // Ring bytes per rank: (N-1)/N of the param chunks per gather pass, of the fp32 gradients once.
  auto plan8 = PlanOnCluster(c, spec, 8);
  ASSERT_TRUE(plan8.ok()) << plan8.status().message();
  const double elements = double(plan8->num_chunks) * double(plan8->chunk_elems);
  EXPECT_DOUBLE_EQ(eight->scatter_bytes, 7.0 / 8.0 * elements * 4.0);
  // Param chunks gathered: each once (all resident) or up to twice (the
  // spare slots keep some over the turn; PayloadIsTheSimulatedStepsAtEveryBudget).
  const double chunk_gather = 7.0 / 8.0 * double(plan8->chunk_elems) * 2.0;
  const double loads = eight->gather_bytes / chunk_gather;
  EXPECT_EQ(loads, std::round(loads));
  EXPECT_GE(loads, double(plan8->num_chunks));
  EXPECT_LE(loads, 2.0 * double(plan8->num_chunks));
  // Within a node NVLink, across nodes the network: 16 GPUs on 2 nodes are slower per byte.
  EXPECT_NEAR(eight->collective_s, (eight->gather_bytes + eight->scatter_bytes) / 370e9, 1e-12);
  EXPECT_EQ(sixteen->nodes, 2);
  EXPECT_NEAR(sixteen->collective_s, (sixteen->gather_bytes + sixteen->scatter_bytes) / (400e9 * 0.9 / 8), 1e-12);
  // Host Adam shards with the ranks.
  EXPECT_NEAR(sixteen->adam_s * 2, eight->adam_s, 1e-12);
  // The pipeline's ends: the gathers of the chunks the first block's first
  // GEMM reads (here one: the embeddings share it) and one chunk's
  // reduce-scatter, with their ring latencies; none on one GPU.
  EXPECT_EQ(one->pipeline_ends_s, 0.0);
  ASSERT_EQ(plan8->chunks_before_first_block, 1);
  EXPECT_NEAR(eight->pipeline_ends_s,
              (chunk_gather + eight->scatter_bytes / double(plan8->num_chunks)) / 370e9 + 2 * 7 * 3e-6, 1e-12);
  // Chunks of the token embedding's size: it fills the first, and the first
  // block's attention weight lies in the second, so both gathers are waited for.
  const Config split = Job({"default_chunk_size=80486400"});
  auto split8 = PredictStep(split, spec, 8);
  ASSERT_TRUE(split8.ok()) << split8.status().message();
  auto plan_split = PlanOnCluster(split, spec, 8);
  ASSERT_TRUE(plan_split.ok()) << plan_split.status().message();
  ASSERT_EQ(plan_split->chunks_before_first_block, 2);
  EXPECT_NEAR(
      split8->pipeline_ends_s,
      (2 * 7.0 / 8.0 * double(plan_split->chunk_elems) * 2.0 + split8->scatter_bytes / double(plan_split->num_chunks)) /
              370e9 +
          3 * 7 * 3e-6,
      1e-12);
  // The turn from forward to backward, where the link idles: the last
  // chunk's forward and backward and the classifier's, a share of the
  // compute; none on one GPU or with every chunk resident.
  EXPECT_EQ(one->turn_s, 0.0);
  const bool resident8 = plan8->device_bytes >= plan8->all_resident_device_bytes;
  const double classifier = 8.0 * 50257 * 1600 / fpt;
  EXPECT_NEAR(eight->turn_s,
              resident8 ? 0.0 : eight->compute_s * (classifier + (1 - classifier) / double(plan8->num_chunks)), 1e-12);
  ClusterSpec tight = spec;  // chunks stream: the turn is there
  tight.gpu_memory_bytes = int64_t(4) << 30;
  auto streamed = PredictStep(c, tight, 8);
  ASSERT_TRUE(streamed.ok()) << streamed.status().message();
  auto plan_tight = PlanOnCluster(c, tight, 8);
  ASSERT_TRUE(plan_tight.ok()) << plan_tight.status().message();
  ASSERT_LT(plan_tight->device_bytes, plan_tight->all_resident_device_bytes);
  EXPECT_NEAR(streamed->turn_s, streamed->compute_s * (classifier + (1 - classifier) / double(plan_tight->num_chunks)),
              1e-12);
  EXPECT_GT(streamed->turn_s, 0.0);
  for (const auto& p : {*one, *eight, *sixteen}) {
    EXPECT_LE(p.step_overlap_s, p.step_sync_s + 1e-12) << p.gpus;
    EXPECT_GE(p.step_overlap_s, p.compute_s) << p.gpus;
    const double comm = p.collective_s + p.collective_latency_s;
    const double beside = std::max(p.pcie_s, p.adam_s + p.disk_s);
    // Compute and the pipeline's ends, or the link's work and its idle time
    // (the turn, or the ends with every chunk resident).
    const double idle = p.turn_s > 0 ? p.turn_s : p.pipeline_ends_s;
    EXPECT_NEAR(
        p.step_overlap_s,
        std::min(p.step_sync_s, std::max({p.compute_s + p.pipeline_ends_s, comm + idle, beside + p.pipeline_ends_s})),
        1e-12)
        << p.gpus;
    EXPECT_NEAR(p.exposed_collective_s, std::max(0.0, p.step_overlap_s - std::max(p.compute_s, beside)), 1e-12)
        << p.gpus;
  }
  EXPECT_GT(sixteen->tokens_per_s, eight->tokens_per_s);
}

// The collectives' bytes against what the runtime sends (`pstar plan
// --payload`'s simulation of the job's own chunk traffic), at budgets from
// the smallest to all resident, at 2 and 3 ranks. The model counts the param
// chunks the slots keep over the turn from forward to backward as every slot
// but the gradient chunks the turn pins, and one reduce-scatter per gradient
// chunk. The runtime may keep more where most ops pin fewer chunks than the
// most (the model then counts more gathers, never more than ZeRO-3's two a
// chunk), and in the smallest budgets gathers the classifier's chunk again:
// within one chunk of the model's count either way.
Config PayloadJob(const std::string& model, const std::string& train, const std::string& chunk, int depth) {
  auto c =
      ParseConfig("", "test",
                  {model, train, "default_chunk_size=" + chunk, "data={source: generated, generated_tokens: 262144}",
                   "runtime.prefetch_depth=" + std::to_string(depth), "client.mem_tracer.overall_gpu_mem_ratio=1.0"});
  EXPECT_TRUE(c.ok()) << c.status().message();
  return *c;
}

struct PayloadPair {
  double predicted_gather = 0, predicted_scatter = 0;
  double simulated_gather = 0, simulated_scatter = 0;
  double chunk_gather = 0, chunk_scatter = 0;  // one chunk's, per rank
  int32_t chunks = 0;
};

PayloadPair Payloads(Config c, int world, int extra) {
  auto base = PlanMemory(c, world);
  EXPECT_TRUE(base.ok()) << base.status().message();
  c.runtime.device_memory = base->min_device_bytes + extra * base->chunk_bytes;
  ClusterSpec spec;
  spec.nodes = world;
  spec.gpus_per_node = 1;
  spec.gpu_memory_bytes = c.runtime.device_memory;
  auto predicted = PredictStep(c, spec, world);
  auto simulated = SimulateStepPayload(c, world);
  EXPECT_TRUE(predicted.ok()) << predicted.status().message();
  EXPECT_TRUE(simulated.ok()) << simulated.status().message();
  PayloadPair p;
  if (!predicted.ok() || !simulated.ok()) return p;
  p.predicted_gather = predicted->gather_bytes;
  p.predicted_scatter = predicted->scatter_bytes;
  p.simulated_gather = double(simulated->all_gather_bytes);
  p.simulated_scatter = double(simulated->reduce_scatter_bytes);
  p.chunk_gather = double(world - 1) / world * double(base->chunk_bytes);
  p.chunk_scatter = p.chunk_gather;
  p.chunks = base->num_chunks;
  return p;
}

TEST(StepTimeModel, PayloadStaysBetweenTheSimulatedStepsAndZero3s) {
  for (int world : {2, 3}) {
    for (int depth : {2, 16}) {
      const Config c = PayloadJob("model={n_layer: 3, n_head: 2, n_embd: 64, vocab_size: 256, max_seq_len: 32}",
                                  "train={batch_size: 2, seq_len: 32}", "16384", depth);
      for (int extra = 0; extra <= 18; extra += 3) {
        const PayloadPair p = Payloads(c, world, extra);
        const std::string at = "world " + std::to_string(world) + ", depth " + std::to_string(depth) + ", " +
                               std::to_string(extra) + " chunks above the smallest budget";
        EXPECT_GE(p.predicted_gather, p.simulated_gather - p.chunk_gather - 0.5) << at;
        EXPECT_LE(p.predicted_gather, 2.0 * p.chunks * p.chunk_gather + 0.5) << at;
        EXPECT_NEAR(p.predicted_scatter, p.simulated_scatter, p.chunk_scatter + 0.5) << at;
      }
    }
  }
}

TEST(StepTimeModel, PayloadIsWithinAChunkOfTheSimulatedSteps) {
  for (int world : {2, 3}) {
    const Config c = PayloadJob("model={n_layer: 4, n_head: 4, n_embd: 256, vocab_size: 2048, max_seq_len: 128}",
                                "train={batch_size: 5, seq_len: 128}", "1048576", 16);
    for (int extra : {0, 2, 5}) {
      const PayloadPair p = Payloads(c, world, extra);
      const std::string at = "world " + std::to_string(world) + ", " + std::to_string(extra) + " chunks above";
      EXPECT_NEAR(p.predicted_gather, p.simulated_gather, p.chunk_gather + 0.5) << at;
      EXPECT_NEAR(p.predicted_scatter, p.simulated_scatter, p.chunk_scatter + 0.5) << at;
    }
  }
}

TEST(StepTimeModel, MoreGpusFitLargerModelsAndTheTableSaysWhere) {
  ClusterSpec spec = SmallCluster(2);
  auto rows = PredictScaling(Job(), spec);
  ASSERT_TRUE(rows.ok()) << rows.status().message();
  ASSERT_EQ(rows->size(), 5u);  // 1, 2, 4, 8, 16
  EXPECT_EQ(rows->back().gpus, 16);
  for (size_t i = 1; i < rows->size(); ++i) {
    EXPECT_GE((*rows)[i].largest_layers, (*rows)[i - 1].largest_layers);
  }
  EXPECT_GT(rows->back().largest_parameters, rows->front().largest_parameters);
  const std::string text = FormatScaling(Job(), spec, *rows);
  EXPECT_NE(text.find("rate: compute_tflops 320.8 TFLOP/s (measured: bench/RESULTS.md"), std::string::npos) << text;
  EXPECT_NE(text.find("    16     2 "), std::string::npos) << text;
  // A cluster not a power of two ends on its own size.
  spec.nodes = 3;
  auto odd = PredictScaling(Job(), spec);
  ASSERT_TRUE(odd.ok());
  EXPECT_EQ(odd->back().gpus, 24);
}

TEST(StepTimeModel, TheMeasuredRatesCiteSectionsOfTheResults) {
  std::ifstream f(test::SourceDir() + "/bench/RESULTS.md");
  std::stringstream results;
  results << f.rdbuf();
  for (const MeasuredRate& r : MeasuredRates()) {
    const std::string source = r.source;
    ASSERT_EQ(source.rfind("bench/RESULTS.md, ", 0), 0u) << source;
    const std::string section = source.substr(18, source.find(':') - 18);
    EXPECT_NE(results.str().find("## " + section), std::string::npos) << section;
    EXPECT_GT(r.value, 0.0);
  }
}

}  // namespace
}  // namespace pstar
