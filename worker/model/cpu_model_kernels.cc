// The CPU ModelKernels: the reference kernels, run at once on this thread.
// Each op is an OpScope: an NVTX range named by its ProfileOp (in a build
// with CUDA) and, with a timer, a timed span.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "kernels/cpu/column_sum.h"
#include "kernels/half.h"
#include "kernels/attention.h"
#include "kernels/classifier.h"
#include "kernels/encoder.h"
#include "kernels/gelu.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "kernels/reduce.h"
#include "kernels/residual.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"
#include "worker/model/model_kernels.h"

namespace pstar {

namespace {

namespace k = kernels::cpu;

// x rounded to `precision` and widened back: the value a 16-bit operand holds.
void RoundTo(Precision precision, const float* x, int64_t n, std::vector<float>& out) {
  out.resize(size_t(n));
  if (precision == Precision::kBf16) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) out[size_t(i)] = kernels::BFloat16ToFloat(kernels::FloatToBFloat16(x[i]));
  } else {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) out[size_t(i)] = kernels::HalfToFloat(kernels::FloatToHalf(x[i]));
  }
}

// 16 bits of `precision` widened to fp32 (exactly).
float Widen(Precision precision, uint16_t h) {
  return precision == Precision::kBf16 ? kernels::BFloat16ToFloat(h) : kernels::HalfToFloat(h);
}

