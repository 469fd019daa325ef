#include "worker/model/model_kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
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

// A vocabulary table's row parts (VocabPartRows) taken in turn give the
// encoder's bits over the whole table, in every precision.
TEST(ModelKernels, EncoderRowPartsInTurnGiveTheWholeTablesBits) {
  const int64_t B = 3, T = 11, C = 20, V = 192, kRows[3] = {64, 64, 64};
  std::mt19937 rng(5);
  std::vector<int32_t> tokens(size_t(B * T));
  for (auto& t : tokens) t = int32_t(rng() % uint32_t(V));
  for (Precision precision : {Precision::kFp32, Precision::kBf16, Precision::kFp16}) {
    const std::string at = PrecisionName(precision);
    auto kernels = MakeCpuModelKernels(precision);
    Operand wte = RandomOperand(precision, V * C, 6);
    Operand whole = RandomOperand(precision, B * T * C, 7), parts = RandomOperand(precision, B * T * C, 8);
    kernels->EncoderForward(whole.act(), tokens.data(), nullptr, wte.param(), Param{}, B, T, C);
    int64_t row0 = 0;
    for (int64_t rows : kRows) {
      Param part = wte.param();
      if (part.f32 != nullptr) part.f32 += row0 * C;
      if (part.h16 != nullptr) part.h16 += row0 * C;
      kernels->EncoderPartForward(parts.act(), tokens.data(), part, row0, rows, B, T, C);
      row0 += rows;
    }
    if (precision == Precision::kFp32) {
      EXPECT_EQ(parts.f32, whole.f32) << at;
    } else {
      EXPECT_EQ(parts.h16, whole.h16) << at;
    }

    Operand dout = RandomOperand(Precision::kFp32, B * T * C, 9);
    std::vector<float> dwte(size_t(V * C), 0.25f), dparts = dwte;
    kernels->EncoderBackward(dwte.data(), nullptr, dout.f32.data(), tokens.data(), nullptr, B, T, C);
    row0 = 0;
    for (int64_t rows : kRows) {
      kernels->EncoderPartBackward(dparts.data() + row0 * C, dout.f32.data(), tokens.data(), row0, rows, B, T, C);
      row0 += rows;
    }
    EXPECT_EQ(dparts, dwte) << at;
  }
}

// Widened values of an operand (fp32, or its 16 bits).
std::vector<double> Values(Precision precision, const Operand& o) {
  std::vector<double> v(o.f32.size());
  const HalfFormat format = precision == Precision::kFp16 ? HalfFormat::kFp16 : HalfFormat::kBf16;
  std::vector<float> wide(o.f32.size());
  if (!o.h16.empty()) WidenFromHalf(wide.data(), o.h16.data(), int64_t(o.h16.size()), format);
  for (size_t i = 0; i < v.size(); ++i) v[i] = o.h16.empty() ? o.f32[i] : wide[i];
  return v;
}

double MaxRelative(const std::vector<double>& got, const std::vector<double>& want) {
  double worst = 0, scale = 0;
  for (double w : want) scale = std::max(scale, std::abs(w));
  for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::abs(got[i] - want[i]) / scale);
  return worst;
}

// The classifier part by part: each part writes its columns of the logits
// (rows Vp apart), the input gradient sums over the parts in fp32, and each
// part's weight gradient is its rows of the whole one; against float64 from
// the operands as the kernels read them.
TEST(ModelKernels, ClassifierRowPartsComputeTheWholeClassifier) {
  const int64_t N = 13, C = 24, Vp = 192, kRows[2] = {128, 64};
  for (Precision precision : {Precision::kFp32, Precision::kBf16, Precision::kFp16}) {
    const std::string at = PrecisionName(precision);
    const bool half = precision != Precision::kFp32;
    auto kernels = MakeCpuModelKernels(precision);
    Operand inp = RandomOperand(precision, N * C, 11), w = RandomOperand(precision, Vp * C, 12);
    Operand logits = RandomOperand(precision, N * Vp, 13), dlogits = RandomOperand(precision, N * Vp, 14);
    const std::vector<double> x = Values(precision, inp), wv = Values(precision, w), d = Values(precision, dlogits);
    std::vector<float> dinp(size_t(N * C), 0.0f), dw(size_t(Vp * C), 0.5f);
    int64_t row0 = 0;
    for (int p = 0; p < 2; ++p) {
      Param part = w.param();
      if (part.f32 != nullptr) part.f32 += row0 * C;
      if (part.h16 != nullptr) part.h16 += row0 * C;
      kernels->ClassifierPartForward(logits.act(), inp.act(), part, N, C, row0, kRows[p], Vp);
      kernels->ClassifierPartBackward(dinp.data(), p > 0, dw.data() + row0 * C, dlogits.act(), inp.act(), part, N, C,
                                      row0, kRows[p], Vp);
      row0 += kRows[p];
    }
    std::vector<double> want_logits(size_t(N * Vp), 0.0), want_dinp(size_t(N * C), 0.0), want_dw(size_t(Vp * C), 0.5);
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t v = 0; v < Vp; ++v) {
        for (int64_t c = 0; c < C; ++c) {
          want_logits[size_t(n * Vp + v)] += x[size_t(n * C + c)] * wv[size_t(v * C + c)];
          want_dinp[size_t(n * C + c)] += d[size_t(n * Vp + v)] * wv[size_t(v * C + c)];
          want_dw[size_t(v * C + c)] += d[size_t(n * Vp + v)] * x[size_t(n * C + c)];
        }
      }
    }
    // A 16-bit output is rounded once (bf16 keeps 8 bits); the gradients are fp32.
    EXPECT_LT(MaxRelative(Values(precision, logits), want_logits), half ? 8e-3 : 1e-6) << at;
    EXPECT_LT(MaxRelative(std::vector<double>(dinp.begin(), dinp.end()), want_dinp), 1e-6) << at;
    EXPECT_LT(MaxRelative(std::vector<double>(dw.begin(), dw.end()), want_dw), 1e-6) << at;
    // Narrow rounds an fp32 sum into the run's format.
    Operand out = RandomOperand(precision, N * C, 15);
    kernels->Narrow(out.act(), dinp.data(), N * C);
    EXPECT_LE(MaxRelative(Values(precision, out), std::vector<double>(dinp.begin(), dinp.end())), half ? 8e-3 : 0.0)
        << at;
  }
}

}  // namespace
}  // namespace pstar
