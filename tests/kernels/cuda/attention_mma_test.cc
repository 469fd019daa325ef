// The mma.sync attention forward and backward (kernels/cuda/attention_mma.cuh)
// run on the host through the warp emulation (tests/kernels/cuda/warp_emulation.h),
// whose mma.sync, ldmatrix and shuffles hand each lane what the PTX ISA's
// fragment layouts give it and whose cp.async copies land only at their
// wait: the kernel's fragment indexing, the P-to-A-fragment reuse, the
// transposed v reads, the double-buffered copies and their waits, the causal
// mask and the n-tiles skipped on the diagonal are checked against the CPU
// kernel on every machine. What only a GPU shows (the instructions
// themselves, speed) the GPU tests check.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/attention.h"
#include "tests/kernels/cuda/warp_emulation.h"

namespace pstar::test {
namespace {

namespace mma {
using namespace emulation;
constexpr int kBlock = int(kernels::kAttentionBlock);
#include "kernels/cuda/attention_mma.cuh"
}  // namespace mma

using emulation::Bf16;

struct Shape {
  int64_t B, T, NH;
};

// The largest |got - want| over the largest |want| (at least `floor`).
double RelativeError(const std::vector<float>& got, const std::vector<float>& want, double floor = 0) {
  double scale = floor, worst = 0;
  for (float w : want) scale = std::max(scale, double(std::fabs(w)));
  for (size_t i = 0; i < got.size(); ++i) {
    const double e = std::fabs(double(got[i]) - double(want[i]));
    worst = std::isnan(e) ? INFINITY : std::max(worst, e);
  }
  return worst / std::max(scale, 1e-30);
}

// The three forms of the forward (q in a tile of its own, q in the second k
// buffer, and 128 queries a block on 8 warps): each against the CPU kernel,
// and the second and third with the first's bits.
template <int HS>
void ExpectMatchesCpu(const Shape& s, std::mt19937& rng) {
  SCOPED_TRACE(testing::Message() << "B=" << s.B << " T=" << s.T << " NH=" << s.NH << " head size " << HS);
  const int64_t C = HS * s.NH;
  std::normal_distribution<float> normal;
  std::vector<float> qkv(size_t(s.B * s.T * 3 * C));
  for (float& x : qkv) x = float(Bf16(2.0f * normal(rng)));  // the values the kernel sees
  std::vector<float> out_cpu(size_t(s.B * s.T * C)), lse_cpu(size_t(s.B * s.NH * s.T));
  kernels::cpu::AttentionForward(out_cpu.data(), lse_cpu.data(), qkv.data(), s.B, s.T, C, s.NH);

  std::vector<Bf16> qkv_in;
  for (float x : qkv) qkv_in.push_back(Bf16(x));
  ASSERT_EQ(reinterpret_cast<uintptr_t>(qkv_in.data()) % 16, 0u) << "the kernel's copies need 16-byte rows";
  const float scale_log2 = 1.4426950408889634f / std::sqrt(float(HS));
  constexpr int kWide = 2 * mma::kMmaWarps;
  std::vector<float> first_out, first_lse;
  for (int form : {0, 1, 2}) {
    SCOPED_TRACE(form == 0 ? "q in a tile of its own" : form == 1 ? "q in the second k buffer" : "128 queries a block");
    std::vector<Bf16> out(out_cpu.size(), Bf16(NAN));  // NaN wherever the kernel should write
    std::vector<float> lse(lse_cpu.size(), NAN);
    const int warps = form == 2 ? kWide : mma::kMmaWarps;
    const unsigned blocks = unsigned((s.T + 16 * warps - 1) / (16 * warps));
    const size_t shared = form == 0   ? mma::MmaForwardSharedBytes<HS>()
                          : form == 1 ? mma::MmaForwardSharedBytes<HS, true>()
                                      : mma::MmaForwardSharedBytes<HS, false, kWide>();
    emulation::RunBlocks({unsigned(s.B * s.NH), blocks, 1}, unsigned(warps * emulation::kWarpSize), shared, [&] {
      if (form == 0) {
        mma::MmaFlashForward<Bf16, HS>(out.data(), lse.data(), qkv_in.data(), s.T, C, int(s.NH), scale_log2);
      } else if (form == 1) {
        mma::MmaFlashForward<Bf16, HS, true>(out.data(), lse.data(), qkv_in.data(), s.T, C, int(s.NH), scale_log2);
      } else {
        mma::MmaFlashForward<Bf16, HS, false, kWide>(out.data(), lse.data(), qkv_in.data(), s.T, C, int(s.NH),
                                                     scale_log2);
      }
    });
    std::vector<float> got;
    for (Bf16 x : out) got.push_back(float(x));
    // P is rounded to bf16 for P v (as on a GPU), the output to bf16.
    EXPECT_LT(RelativeError(got, out_cpu), 1e-2) << "out";
    // The scores' products are exact and their sums fp32: lse is fp32's.
    EXPECT_LT(RelativeError(lse, lse_cpu), 1e-5) << "lse";
    if (form == 0) {
      first_out = got;
      first_lse = lse;
    } else {
      EXPECT_EQ(0, std::memcmp(got.data(), first_out.data(), got.size() * sizeof(float))) << "the same bits";
      EXPECT_EQ(0, std::memcmp(lse.data(), first_lse.data(), lse.size() * sizeof(float))) << "the same bits";
    }
  }
}

// The backward from the CPU forward's results (lse, and dsum =
// rowsum(dout * out)), all 16-bit, against the CPU backward: the two passes,
// or (one_pass) the five-product pass with its ordered dq sums, whose counts
// the emulation checks are only ever waited on after an earlier block
// released them.
template <int HS>
void ExpectBackwardMatchesCpu(const Shape& s, std::mt19937& rng, bool one_pass = false, unsigned shuffle_seed = 0) {
  SCOPED_TRACE(testing::Message() << (one_pass ? "one-pass " : "") << "backward B=" << s.B << " T=" << s.T
                                  << " NH=" << s.NH << " head size " << HS);
  const int64_t C = HS * s.NH, blocks = (s.T + mma::kBlock - 1) / mma::kBlock;
  std::normal_distribution<float> normal;
  std::vector<float> qkv(size_t(s.B * s.T * 3 * C)), dout(size_t(s.B * s.T * C));
  for (float& x : qkv) x = float(Bf16(2.0f * normal(rng)));
  for (float& x : dout) x = float(Bf16(normal(rng)));
  std::vector<float> out(dout.size()), lse(size_t(s.B * s.NH * s.T)), dqkv_cpu(qkv.size());
  kernels::cpu::AttentionForward(out.data(), lse.data(), qkv.data(), s.B, s.T, C, s.NH);
  kernels::cpu::AttentionBackward(dqkv_cpu.data(), dout.data(), qkv.data(), out.data(), lse.data(), s.B, s.T, C, s.NH);
  std::vector<float> dsum(lse.size());
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t h = 0; h < s.NH; ++h) {
      for (int64_t t = 0; t < s.T; ++t) {
        double d = 0;
        for (int64_t e = 0; e < HS; ++e) {
          const size_t at = size_t((b * s.T + t) * C + h * HS + e);
          d += double(dout[at]) * out[at];
        }
        dsum[size_t((b * s.NH + h) * s.T + t)] = float(d);
      }
    }
  }
  std::vector<Bf16> qkv_in, dout_in, dqkv(qkv.size(), Bf16(NAN));  // NaN wherever the kernels should write
  for (float x : qkv) qkv_in.push_back(Bf16(x));
  for (float x : dout) dout_in.push_back(Bf16(x));
  const float scale = 1.0f / std::sqrt(float(HS));
  const emulation::Dim3 grid{unsigned(s.B * s.NH), unsigned(blocks), 1};
  const unsigned threads = mma::kMmaWarps * emulation::kWarpSize;
  if (one_pass) {
    // The sums start as garbage (the first adder stores), the counts at zero.
    std::vector<float> dq_sum(size_t(s.B * s.T * C), NAN);
    std::vector<int> counts(size_t(s.B * s.NH * blocks + 1), 0);  // then the ticket counter
    emulation::RunBlocks(
        grid, threads, mma::MmaBackwardKeysSharedBytes<HS, true>(),
        [&] {
          mma::MmaFlashBackwardKeys<Bf16, HS, true>(dqkv.data(), dout_in.data(), qkv_in.data(), lse.data(), dsum.data(),
                                                    s.T, C, int(s.NH), scale, dq_sum.data(), counts.data());
        },
        shuffle_seed);
    // Every query block but the first got one release per key block above
    // 0, and every block took one ticket.
    for (int64_t bh = 0; bh < s.B * s.NH; ++bh) {
      for (int64_t i = 0; i < blocks; ++i) EXPECT_EQ(counts[size_t(bh * blocks + i)], int(i)) << "count " << i;
    }
    EXPECT_EQ(counts.back(), int(s.B * s.NH * blocks)) << "tickets";
  } else {
    emulation::RunBlocks(grid, threads, mma::MmaBackwardKeysSharedBytes<HS>(), [&] {
      mma::MmaFlashBackwardKeys<Bf16, HS>(dqkv.data(), dout_in.data(), qkv_in.data(), lse.data(), dsum.data(), s.T, C,
                                          int(s.NH), scale);
    });
    emulation::RunBlocks(grid, threads, mma::MmaBackwardQueriesSharedBytes<HS>(), [&] {
      mma::MmaFlashBackwardQueries<Bf16, HS>(dqkv.data(), dout_in.data(), qkv_in.data(), lse.data(), dsum.data(), s.T,
                                             C, int(s.NH), scale);
    });
    // The two passes on 128 rows a block over 8 warps: each key and each
    // query meets the same blocks in the same order, so the same bits.
    constexpr int kWide = 2 * mma::kMmaWarps;
    const emulation::Dim3 wide_grid{unsigned(s.B * s.NH), unsigned((s.T + 16 * kWide - 1) / (16 * kWide)), 1};
    const unsigned wide_threads = kWide * emulation::kWarpSize;
    std::vector<Bf16> wide(dqkv.size(), Bf16(NAN));
    emulation::RunBlocks(wide_grid, wide_threads, mma::MmaBackwardKeysSharedBytes<HS, false, kWide>(), [&] {
      mma::MmaFlashBackwardKeys<Bf16, HS, false, 1, kWide>(wide.data(), dout_in.data(), qkv_in.data(), lse.data(),
                                                           dsum.data(), s.T, C, int(s.NH), scale);
    });
    emulation::RunBlocks(wide_grid, wide_threads, mma::MmaBackwardQueriesSharedBytes<HS, kWide>(), [&] {
      mma::MmaFlashBackwardQueries<Bf16, HS, kWide>(wide.data(), dout_in.data(), qkv_in.data(), lse.data(), dsum.data(),
                                                    s.T, C, int(s.NH), scale);
    });
    EXPECT_EQ(0, std::memcmp(wide.data(), dqkv.data(), dqkv.size() * sizeof(Bf16))) << "128 rows a block";
  }
  // q, k and v gradients each against their own scale, at least the whole
  // gradient's: dq and dk cancel to zero at one position (T = 1), where
  // only rounding is left of them. P, dS and the outputs are rounded to bf16.
  double floor = 0;
  for (float w : dqkv_cpu) floor = std::max(floor, double(std::fabs(w)));
  for (int part = 0; part < 3; ++part) {
    std::vector<float> got, want;
    for (int64_t row = 0; row < s.B * s.T; ++row) {
      for (int64_t c = 0; c < C; ++c) {
        got.push_back(float(dqkv[size_t(row * 3 * C + part * C + c)]));
        want.push_back(dqkv_cpu[size_t(row * 3 * C + part * C + c)]);
      }
    }
    EXPECT_LT(RelativeError(got, want, floor), 2e-2) << "d"
                                                     << "qkv"[part];
  }
}