class CpuModelKernels final : public ModelKernels {
 public:
  explicit CpuModelKernels(Precision precision) : precision_(precision) {}
  ComputeDevice device() const override { return ComputeDevice::kCpu; }
  Precision precision() const override { return precision_; }
  void SetScratch(void*, int64_t) override {}
  void DownloadRows(float* dst, ActTensor src, int64_t rows, int64_t cols, int64_t ld) override {
    if (!Is16(src)) {
      for (int64_t r = 0; r < rows; ++r) std::memcpy(dst + r * cols, src.f32 + r * ld, size_t(cols) * sizeof(float));
      return;
    }
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < cols; ++j) dst[r * cols + j] = Widen(precision_, src.h16[r * ld + j]);
    }
  }
  void Upload(int32_t* dst, const int32_t* src, int64_t n) override {
    OpScope op(timer(), ProfileOp::kUpload);
    std::memcpy(dst, src, size_t(n) * sizeof(int32_t));
  }
  void Upload(float* dst, const float* src, int64_t n) override {
    OpScope op(timer(), ProfileOp::kUpload);
    std::memcpy(dst, src, size_t(n) * sizeof(float));
  }
  void Zero(float* dst, int64_t n) override {
    OpScope op(timer(), ProfileOp::kZero);
    std::memset(dst, 0, size_t(n) * sizeof(float));
  }
  void AddToLossSum(const float* x, int64_t n) override {
    OpScope op(timer(), ProfileOp::kLossSum);
    for (int64_t i = 0; i < n; ++i) loss_sum_ += x[i];
  }
  double TakeLossSum() override { return std::exchange(loss_sum_, 0.0); }
  double TakeStepSums(std::span<const Span> spans, double* sums) override {
    for (size_t i = 0; i < spans.size(); ++i) sums[i] = k::SumOfSquares(spans[i].data, spans[i].n);
    return TakeLossSum();
  }
  void RoundToPrecision(float* x, int64_t n) override {
    OpScope op(timer(), ProfileOp::kGradRound);
    if (precision_ == Precision::kBf16) {
      for (int64_t i = 0; i < n; ++i) x[i] = pstar::kernels::BFloat16ToFloat(pstar::kernels::FloatToBFloat16(x[i]));
    } else if (precision_ == Precision::kFp16) {
      for (int64_t i = 0; i < n; ++i) x[i] = pstar::kernels::HalfToFloat(pstar::kernels::FloatToHalf(x[i]));
    }
  }
  void EncoderForward(ActTensor out, const int32_t* tokens, const int32_t* positions, Param wte, Param wpe, int64_t B,
                      int64_t T, int64_t C) override {
    OpScope op(timer(), ProfileOp::kEncoderForward);
    if (!Is16(out)) return k::EncoderForward(out.f32, tokens, positions, Fp32(wte), Fp32(wpe), B, T, C);
    if (wte.h16 == nullptr) return k::EncoderForward(out.h16, bf16(), tokens, positions, wte.f32, wpe.f32, B, T, C);
    k::EncoderForward(out.h16, tokens, positions, Half(wte), wpe.empty() ? nullptr : Half(wpe), bf16(), B, T, C);
  }
  void EncoderBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, const int32_t* positions,
                       int64_t B, int64_t T, int64_t C) override {
    OpScope op(timer(), ProfileOp::kEncoderBackward);
    k::EncoderBackward(dwte, dwpe, dout, tokens, positions, B, T, C);
  }
  void ResidualLayerNormForward(ActTensor res, ActTensor out, float* mean, float* rstd, ActTensor a, const float* b,
                                Param weight, Param bias, int64_t N, int64_t C) override {
    OpScope op(timer(), ProfileOp::kLayerNormForward);
    const float* w = Wide(weight, C, norm_weight_);
    const float* bi = Wide(bias, C, norm_bias_);
    if (Is16(res, out, a)) {
      return k::ResidualLayerNormForward(res.h16, out.h16, mean, rstd, a.h16, b, bf16(), w, bi, N, C);
    }
    k::ResidualLayerNormForward(res.f32, out.f32, mean, rstd, a.f32, b, w, bi, N, C);
  }
  void LayerNormForward(ActTensor out, float* mean, float* rstd, ActTensor inp, Param weight, Param bias,
                        int64_t N, int64_t C) override {
    OpScope op(timer(), ProfileOp::kLayerNormForward);
    const float* w = Wide(weight, C, norm_weight_);
    const float* bi = Wide(bias, C, norm_bias_);
    if (Is16(out, inp)) return k::LayerNormForward(out.h16, mean, rstd, inp.h16, bf16(), w, bi, N, C);
    k::LayerNormForward(out.f32, mean, rstd, inp.f32, w, bi, N, C);
  }
  // The norms' backward: a 16-bit dout is widened exactly, the fp32 kernel
  // runs, and the copy is dinp's new values rounded: the GPU kernel's
  // arithmetic in one pass.
  void LayerNormBackward(float* dinp, ActTensor dinp_copy, float* dweight, float* dbias, ActTensor dout,
                         ActTensor inp, Param weight, const float* mean, const float* rstd, int64_t N,
                         int64_t C) override {
    const auto [w, dy] = NormBackwardOperands(weight, dout, N, C);
    {
      OpScope op(timer(), ProfileOp::kLayerNormBackward);
      if (Is16(inp)) {
        k::LayerNormBackward(dinp, dweight, dbias, dy, inp.h16, bf16(), w, mean, rstd, N, C);
      } else {
        k::LayerNormBackward(dinp, dweight, dbias, dy, inp.f32, w, mean, rstd, N, C);
      }
      NarrowGradCopy(dinp, dinp_copy, N * C);
    }
  }
  void MatmulForward(LinearRole role, ActTensor out, ActTensor inp, Param weight, Param bias, int64_t N, int64_t C,
                     int64_t OC) override {
    const float* b = nullptr;
    const float* w = nullptr;
    if (Is16(inp)) {
      // The operands as the GPU multiplies them (its casts happen where the
      // data is written; here they are an emulation's).
      OpScope cast(timer(), ProfileOp::kCast);
      b = Wide(bias, OC, bias_);
      WidenInto(inp.h16, N * C, inp_);
      w = Operand(weight, OC * C);
    } else {
      b = Wide(bias, OC, bias_);
    }
    OpScope op(timer(), GemmOp(role, GemmPass::kForward));
    if (!Is16(inp)) return k::MatmulForward(Fp32Out(out), inp.f32, Fp32(weight), b, N, C, OC);
    if (out.f32 != nullptr) return k::MatmulForward(out.f32, inp_.data(), w, b, N, C, OC);
    // A 16-bit output: x·w + b in fp32, rounded once, as the GPU's GEMM
    // rounds its fp32 accumulator.
    out_.resize(size_t(N * OC));
    k::MatmulForward(out_.data(), inp_.data(), w, b, N, C, OC);
    NarrowInto(out_.data(), N * OC, out.h16);
  }
  // The same GEMMs as kernels::cpu::MatmulBackward, one at a time so the
  // profile sees each. In a 16-bit run dout is 16-bit (widened exactly) and
  // dinp is computed in fp32 and rounded once, as the GPU's GEMM rounds its
  // accumulator.
  void MatmulBackward(LinearRole role, ActTensor dinp, float* dweight, float* dbias, ActTensor dout, ActTensor inp,
                      Param weight, int64_t N, int64_t C, int64_t OC) override {
    const bool input_grad = dinp.f32 != nullptr || dinp.h16 != nullptr;
    const bool half = input_grad ? Is16(dinp, dout, inp) : Is16(dout, inp);
    const float* x = inp.f32;
    const float* w = nullptr;
    const float* d = dout.f32;
    float* dx = dinp.f32;
    if (half) {
      OpScope cast(timer(), ProfileOp::kCast);
      if (dweight != nullptr) {
        WidenInto(inp.h16, N * C, inp_);
        x = inp_.data();
      }
      if (input_grad) {
        w = Operand(weight, OC * C);
        grad_.resize(size_t(N * C));
        dx = grad_.data();
      }
      WidenInto(dout.h16, N * OC, dout_);
      d = dout_.data();
    } else if (input_grad) {
      w = Fp32(weight);
    }
    if (input_grad) {
      OpScope op(timer(), GemmOp(role, GemmPass::kInputGrad));
      k::Gemm(false, false, N, C, OC, 1.0f, d, OC, w, C, 0.0f, dx, C);
      if (half) NarrowInto(dx, N * C, dinp.h16);
    }
    if (dweight != nullptr) {
      OpScope op(timer(), GemmOp(role, GemmPass::kWeightGrad));
      k::Gemm(true, false, OC, C, N, 1.0f, d, OC, x, C, 1.0f, dweight, C);
    }
    if (dbias != nullptr) {
      OpScope op(timer(), ProfileOp::kBiasGrad);
      k::AccumulateColumns(dbias, N, OC, [&](int64_t n, int64_t j) { return d[n * OC + j]; });
    }
  }
  void AttentionForward(ActTensor out, float* lse, ActTensor qkv, const kernels::AttentionShape& shape) override {
    OpScope op(timer(), ProfileOp::kAttentionForward);
    if (Is16(out, qkv)) return k::AttentionForward(out.h16, lse, qkv.h16, bf16(), shape);
    k::AttentionForward(out.f32, lse, qkv.f32, shape);
  }
  // In a 16-bit run dout is widened exactly and dqkv computed in fp32
  // (rotated back there with RoPE) and rounded once.
  void AttentionBackward(ActTensor dqkv, ActTensor dout, ActTensor qkv, ActTensor out, const float* lse,
                         const kernels::AttentionShape& shape, const RopeTable* rope) override {
    const int64_t rows = shape.B * shape.T, n = rows * shape.RowElements();
    const bool half = Is16(dqkv, dout, qkv, out);
    float* dx = dqkv.f32;
    {
      OpScope op(timer(), ProfileOp::kAttentionBackward);
      if (!half) {
        k::AttentionBackward(dqkv.f32, dout.f32, qkv.f32, out.f32, lse, shape);
      } else {
        const float* dy = GradIn(dout, rows * shape.NH * shape.hs, dout_);
        grad_.resize(size_t(n));
        dx = grad_.data();
        k::AttentionBackward(dx, dy, qkv.h16, out.h16, bf16(), lse, shape);
      }
    }
    if (rope != nullptr) {
      OpScope op(timer(), ProfileOp::kRopeBackward);
      k::RopeBackward(dx, shape.RowElements(), rope->cos, rope->sin, rope->positions, rows, shape.NH + shape.NKV,
                      shape.hs);
    }
    if (half) NarrowInto(dx, n, dqkv.h16);
  }
  void RmsNormForward(ActTensor out, float* rstd, ActTensor inp, Param weight, float eps, int64_t N,
                      int64_t C) override {
    OpScope op(timer(), ProfileOp::kRmsNormForward);
    const float* w = Wide(weight, C, norm_weight_);
    if (Is16(out, inp)) return k::RmsNormForward(out.h16, rstd, inp.h16, bf16(), w, eps, N, C);
    k::RmsNormForward(out.f32, rstd, inp.f32, w, eps, N, C);
  }
  void ResidualRmsNormForward(ActTensor res, ActTensor out, float* rstd, ActTensor a, const float* b, Param weight,
                              float eps, int64_t N, int64_t C) override {
    OpScope op(timer(), ProfileOp::kRmsNormForward);
    const float* w = Wide(weight, C, norm_weight_);
    if (Is16(res, out, a)) return k::ResidualRmsNormForward(res.h16, out.h16, rstd, a.h16, b, bf16(), w, eps, N, C);
    k::ResidualRmsNormForward(res.f32, out.f32, rstd, a.f32, b, w, eps, N, C);
  }
  void RmsNormBackward(float* dinp, ActTensor dinp_copy, float* dweight, ActTensor dout, ActTensor inp, Param weight,
                       const float* rstd, int64_t N, int64_t C) override {
    const auto [w, dy] = NormBackwardOperands(weight, dout, N, C);
    {
      OpScope op(timer(), ProfileOp::kRmsNormBackward);
      if (Is16(inp)) {
        k::RmsNormBackward(dinp, dweight, dy, inp.h16, bf16(), w, rstd, N, C);
      } else {
        k::RmsNormBackward(dinp, dweight, dy, inp.f32, w, rstd, N, C);
      }
      NarrowGradCopy(dinp, dinp_copy, N * C);
    }
  }
  void RopeForward(ActTensor qkv, const kernels::AttentionShape& shape, const RopeTable& rope) override {
    OpScope op(timer(), ProfileOp::kRopeForward);
    const int64_t rows = shape.B * shape.T, heads = shape.NH + shape.NKV;
    if (Is16(qkv)) {
      return k::RopeForward(qkv.h16, bf16(), shape.RowElements(), rope.cos, rope.sin, rope.positions, rows, heads,
                            shape.hs);
    }
    k::RopeForward(qkv.f32, shape.RowElements(), rope.cos, rope.sin, rope.positions, rows, heads, shape.hs);
  }
  void SwiGluForward(ActTensor out, ActTensor gu, int64_t N, int64_t F) override {
    OpScope op(timer(), ProfileOp::kSwiGluForward);
    if (Is16(out, gu)) return k::SwiGluForward(out.h16, gu.h16, bf16(), N, F);
    k::SwiGluForward(out.f32, gu.f32, N, F);
  }
  void SwiGluBackward(ActTensor dgu, ActTensor gu, ActTensor dout, int64_t N, int64_t F) override {
    OpScope op(timer(), ProfileOp::kSwiGluBackward);
    if (!Is16(dgu, gu, dout)) return k::SwiGluBackward(dgu.f32, gu.f32, dout.f32, N, F);
    const float* dy = GradIn(dout, N * F, dout_);
    grad_.resize(size_t(2 * N * F));
    k::SwiGluBackward(grad_.data(), gu.h16, bf16(), dy, N, F);
    NarrowInto(grad_.data(), 2 * N * F, dgu.h16);
  }
  void EncoderPartForward(ActTensor out, const int32_t* tokens, Param part, int64_t row0, int64_t rows, int64_t B,
                          int64_t T, int64_t C) override {
    OpScope op(timer(), ProfileOp::kEncoderForward);
    if (!Is16(out)) return k::EncoderPartForward(out.f32, tokens, Fp32(part), row0, rows, B, T, C);
    if (part.h16 == nullptr) return k::EncoderPartForward(out.h16, bf16(), tokens, part.f32, row0, rows, B, T, C);
    k::EncoderPartForward(out.h16, tokens, part.h16, bf16(), row0, rows, B, T, C);
  }
  void EncoderPartBackward(float* dpart, const float* dout, const int32_t* tokens, int64_t row0, int64_t rows,
                           int64_t B, int64_t T, int64_t C) override {
    OpScope op(timer(), ProfileOp::kEncoderBackward);
    k::EncoderPartBackward(dpart, dout, tokens, row0, rows, B, T, C);
  }
  // MatmulForward's GEMM over the part's columns, rows Vp apart.
  void ClassifierPartForward(ActTensor logits, ActTensor inp, Param part, int64_t N, int64_t C, int64_t row0,
                             int64_t rows, int64_t Vp) override {
    if (!Is16(logits, inp)) {
      OpScope op(timer(), GemmOp(LinearRole::kClassifier, GemmPass::kForward));
      return k::Gemm(false, true, N, rows, C, 1.0f, inp.f32, C, Fp32(part), C, 0.0f, logits.f32 + row0, Vp);
    }
    const float* w = nullptr;
    {
      OpScope cast(timer(), ProfileOp::kCast);
      WidenInto(inp.h16, N * C, inp_);
      w = Operand(part, rows * C);
    }
    OpScope op(timer(), GemmOp(LinearRole::kClassifier, GemmPass::kForward));
    out_.resize(size_t(N * rows));
    k::Gemm(false, true, N, rows, C, 1.0f, inp_.data(), C, w, C, 0.0f, out_.data(), rows);
    for (int64_t n = 0; n < N; ++n) NarrowInto(out_.data() + n * rows, rows, logits.h16 + n * Vp + row0);
  }
  // MatmulBackward's GEMMs over the part's columns of dlogits.
  void ClassifierPartBackward(float* dinp, bool accumulate, float* dpart, ActTensor dlogits, ActTensor inp,
                              Param part, int64_t N, int64_t C, int64_t row0, int64_t rows, int64_t Vp) override {
    const bool half = Is16(dlogits, inp);
    const float* d = dlogits.f32 + (half ? 0 : row0);
    int64_t ld = Vp;
    const float* x = inp.f32;
    const float* w = nullptr;
    if (half) {
      OpScope cast(timer(), ProfileOp::kCast);
      dout_.resize(size_t(N * rows));
#pragma omp parallel for schedule(static)
      for (int64_t n = 0; n < N; ++n) {
        for (int64_t j = 0; j < rows; ++j) dout_[size_t(n * rows + j)] = Widen(precision_, dlogits.h16[n * Vp + row0 + j]);
      }
      d = dout_.data();
      ld = rows;
      if (dpart != nullptr) {
        WidenInto(inp.h16, N * C, inp_);
        x = inp_.data();
      }
      if (dinp != nullptr) w = Operand(part, rows * C);
    } else if (dinp != nullptr) {
      w = Fp32(part);
    }
    if (dinp != nullptr) {
      OpScope op(timer(), GemmOp(LinearRole::kClassifier, GemmPass::kInputGrad));
      k::Gemm(false, false, N, C, rows, 1.0f, d, ld, w, C, accumulate ? 1.0f : 0.0f, dinp, C);
    }
    if (dpart != nullptr) {
      OpScope op(timer(), GemmOp(LinearRole::kClassifier, GemmPass::kWeightGrad));
      k::Gemm(true, false, rows, C, N, 1.0f, d, ld, x, C, 1.0f, dpart, C);
    }
  }
  void Narrow(ActTensor out, const float* x, int64_t n) override {
    if (!Is16(out)) {
      if (out.f32 != x) std::memcpy(out.f32, x, size_t(n) * sizeof(float));
      return;
    }
    OpScope op(timer(), ProfileOp::kCast);
    NarrowInto(x, n, out.h16);
  }
  bool HasLlamaOps() const override { return true; }
  void GeluForward(ActTensor out, ActTensor inp, int64_t n) override {
    OpScope op(timer(), ProfileOp::kGeluForward);
    if (Is16(out, inp)) return k::GeluForward(out.h16, inp.h16, bf16(), n);
    k::GeluForward(out.f32, inp.f32, n);
  }
  void GeluBackward(ActTensor dinp, ActTensor inp, ActTensor dout, int64_t n) override {
    OpScope op(timer(), ProfileOp::kGeluBackward);
    if (!Is16(dinp, inp, dout)) return k::GeluBackward(dinp.f32, inp.f32, dout.f32, n);
    const float* dy = GradIn(dout, n, dout_);
    grad_.resize(size_t(n));
    k::GeluBackward(grad_.data(), inp.h16, bf16(), dy, n);
    NarrowInto(grad_.data(), n, dinp.h16);
  }
  void ResidualForward(ActTensor out, ActTensor a, const float* b, int64_t n) override {
    OpScope op(timer(), ProfileOp::kResidual);
    if (Is16(out, a)) return k::ResidualForward(out.h16, a.h16, b, bf16(), n);
    k::ResidualForward(out.f32, a.f32, b, n);
  }
  void CrossEntropy(float* losses, ActTensor logits, const int32_t* targets, float dloss, bool write_dlogits,
                    int64_t N, int64_t V, int64_t Vp) override {
    OpScope op(timer(), ProfileOp::kCrossEntropy);
    if (Is16(logits)) return k::CrossEntropy(losses, logits.h16, bf16(), targets, dloss, write_dlogits, N, V, Vp);
    k::CrossEntropy(losses, logits.f32, targets, dloss, write_dlogits, N, V, Vp);
  }

 private:
  bool bf16() const { return precision_ == Precision::kBf16; }
  // A norm's weight and dout as its fp32 backward reads them (in a 16-bit
  // run widened: a cast).
  std::pair<const float*, const float*> NormBackwardOperands(Param weight, ActTensor dout, int64_t N, int64_t C) {
    if (precision_ == Precision::kFp32) return {weight.f32, dout.f32};
    OpScope cast(timer(), ProfileOp::kCast);
    const float* w = Wide(weight, C, norm_weight_);
    return {w, GradIn(dout, N * C, dout_)};
  }
  // dinp's new values rounded into its 16-bit copy; the copy exists in
  // 16-bit runs only (in an fp32 run dinp is the operand).
  void NarrowGradCopy(const float* dinp, ActTensor copy, int64_t n) {
    if (copy.f32 == nullptr && copy.h16 == nullptr) return;
    if (!Is16(copy)) Misuse("an fp32 run's norm gradient copy");
    NarrowInto(dinp, n, copy.h16);
  }
  // Whether the run's ActTensors are 16-bit; each given must be in the
  // run's format (every one is checked).
  template <typename... More>
  bool Is16(ActTensor x, More... more) const {
    const bool half = precision_ != Precision::kFp32;
    for (const ActTensor& t : {x, more...}) {
      if ((t.h16 != nullptr) != half || (t.f32 != nullptr) == half) Misuse("an ActTensor not in the run's format");
    }
    return half;
  }
  // An fp32 run's output (a 16-bit one only in a 16-bit run).
  float* Fp32Out(ActTensor x) const {
    if (x.f32 == nullptr) Misuse("a 16-bit ActTensor in an fp32 run");
    return x.f32;
  }
  // n floats rounded into the run's 16-bit format.
  void NarrowInto(const float* x, int64_t n, uint16_t* out) const {
    if (precision_ == Precision::kBf16) {
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) out[i] = kernels::FloatToBFloat16(x[i]);
    } else {
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) out[i] = kernels::FloatToHalf(x[i]);
    }
  }
  // An activation gradient as fp32: itself, or its 16 bits widened into `buf`.
  const float* GradIn(ActTensor g, int64_t n, std::vector<float>& buf) const {
    if (!Is16(g)) return g.f32;
    WidenInto(g.h16, n, buf);
    return buf.data();
  }
  // n 16-bit values widened into `out`.
  void WidenInto(const uint16_t* x, int64_t n, std::vector<float>& out) const {
    out.resize(size_t(n));
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) out[size_t(i)] = Widen(precision_, x[i]);
  }
  // An fp32 param (a 16-bit one only in a 16-bit precision).
  const float* Fp32(Param p) const {
    if (p.h16 != nullptr) Misuse("a 16-bit param in an fp32 run");
    return p.f32;
  }
  const uint16_t* Half(Param p) const {
    if (p.h16 == nullptr || precision_ == Precision::kFp32) Misuse("tables of one op in different formats");
    return p.h16;
  }
  // A param as fp32: itself, or its 16 bits widened into `buf` (null stays null).
  const float* Wide(Param p, int64_t n, std::vector<float>& buf) const {
    if (p.h16 == nullptr) return p.f32;
    if (precision_ == Precision::kFp32) Misuse("a 16-bit param in an fp32 run");
    buf.resize(size_t(n));
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) buf[size_t(i)] = Widen(precision_, p.h16[i]);
    return buf.data();
  }
  // A weight as a 16-bit GEMM operand, in weight_: widened, or an fp32 one rounded.
  const float* Operand(Param weight, int64_t n) {
    if (weight.h16 != nullptr) return Wide(weight, n, weight_);
    RoundTo(precision_, weight.f32, n, weight_);
    return weight_.data();
  }
  [[noreturn]] static void Misuse(const char* what) {
    std::fprintf(stderr, "pstar: internal error: %s\n", what);
    std::abort();
  }

  Precision precision_;
  double loss_sum_ = 0.0;
  std::vector<float> inp_, weight_, dout_;  // rounded operands, reused between calls
  std::vector<float> out_;  // a GEMM's fp32 output before it is rounded
  std::vector<float> grad_;  // an fp32 activation gradient before it is rounded
  std::vector<float> bias_, norm_weight_, norm_bias_;  // widened 16-bit params
};

}  // namespace

std::unique_ptr<ModelKernels> MakeCpuModelKernels(Precision precision) {
  return std::make_unique<CpuModelKernels>(precision);
}

}  // namespace pstar
