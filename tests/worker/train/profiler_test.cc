// The profiler: a training run with profiling counts every op family as
// often as the model runs it, the op shares add up to the measured op time,
// chunk copies and collectives match the runtime's and the communicator's own
// counters, the summary prints one aligned line per entry, and profiling
// changes no result. The GPU case is skipped (with the reason) without a GPU.
#include "worker/train/profiler.h"

#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cstring>
#include <map>
#include <sstream>
#include <thread>

#include "tests/test_util.h"
#include "tests/worker/tiny_gpt_job.h"
#include "worker/dist/gloo_communicator.h"
#include "worker/dist/store.h"
#include "worker/train/trainer.h"
#ifdef PSTAR_WITH_CUDA
#include "kernels/cuda/tuning.h"
#include "worker/runtime/cuda_backend.h"
#endif

namespace pstar {
namespace {

std::string Set(const std::string& key, int64_t v) { return key + "=" + std::to_string(v); }

// Whether this run's GELU backward runs in the fc_proj input-gradient GEMM's
// epilogue (a 16-bit run on a GPU whose tuning table says so), which leaves
// no gelu.bwd row: its time is the GEMM's.
bool GeluBackwardFolded(const Config& c) {
#ifdef PSTAR_WITH_CUDA
  return c.runtime.device == ComputeDevice::kCuda && c.train.precision != Precision::kFp32 &&
         kernels::cuda::TuningFor(CudaDeviceName(0), CudaComputeCapability(0)).gelu_backward_epilogue == 1;
#else
  (void)c;
  return false;
#endif
}

// How often one step runs each profile row, from the model's structure
// (Gpt's Forward and Backward without recomputation, fp32: no casts): per
// micro-batch, each layer has 4 linear layers (a forward, an input-gradient
// and a weight-gradient GEMM each, and a bias gradient), 2 LayerNorms,
// attention and GELU each way, one residual add forward (the other is fused
// into ln_2, counted as a LayerNorm; no residual backward: the gradient passes
// through), plus a GELU forward recomputed in backward by every layer but the
// last unless the plan keeps every layer's GELU output (`gelu_kept`), and the
// model adds the encoder, the final LayerNorm and the
// classifier: with the whole micro-batch's logits kept, one forward GEMM, one
// cross-entropy (loss and dlogits) and the two gradient GEMMs (no bias); in
// row blocks, per block forward its GEMM and the loss, backward the GEMM
// again, the dlogits and the two gradient GEMMs. The gradient norm and the
// optimizer run once per step. GELU's backward has no row of its own where
// GeluBackwardFolded.
std::map<ProfileOp, int64_t> CallsPerStep(const Config& c, bool gelu_kept) {
  const int64_t L = c.model.gpt.n_layer, accum = c.train.grad_accum_steps;
  const int64_t tokens = c.train.batch_size * c.train.seq_len, rows = ClassifierRows(c.model.gpt, tokens);
  const int64_t blocks = (tokens + rows - 1) / rows;
  const int64_t passes = rows >= tokens ? 1 : 2 * blocks;  // classifier forward GEMMs and cross-entropies
  std::map<ProfileOp, int64_t> m = {{ProfileOp::kUpload, 2},
                                    {ProfileOp::kEncoderForward, 1},
                                    {ProfileOp::kEncoderBackward, 1},
                                    {ProfileOp::kLayerNormForward, 2 * L + 1},
                                    {ProfileOp::kLayerNormBackward, 2 * L + 1},
                                    {ProfileOp::kAttentionForward, L},
                                    {ProfileOp::kAttentionBackward, L},
                                    {ProfileOp::kResidual, L},
                                    {ProfileOp::kGeluForward, gelu_kept ? L : 2 * L - 1},
                                    {ProfileOp::kGeluBackward, L},
                                    {ProfileOp::kBiasGrad, 4 * L},
                                    {ProfileOp::kCrossEntropy, passes},
                                    {ProfileOp::kLossSum, 1},
                                    {ProfileOp::kZero, 1}};
  for (LinearRole role : {LinearRole::kQkv, LinearRole::kAttnProj, LinearRole::kFc, LinearRole::kFcProj}) {
    for (GemmPass pass : {GemmPass::kForward, GemmPass::kInputGrad, GemmPass::kWeightGrad}) m[GemmOp(role, pass)] = L;
  }
  m[GemmOp(LinearRole::kClassifier, GemmPass::kForward)] = passes;
  m[GemmOp(LinearRole::kClassifier, GemmPass::kInputGrad)] = blocks;
  m[GemmOp(LinearRole::kClassifier, GemmPass::kWeightGrad)] = blocks;
  if (GeluBackwardFolded(c)) m.erase(ProfileOp::kGeluBackward);
  for (auto& [op, n] : m) n *= accum;
  m[ProfileOp::kGradNorm] = 1;
  m[ProfileOp::kAdam] = 1;
  return m;
}

struct RunResult {
  std::vector<float> losses, norms;
  std::vector<std::vector<float>> params, exp_avg;
  ProfileSummary profile;
  bool profiled = false;
  bool gelu_kept = false;  // the plan kept every layer's GELU output
  // Chunk copies after the first step, from the runtime's counters.
  int64_t moves[kNumDirections] = {0, 0}, moved_bytes[kNumDirections] = {0, 0};
};

RunResult Train(const Config& config, const TokenSource& data, bool profile, int64_t warmup = 1) {
  auto t = Trainer::Create(config, data);
  EXPECT_TRUE(t.ok()) << t.status().message();
  if (!t.ok()) return {};
  EXPECT_EQ((*t)->profiler(), nullptr) << "profiling is off unless enabled";
  if (profile) (*t)->EnableProfiling(warmup);
  RunResult r;
  r.gelu_kept = (*t)->plan().gelu_outputs_kept;
  const RuntimeCounters& rc = (*t)->store().chunks().counters();
  for (int64_t s = 0; s < config.train.steps; ++s) {
    auto st = (*t)->Step();
    EXPECT_TRUE(st.ok()) << st.status().message();
    if (!st.ok()) return {};
    r.losses.push_back(st->loss);
    r.norms.push_back(float(st->grad_norm));
    if (s + 1 == warmup) {
      for (int d = 0; d < kNumDirections; ++d) {
        r.moves[d] = -rc.moves[size_t(d)].load();
        r.moved_bytes[d] = -rc.moved_bytes[size_t(d)].load();
      }
    }
  }
  for (int d = 0; d < kNumDirections; ++d) {
    r.moves[d] += rc.moves[size_t(d)].load();
    r.moved_bytes[d] += rc.moved_bytes[size_t(d)].load();
  }
  if ((*t)->profiler() != nullptr) {
    r.profile = (*t)->profiler()->Summary();
    r.profiled = true;
  }
  r.params = test::TensorCopies((*t)->store(), StateKind::kParam);
  r.exp_avg = test::TensorCopies((*t)->store(), StateKind::kExpAvg);
  return r;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void ExpectSameResults(const RunResult& a, const RunResult& b, const std::string& what) {
  EXPECT_TRUE(SameBits(a.losses, b.losses)) << what;
  EXPECT_TRUE(SameBits(a.norms, b.norms)) << what;
  ASSERT_EQ(a.params.size(), b.params.size()) << what;
  for (size_t i = 0; i < a.params.size(); ++i) {
    EXPECT_TRUE(SameBits(a.params[i], b.params[i])) << what << ": tensor " << i;
    EXPECT_TRUE(SameBits(a.exp_avg[i], b.exp_avg[i])) << what << ": exp_avg of tensor " << i;
  }
}

// Every profile row with the model's call counts; the op entries add up to
// the op time, which with the idle row makes the step time; most time first.
void ExpectCompleteOpProfile(const Config& c, const ProfileSummary& p, int64_t steps, bool gelu_kept) {
  EXPECT_EQ(p.steps, steps);
  for (const auto& [op, per_step] : CallsPerStep(c, gelu_kept)) {
    const ProfileEntry* e = p.Find(ProfileKind::kOp, ProfileOpName(op));
    ASSERT_NE(e, nullptr) << ProfileOpName(op);
    EXPECT_EQ(e->count, per_step * steps) << ProfileOpName(op);
    EXPECT_GE(e->seconds, 0.0) << ProfileOpName(op);
  }
  double seconds = 0, shares = 0;
  int ops = 0;
  for (const ProfileEntry& e : p.entries) {
    if (e.kind != ProfileKind::kOp || e.name == "idle") continue;
    // Casts (16-bit runs: the parameters' rounded copies) vary in number
    // with the chunk layout; every other op is the model's.
    if (e.name != "cast") ++ops;
    seconds += e.seconds;
    shares += e.share;
    EXPECT_NEAR(e.share, 100.0 * e.seconds / p.step_seconds, 1e-9) << e.name;
  }
  EXPECT_EQ(ops, int(CallsPerStep(c, gelu_kept).size()));
  if (c.train.precision == Precision::kFp32) {
    EXPECT_EQ(p.Find(ProfileKind::kOp, "cast"), nullptr) << "fp32: nothing rounds";
  }
  EXPECT_NEAR(seconds, p.op_seconds, 1e-12);
  EXPECT_GT(p.op_seconds, 0.0);
  EXPECT_LE(p.op_seconds, p.step_seconds);
  // The shares are of the step time: together they are the op time's share.
  EXPECT_NEAR(shares, 100.0 * p.op_seconds / p.step_seconds, 1e-9);
  // The idle row is what the ops left of the steps: with it the table sums
  // to the step time (one clock on the CPU backend: exactly; on a GPU the
  // events and the host clock may disagree by their resolution).
  const ProfileEntry* idle = p.Find(ProfileKind::kOp, "idle");
  ASSERT_NE(idle, nullptr);
  EXPECT_EQ(idle->count, steps);
  EXPECT_EQ(idle->seconds, p.idle_seconds);
  EXPECT_GE(p.idle_seconds, 0.0);
  const bool one_clock = std::string(p.clock) == "the host clock";
  EXPECT_NEAR(p.op_seconds + p.idle_seconds, p.step_seconds,
              one_clock ? 1e-9 * double(steps) + 1e-6 * p.step_seconds : 1e-4 * double(steps) + 0.02 * p.step_seconds);
  EXPECT_GT(p.Find(ProfileKind::kOp, "gemm.fc.fwd")->seconds, 0.0) << "the largest GEMM took no time";
  for (size_t i = 1; i < p.entries.size(); ++i) {
    EXPECT_GE(p.entries[i - 1].seconds, p.entries[i].seconds) << "entries by time, most first";
  }
}

// A model whose ops are big enough to dominate the step on the CPU.
const std::vector<std::string> kMidSize = {"model.n_embd=64", "model.n_head=4", "model.max_seq_len=32",
                                           "model.vocab_size=256", "train.seq_len=32", "train.batch_size=4"};

TEST(Profiler, CountsEveryOpRowAndTheSharesAddUpOnTheCpu) {
  // A vocabulary of 256 keeps the classifier's logits whole, one of 48 makes
  // it run over row blocks (ClassifierRows).
  for (int64_t vocab : {256, 48}) {
    auto data = test::RandomTokens(20000, vocab, 31);
    for (int64_t accum : {1, 2}) {
      auto overrides = kMidSize;
      overrides.push_back("train.steps=4");
      overrides.push_back(Set("train.grad_accum_steps", accum));
      overrides.push_back(Set("model.vocab_size", vocab));
      const Config c = test::TinyGptConfig(overrides);
      const RunResult r = Train(c, data, /*profile=*/true);
      ASSERT_TRUE(r.profiled);
      SCOPED_TRACE("vocab " + std::to_string(vocab) + ", grad_accum_steps " + std::to_string(accum) + "\n" +
                   FormatProfile(r.profile));
      const int64_t tokens = c.train.batch_size * c.train.seq_len;
      EXPECT_EQ(ClassifierRows(c.model.gpt, tokens) < tokens, vocab == 48);
      EXPECT_EQ(r.profile.skipped_steps, 1);
      ExpectCompleteOpProfile(c, r.profile, 3, r.gelu_kept);
      // On the CPU backend a step is its ops plus bookkeeping: the ops, timed
      // one by one, must account for most of it.
      EXPECT_GT(r.profile.op_seconds, 0.5 * r.profile.step_seconds);
      EXPECT_EQ(r.profile.Find(ProfileKind::kCollective, "all_reduce"), nullptr) << "one rank: no collectives";
      ASSERT_NE(r.profile.Find(ProfileKind::kMove, "h2d"), nullptr);
      ASSERT_NE(r.profile.Find(ProfileKind::kMove, "d2h"), nullptr);
    }
  }
}

// Device bytes for the activations and the fewest chunks an op needs: chunks
// move all the time.
int64_t MinimumBudget(const Config& c) {
  auto plan = PlanMemory(c);
  EXPECT_TRUE(plan.ok());
  return plan.ok() ? plan->min_device_bytes : 0;
}

TEST(Profiler, ChangesNoResult) {
  auto data = test::RandomTokens(3000, 40, 32);
  for (bool tight : {false, true}) {
    std::vector<std::string> overrides = {"default_chunk_size=1024", "train.steps=3"};
    if (tight) overrides.push_back(Set("runtime.device_memory", MinimumBudget(test::TinyGptConfig(overrides))));
    const Config c = test::TinyGptConfig(overrides);
    const RunResult plain = Train(c, data, false);
    const RunResult profiled = Train(c, data, true);
    EXPECT_FALSE(plain.profiled);
    EXPECT_TRUE(profiled.profiled);
    ExpectSameResults(plain, profiled, tight ? "at the minimum budget" : "all resident");
  }
}

// A device budget with room for every chunk and every layer's GELU output
// keeps those (the plan says so): backward reads them instead of running
// GELU again, with the same results as when it recomputes them.
TEST(Profiler, KeptGeluOutputsSkipTheRecomputeAndChangeNoResult) {
  auto data = test::RandomTokens(20000, 256, 36);
  for (const char* precision : {"fp32", "bf16"}) {
    SCOPED_TRACE(precision);
    auto overrides = kMidSize;
    overrides.insert(overrides.end(), {"train.steps=4", std::string("train.precision=") + precision});
    const Config recomputed = test::TinyGptConfig(overrides);
    overrides.push_back("runtime.device_memory=1073741824");
    const Config kept = test::TinyGptConfig(overrides);
    const RunResult a = Train(recomputed, data, true), b = Train(kept, data, true);
    EXPECT_FALSE(a.gelu_kept) << "no device budget: nothing kept beyond the plan's minimum";
    EXPECT_TRUE(b.gelu_kept);
    ExpectSameResults(a, b, "GELU outputs kept");
    ExpectCompleteOpProfile(recomputed, a.profile, 3, a.gelu_kept);
    ExpectCompleteOpProfile(kept, b.profile, 3, b.gelu_kept);
    const int64_t L = kept.model.gpt.n_layer;
    EXPECT_EQ(b.profile.Find(ProfileKind::kOp, "gelu.fwd")->count, 3 * L);
    EXPECT_EQ(a.profile.Find(ProfileKind::kOp, "gelu.fwd")->count, 3 * (2 * L - 1));
  }
}

TEST(Profiler, TimesChunkCopiesAsTheRuntimeCountsThem) {
  auto data = test::RandomTokens(3000, 40, 33);
  std::vector<std::string> overrides = {"default_chunk_size=1024", "train.steps=4", "runtime.prefetch_depth=2"};
  overrides.push_back(Set("runtime.device_memory", MinimumBudget(test::TinyGptConfig(overrides))));
  const Config c = test::TinyGptConfig(overrides);
  const RunResult r = Train(c, data, true);
  SCOPED_TRACE(FormatProfile(r.profile));
  for (int d = 0; d < kNumDirections; ++d) {
    const ProfileEntry* e = r.profile.Find(ProfileKind::kMove, DirectionName(Direction(d)));
    ASSERT_NE(e, nullptr) << DirectionName(Direction(d));
    EXPECT_GT(r.moves[d], 0) << "the budget makes chunks move: " << DirectionName(Direction(d));
    EXPECT_EQ(e->count, r.moves[d]) << DirectionName(Direction(d));
    EXPECT_EQ(e->bytes, r.moved_bytes[d]) << DirectionName(Direction(d));
    EXPECT_GT(e->seconds, 0.0) << DirectionName(Direction(d));
    EXPECT_NEAR(e->GigabytesPerSecond(), double(e->bytes) / e->seconds * 1e-9, 1e-9);
  }
  ExpectCompleteOpProfile(c, r.profile, 3, r.gelu_kept);
}

// A world of two whose collectives take a known time and count as the real
// communicators do.
class CountingCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 2; }
  Status AllGather(const float*, float*, int64_t n) override { return Count(CollectiveOp::kAllGather, n * 4); }
  Status ReduceScatter(const float*, float*, int64_t n) override {
    return Count(CollectiveOp::kReduceScatter, n * 4);
  }
  Status AllReduceSum(double*, int64_t n) override { return Count(CollectiveOp::kAllReduce, n * 8); }
  Status Broadcast(void*, int64_t bytes, int) override { return Count(CollectiveOp::kBroadcast, bytes); }
  Status Barrier() override { return Count(CollectiveOp::kBarrier, 1); }

