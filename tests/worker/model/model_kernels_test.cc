#include "worker/model/model_kernels.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "worker/runtime/half_format.h"

namespace pstar {
namespace {

// Random values in the run's format: fp32, or rounded to its 16-bit type.
struct Operand {
  std::vector<float> f32;
  std::vector<uint16_t> h16;
  ActTensor act() { return h16.empty() ? ActTensor{f32.data(), nullptr} : ActTensor{nullptr, h16.data()}; }
  Param param() const { return h16.empty() ? Param{f32.data(), nullptr} : Param{nullptr, h16.data()}; }
};

Operand RandomOperand(Precision precision, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Operand o;
  o.f32.resize(size_t(n));
  for (float& v : o.f32) v = normal(rng);
  if (precision != Precision::kFp32) {
    o.h16.resize(size_t(n));
    const HalfFormat format = precision == Precision::kFp16 ? HalfFormat::kFp16 : HalfFormat::kBf16;
    NarrowToHalf(o.h16.data(), o.f32.data(), n, format);
  }
  return o;
}

// The classifier's backward is taken in two calls, dinp at the turn from
// forward to backward and the weight gradient at the end (Gpt::Backward):
// each half alone gives the bits the whole call gives, accumulating into
// the same weight gradient.
TEST(ModelKernels, MatmulBackwardInTwoHalvesGivesTheBitsOfOne) {
  const int64_t N = 37, C = 24, OC = 50;
  for (Precision precision : {Precision::kFp32, Precision::kBf16, Precision::kFp16}) {
    auto kernels = MakeCpuModelKernels(precision);
    Operand dout = RandomOperand(precision, N * OC, 1), inp = RandomOperand(precision, N * C, 2);
    Operand weight = RandomOperand(precision, OC * C, 3);
    std::vector<float> dweight_start(size_t(OC * C));
    for (size_t i = 0; i < dweight_start.size(); ++i) dweight_start[i] = 0.01f * float(i % 7);
    std::vector<float> dbias_start(size_t(OC), 0.5f);

    Operand dinp_whole = RandomOperand(precision, N * C, 4), dinp_half = dinp_whole;
    std::vector<float> dweight_whole = dweight_start, dweight_half = dweight_start;
    std::vector<float> dbias_whole = dbias_start, dbias_half = dbias_start;
    kernels->MatmulBackward(LinearRole::kClassifier, dinp_whole.act(), dweight_whole.data(), dbias_whole.data(),
                            dout.act(), inp.act(), weight.param(), N, C, OC);
    kernels->MatmulBackward(LinearRole::kClassifier, dinp_half.act(), nullptr, nullptr, dout.act(), inp.act(),
                            weight.param(), N, C, OC);
    EXPECT_EQ(dweight_half, dweight_start) << "the input half wrote the weight gradient";
    kernels->MatmulBackward(LinearRole::kClassifier, ActTensor{}, dweight_half.data(), dbias_half.data(), dout.act(),
                            inp.act(), Param{}, N, C, OC);
    const std::string at = PrecisionName(precision);
    EXPECT_EQ(dinp_half.f32, dinp_whole.f32) << at;
    EXPECT_EQ(dinp_half.h16, dinp_whole.h16) << at;
    EXPECT_EQ(dweight_half, dweight_whole) << at;
    EXPECT_EQ(dbias_half, dbias_whole) << at;
    EXPECT_NE(dweight_whole, dweight_start) << at;
  }
}

}  // namespace
}  // namespace pstar
