// The tensor-core attention kernels' own code, run on the host through an
// emulation of threads, barriers and WMMA (tests/kernels/cuda/warp_emulation.h)
// against the CPU kernels: indexing, causal masking, partial blocks, the
// placement of every barrier and the tile loads (16 bytes at a time, narrowing
// fp32 gradients to 16 bits, or one element at a time where misaligned) are
// checked on every machine, in fp32 and in a bf16 of the emulation's own, so
// that a GPU run checks only what the emulation cannot (the fragments'
// layouts, the hardware's 16-bit products, speed).
#include "tests/kernels/cuda/warp_emulation.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <random>
#include <type_traits>
#include <vector>

#include "kernels/attention.h"
#include "tests/kernels/cuda/relative_error.h"

namespace pstar::test {
namespace {

namespace tensor_core {
using namespace emulation;
using kernels::FirstVisibleKey;
using kernels::QkvRows;
constexpr int kBlock = int(kernels::kAttentionBlock);
#include "kernels/cuda/attention_tensor_core.cuh"
}  // namespace tensor_core

using emulation::Bf16;

// C = NH * head size; NKV key/value heads (0: NH, multi-head attention);
// `positions`, where rows hold packed examples (B*T; empty: one sequence a
// row).
struct Shape {
  int64_t B, T, C, NH, NKV = 0;
  std::vector<int32_t> positions = {};
  int64_t kv() const { return NKV > 0 ? NKV : NH; }
  kernels::AttentionShape Kernel() const {
    return {B, T, NH, NKV > 0 ? NKV : NH, C / NH, positions.empty() ? nullptr : positions.data()};
  }
};

// fp32 kernels match to fp32 rounding; 16-bit ones round P, dS and dout to
// 16 bits for their products (as on a GPU), so to bf16's.
template <typename E>
constexpr double kTolerance = std::is_same_v<E, float> ? 1e-5 : 1e-2;

template <typename E>
std::vector<E> ToElements(const std::vector<float>& x) {
  std::vector<E> out;
  out.reserve(x.size());
  for (float v : x) out.push_back(E(v));
  return out;
}
template <typename E>
std::vector<float> ToFloats(const E* x, size_t n) {
  std::vector<float> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) out.push_back(float(x[i]));
  return out;
}
// x rounded to E and back: the values the kernels see.
template <typename E>
void RoundTo(std::vector<float>& x) {
  for (float& v : x) v = float(E(v));
}

// Activations A (float or Bf16), gradients G (float, or A). misaligned: the
// kernels read qkv and dout one element past a 16-byte boundary, where their
// tile loads go one element at a time.
template <typename A, typename G>
void ExpectMatchesCpu(const Shape& s, std::mt19937& rng, bool misaligned = false) {
  SCOPED_TRACE(testing::Message() << "B=" << s.B << " T=" << s.T << " C=" << s.C << " NH=" << s.NH << " NKV=" << s.kv()
                                  << (std::is_same_v<A, float> ? " fp32" : " bf16") << " activations, "
                                  << (std::is_same_v<G, float> ? "fp32" : "bf16") << " gradients"
                                  << (misaligned ? ", misaligned" : "")
                                  << (s.positions.empty() ? "" : ", packed examples"));
  const int64_t hs = s.C / s.NH, blocks = (s.T + tensor_core::kBlock - 1) / tensor_core::kBlock;
  const float scale = 1.0f / std::sqrt(float(hs));
  std::normal_distribution<float> normal;
  const kernels::AttentionShape shape = s.Kernel();
  const kernels::QkvRows rows = kernels::RowsOf(shape);
  std::vector<float> qkv(size_t(s.B * s.T * shape.RowElements())), dout(size_t(s.B * s.T * s.C));
  for (float& x : qkv) x = normal(rng);
  for (float& x : dout) x = normal(rng);
  RoundTo<A>(qkv);
  RoundTo<G>(dout);
  std::vector<float> out_cpu(dout.size()), lse_cpu(size_t(s.B * s.NH * s.T)), dqkv_cpu(qkv.size());
  kernels::cpu::AttentionForward(out_cpu.data(), lse_cpu.data(), qkv.data(), shape);
  kernels::cpu::AttentionBackward(dqkv_cpu.data(), dout.data(), qkv.data(), out_cpu.data(), lse_cpu.data(), shape);

  const size_t shift = misaligned ? 1 : 0;
  std::vector<A> qkv_at = ToElements<A>(qkv);
  std::vector<G> dout_at = ToElements<G>(dout);
  qkv_at.insert(qkv_at.begin(), shift, A(0.0f));
  dout_at.insert(dout_at.begin(), shift, G(0.0f));
  const A* qkv_in = qkv_at.data() + shift;
  const G* dout_in = dout_at.data() + shift;

  // The keys pass takes a (batch, key/value head) a block, the others a
  // (batch, query head).
  const emulation::Dim3 grid{unsigned(s.B * s.NH), unsigned(blocks), 1};
  const emulation::Dim3 keys_grid{unsigned(s.B * s.kv()), unsigned(blocks), 1};
  const unsigned threads = tensor_core::kTcWarps * emulation::kWarpSize;
  // NaN wherever the kernels should write.
  std::vector<A> out(dout.size(), A(NAN));
  std::vector<float> lse(lse_cpu.size(), NAN);
  std::vector<G> dqkv(qkv.size(), G(NAN));
  emulation::RunBlocks(grid, threads, tensor_core::TensorCoreForwardSharedBytes(int(hs), sizeof(A)), [&] {
    tensor_core::TensorCoreFlashForward<A>(out.data(), lse.data(), qkv_in, s.T, rows, int(hs), scale);
  });
  EXPECT_LT(RelativeError(ToFloats(out.data(), out.size()), out_cpu), kTolerance<A>) << "out";
  // lse's statistics are fp32 whatever A is; only the scores' products differ.
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
  emulation::RunBlocks(keys_grid, threads, tensor_core::TensorCoreBackwardKeysSharedBytes(int(hs), sizeof(A)), [&] {
    tensor_core::TensorCoreBackwardKeys<G, A>(dqkv.data(), dout_in, qkv_in, lse_cpu.data(), dsum.data(), s.T, rows,
                                              int(hs), scale);
  });
  emulation::RunBlocks(grid, threads, tensor_core::TensorCoreBackwardQueriesSharedBytes(int(hs), sizeof(A)), [&] {
    tensor_core::TensorCoreBackwardQueries<G, A>(dqkv.data(), dout_in, qkv_in, lse_cpu.data(), dsum.data(), s.T, rows,
                                                 int(hs), scale);
  });
  EXPECT_LT(RelativeError(ToFloats(dqkv.data(), dqkv.size()), dqkv_cpu), kTolerance<A>) << "dqkv";
}

// Packed examples (AttentionShape::positions): each query sees its own
// example's keys only, forward and backward, fp32 and bf16, grouped heads,
// against the CPU kernel with the same positions (examples of 1 to 90
// positions, starting anywhere in a block).
TEST(TensorCoreAttentionEmulated, PackedExamplesMatchTheCpuKernels) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  auto packed = [&](Shape s) {
    for (int64_t b = 0; b < s.B; ++b) {
      for (int64_t t = 0; t < s.T;) {
        const int64_t len = std::uniform_int_distribution<int64_t>(1, 90)(rng);
        for (int64_t i = 0; i < len && t < s.T; ++i, ++t) s.positions.push_back(int32_t(i));
      }
    }
    return s;
  };
  ExpectMatchesCpu<float, float>(packed({2, 150, 48, 3}), rng);
  ExpectMatchesCpu<Bf16, float>(packed({1, 200, 64, 4, 2}), rng);
  ExpectMatchesCpu<Bf16, Bf16>(packed({1, 130, 32, 2, 1}), rng);
}