 private:
  Status Count(CollectiveOp op, int64_t bytes) {
    const auto start = std::chrono::steady_clock::now();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    ++counters_.calls[size_t(op)];
    counters_.bytes[size_t(op)] += bytes;
    counters_.nanoseconds[size_t(op)] +=
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
    return Status();
  }
};

TEST(Profiler, TakesCollectivesFromTheCommunicatorWithinSteps) {
  auto backend = MakeCpuBackend();
  CountingCommunicator comm;
  Profiler profiler(*backend, &comm, /*skip_steps=*/1);
  double x[4] = {};
  float f[8] = {};
  // The warm-up step and anything between steps are left out.
  profiler.BeginStep();
  ASSERT_TRUE(comm.AllReduceSum(x, 4).ok());
  profiler.EndStep();
  ASSERT_TRUE(comm.Barrier().ok());
  for (int step = 0; step < 2; ++step) {
    profiler.BeginStep();
    ASSERT_TRUE(comm.AllGather(f, f, 8).ok());
    ASSERT_TRUE(comm.AllGather(f, f, 8).ok());
    ASSERT_TRUE(comm.ReduceScatter(f, f, 8).ok());
    ASSERT_TRUE(comm.AllReduceSum(x, 1).ok());
    profiler.EndStep();
  }
  ASSERT_TRUE(comm.Broadcast(x, 16, 0).ok());
  const ProfileSummary p = profiler.Summary();
  SCOPED_TRACE(FormatProfile(p));
  EXPECT_EQ(p.steps, 2);
  EXPECT_EQ(p.skipped_steps, 1);
  struct Want {
    const char* name;
    int64_t count, bytes;
  };
  for (const Want& w : {Want{"all_gather", 4, 4 * 32}, Want{"reduce_scatter", 2, 2 * 32}, Want{"all_reduce", 2, 2 * 8},
                        Want{"broadcast", 0, 0}, Want{"barrier", 0, 0}}) {
    const ProfileEntry* e = p.Find(ProfileKind::kCollective, w.name);
    ASSERT_NE(e, nullptr) << w.name;
    EXPECT_EQ(e->count, w.count) << w.name;
    EXPECT_EQ(e->bytes, w.bytes) << w.name;
    EXPECT_GE(e->seconds, 0.002 * double(w.count)) << w.name;
    EXPECT_LE(e->seconds, p.step_seconds) << w.name;
    EXPECT_NEAR(e->share, 100.0 * e->seconds / p.step_seconds, 1e-9) << w.name;
  }
  EXPECT_EQ(p.op_seconds, 0.0);
}

TEST(Profiler, ReportsTheCollectivesOfTwoGlooRanks) {
  auto data = test::RandomTokens(4000, 40, 34);
  const Config c = test::TinyGptConfig({"train.batch_size=2", "train.steps=3", "default_chunk_size=1024"});
  const int port = test::FreePort();
  constexpr int kWorld = 2;
  std::vector<std::string> errors(kWorld);
  std::vector<ProfileSummary> profiles(kWorld);
  std::vector<uint8_t> gelu_kept(kWorld, 0);
  std::vector<std::array<int64_t, kNumCollectiveOps>> calls(kWorld), bytes(kWorld);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      StoreOptions o;
      o.host = "127.0.0.1";
      o.port = port;
      o.rdzv_id = "profiler-test";
      o.rank = r;
      o.world_size = kWorld;
      o.timeout = std::chrono::milliseconds(20000);
      auto store = Store::Connect(o);
      if (!store.ok()) return void(errors[size_t(r)] = store.status().message());
      auto comm = MakeGlooCommunicator(**store, r, kWorld, std::chrono::milliseconds(20000));
      if (!comm.ok()) return void(errors[size_t(r)] = comm.status().message());
      auto t = Trainer::Create(c, data, comm->get());
      if (!t.ok()) return void(errors[size_t(r)] = t.status().message());
      gelu_kept[size_t(r)] = (*t)->plan().gelu_outputs_kept;
      (*t)->EnableProfiling(1);
      const CollectiveCounters& cc = (*comm)->counters();
      for (int64_t s = 0; s < c.train.steps; ++s) {
        auto st = (*t)->Step();
        if (!st.ok()) return void(errors[size_t(r)] = st.status().message());
        if (s == 0) {
          for (int op = 0; op < kNumCollectiveOps; ++op) {
            calls[size_t(r)][size_t(op)] = -cc.calls[size_t(op)].load();
            bytes[size_t(r)][size_t(op)] = -cc.bytes[size_t(op)].load();
          }
        }
      }
      for (int op = 0; op < kNumCollectiveOps; ++op) {
        calls[size_t(r)][size_t(op)] += cc.calls[size_t(op)].load();
        bytes[size_t(r)][size_t(op)] += cc.bytes[size_t(op)].load();
      }
      profiles[size_t(r)] = (*t)->profiler()->Summary();
    });
  }
  for (auto& th : threads) th.join();
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_EQ(errors[size_t(r)], "") << "rank " << r;
    const ProfileSummary& p = profiles[size_t(r)];
    SCOPED_TRACE("rank " + std::to_string(r) + "\n" + FormatProfile(p));
    ExpectCompleteOpProfile(c, p, 2, gelu_kept[size_t(r)]);
    for (int op = 0; op < kNumCollectiveOps; ++op) {
      const char* name = CollectiveOpName(CollectiveOp(op));
      const ProfileEntry* e = p.Find(ProfileKind::kCollective, name);
      ASSERT_NE(e, nullptr) << name;
      EXPECT_EQ(e->count, calls[size_t(r)][size_t(op)]) << name;
      EXPECT_EQ(e->bytes, bytes[size_t(r)][size_t(op)]) << name;
    }
    // ZeRO gathers parameters, reduce-scatters gradients and all-reduces the
    // loss and the gradient norm in every step.
    for (const char* name : {"all_gather", "reduce_scatter", "all_reduce"}) {
      const ProfileEntry* e = p.Find(ProfileKind::kCollective, name);
      EXPECT_GT(e->count, 0) << name;
      EXPECT_GT(e->bytes, 0) << name;
      EXPECT_GT(e->seconds, 0.0) << name;
    }
  }
}

