// The CUDA ModelKernels: the kernels of kernels/cuda queued on the compute
// stream. Only TakeLossSum and TakeStepSums wait for the device. Each piece
// of work is an OpScope around its launches: an NVTX range named by its
// ProfileOp (nsys projects it onto the kernels) and, with a timer, a pair of
// timing events on the stream.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/classifier.h"
#include "kernels/cuda/cudnn_attention.h"
#include "kernels/cuda/encoder.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/layernorm.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/pointwise.h"
#include "kernels/cuda/reduce.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/swiglu.h"
#include "kernels/cuda/tuning.h"
#include "kernels/half.h"
#include "worker/model/model_kernels.h"

namespace pstar {

namespace {

namespace kc = kernels::cuda;

// A failed copy on the compute stream is as fatal as a failed launch.
void CheckCuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "pstar: CUDA %s failed: %s\n", what, cudaGetErrorString(e));
    std::abort();
  }
  kernels::cuda::SyncCheck(what);
}

class CudaModelKernels final : public ModelKernels {
 public:
  CudaModelKernels(cudaStream_t stream, Precision precision, kc::KernelTuning tuning)
      : stream_(stream), precision_(precision), tuning_(tuning) {}

  ComputeDevice device() const override { return ComputeDevice::kCuda; }
  Precision precision() const override { return precision_; }

  void SetScratch(void* scratch, int64_t bytes) override {
    auto* base = static_cast<std::byte*>(scratch);
    loss_sum_ = reinterpret_cast<double*>(base);
    CheckCuda(cudaMemsetAsync(loss_sum_, 0, sizeof(double), stream_), "memset");
    shared_ = base + 256;
    shared_bytes_ = bytes - 256;
  }

  void DownloadRows(float* dst, ActTensor src, int64_t rows, int64_t cols, int64_t ld) override {
    if (precision_ == Precision::kFp32) {
      CheckCuda(cudaMemcpy2DAsync(dst, size_t(cols) * sizeof(float), As<float>(src), size_t(ld) * sizeof(float),
                                  size_t(cols) * sizeof(float), size_t(rows), cudaMemcpyDeviceToHost, stream_),
                "download");
      CheckCuda(cudaStreamSynchronize(stream_), "download");
      return;
    }
    // 16 bits: packed into a host buffer, widened there.
    std::vector<uint16_t> packed(size_t(rows * cols));
    const uint16_t* h = src.h16;
    if (h == nullptr || src.f32 != nullptr) Internal("an ActTensor not in the run's format on the GPU");
    CheckCuda(cudaMemcpy2DAsync(packed.data(), size_t(cols) * 2, h, size_t(ld) * 2, size_t(cols) * 2, size_t(rows),
                                cudaMemcpyDeviceToHost, stream_),
              "download");
    CheckCuda(cudaStreamSynchronize(stream_), "download");
    const bool bf16 = precision_ == Precision::kBf16;
    for (size_t i = 0; i < packed.size(); ++i) {
      dst[i] = bf16 ? kernels::BFloat16ToFloat(packed[i]) : kernels::HalfToFloat(packed[i]);
    }
  }
  void Upload(int32_t* dst, const int32_t* src, int64_t n) override {
    OpScope op(timer(), ProfileOp::kUpload);
    // Pageable source: the copy is staged, and returns once the source may change.
    CheckCuda(cudaMemcpyAsync(dst, src, size_t(n) * sizeof(int32_t), cudaMemcpyHostToDevice, stream_),
              "token upload");
  }
  void Upload(float* dst, const float* src, int64_t n) override {
    OpScope op(timer(), ProfileOp::kUpload);
    CheckCuda(cudaMemcpyAsync(dst, src, size_t(n) * sizeof(float), cudaMemcpyHostToDevice, stream_), "table upload");
  }
  void Zero(float* dst, int64_t n) override {
    OpScope op(timer(), ProfileOp::kZero);
    CheckCuda(cudaMemsetAsync(dst, 0, size_t(n) * sizeof(float), stream_), "memset");
  }
  void AddToLossSum(const float* x, int64_t n) override {
    OpScope op(timer(), ProfileOp::kLossSum);
    Need(kc::ReduceScratchElements() * int64_t(sizeof(double)), "AddToLossSum");
    kc::Sum(loss_sum_, Shared<double>(), x, n, stream_);
  }
  double TakeLossSum() override {
    double host = 0;
    CheckCuda(cudaMemcpyAsync(&host, loss_sum_, sizeof(double), cudaMemcpyDeviceToHost, stream_), "download");
    CheckCuda(cudaMemsetAsync(loss_sum_, 0, sizeof(double), stream_), "memset");
    CheckCuda(cudaStreamSynchronize(stream_), "download");
    return host;
  }
  void RoundToPrecision(float* x, int64_t n) override {
    OpScope op(timer(), ProfileOp::kGradRound);
    if (precision_ == Precision::kBf16) kc::RoundThrough<kc::bf16>(x, n, stream_);
    if (precision_ == Precision::kFp16) kc::RoundThrough<kc::fp16>(x, n, stream_);
  }
  // Every span in two launches (kc::SumsOfSquares), as many spans at a time
  // as the scratch holds (all of them for any real model); the loss is
  // copied beside the last batch's sums on the device, so one download and
  // one wait bring both to the host.
  double TakeStepSums(std::span<const Span> spans, double* sums) override {
    if (spans.empty()) return TakeLossSum();
    const int64_t per_span = (kc::SumsOfSquaresScratchElements(1) + 1) * int64_t(sizeof(double)) +
                             int64_t(sizeof(kc::DeviceSpan));
    Need(per_span + int64_t(sizeof(double)), "TakeStepSums");
    const size_t batch =
        size_t(std::min<int64_t>((shared_bytes_ - int64_t(sizeof(double))) / per_span, kc::kMaxSumSpans));
    std::vector<kc::DeviceSpan> descriptors(std::min(batch, spans.size()));
    std::vector<double> downloaded(descriptors.size() + 1);
    double loss = 0.0;
    for (size_t first = 0; first < spans.size(); first += batch) {
      const size_t count = std::min(batch, spans.size() - first);
      const bool last = first + count == spans.size();
      // [partials][results, then the loss][descriptors], each 8-byte aligned.
      double* partials = Shared<double>();
      double* results = partials + kc::SumsOfSquaresScratchElements(int64_t(count));
      auto* device_spans = reinterpret_cast<kc::DeviceSpan*>(results + count + 1);
      for (size_t i = 0; i < count; ++i) descriptors[i] = {spans[first + i].data, spans[first + i].n};
      CheckCuda(cudaMemcpyAsync(device_spans, descriptors.data(), count * sizeof(kc::DeviceSpan),
                                cudaMemcpyHostToDevice, stream_),
                "upload");
      CheckCuda(cudaMemsetAsync(results, 0, count * sizeof(double), stream_), "memset");
      kc::SumsOfSquares(results, partials, device_spans, int64_t(count), stream_);
      if (last) {
        CheckCuda(cudaMemcpyAsync(results + count, loss_sum_, sizeof(double), cudaMemcpyDeviceToDevice, stream_),
                  "copy");
        CheckCuda(cudaMemsetAsync(loss_sum_, 0, sizeof(double), stream_), "memset");
      }
      const size_t n = count + (last ? 1 : 0);
      CheckCuda(cudaMemcpyAsync(downloaded.data(), results, n * sizeof(double), cudaMemcpyDeviceToHost, stream_),
                "download");
      CheckCuda(cudaStreamSynchronize(stream_), "download");
      std::copy(downloaded.begin(), downloaded.begin() + std::ptrdiff_t(count), sums + first);
      if (last) loss = downloaded[count];
    }
    return loss;
  }