TEST(TensorCoreAttentionEmulated, MatchesTheCpuKernels) {
  std::mt19937 rng(std::random_device{}());
  // A single position, T across and off the 64-position block, head sizes 16
  // to 128, several heads and batches.
  for (const Shape& s : {Shape{1, 1, 16, 1}, Shape{2, 17, 64, 4}, Shape{1, 65, 48, 1}, Shape{1, 129, 128, 1},
                         Shape{1, 200, 128, 2}}) {
    ExpectMatchesCpu<float, float>(s, rng);
  }
  ExpectMatchesCpu<float, float>({2, 70, 64, 2}, rng, /*misaligned=*/true);
  // And a fresh shape each run.
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 pick(seed);
  const int64_t hs = 16 * std::uniform_int_distribution<int64_t>(1, 8)(pick);
  const int64_t heads = std::uniform_int_distribution<int64_t>(1, 3)(pick);
  ExpectMatchesCpu<float, float>({std::uniform_int_distribution<int64_t>(1, 2)(pick),
                                  std::uniform_int_distribution<int64_t>(1, 140)(pick), hs * heads, heads},
                                 rng);
}

// The 16-bit instantiations: 16-bit activations with fp32 gradients (the
// bf16 runs' default: dout is narrowed as its tiles load) and with 16-bit
// gradients (16-byte copies throughout), aligned and not.
TEST(TensorCoreAttentionEmulated, SixteenBitElementsMatchTheCpuKernels) {
  std::mt19937 rng(std::random_device{}());
  for (const Shape& s : {Shape{2, 17, 64, 4}, Shape{1, 129, 128, 1}, Shape{1, 70, 48, 3}}) {
    ExpectMatchesCpu<Bf16, float>(s, rng);
    ExpectMatchesCpu<Bf16, Bf16>(s, rng);
  }
  ExpectMatchesCpu<Bf16, float>({1, 70, 64, 2}, rng, /*misaligned=*/true);
  ExpectMatchesCpu<Bf16, Bf16>({1, 70, 64, 2}, rng, /*misaligned=*/true);
}

// Grouped-query heads (query head h reads key/value head h / group): 1, 2,
// 3, 4, 7 and 8 query heads a key/value head, head sizes 64 and 128 and
// one the mma kernels do not take, fp32 and 16-bit.
TEST(TensorCoreAttentionEmulated, GroupedQueryHeadsMatchTheCpuKernels) {
  std::mt19937 rng(std::random_device{}());
  for (const int64_t group : {1, 2, 3, 4, 7, 8}) {
    const int64_t kv = group <= 2 ? 2 : 1;
    ExpectMatchesCpu<float, float>({1, 70, 64 * group * kv, group * kv, kv}, rng);
    ExpectMatchesCpu<Bf16, Bf16>({1, 70, 64 * group * kv, group * kv, kv}, rng);
  }
  for (const int64_t group : {2, 4}) ExpectMatchesCpu<Bf16, float>({1, 129, 128 * group, group, 1}, rng);
  ExpectMatchesCpu<float, float>({2, 40, 48 * 6, 6, 2}, rng);
}

}  // namespace
}  // namespace pstar::test
