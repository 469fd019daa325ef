// The Llama family's CUDA kernels (RMSNorm, RoPE, SwiGLU: kernels/cuda/*.cuh)
// run on the host through the warp emulation (tests/kernels/cuda/warp_emulation.h)
// against their CPU twins, in fp32 and in the emulation's bf16: the row and
// lane indexing, partial warps and blocks, the residual fused in front, the
// 16-byte packs and their element-by-element fallback, the norms' row-group
// column sums and every store's rounding are checked on every machine. The GPU
// tests (llama_kernels_test.cc) check what only a GPU shows.
#include "tests/kernels/cuda/warp_emulation.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <type_traits>
#include <vector>

#include "kernels/half.h"
#include "tests/kernels/cuda/relative_error.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"

namespace pstar::test {
namespace {

namespace emu {
using namespace emulation;
#include "kernels/cuda/packs.cuh"
#include "kernels/cuda/norm_columns.cuh"
#include "kernels/cuda/rmsnorm.cuh"
#include "kernels/cuda/rope.cuh"
#include "kernels/cuda/swiglu.cuh"
}  // namespace emu

using emulation::Bf16;
using emulation::Dim3;

unsigned Blocks(int64_t n, unsigned per) { return unsigned((n + per - 1) / per); }

std::vector<float> Normal(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// As the kernel stores them: fp32 as is, bf16 rounded (and back to float).
template <typename E>
std::vector<E> Stored(const std::vector<float>& v) {
  std::vector<E> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = E(v[i]);
  return out;
}
template <typename E>
std::vector<float> Wide(const std::vector<E>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = float(v[i]);
  return out;
}
std::vector<uint16_t> Bits(const std::vector<Bf16>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = v[i].bits;
  return out;
}
std::vector<float> RoundedBf16(const std::vector<float>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = kernels::BFloat16ToFloat(kernels::FloatToBFloat16(v[i]));
  return out;
}

// fp32 kernels agree to fp32 rounding (other summation orders, expf against
// the CPU's own exp); a 16-bit store may land one bf16 step away.
template <typename E>
double Bound() {
  return std::is_same_v<E, float> ? 2e-5 : 1e-2;
}

struct NormCase {
  int64_t N, C;
};
// Rows not a multiple of a block's 8, columns below, at and past a warp's
// 32, with and without 16-byte runs (C % 8).
const NormCase kNormCases[] = {{1, 8}, {9, 20}, {37, 200}, {70, 256}, {100, 96}};

template <typename E>
void ExpectRmsNormForwardMatchesCpu(bool residual) {
  std::mt19937 rng(11);
  for (const NormCase& k : kNormCases) {
    SCOPED_TRACE(testing::Message() << "N=" << k.N << " C=" << k.C << " residual " << residual);
    const size_t n = size_t(k.N * k.C);
    const std::vector<E> a = Stored<E>(Normal(n, rng, 2.0f));
    const std::vector<float> b = Normal(n, rng);
    const std::vector<E> w = Stored<E>(Normal(size_t(k.C), rng));
    const float eps = 1e-5f;
    std::vector<E> out(n), res(n);
    std::vector<float> rstd(size_t(k.N));
    emulation::RunBlocks(Dim3{Blocks(k.N, emu::kRmsNormRowsPerBlock), 1, 1}, emu::kRmsNormThreads, 0, [&] {
      emu::RmsNormForwardKernel<E, float>(residual ? res.data() : nullptr, out.data(), rstd.data(), a.data(),
                                          residual ? b.data() : nullptr, w.data(), eps, k.N, k.C);
    });
    std::vector<float> want_out(n), want_res(n), want_rstd(size_t(k.N));
    const std::vector<float> wf = Wide(w);
    if constexpr (std::is_same_v<E, float>) {
      if (residual) {
        kernels::cpu::ResidualRmsNormForward(want_res.data(), want_out.data(), want_rstd.data(), a.data(), b.data(),
                                             wf.data(), eps, k.N, k.C);
      } else {
        kernels::cpu::RmsNormForward(want_out.data(), want_rstd.data(), a.data(), wf.data(), eps, k.N, k.C);
      }
    } else {
      std::vector<uint16_t> o16(n), r16(n);
      const std::vector<uint16_t> a16 = Bits(a);
      if (residual) {
        kernels::cpu::ResidualRmsNormForward(r16.data(), o16.data(), want_rstd.data(), a16.data(), b.data(), true,
                                             wf.data(), eps, k.N, k.C);
      } else {
        kernels::cpu::RmsNormForward(o16.data(), want_rstd.data(), a16.data(), true, wf.data(), eps, k.N, k.C);
      }
      for (size_t i = 0; i < n; ++i) {
        want_out[i] = kernels::BFloat16ToFloat(o16[i]);
        want_res[i] = kernels::BFloat16ToFloat(r16[i]);
      }
    }
    EXPECT_LT(RelativeError(Wide(out), want_out), Bound<E>());
    EXPECT_LT(RelativeError(rstd, want_rstd), 1e-5);
    // The sum a + b is one rounding on both sides: the same bits.
    if (residual) {
      EXPECT_EQ(Wide(res), want_res);
    }
  }
}

TEST(LlamaKernelsEmulated, RmsNormForwardMatchesTheCpuKernel) {
  ExpectRmsNormForwardMatchesCpu<float>(false);
  ExpectRmsNormForwardMatchesCpu<Bf16>(false);
}

TEST(LlamaKernelsEmulated, ResidualRmsNormForwardMatchesTheCpuKernel) {
  ExpectRmsNormForwardMatchesCpu<float>(true);
  ExpectRmsNormForwardMatchesCpu<Bf16>(true);
}

// dinp and dweight accumulate into what is there; the copy is dinp's new
// values rounded to the gradients' type.
template <typename E>
void ExpectRmsNormBackwardMatchesCpu(bool vector) {
  std::mt19937 rng(12);
  for (const NormCase& k : kNormCases) {
    if (vector && k.C % 8 != 0) continue;
    SCOPED_TRACE(testing::Message() << "N=" << k.N << " C=" << k.C << " vector " << vector);
    const size_t n = size_t(k.N * k.C);
    const std::vector<E> x = Stored<E>(Normal(n, rng, 2.0f));
    const std::vector<E> dy = Stored<E>(Normal(n, rng));
    const std::vector<float> w = Normal(size_t(k.C), rng);
    std::vector<float> rstd(size_t(k.N));
    for (float& s : rstd) s = std::uniform_real_distribution<float>(0.3f, 2.0f)(rng);
    const std::vector<float> dinp0 = Normal(n, rng), dw0 = Normal(size_t(k.C), rng);

    std::vector<float> dinp = dinp0, dw = dw0;
    std::vector<E> copy(n);
    const int64_t groups = emu::NormGroups(k.N);
    std::vector<float> partials(size_t(groups * k.C));
    emulation::RunBlocks(Dim3{Blocks(k.N, emu::kRmsNormRowsPerBlock), 1, 1}, emu::kRmsNormThreads, 0, [&] {
      if (vector) {
        emu::RmsNormBackwardRowsVectorKernel<E, E>(dinp.data(), copy.data(), dy.data(), x.data(), w.data(),
                                                   rstd.data(), k.N, k.C);
      } else {
        emu::RmsNormBackwardRowsKernel<E, E>(dinp.data(), copy.data(), dy.data(), x.data(), w.data(), rstd.data(),
                                             k.N, k.C);
      }
    });
    emulation::RunBlocks(Dim3{unsigned(groups), Blocks(k.C, 64), 1}, 64, 0, [&] {
      emu::NormColumnPartialsKernel<false>(partials.data(), dy.data(), x.data(), static_cast<const float*>(nullptr),
                                           rstd.data(), k.N, k.C, emu::NormGroupRows(k.N));
    });
    emulation::RunBlocks(Dim3{Blocks(k.C, 64), 1, 1}, 64, 0, [&] {
      emu::NormColumnTotalsKernel<false, float>(dw.data(), nullptr, partials.data(), groups, k.C);
    });

    std::vector<float> want_dinp = dinp0, want_dw = dw0;
    const std::vector<float> dyf = Wide(dy);
    if constexpr (std::is_same_v<E, float>) {
      kernels::cpu::RmsNormBackward(want_dinp.data(), want_dw.data(), dyf.data(), x.data(), w.data(), rstd.data(),
                                    k.N, k.C);
    } else {
      const std::vector<uint16_t> x16 = Bits(x);
      kernels::cpu::RmsNormBackward(want_dinp.data(), want_dw.data(), dyf.data(), x16.data(), true, w.data(),
                                    rstd.data(), k.N, k.C);
    }
    EXPECT_LT(RelativeError(dinp, want_dinp), 2e-5);
    EXPECT_LT(RelativeError(dw, want_dw), 2e-5);
    const std::vector<float> want_copy = std::is_same_v<E, float> ? dinp : RoundedBf16(dinp);
    EXPECT_EQ(Wide(copy), want_copy);
  }
}

TEST(LlamaKernelsEmulated, RmsNormBackwardMatchesTheCpuKernel) {
  ExpectRmsNormBackwardMatchesCpu<float>(false);
  ExpectRmsNormBackwardMatchesCpu<float>(true);
  ExpectRmsNormBackwardMatchesCpu<Bf16>(false);
  ExpectRmsNormBackwardMatchesCpu<Bf16>(true);
}

// q and k heads of grouped-query rows rotated in place, by a position per
// row (packed rows restart them); the v heads are left alone. The backward
// rotation undoes the forward one.
template <typename E>
void ExpectRopeMatchesCpu() {
  std::mt19937 rng(13);
  struct Case {
    int64_t N, NH, NKV, hs;
  };
  for (const Case& k : {Case{5, 2, 2, 8}, Case{33, 4, 1, 16}, Case{17, 6, 2, 64}}) {
    SCOPED_TRACE(testing::Message() << "N=" << k.N << " NH=" << k.NH << " NKV=" << k.NKV << " hs=" << k.hs);
    const int64_t stride = (k.NH + 2 * k.NKV) * k.hs, heads = k.NH + k.NKV, positions = 40;
    std::vector<float> cos(size_t(positions * k.hs / 2)), sin(cos.size());
    kernels::RopeTables(cos.data(), sin.data(), positions, k.hs, 10000.0, kernels::RopeScaling{});
    std::vector<int32_t> pos(size_t(k.N));
    for (int32_t& p : pos) p = std::uniform_int_distribution<int32_t>(0, int32_t(positions - 1))(rng);
    const std::vector<E> x0 = Stored<E>(Normal(size_t(k.N * stride), rng));
    std::vector<E> x = x0;
    const int64_t pairs = k.N * heads * (k.hs / 2);
    emulation::RunBlocks(Dim3{Blocks(pairs, emu::kRopeThreads), 1, 1}, emu::kRopeThreads, 0, [&] {
      emu::RopeRotateKernel<E>(x.data(), stride, cos.data(), sin.data(), pos.data(), k.N, heads, k.hs / 2, 1.0f);
    });
    std::vector<float> want = Wide(x0);
    kernels::cpu::RopeForward(want.data(), stride, cos.data(), sin.data(), pos.data(), k.N, heads, k.hs);
    if (!std::is_same_v<E, float>) want = RoundedBf16(want);
    EXPECT_LT(RelativeError(Wide(x), want), Bound<E>());
    for (int64_t n = 0; n < k.N; ++n) {
      for (int64_t c = heads * k.hs; c < stride; ++c) {
        ASSERT_EQ(float(x[size_t(n * stride + c)]), float(x0[size_t(n * stride + c)])) << "a v head changed";
      }
    }
    if constexpr (std::is_same_v<E, float>) {
      std::vector<float> back = x;
      emulation::RunBlocks(Dim3{Blocks(pairs, emu::kRopeThreads), 1, 1}, emu::kRopeThreads, 0, [&] {
        emu::RopeRotateKernel<float>(back.data(), stride, cos.data(), sin.data(), pos.data(), k.N, heads, k.hs / 2,
                                     -1.0f);
      });
      std::vector<float> want_back = x;
      kernels::cpu::RopeBackward(want_back.data(), stride, cos.data(), sin.data(), pos.data(), k.N, heads, k.hs);
      EXPECT_LT(RelativeError(back, want_back), 2e-6);
      EXPECT_LT(RelativeError(back, x0), 2e-6);
    }
  }
}

TEST(LlamaKernelsEmulated, RopeMatchesTheCpuKernel) {
  ExpectRopeMatchesCpu<float>();
  ExpectRopeMatchesCpu<Bf16>();
}

template <typename E>
void ExpectSwiGluMatchesCpu() {
  std::mt19937 rng(14);
  // F a multiple of 8 (packs) and not; N * F not a multiple of a thread's 8.
  for (const NormCase& k : {NormCase{3, 24}, NormCase{7, 13}, NormCase{5, 64}, NormCase{1, 5}}) {
    const int64_t N = k.N, F = k.C;
    SCOPED_TRACE(testing::Message() << "N=" << N << " F=" << F);
    const bool packs = F % 8 == 0;
    const std::vector<E> gu = Stored<E>(Normal(size_t(2 * N * F), rng, 3.0f));
    const std::vector<E> dy = Stored<E>(Normal(size_t(N * F), rng));
    std::vector<E> out(size_t(N * F)), dgu(size_t(2 * N * F));
    const unsigned blocks = Blocks((N * F + emu::kSwiGluPer - 1) / emu::kSwiGluPer, emu::kSwiGluThreads);
    emulation::RunBlocks(Dim3{blocks, 1, 1}, emu::kSwiGluThreads, 0, [&] {
      emu::SwiGluForwardKernel<E>(out.data(), gu.data(), N, F, packs);
    });
    emulation::RunBlocks(Dim3{blocks, 1, 1}, emu::kSwiGluThreads, 0, [&] {
      emu::SwiGluBackwardKernel<E>(dgu.data(), gu.data(), dy.data(), N, F, packs);
    });
    const std::vector<float> guf = Wide(gu), dyf = Wide(dy);
    std::vector<float> want_out(size_t(N * F)), want_dgu(size_t(2 * N * F));
    kernels::cpu::SwiGluForward(want_out.data(), guf.data(), N, F);
    kernels::cpu::SwiGluBackward(want_dgu.data(), guf.data(), dyf.data(), N, F);
    if (!std::is_same_v<E, float>) {
      want_out = RoundedBf16(want_out);
      want_dgu = RoundedBf16(want_dgu);
    }
    EXPECT_LT(RelativeError(Wide(out), want_out), Bound<E>());
    EXPECT_LT(RelativeError(Wide(dgu), want_dgu), Bound<E>());
  }
}

TEST(LlamaKernelsEmulated, SwiGluMatchesTheCpuKernel) {
  ExpectSwiGluMatchesCpu<float>();
  ExpectSwiGluMatchesCpu<Bf16>();
}

}  // namespace
}  // namespace pstar::test
