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
#include "kernels/half.h"
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

// Packed examples (AttentionShape::positions): each example of a row gets
// what it gets alone, as its own row, at every group size and in bf16
// (where the 16-bit output rounds once either way). The examples straddle
// the blocks (lengths across and off 64, a one-token example, padding
// positions each their own example) and rows differ.
TEST(AttentionSegments, EachPackedExampleAttendsAsIfAlone) {
  std::mt19937_64 rng(test::RunSeed());
  SCOPED_TRACE("seed " + std::to_string(test::RunSeed()));
  const int64_t T = 3 * kAttentionBlock + 9, hs = 16;
  // Row 2 ends in padding: one-position examples.
  std::vector<std::vector<int64_t>> rows = {{37, 64, 1, 94, 5}, {T}, {70, 70}};
  rows[2].resize(size_t(T - 140 + 2), 1);
  const int64_t B = int64_t(rows.size());
  std::vector<int32_t> positions(size_t(B * T));
  for (int64_t b = 0; b < B; ++b) {
    int64_t t = 0;
    for (int64_t len : rows[size_t(b)]) {
      for (int64_t i = 0; i < len && t < T; ++i) positions[size_t(b * T + t++)] = int32_t(i);
    }
    ASSERT_EQ(t, T) << "row " << b << " must fill T";
  }
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const std::pair<int64_t, int64_t>& heads : std::vector<std::pair<int64_t, int64_t>>{{2, 2}, {4, 1}, {6, 2}}) {
    const int64_t NH = heads.first, NKV = heads.second;  // named, not bound: lambdas below capture them
    for (bool bf16 : {false, true}) {
      SCOPED_TRACE(testing::Message() << "NH=" << NH << " NKV=" << NKV << (bf16 ? " bf16" : " fp32"));
      const AttentionShape packed{B, T, NH, NKV, hs, positions.data()};
      const int64_t ld = packed.RowElements(), ldo = NH * hs;
      std::vector<float> qkv(size_t(B * T * ld)), dout(size_t(B * T * ldo));
      for (float& x : qkv) x = bf16 ? BFloat16ToFloat(FloatToBFloat16(normal(rng))) : normal(rng);
      for (float& x : dout) x = normal(rng);
      std::vector<uint16_t> qkv16(qkv.size());
      for (size_t i = 0; i < qkv.size(); ++i) qkv16[i] = FloatToBFloat16(qkv[i]);
      // out, lse and dqkv of a (Bx, Tx) batch of rows of qkv.
      auto run = [&](const AttentionShape& s, const float* q, const uint16_t* q16, const float* dy) {
        Result r{std::vector<float>(size_t(s.B * s.T * ldo)), std::vector<float>(size_t(s.B * NH * s.T)),
                 std::vector<float>(size_t(s.B * s.T * ld))};
        if (bf16) {
          std::vector<uint16_t> out16(r.out.size());
          AttentionForward(out16.data(), r.lse.data(), q16, true, s);
          AttentionBackward(r.dqkv.data(), dy, q16, out16.data(), true, r.lse.data(), s);
          for (size_t i = 0; i < out16.size(); ++i) r.out[i] = BFloat16ToFloat(out16[i]);
        } else {
          AttentionForward(r.out.data(), r.lse.data(), q, s);
          AttentionBackward(r.dqkv.data(), dy, q, r.out.data(), r.lse.data(), s);
        }
        return r;
      };
      const Result all = run(packed, qkv.data(), qkv16.data(), dout.data());
      for (int64_t b = 0; b < B; ++b) {
        int64_t t0 = 0;
        for (int64_t len : rows[size_t(b)]) {
          const int64_t at = b * T + t0;
          const AttentionShape alone{1, len, NH, NKV, hs};
          const Result one = run(alone, qkv.data() + at * ld, qkv16.data() + at * ld, dout.data() + at * ldo);
          double worst = 0;
          auto expect_near = [&](float got, float want, const char* what, int64_t i) {
            const double err = std::abs(double(got) - double(want)) / std::max(1.0, std::abs(double(want)));
            worst = std::max(worst, err);
            // bf16's output may round to the neighbouring value.
            ASSERT_LE(err, bf16 ? 1e-2 : 2e-5) << what << " row " << b << " example at " << t0 << " (" << len
                                                << " long), element " << i << ": packed " << got << ", alone "
                                                << want;
          };
          for (int64_t i = 0; i < len * ldo; ++i) expect_near(all.out[size_t(at * ldo + i)], one.out[size_t(i)], "out", i);
          for (int64_t i = 0; i < len * ld; ++i) expect_near(all.dqkv[size_t(at * ld + i)], one.dqkv[size_t(i)], "dqkv", i);
          for (int64_t h = 0; h < NH; ++h) {
            for (int64_t t = 0; t < len; ++t) {
              expect_near(all.lse[size_t((b * NH + h) * T + t0 + t)], one.lse[size_t(h * len + t)], "lse", t);
            }
          }
          t0 += len;
        }
      }
    }
  }
}

// Positions of one sequence from 0 give the bits of no positions.
TEST(AttentionSegments, OneExampleARowIsTheUnpackedKernelBitForBit) {
  std::mt19937_64 rng(test::RunSeed());
  const int64_t B = 2, T = 2 * kAttentionBlock + 3, NH = 4, NKV = 2, hs = 8;
  std::vector<int32_t> positions(size_t(B * T));
  for (int64_t i = 0; i < B * T; ++i) positions[size_t(i)] = int32_t(i % T);
  const AttentionShape plain{B, T, NH, NKV, hs}, with{B, T, NH, NKV, hs, positions.data()};
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> qkv(size_t(B * T * plain.RowElements())), dout(size_t(B * T * NH * hs));
  for (float& x : qkv) x = normal(rng);
  for (float& x : dout) x = normal(rng);
  Result a{std::vector<float>(dout.size()), std::vector<float>(size_t(B * NH * T)), std::vector<float>(qkv.size())};
  Result b = a;
  AttentionForward(a.out.data(), a.lse.data(), qkv.data(), plain);
  AttentionBackward(a.dqkv.data(), dout.data(), qkv.data(), a.out.data(), a.lse.data(), plain);
  AttentionForward(b.out.data(), b.lse.data(), qkv.data(), with);
  AttentionBackward(b.dqkv.data(), dout.data(), qkv.data(), b.out.data(), b.lse.data(), with);
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(a.lse, b.lse);
  EXPECT_EQ(a.dqkv, b.dqkv);
}

}  // namespace
}  // namespace pstar::kernels::cpu
