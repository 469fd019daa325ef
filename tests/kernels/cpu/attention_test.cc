// The CPU attention kernel against PyTorch's float64 attention on fresh random
// shapes every run (T across and off the block size, head sizes 1..128), and
// its bits at 1, 2 and 3 threads.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <vector>

#include "kernels/attention.h"
#include "tests/test_util.h"
#include "worker/ckpt/safetensors.h"

namespace pstar::kernels::cpu {
namespace {

struct Shape {
  int64_t B, T, NH, hs;
};

struct Result {
  std::vector<float> out, lse, dqkv;
};

Result RunAttention(const Shape& s, const std::vector<float>& qkv, const std::vector<float>& dout) {
  const int64_t C = s.NH * s.hs;
  Result r{std::vector<float>(size_t(s.B * s.T * C)), std::vector<float>(size_t(s.B * s.NH * s.T)),
           std::vector<float>(qkv.size(), std::nanf(""))};
  AttentionForward(r.out.data(), r.lse.data(), qkv.data(), s.B, s.T, C, s.NH);
  AttentionBackward(r.dqkv.data(), dout.data(), qkv.data(), r.out.data(), r.lse.data(), s.B, s.T, C, s.NH);
  return r;
}

// max |a - b| / max |b| over the elements of one third (q, k or v) of a
// (B*T, 3C) array, or over all of it when part < 0. A third that is exactly
// zero (dq and dk of a single position) is measured against all of b.
double MaxRelative(const std::vector<float>& a, const std::vector<double>& b, int64_t C = 0, int part = -1) {
  double maxb = 0, maxd = 0, max_all = 1e-300;
  for (size_t i = 0; i < a.size(); ++i) {
    max_all = std::max(max_all, std::abs(b[i]));
    if (part >= 0 && int64_t(i) % (3 * C) / C != part) continue;
    maxb = std::max(maxb, std::abs(b[i]));
    maxd = std::max(maxd, std::abs(double(a[i]) - b[i]));
  }
  return maxd / (maxb > 0 ? maxb : max_all);
}

std::vector<Shape> Shapes(std::mt19937_64& rng) {
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  const int64_t block = kAttentionBlock;
  // The extremes of the head size, T of one block, many blocks and one
  // position, then random ones. Head size 1 takes at least 8 positions:
  // with 2 or 3, every key's gradient is one sum of nearly cancelling terms
  // (v_j - out_i, with v_j close to out_i), and the relative error of fp32
  // against float64 has nothing larger to be measured against.
  std::vector<Shape> shapes = {{1, pick(8, block - 1), pick(1, 3), 1},
                               {pick(1, 2), pick(block + 1, 3 * block - 1), 1, 128},
                               {1, 1, 2, pick(1, 16)},
                               {2, block, 2, pick(17, 64)},
                               {1, 2 * block, 1, pick(2, 40)}};
  for (int i = 0; i < 3; ++i) shapes.push_back({pick(1, 2), pick(1, 4 * block + 7), pick(1, 4), pick(1, 128)});
  return shapes;
}

TEST(AttentionTorch, OutputLseAndGradientsMatchFloat64) {
  const uint64_t seed = test::RunSeed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (PSTAR_TEST_SEED reproduces it)");
  std::mt19937_64 rng(seed);
  const std::vector<Shape> shapes = Shapes(rng);
  // Every case's inputs, then one PyTorch run for all of them.
  test::TempDir dir("attention_torch");
  std::vector<std::vector<float>> qkvs, douts;
  std::vector<std::string> argv = {"/usr/bin/python3",
                                   test::SourceDir() + "/tests/fixtures/torch_attention_reference.py"};
  for (size_t i = 0; i < shapes.size(); ++i) {
    const Shape& s = shapes[i];
    const int64_t C = s.NH * s.hs;
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> qkv(size_t(s.B * s.T * 3 * C)), dout(size_t(s.B * s.T * C));
    for (float& x : qkv) x = normal(rng);
    for (float& x : dout) x = normal(rng);
    const std::string case_dir = dir.path() + "/case-" + std::to_string(i);
    std::filesystem::create_directories(case_dir);
    SafetensorsWriter inputs;
    inputs.SetMetadata("n_head", std::to_string(s.NH));
    inputs.Add("qkv", Dtype::kF32, {s.B, s.T, 3 * C}, qkv.data());
    inputs.Add("dout", Dtype::kF32, {s.B, s.T, C}, dout.data());
    ASSERT_TRUE(inputs.Write(case_dir + "/inputs.safetensors").ok());
    argv.push_back(case_dir);
    qkvs.push_back(std::move(qkv));
    douts.push_back(std::move(dout));
  }
  test::ProcessResult py = test::RunProcess(argv);
  ASSERT_EQ(py.exit_code, 0) << py.out << py.err;

  for (size_t i = 0; i < shapes.size(); ++i) {
    const Shape& s = shapes[i];
    const int64_t C = s.NH * s.hs;
    const std::vector<float>& qkv = qkvs[i];
    const std::vector<float>& dout = douts[i];
    SCOPED_TRACE(testing::Message() << "B=" << s.B << " T=" << s.T << " NH=" << s.NH << " hs=" << s.hs);
    auto ref = SafetensorsFile::Read(dir.path() + "/case-" + std::to_string(i) + "/ref.safetensors");
    ASSERT_TRUE(ref.ok()) << ref.status().message();

    const Result got = RunAttention(s, qkv, dout);
    const std::vector<double> dqkv = *ref->ToDoubles("dqkv");
    EXPECT_LE(MaxRelative(got.out, *ref->ToDoubles("out")), 1e-5) << "out";
    EXPECT_LE(MaxRelative(got.lse, *ref->ToDoubles("lse")), 1e-5) << "lse";
    for (int part = 0; part < 3; ++part) {
      EXPECT_LE(MaxRelative(got.dqkv, dqkv, C, part), 1e-5) << "d" << "qkv"[part];
    }
    std::printf("B=%lld T=%lld NH=%lld hs=%lld: out %.2g, dq %.2g, dk %.2g, dv %.2g\n", (long long)s.B,
                (long long)s.T, (long long)s.NH, (long long)s.hs, MaxRelative(got.out, *ref->ToDoubles("out")),
                MaxRelative(got.dqkv, dqkv, C, 0), MaxRelative(got.dqkv, dqkv, C, 1),
                MaxRelative(got.dqkv, dqkv, C, 2));
  }
}

// The work is split by the shape alone: the same bits at any thread count.
TEST(AttentionTorch, SameBitsAtOneTwoAndThreeThreads) {
  std::mt19937_64 rng(test::RunSeed());
  const Shape s{2, 3 * kAttentionBlock + 5, 3, 24};
  const int64_t C = s.NH * s.hs;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> qkv(size_t(s.B * s.T * 3 * C)), dout(size_t(s.B * s.T * C));
  for (float& x : qkv) x = normal(rng);
  for (float& x : dout) x = normal(rng);
  std::vector<Result> runs;
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    runs.push_back(RunAttention(s, qkv, dout));
  }
  omp_set_num_threads(omp_get_num_procs());
  for (size_t i = 1; i < runs.size(); ++i) {
    EXPECT_EQ(runs[i].out, runs[0].out) << i + 1 << " threads";
    EXPECT_EQ(runs[i].lse, runs[0].lse) << i + 1 << " threads";
    EXPECT_EQ(runs[i].dqkv, runs[0].dqkv) << i + 1 << " threads";
  }
}

}  // namespace
}  // namespace pstar::kernels::cpu