TEST(Profiler, PrintsOneAlignedLinePerEntry) {
  ProfileSummary s;
  s.clock = "the host clock";
  s.steps = 9;
  s.skipped_steps = 1;
  s.step_seconds = 2.0;
  s.op_seconds = 1.5;
  auto entry = [](ProfileKind kind, const char* name, int64_t count, double seconds, int64_t bytes) {
    ProfileEntry e;
    e.kind = kind;
    e.name = name;
    e.count = count;
    e.seconds = seconds;
    e.share = 100.0 * seconds / 2.0;
    e.bytes = bytes;
    return e;
  };
  s.entries = {entry(ProfileKind::kOp, "matmul", 12345, 1.25, 0),
               entry(ProfileKind::kCollective, "reduce_scatter", 40, 0.5, int64_t(3) << 30),
               entry(ProfileKind::kOp, "gelu", 7, 0.25, 0), entry(ProfileKind::kMove, "h2d", 0, 0.0, 0)};
  const std::string text = FormatProfile(s);
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 1 + s.entries.size()) << text;
  EXPECT_EQ(lines[0].rfind("profile: 9 steps (1 warm-up step left out) | step time 2.000 s | ops 1.500 s = 75.0%", 0),
            0u)
      << text;
  size_t calls_at = std::string::npos, share_at = std::string::npos;
  for (size_t i = 0; i < s.entries.size(); ++i) {
    const std::string& line = lines[i + 1];
    const ProfileEntry& e = s.entries[i];
    EXPECT_EQ(line.rfind(std::string("  ") + ProfileKindName(e.kind), 0), 0u) << line;
    EXPECT_NE(line.find(" " + e.name + " "), std::string::npos) << line;
    EXPECT_NE(line.find(" " + std::to_string(e.count) + " calls"), std::string::npos) << line;
    // The columns line up: the same position for "calls" and the share's "%".
    if (i == 0) calls_at = line.find(" calls"), share_at = line.find('%');
    EXPECT_EQ(line.find(" calls"), calls_at) << text;
    EXPECT_EQ(line.find('%'), share_at) << text;
    EXPECT_EQ(line.find("GB/s") != std::string::npos, e.kind != ProfileKind::kOp) << line;
  }
  EXPECT_NE(lines[2].find(" 25.0%"), std::string::npos) << lines[2];
  EXPECT_NE(lines[2].find("3.0 GiB"), std::string::npos) << lines[2];
  EXPECT_NE(lines[2].find(" 6.44 GB/s"), std::string::npos) << lines[2];  // 3 GiB in 0.5 s
}

