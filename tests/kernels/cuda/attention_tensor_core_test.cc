// The tensor-core attention kernels' own code, run on the host through an
// emulation of threads, barriers and WMMA (tests/kernels/cuda/warp_emulation.h)
// with fp32 elements, against the CPU kernels: indexing, causal masking,
// partial blocks and the placement of every barrier are checked on every
// machine, so that a GPU run checks only what the emulation cannot (the
// fragments' layouts, 16-bit rounding, alignment, speed).
#include "tests/kernels/cuda/warp_emulation.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <random>
#include <type_traits>
#include <vector>

#include "kernels/attention.h"

namespace pstar::test {
namespace {

namespace tensor_core {
using namespace emulation;
constexpr int kBlock = int(kernels::kAttentionBlock);
#include "kernels/cuda/attention_tensor_core.cuh"
}  // namespace tensor_core

struct Shape {
  int64_t B, T, C, NH;
};

// The largest |got - want| over the largest |want|.
double RelativeError(const std::vector<float>& got, const std::vector<float>& want) {
  double scale = 0, worst = 0;
  for (float w : want) scale = std::max(scale, double(std::fabs(w)));
  for (size_t i = 0; i < got.size(); ++i) {
    const double e = std::fabs(double(got[i]) - double(want[i]));
    worst = std::isnan(e) ? INFINITY : std::max(worst, e);
  }
  return worst / std::max(scale, 1e-30);
}

// misaligned: the kernels read qkv and dout one float past a 16-byte
// boundary, where their tile loads go one element at a time.
void ExpectMatchesCpu(const Shape& s, std::mt19937& rng, bool misaligned = false) {
  SCOPED_TRACE(testing::Message() << "B=" << s.B << " T=" << s.T << " C=" << s.C << " NH=" << s.NH
                                  << (misaligned ? " misaligned" : ""));
  const int64_t hs = s.C / s.NH, blocks = (s.T + tensor_core::kBlock - 1) / tensor_core::kBlock;
  const float scale = 1.0f / std::sqrt(float(hs));
  std::normal_distribution<float> normal;
  std::vector<float> qkv(size_t(s.B * s.T * 3 * s.C)), dout(size_t(s.B * s.T * s.C));
  for (float& x : qkv) x = normal(rng);
  for (float& x : dout) x = normal(rng);
  std::vector<float> out_cpu(dout.size()), lse_cpu(size_t(s.B * s.NH * s.T)), dqkv_cpu(qkv.size());
  kernels::cpu::AttentionForward(out_cpu.data(), lse_cpu.data(), qkv.data(), s.B, s.T, s.C, s.NH);
  kernels::cpu::AttentionBackward(dqkv_cpu.data(), dout.data(), qkv.data(), out_cpu.data(), lse_cpu.data(), s.B, s.T,
                                  s.C, s.NH);

  const size_t shift = misaligned ? 1 : 0;
  std::vector<float> qkv_at(qkv.size() + shift), dout_at(dout.size() + shift);
  std::copy(qkv.begin(), qkv.end(), qkv_at.begin() + std::ptrdiff_t(shift));
  std::copy(dout.begin(), dout.end(), dout_at.begin() + std::ptrdiff_t(shift));
  const float* qkv_in = qkv_at.data() + shift;
  const float* dout_in = dout_at.data() + shift;

  const emulation::Dim3 grid{unsigned(s.B * s.NH), unsigned(blocks), 1};
  const unsigned threads = tensor_core::kTcWarps * emulation::kWarpSize;
  // NaN wherever the kernels should write.
  std::vector<float> out(dout.size(), NAN), lse(lse_cpu.size(), NAN), dqkv(qkv.size(), NAN);
  emulation::RunBlocks(grid, threads, tensor_core::TensorCoreForwardSharedBytes(int(hs), sizeof(float)), [&] {
    tensor_core::TensorCoreFlashForward<float>(out.data(), lse.data(), qkv_in, s.T, s.C, int(s.NH), int(hs),
                                               scale);
  });
  EXPECT_LT(RelativeError(out, out_cpu), 1e-5) << "out";
  EXPECT_LT(RelativeError(lse, lse_cpu), 1e-5) << "lse";

  // The backward from the CPU forward's results, with D = rowsum(dout * out).
  std::vector<float> dsum(lse_cpu.size());
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t h = 0; h < s.NH; ++h) {
      for (int64_t t = 0; t < s.T; ++t) {
        double d = 0;
        for (int64_t e = 0; e < hs; ++e) {
          const size_t at = size_t((b * s.T + t) * s.C + h * hs + e);
          d += double(dout[at]) * out_cpu[at];
        }
        dsum[size_t((b * s.NH + h) * s.T + t)] = float(d);
      }
    }
  }
  emulation::RunBlocks(grid, threads, tensor_core::TensorCoreBackwardKeysSharedBytes(int(hs), sizeof(float)), [&] {
    tensor_core::TensorCoreBackwardKeys<float, float>(dqkv.data(), dout_in, qkv_in, lse_cpu.data(),
                                                      dsum.data(), s.T, s.C, int(s.NH), int(hs), scale);
  });
  emulation::RunBlocks(grid, threads, tensor_core::TensorCoreBackwardQueriesSharedBytes(int(hs), sizeof(float)), [&] {
    tensor_core::TensorCoreBackwardQueries<float, float>(dqkv.data(), dout_in, qkv_in, lse_cpu.data(),
                                                         dsum.data(), s.T, s.C, int(s.NH), int(hs), scale);
  });
  EXPECT_LT(RelativeError(dqkv, dqkv_cpu), 1e-5) << "dqkv";
}

TEST(TensorCoreAttentionEmulated, MatchesTheCpuKernels) {
  std::mt19937 rng(std::random_device{}());
  // A single position, T across and off the 64-position block, head sizes 16
  // to 128, several heads and batches.
  for (const Shape& s : {Shape{1, 1, 16, 1}, Shape{2, 17, 64, 4}, Shape{1, 65, 48, 1}, Shape{1, 129, 128, 1},
                         Shape{1, 200, 128, 2}}) {
    ExpectMatchesCpu(s, rng);
  }
  ExpectMatchesCpu({2, 70, 64, 2}, rng, /*misaligned=*/true);
  // And a fresh shape each run.
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 pick(seed);
  const int64_t hs = 16 * std::uniform_int_distribution<int64_t>(1, 8)(pick);
  const int64_t heads = std::uniform_int_distribution<int64_t>(1, 3)(pick);
  ExpectMatchesCpu({std::uniform_int_distribution<int64_t>(1, 2)(pick),
                    std::uniform_int_distribution<int64_t>(1, 140)(pick), hs * heads, heads},
                   rng);
}

}  // namespace
}  // namespace pstar::test
