// The mma.sync attention forward (kernels/cuda/attention_mma.cuh) run on the
// host through the warp emulation (tests/kernels/cuda/warp_emulation.h),
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

template <int HS>
void ExpectMatchesCpu(const Shape& s, std::mt19937& rng) {
  SCOPED_TRACE(testing::Message() << "B=" << s.B << " T=" << s.T << " NH=" << s.NH << " head size " << HS);
  const int64_t C = HS * s.NH, blocks = (s.T + mma::kBlock - 1) / mma::kBlock;
  std::normal_distribution<float> normal;
  std::vector<float> qkv(size_t(s.B * s.T * 3 * C));
  for (float& x : qkv) x = float(Bf16(2.0f * normal(rng)));  // the values the kernel sees
  std::vector<float> out_cpu(size_t(s.B * s.T * C)), lse_cpu(size_t(s.B * s.NH * s.T));
  kernels::cpu::AttentionForward(out_cpu.data(), lse_cpu.data(), qkv.data(), s.B, s.T, C, s.NH);

  std::vector<Bf16> qkv_in;
  for (float x : qkv) qkv_in.push_back(Bf16(x));
  ASSERT_EQ(reinterpret_cast<uintptr_t>(qkv_in.data()) % 16, 0u) << "the kernel's copies need 16-byte rows";
  std::vector<Bf16> out(out_cpu.size(), Bf16(NAN));  // NaN wherever the kernel should write
  std::vector<float> lse(lse_cpu.size(), NAN);
  const float scale_log2 = 1.4426950408889634f / std::sqrt(float(HS));
  emulation::RunBlocks(
      {unsigned(s.B * s.NH), unsigned(blocks), 1}, mma::kMmaWarps * emulation::kWarpSize,
      mma::MmaForwardSharedBytes<HS>(),
      [&] { mma::MmaFlashForward<Bf16, HS>(out.data(), lse.data(), qkv_in.data(), s.T, C, int(s.NH), scale_log2); });
  std::vector<float> got;
  for (Bf16 x : out) got.push_back(float(x));
  // P is rounded to bf16 for P v (as on a GPU), the output to bf16.
  EXPECT_LT(RelativeError(got, out_cpu), 1e-2) << "out";
  // The scores' products are exact and their sums fp32: lse is fp32's.
  EXPECT_LT(RelativeError(lse, lse_cpu), 1e-5) << "lse";
}

TEST(MmaAttentionEmulated, ForwardMatchesTheCpuKernelAtHeadSize64) {
  std::mt19937 rng(std::random_device{}());
  // One position, T off and across the 64-position block (the diagonal's
  // skipped n-tiles in every warp, a partial last block), several heads.
  for (const Shape& s : {Shape{1, 1, 1}, Shape{1, 64, 2}, Shape{2, 77, 1}, Shape{1, 200, 3}}) {
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