TEST(Profiler, TimesOpsAndCopiesOnTheGpu) {
#ifdef PSTAR_WITH_CUDA
  const int gpus = CudaDeviceCount();
  PSTAR_REQUIRE_GPUS_FOUND(1, gpus);
  auto data = test::RandomTokens(20000, 256, 35);
  for (const char* precision : {"fp32", "bf16"}) {
    auto overrides = kMidSize;
    overrides.insert(overrides.end(), {"runtime.device=cuda", "train.steps=4", "default_chunk_size=16384",
                                       std::string("train.precision=") + precision});
    const Config all_resident = test::TinyGptConfig(overrides);
    overrides.push_back(Set("runtime.device_memory", MinimumBudget(all_resident)));
    const Config tight = test::TinyGptConfig(overrides);
    for (bool moving : {false, true}) {
      const Config& c = moving ? tight : all_resident;
      const RunResult plain = Train(c, data, false);
      const RunResult r = Train(c, data, true);
      SCOPED_TRACE(std::string(precision) + (moving ? " at the minimum budget\n" : " all resident\n") +
                   FormatProfile(r.profile));
      ExpectSameResults(plain, r, "profiled on the GPU");
      EXPECT_STREQ(r.profile.clock, "CUDA events");
      ExpectCompleteOpProfile(c, r.profile, 3, r.gelu_kept);
      for (const char* op : {"gemm.fc.fwd", "gemm.fc.dinp", "gemm.fc.dweight", "attention.fwd", "attention.bwd",
                             "layernorm.fwd", "gelu.fwd", "bias_grad", "adam", "grad_norm"}) {
        EXPECT_GT(r.profile.Find(ProfileKind::kOp, op)->seconds, 0.0) << op;
      }
      for (int d = 0; d < kNumDirections; ++d) {
        const ProfileEntry* e = r.profile.Find(ProfileKind::kMove, DirectionName(Direction(d)));
        ASSERT_NE(e, nullptr);
        EXPECT_EQ(e->count, r.moves[d]) << DirectionName(Direction(d));
        EXPECT_EQ(e->bytes, r.moved_bytes[d]) << DirectionName(Direction(d));
        if (moving) {
          EXPECT_GT(e->count, 0) << DirectionName(Direction(d));
          EXPECT_GT(e->seconds, 0.0) << DirectionName(Direction(d));
        }
      }
    }
  }
#else
  GTEST_SKIP() << "this build has no CUDA";
#endif
}

}  // namespace
}  // namespace pstar