  void EncoderForward(ActTensor out, const int32_t* tokens, const int32_t* positions, Param wte, Param wpe, int64_t B,
                      int64_t T, int64_t C) override {
    OpScope op(timer(), ProfileOp::kEncoderForward);
    if (precision_ == Precision::kFp32) {
      return kc::EncoderForward(As<float>(out), tokens, positions, wte.f32, wpe.f32, B, T, C, stream_);
    }
    InSixteenBits([&](auto tag) {
      using H = decltype(tag);
      kc::EncoderForward(As<H>(out), tokens, positions, Half<H>(wte), wpe.empty() ? nullptr : Half<H>(wpe), B, T, C,
                         stream_);
    });
  }
  void EncoderBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, const int32_t* positions,
                       int64_t B, int64_t T, int64_t C) override {
    OpScope op(timer(), ProfileOp::kEncoderBackward);
    Need(kc::EncoderBackwardScratchElements(B, T) * int64_t(sizeof(int32_t)), "EncoderBackward");
    kc::EncoderBackward(dwte, dwpe, Shared<int32_t>(), dout, tokens, positions, B, T, C, stream_);
  }
  // The Llama family's ops. In a 16-bit run the residual stream, the
  // norm's output and its weight are 16-bit, as LayerNorm's are.
  void RmsNormForward(ActTensor out, float* rstd, ActTensor inp, Param weight, float eps, int64_t N,
                      int64_t C) override {
    OpScope op(timer(), ProfileOp::kRmsNormForward);
    if (precision_ == Precision::kFp32) {
      return kc::RmsNormForward(As<float>(out), rstd, As<float>(inp), weight.f32, eps, N, C, stream_);
    }
    InSixteenBits([&](auto tag) {
      using H = decltype(tag);
      kc::RmsNormForward(As<H>(out), rstd, As<H>(inp), Half<H>(weight), eps, N, C, stream_);
    });
  }
  void ResidualRmsNormForward(ActTensor res, ActTensor out, float* rstd, ActTensor a, const float* b, Param weight,
                              float eps, int64_t N, int64_t C) override {
    OpScope op(timer(), ProfileOp::kRmsNormForward);
    if (precision_ == Precision::kFp32) {
      return kc::ResidualRmsNormForward(As<float>(res), As<float>(out), rstd, As<float>(a), b, weight.f32, eps, N, C,
                                        stream_);
    }
    InSixteenBits([&](auto tag) {
      using H = decltype(tag);
      kc::ResidualRmsNormForward(As<H>(res), As<H>(out), rstd, As<H>(a), b, Half<H>(weight), eps, N, C, stream_);
    });
  }
  // As LayerNormBackward: the weight widened after the partial sums, the
  // 16-bit input and dout read as they are, dinp's 16-bit copy in the same pass.
  void RmsNormBackward(float* dinp, ActTensor dinp_copy, float* dweight, ActTensor dout, ActTensor inp, Param weight,
                       const float* rstd, int64_t N, int64_t C) override {
    int64_t offset = Aligned(kc::RmsNormBackwardScratchElements(N, C) * int64_t(sizeof(float)));
    Need(offset, "RmsNormBackward");
    const float* w = Wide(weight, C, offset, "RmsNormBackward");
    OpScope op(timer(), ProfileOp::kRmsNormBackward);
    const auto kernel = kc::LayerNormKernel(tuning_.layernorm_backward_kernel);
    if (precision_ == Precision::kFp32) {
      if (dinp_copy.f32 != nullptr || dinp_copy.h16 != nullptr) Internal("an fp32 run's RMSNorm gradient copy");
      return kc::RmsNormBackward<float, float>(dinp, dweight, Shared<float>(), As<float>(dout), As<float>(inp), w,
                                               rstd, N, C, stream_, nullptr, kernel);
    }
    InSixteenBits([&](auto tag) {
      using H = decltype(tag);
      H* copy = dinp_copy.h16 != nullptr ? As<H>(dinp_copy) : nullptr;
      kc::RmsNormBackward<H, H>(dinp, dweight, Shared<float>(), As<H>(dout), As<H>(inp), w, rstd, N, C, stream_, copy,
                                kernel);
    });
  }
  void RopeForward(ActTensor qkv, const kernels::AttentionShape& shape, const RopeTable& rope) override {
    OpScope op(timer(), ProfileOp::kRopeForward);
    const int64_t rows = shape.B * shape.T, heads = shape.NH + shape.NKV;
    if (precision_ == Precision::kFp32) {
      return kc::RopeForward(As<float>(qkv), shape.RowElements(), rope.cos, rope.sin, rope.positions, rows, heads,
                             shape.hs, stream_);
    }
    InSixteenBits([&](auto tag) {
      using H = decltype(tag);
      kc::RopeForward(As<H>(qkv), shape.RowElements(), rope.cos, rope.sin, rope.positions, rows, heads, shape.hs,
                      stream_);
    });
  }
  void SwiGluForward(ActTensor out, ActTensor gu, int64_t N, int64_t F) override {
    OpScope op(timer(), ProfileOp::kSwiGluForward);
    if (precision_ == Precision::kFp32) return kc::SwiGluForward(As<float>(out), As<float>(gu), N, F, stream_);
    InSixteenBits([&](auto tag) {
      using H = decltype(tag);
      kc::SwiGluForward(As<H>(out), As<H>(gu), N, F, stream_);
    });
  }
  void SwiGluBackward(ActTensor dgu, ActTensor gu, ActTensor dout, int64_t N, int64_t F) override {
    OpScope op(timer(), ProfileOp::kSwiGluBackward);
    if (precision_ == Precision::kFp32) {
      return kc::SwiGluBackward(As<float>(dgu), As<float>(gu), As<float>(dout), N, F, stream_);
    }
    InSixteenBits([&](auto tag) {
      using H = decltype(tag);
      kc::SwiGluBackward(As<H>(dgu), As<H>(gu), As<H>(dout), N, F, stream_);
    });
  }
  void EncoderPartForward(ActTensor out, const int32_t* tokens, Param part, int64_t row0, int64_t rows, int64_t B,
                          int64_t T, int64_t C) override {
    OpScope op(timer(), ProfileOp::kEncoderForward);
    if (precision_ == Precision::kFp32) {
      return kc::EncoderPartForward(As<float>(out), tokens, part.f32, row0, rows, B, T, C, stream_);
    }
    InSixteenBits([&](auto tag) {
      using H = decltype(tag);
      kc::EncoderPartForward(As<H>(out), tokens, Half<H>(part), row0, rows, B, T, C, stream_);
    });
  }
  void EncoderPartBackward(float* dpart, const float* dout, const int32_t* tokens, int64_t row0, int64_t rows,
                           int64_t B, int64_t T, int64_t C) override {
    OpScope op(timer(), ProfileOp::kEncoderBackward);
    Need(kc::EncoderBackwardScratchElements(B, T) * int64_t(sizeof(int32_t)), "EncoderPartBackward");
    kc::EncoderPartBackward(dpart, Shared<int32_t>(), dout, tokens, row0, rows, B, T, C, stream_);
  }
  // The part's GEMM writes its columns of the logits, rows Vp apart, in the
  // run's format (one rounding of the fp32 accumulator, as MatmulForward's).
  void ClassifierPartForward(ActTensor logits, ActTensor inp, Param part, int64_t N, int64_t C, int64_t row0,
                             int64_t rows, int64_t Vp) override {
    OpScope op(timer(), GemmOp(LinearRole::kClassifier, GemmPass::kForward));
    if (precision_ == Precision::kFp32) {
      return kc::GemmTo<float, float>(blas_, false, true, N, rows, C, 1.0f, As<float>(inp), C, part.f32, C, 0.0f,
                                      As<float>(logits) + row0, Vp, stream_);
    }
    InSixteenBits([&](auto tag) {
      using H = decltype(tag);
      kc::GemmTo<H, H>(blas_, false, true, N, rows, C, 1.0f, As<H>(inp), C, Half<H>(part), C, 0.0f,
                       As<H>(logits) + row0, Vp, stream_);
    });
  }
  // The part's columns of dlogits (rows Vp apart) as the GEMMs' operand;
  // dinp and dpart fp32.
  void ClassifierPartBackward(float* dinp, bool accumulate, float* dpart, ActTensor dlogits, ActTensor inp,
                              Param part, int64_t N, int64_t C, int64_t row0, int64_t rows, int64_t Vp) override {
    auto gemms = [&](auto tag) {
      using H = decltype(tag);
      const H* d = As<H>(dlogits) + row0;
      if (dinp != nullptr) {
        OpScope op(timer(), GemmOp(LinearRole::kClassifier, GemmPass::kInputGrad));
        const H* w = nullptr;
        if constexpr (std::is_same_v<H, float>) {
          w = part.f32;
        } else {
          w = Half<H>(part);
        }
        kc::GemmTo<H, float>(blas_, false, false, N, C, rows, 1.0f, d, Vp, w, C, accumulate ? 1.0f : 0.0f, dinp, C,
                             stream_);
      }
      if (dpart != nullptr) {
        OpScope op(timer(), GemmOp(LinearRole::kClassifier, GemmPass::kWeightGrad));
        kc::GemmTo<H, float>(blas_, true, false, rows, C, N, 1.0f, d, Vp, As<H>(inp), C, 1.0f, dpart, C, stream_);
      }
    };
    if (precision_ == Precision::kFp32) return gemms(float{});
    InSixteenBits(gemms);
  }
  void Narrow(ActTensor out, const float* x, int64_t n) override {
    if (precision_ == Precision::kFp32) {
      if (As<float>(out) != x) {
        CheckCuda(cudaMemcpyAsync(out.f32, x, size_t(n) * sizeof(float), cudaMemcpyDeviceToDevice, stream_), "copy");
      }
      return;
    }
    OpScope op(timer(), ProfileOp::kCast);
    InSixteenBits([&](auto tag) {
      using H = decltype(tag);
      kc::Convert<H, float>(As<H>(out), x, n, stream_);
    });
  }
  bool HasLlamaOps() const override { return true; }

  // In a 16-bit run the residual stream, the LayerNorm's output and its
  // weight and bias are all 16-bit: the kernels' all-16-bit forms.
  void ResidualLayerNormForward(ActTensor res, ActTensor out, float* mean, float* rstd, ActTensor a, const float* b,
                                Param weight, Param bias, int64_t N, int64_t C) override {
    OpScope op(timer(), ProfileOp::kLayerNormForward);
    if (precision_ == Precision::kFp32) {
      return kc::ResidualLayerNormForward(As<float>(res), As<float>(out), mean, rstd, As<float>(a), b, weight.f32,
                                          bias.f32, N, C, stream_);
    }
    InSixteenBits([&](auto tag) {
      using H = decltype(tag);
      kc::ResidualLayerNormForward(As<H>(res), As<H>(out), mean, rstd, As<H>(a), b, Half<H>(weight),
                                   Half<H>(bias), N, C, stream_);
    });
  }
  void LayerNormForward(ActTensor out, float* mean, float* rstd, ActTensor inp, Param weight, Param bias,
                        int64_t N, int64_t C) override {
    OpScope op(timer(), ProfileOp::kLayerNormForward);
    if (precision_ == Precision::kFp32) {
      return kc::LayerNormForward(As<float>(out), mean, rstd, As<float>(inp), weight.f32, bias.f32, N, C, stream_);
    }
    InSixteenBits([&](auto tag) {
      using H = decltype(tag);
      kc::LayerNormForward(As<H>(out), mean, rstd, As<H>(inp), Half<H>(weight), Half<H>(bias), N, C, stream_);
    });
  }
  // The gradients are fp32: the 16-bit weight is widened, the 16-bit input
  // read as it is.
  // The gradients of the weight and bias are fp32 (the 16-bit weight is
  // widened), the 16-bit input is read as it is; in a 16-bit run dout is
  // 16-bit and the kernel writes dinp's 16-bit copy in the same pass.
  void LayerNormBackward(float* dinp, ActTensor dinp_copy, float* dweight, float* dbias, ActTensor dout,
                         ActTensor inp, Param weight, const float* mean, const float* rstd, int64_t N,
                         int64_t C) override {
    // The widened weight after the partial sums.
    int64_t offset = Aligned(kc::LayerNormBackwardScratchElements(N, C) * int64_t(sizeof(float)));
    Need(offset, "LayerNormBackward");
    const float* w = Wide(weight, C, offset, "LayerNormBackward");
    OpScope op(timer(), ProfileOp::kLayerNormBackward);
    if (precision_ == Precision::kFp32) {
      if (dinp_copy.f32 != nullptr || dinp_copy.h16 != nullptr) Internal("an fp32 run's LayerNorm gradient copy");
      return kc::LayerNormBackward(dinp, dweight, dbias, Shared<float>(), As<float>(dout), As<float>(inp), w, mean,
                                   rstd, N, C, stream_, static_cast<float*>(nullptr),
                                   kc::LayerNormKernel(tuning_.layernorm_backward_kernel));
    }
    InSixteenBits([&](auto tag) {
      using H = decltype(tag);
      H* copy = dinp_copy.h16 != nullptr ? As<H>(dinp_copy) : nullptr;
      kc::LayerNormBackward<float, H, H>(dinp, dweight, dbias, Shared<float>(), As<H>(dout), As<H>(inp), w, mean, rstd,
                                         N, C, stream_, copy, kc::LayerNormKernel(tuning_.layernorm_backward_kernel));
    });
  }
  // A 16-bit output (qkv, the MLP's pre-activation) is the all-16-bit GEMM:
  // the bias, 16-bit too, goes into the output first and the GEMM adds its
  // fp32 accumulator to it, one rounding. An fp32 output (the projections'
  // workspace) is the mixed GEMM with the bias widened.
  void MatmulForward(LinearRole role, ActTensor out, ActTensor inp, Param weight, Param bias, int64_t N, int64_t C,
                     int64_t OC) override {
    if (precision_ == Precision::kFp32) {
      OpScope op(timer(), GemmOp(role, GemmPass::kForward));
      return kc::MatmulForward(blas_, As<float>(out), As<float>(inp), weight.f32, bias.f32, N, C, OC, stream_);
    }
    InSixteenBits([&](auto tag) {
      using H = decltype(tag);
      if (out.f32 != nullptr) return MixedForward<H>(role, out.f32, inp, weight, bias, N, C, OC);
      const H* b = bias.empty() ? nullptr : Half<H>(bias);
      OpScope op(timer(), GemmOp(role, GemmPass::kForward));
      kc::MatmulForward(blas_, As<H>(out), As<H>(inp), Half<H>(weight), b, N, C, OC, stream_);
    });
  }
  // dinp, dweight and the bias gradient as three timed pieces (the same
  // kernels as kc::MatmulBackward). In a 16-bit run dout and dinp are 16-bit
  // (the GEMMs read and write them as they are, no cast) and the weight and
  // bias gradients fp32.
  void MatmulBackward(LinearRole role, ActTensor dinp, float* dweight, float* dbias, ActTensor dout, ActTensor inp,
                      Param weight, int64_t N, int64_t C, int64_t OC) override {
    // Without dinp only the weight and bias gradients (the weight unread).
    const bool input_grad = dinp.f32 != nullptr || dinp.h16 != nullptr;
    if (precision_ == Precision::kFp32) {
      LinearBackward<float>(role, input_grad ? As<float>(dinp) : nullptr, dweight, dbias, As<float>(dout),
                            As<float>(inp), weight.f32, N, C, OC);
      return;
    }
    InSixteenBits([&](auto tag) {
      using H = decltype(tag);
      LinearBackward<H>(role, input_grad ? As<H>(dinp) : nullptr, dweight, dbias, As<H>(dout), As<H>(inp),
                        input_grad ? Half<H>(weight) : nullptr, N, C, OC);
    });
  }
  // A 16-bit run's attention: the all-16-bit forward, and a backward that
  // reads the 16-bit qkv and output beside fp32 gradients.
  void AttentionForward(ActTensor out, float* lse, ActTensor qkv, const kernels::AttentionShape& shape) override {
    OpScope op(timer(), ProfileOp::kAttentionForward);
    if (precision_ == Precision::kFp32) {
      return kc::AttentionForward(As<float>(out), lse, As<float>(qkv), shape, stream_);
    }
    const auto kernel = kc::AttentionForwardKernel(tuning_.attention_forward);
    // cuDNN's graphs take no segments: packed rows run the own kernels.
    if (kernel == kc::AttentionForwardKernel::kCudnn && shape.positions == nullptr && Cudnn() != nullptr) {
      if (cudnn_->Forward(precision_ == Precision::kBf16, out.h16, lse, qkv.h16, shape, stream_, shared_,
                          size_t(shared_bytes_))) {
        return;
      }
      CudnnFallback(cudnn_forward_fell_back_, "forward");
    }
    InSixteenBits([&](auto tag) {
      using H = decltype(tag);
      kc::AttentionForward(As<H>(out), lse, As<H>(qkv), shape, stream_, kernel);
    });
  }
  // With RoPE, dq and dk are rotated back in place after the kernel (in a
  // 16-bit run a second rounding, which the CPU backend does not take).
  void AttentionBackward(ActTensor dqkv, ActTensor dout, ActTensor qkv, ActTensor out, const float* lse,
                         const kernels::AttentionShape& shape, const RopeTable* rope) override {
    AttentionBackwardKernels(dqkv, dout, qkv, out, lse, shape);
    if (rope == nullptr) return;
    OpScope op(timer(), ProfileOp::kRopeBackward);
    const int64_t rows = shape.B * shape.T, heads = shape.NH + shape.NKV;
    if (precision_ == Precision::kFp32) {
      return kc::RopeBackward(As<float>(dqkv), shape.RowElements(), rope->cos, rope->sin, rope->positions, rows,
                              heads, shape.hs, stream_);
    }
    InSixteenBits([&](auto tag) {
      using H = decltype(tag);
      kc::RopeBackward(As<H>(dqkv), shape.RowElements(), rope->cos, rope->sin, rope->positions, rows, heads,
                       shape.hs, stream_);
    });
  }
  // With the tuning's gelu_backward_epilogue in a 16-bit run, GELU's
  // backward rides in the input gradient's epilogue where cuBLASLt takes it.
  void MatmulBackwardGelu(LinearRole role, ActTensor dinp, float* dweight, float* dbias, ActTensor dout,
                          ActTensor inp, Param weight, ActTensor pre, int64_t N, int64_t C, int64_t OC) override {
    bool fused = false;
    if (precision_ != Precision::kFp32 && tuning_.gelu_backward_epilogue == 1) {
      InSixteenBits([&](auto tag) {
        using H = decltype(tag);
        fused = LinearBackward<H>(role, As<H>(dinp), dweight, dbias, As<H>(dout), As<H>(inp), Half<H>(weight), N, C,
                                  OC, As<H>(pre));
      });
    }
    if (!fused) ModelKernels::MatmulBackwardGelu(role, dinp, dweight, dbias, dout, inp, weight, pre, N, C, OC);
  }
  void GeluForward(ActTensor out, ActTensor inp, int64_t n) override {
    OpScope op(timer(), ProfileOp::kGeluForward);
    if (precision_ == Precision::kFp32) return kc::GeluForward(As<float>(out), As<float>(inp), n, stream_);
    InSixteenBits([&](auto tag) {
      using H = decltype(tag);
      kc::GeluForward(As<H>(out), As<H>(inp), n, stream_);
    });
  }
  void GeluBackward(ActTensor dinp, ActTensor inp, ActTensor dout, int64_t n) override {
    OpScope op(timer(), ProfileOp::kGeluBackward);
    if (precision_ == Precision::kFp32) {
      return kc::GeluBackward(As<float>(dinp), As<float>(inp), As<float>(dout), n, stream_);
    }
    InSixteenBits([&](auto tag) {
      using H = decltype(tag);
      kc::GeluBackward<H, H>(As<H>(dinp), As<H>(inp), As<H>(dout), n, stream_);
    });
  }
  void ResidualForward(ActTensor out, ActTensor a, const float* b, int64_t n) override {
    OpScope op(timer(), ProfileOp::kResidual);
    if (precision_ == Precision::kFp32) return kc::ResidualForward(As<float>(out), As<float>(a), b, n, stream_);
    InSixteenBits([&](auto tag) {
      using H = decltype(tag);
      kc::ResidualForward(As<H>(out), As<H>(a), b, n, stream_);
    });
  }
  void CrossEntropy(float* losses, ActTensor logits, const int32_t* targets, float dloss, bool write_dlogits,
                    int64_t N, int64_t V, int64_t Vp) override {
    OpScope op(timer(), ProfileOp::kCrossEntropy);
    if (precision_ == Precision::kFp32) {
      return kc::CrossEntropy(losses, As<float>(logits), targets, dloss, write_dlogits, N, V, Vp, stream_,
                              tuning_.cross_entropy_threads, kc::CrossEntropyKernel(tuning_.cross_entropy_kernel));
    }
    InSixteenBits([&](auto tag) {
      using H = decltype(tag);
      kc::CrossEntropy(losses, As<H>(logits), targets, dloss, write_dlogits, N, V, Vp, stream_,
                       tuning_.cross_entropy_threads, kc::CrossEntropyKernel(tuning_.cross_entropy_kernel));
    });
  }

 private:
  // The cuDNN attention route, opened at the first op the tuning gives it;
  // null where it cannot open (said once: the kernels of
  // kernels/cuda/attention.h run instead).
  kc::CudnnAttention* Cudnn() {
    if (!cudnn_opened_) {
      cudnn_opened_ = true;
      std::string why_not;
      cudnn_ = kc::CudnnAttention::Open(&why_not);
      if (cudnn_ == nullptr) {
        std::fprintf(stderr,
                     "pstar: the tuning picks cuDNN's attention, which cannot run here (%s): pstar's "
                     "attention kernels run instead\n",
                     why_not.c_str());
      }
    }
    return cudnn_.get();
  }
  // Says once per direction why cuDNN's attention did not run an op.
  void CudnnFallback(bool& said, const char* direction) {
    if (said) return;
    said = true;
    std::fprintf(stderr, "pstar: cuDNN's attention %s does not run here (%s): pstar's kernel runs instead\n", direction,
                 cudnn_->last_error().c_str());
  }

  // The attention backward's kernels: cuDNN's where the tuning picks it, else ours.
  void AttentionBackwardKernels(ActTensor dqkv, ActTensor dout, ActTensor qkv, ActTensor out, const float* lse,
                                const kernels::AttentionShape& shape) {
    OpScope op(timer(), ProfileOp::kAttentionBackward);
    const auto kernel = precision_ == Precision::kFp32 ? kc::AttentionBackwardKernel::kTensorCore
                                                       : kc::AttentionBackwardKernel(tuning_.attention_backward);
    if (kernel == kc::AttentionBackwardKernel::kCudnn && shape.positions == nullptr && Cudnn() != nullptr) {
      if (cudnn_->Backward(precision_ == Precision::kBf16, dqkv.h16, dout.h16, qkv.h16, out.h16, lse, shape, stream_,
                           shared_, size_t(shared_bytes_))) {
        return;
      }
      CudnnFallback(cudnn_backward_fell_back_, "backward");
    }
    Need(kc::AttentionScratchElements(shape, kernel) * int64_t(sizeof(float)), "AttentionBackward");
    float* s = Shared<float>();
    if (precision_ == Precision::kFp32) {
      return kc::AttentionBackward(As<float>(dqkv), s, As<float>(dout), As<float>(qkv), As<float>(out), lse, shape,
                                   stream_);
    }
    InSixteenBits([&](auto tag) {
      using H = decltype(tag);
      kc::AttentionBackward<H, H>(As<H>(dqkv), s, As<H>(dout), As<H>(qkv), As<H>(out), lse, shape, stream_, kernel);
    });
  }
  // f(H{}) with H the run's 16-bit type (bf16 or fp16); a 16-bit run only.
  template <typename F>
  void InSixteenBits(F&& f) const {
    if (precision_ == Precision::kBf16) {
      f(kc::bf16{});
    } else {
      f(kc::fp16{});
    }
  }
  template <typename T>
  T* Shared() const {
    return reinterpret_cast<T*>(shared_);
  }
  // 256-byte aligned pieces of the shared scratch: 16-bit params widened to
  // fp32 (a bias, a LayerNorm weight); KernelScratchBytes sizes it.
  static int64_t Aligned(int64_t bytes) { return (bytes + 255) / 256 * 256; }
  template <typename T>
  T* Piece(int64_t& offset, int64_t elems, const char* op) {
    T* p = reinterpret_cast<T*>(shared_ + offset);
    offset += Aligned(elems * int64_t(sizeof(T)));
    Need(offset, op);
    return p;
  }
  // A 16-bit run's param in its format (a 16-bit precision takes 16-bit params only).
  template <typename T>
  const T* Half(Param p) const {
    if (p.h16 == nullptr) {
      std::fprintf(stderr, "pstar: internal error: an fp32 param in a 16-bit run on the GPU\n");
      std::abort();
    }
    return reinterpret_cast<const T*>(p.h16);
  }
  // An ActTensor as T, the run's format (float, or its 16-bit type): a
  // 16-bit precision takes 16-bit ActTensors only.
  template <typename T>
  T* As(ActTensor x) const {
    const bool half = !std::is_same_v<T, float>;
    if ((x.h16 != nullptr) != half || (x.f32 != nullptr) == half) {
      std::fprintf(stderr, "pstar: internal error: an ActTensor not in the run's format on the GPU\n");
      std::abort();
    }
    if constexpr (std::is_same_v<T, float>) {
      return x.f32;
    } else {
      return reinterpret_cast<T*>(x.h16);
    }
  }
  // A param as fp32: itself, or (16-bit) widened into a scratch piece; null stays null.
  const float* Wide(Param p, int64_t n, int64_t& offset, const char* op) {
    if (p.h16 == nullptr) return p.f32;
    float* wide = Piece<float>(offset, n, op);
    OpScope cast(timer(), ProfileOp::kCast);
    if (precision_ == Precision::kBf16) {
      kc::Convert<float, kc::bf16>(wide, Half<kc::bf16>(p), n, stream_);
    } else {
      kc::Convert<float, kc::fp16>(wide, Half<kc::fp16>(p), n, stream_);
    }
    return wide;
  }
  // The weight and the input are read as they are (16 bits, no cast per
  // op); the bias is widened.
  template <typename T>
  void MixedForward(LinearRole role, float* out, ActTensor inp, Param weight, Param bias, int64_t N, int64_t C,
                    int64_t OC) {
    int64_t offset = 0;
    const float* b = Wide(bias, OC, offset, "MatmulForward");
    OpScope op(timer(), GemmOp(role, GemmPass::kForward));
    kc::MatmulForwardMixed<T>(blas_, out, As<T>(inp), Half<T>(weight), b, N, C, OC, stream_);
  }
  // dinp and dout in T (fp32, or the run's 16-bit type), the weight and
  // bias gradients fp32; the bias gradient sums dout. With `gelu_pre` (the
  // tuning's gelu_backward_epilogue, 16 bits), dinp is multiplied by GELU'(gelu_pre)
  // in the input gradient's epilogue; false, having done nothing, where
  // cuBLASLt does not take that epilogue.
  // dinp null: the weight and bias gradients alone; dweight null: dinp alone.
  template <typename T>
  bool LinearBackward(LinearRole role, T* dinp, float* dweight, float* dbias, const T* dout, const T* inp,
                      const T* weight, int64_t N, int64_t C, int64_t OC, const T* gelu_pre = nullptr) {
    if (dinp != nullptr) {
      OpScope op(timer(), GemmOp(role, GemmPass::kInputGrad));
      if constexpr (std::is_same_v<T, float>) {
        kc::MatmulBackwardInput<T, T>(blas_, dinp, dout, weight, N, C, OC, stream_);
      } else {
        if (gelu_pre == nullptr) {
          kc::MatmulBackwardInput<T, T>(blas_, dinp, dout, weight, N, C, OC, stream_);
        } else if (!kc::MatmulBackwardInputGelu<T>(blas_, dinp, dout, weight, gelu_pre, N, C, OC, stream_)) {
          return false;
        }
      }
    }
    // With the tuning's bias_grad_epilogue (16 bits), the bias gradient
    // rides in the weight gradient's epilogue into scratch, then is added.
    bool bias_done = false;
    if (dweight != nullptr) {
      OpScope op(timer(), GemmOp(role, GemmPass::kWeightGrad));
      // The tuned rank for the layers' 16-bit weight gradients (the shapes the
      // tuner timed); the classifier's and fp32 runs' take the first.
      const bool tuned = !std::is_same_v<T, float> && role != LinearRole::kClassifier;
      const int algo = tuned ? tuning_.weight_grad_gemm_algo : 0;
      if constexpr (!std::is_same_v<T, float>) {
        if (dbias != nullptr && tuning_.bias_grad_epilogue == 1) {
          Need(OC * int64_t(sizeof(float)), "MatmulBackward (bias gradient epilogue)");
          bias_done = kc::MatmulBackwardWeightBiasGrad<T>(blas_, dweight, Shared<float>(), dout, inp, N, C, OC,
                                                          stream_, algo);
        }
      }
      if (!bias_done) kc::MatmulBackwardWeight<T, float>(blas_, dweight, dout, inp, N, C, OC, stream_, algo);
    }
    if (dbias != nullptr) {
      OpScope op(timer(), ProfileOp::kBiasGrad);
      if (bias_done) {
        kc::ResidualForward<float, float>(dbias, dbias, Shared<float>(), OC, stream_);
      } else {
        Need(kc::BiasGradientScratchElements(N, OC) * int64_t(sizeof(float)), "MatmulBackward");
        kc::AddBiasGradient<float, T>(dbias, Shared<float>(), dout, N, OC, stream_, tuning_.bias_grad_group_rows);
      }
    }
    return true;
  }
  [[noreturn]] static void Internal(const char* what) {
    std::fprintf(stderr, "pstar: internal error: %s\n", what);
    std::abort();
  }
  // The planner's KernelScratchBytes must cover every kernel's need.
  void Need(int64_t bytes, const char* op) const {
    if (bytes <= shared_bytes_) return;
    std::fprintf(stderr, "pstar: %s needs %lld bytes of scratch, the plan gave %lld\n", op,
                 static_cast<long long>(bytes), static_cast<long long>(shared_bytes_));
    std::abort();
  }

  cudaStream_t stream_;
  Precision precision_;
  kc::KernelTuning tuning_;  // this GPU kind's launch choices (kernels/cuda/tuning_table.inc)
  kc::BlasContext blas_;
  std::unique_ptr<kc::CudnnAttention> cudnn_;
  bool cudnn_opened_ = false;
  bool cudnn_forward_fell_back_ = false;
  bool cudnn_backward_fell_back_ = false;
  double* loss_sum_ = nullptr;  // in the first 256 bytes of scratch
  std::byte* shared_ = nullptr;
  int64_t shared_bytes_ = 0;
};

}  // namespace

Result<std::unique_ptr<ModelKernels>> MakeCudaModelKernels(void* compute_stream, Precision precision) {
  int device = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&device) != cudaSuccess || cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    return Status::Internal("cannot read the current CUDA device's properties");
  }
  kc::KernelTuning tuning = kc::TuningFor(prop.name, prop.major * 10 + prop.minor);
  // The user's choices over the table's (docs/gpu.md): for a GPU kind it has
  // no rows for, or one candidate tried in training.
  if (const char* spec = std::getenv("PSTAR_KERNEL_TUNING"); spec != nullptr && spec[0] != '\0') {
    if (const std::string error = kc::ApplyTuningOverrides(spec, &tuning); !error.empty()) {
      return Status::InvalidArgument("PSTAR_KERNEL_TUNING: " + error);
    }
  }
  return std::unique_ptr<ModelKernels>(
      new CudaModelKernels(static_cast<cudaStream_t>(compute_stream), precision, tuning));
}

}  // namespace pstar