TEST(MmaAttentionEmulated, BackwardMatchesTheCpuKernel) {
  std::mt19937 rng(std::random_device{}());
  for (const Shape& s : {Shape{1, 1, 1}, Shape{1, 64, 1}, Shape{2, 77, 1}, Shape{1, 130, 1}, Shape{1, 200, 1}}) {
    ExpectBackwardMatchesCpu<64>(s, rng);
  }
  for (const Shape& s : {Shape{1, 5, 1}, Shape{1, 129, 1}}) ExpectBackwardMatchesCpu<128>(s, rng);
}

// Five products: dq from each key block's dS, added in a fixed order across
// key blocks; one block (T <= 64), several (the diagonal's skipped k-steps,
// a partial last block), several heads and batches, and a fresh length.
TEST(MmaAttentionEmulated, OnePassBackwardMatchesTheCpuKernel) {
  std::mt19937 rng(std::random_device{}());
  for (const Shape& s : {Shape{1, 1, 1}, Shape{1, 64, 2}, Shape{2, 77, 1}, Shape{1, 200, 2}}) {
    ExpectBackwardMatchesCpu<64>(s, rng, true);
  }
  for (const Shape& s : {Shape{1, 5, 1}, Shape{1, 129, 1}}) ExpectBackwardMatchesCpu<128>(s, rng, true);
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 pick(seed);
  ExpectBackwardMatchesCpu<64>({1, std::uniform_int_distribution<int64_t>(1, 260)(pick), 1}, rng, true);
  // The blocks started in a shuffled order: they take their work by ticket,
  // so each still waits only on work already begun.
  ExpectBackwardMatchesCpu<64>({2, 200, 2}, rng, true, seed | 1u);
}

TEST(MmaAttentionEmulated, ForwardMatchesTheCpuKernelAtHeadSize64) {
  std::mt19937 rng(std::random_device{}());
  // One position, T off and across the 64- and 128-position blocks (the
  // diagonal's skipped n-tiles in every warp, the key block the first four
  // of eight warps skip, a partial last block), several heads.
  for (const Shape& s : {Shape{1, 1, 1}, Shape{1, 64, 2}, Shape{2, 77, 1}, Shape{1, 128, 1}, Shape{1, 200, 3}}) {
    ExpectMatchesCpu<64>(s, rng);
  }
}

TEST(MmaAttentionEmulated, ForwardMatchesTheCpuKernelAtHeadSize128) {
  std::mt19937 rng(std::random_device{}());
  for (const Shape& s : {Shape{1, 5, 1}, Shape{1, 129, 2}}) ExpectMatchesCpu<128>(s, rng);
  // And a fresh length each run.
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 pick(seed);
  ExpectMatchesCpu<128>({1, std::uniform_int_distribution<int64_t>(1, 260)(pick), 1}, rng);
}

}  // namespace
}  // namespace pstar::test
