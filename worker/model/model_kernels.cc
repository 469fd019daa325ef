#include "worker/model/model_kernels.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "kernels/attention.h"

namespace pstar {

const char* LinearRoleName(LinearRole role) {
  switch (role) {
    case LinearRole::kQkv: return "qkv";
    case LinearRole::kAttnProj: return "attn_proj";
    case LinearRole::kFc: return "fc";
    case LinearRole::kFcProj: return "fc_proj";
    case LinearRole::kClassifier: return "classifier";
  }
  return "?";
}

const char* ProfileOpName(ProfileOp op) {
  static constexpr const char* kGemmNames[3 * kNumLinearRoles] = {
      "gemm.qkv.fwd",     "gemm.qkv.dinp",     "gemm.qkv.dweight",     "gemm.attn_proj.fwd",
      "gemm.attn_proj.dinp", "gemm.attn_proj.dweight", "gemm.fc.fwd",  "gemm.fc.dinp",
      "gemm.fc.dweight",  "gemm.fc_proj.fwd",  "gemm.fc_proj.dinp",   "gemm.fc_proj.dweight",
      "gemm.classifier.fwd", "gemm.classifier.dinp", "gemm.classifier.dweight"};
  if (IsGemmOp(op)) return kGemmNames[int(op) - int(ProfileOp::kGemmFirst)];
  switch (op) {
    case ProfileOp::kEncoderForward: return "encoder.fwd";
    case ProfileOp::kEncoderBackward: return "encoder.bwd";
    case ProfileOp::kLayerNormForward: return "layernorm.fwd";
    case ProfileOp::kLayerNormBackward: return "layernorm.bwd";
    case ProfileOp::kAttentionForward: return "attention.fwd";
    case ProfileOp::kAttentionBackward: return "attention.bwd";
    case ProfileOp::kGeluForward: return "gelu.fwd";
    case ProfileOp::kGeluBackward: return "gelu.bwd";
    case ProfileOp::kResidual: return "residual";
    case ProfileOp::kBiasGrad: return "bias_grad";
    case ProfileOp::kCast: return "cast";
    case ProfileOp::kCrossEntropy: return "cross_entropy";
    case ProfileOp::kLossSum: return "loss_sum";
    case ProfileOp::kUpload: return "upload";
    case ProfileOp::kZero: return "zero";
    case ProfileOp::kGradNorm: return "grad_norm";
    case ProfileOp::kAdam: return "adam";
    case ProfileOp::kGradRound: return "grad_round";
    case ProfileOp::kRmsNormForward: return "rmsnorm.fwd";
    case ProfileOp::kRmsNormBackward: return "rmsnorm.bwd";
    case ProfileOp::kRopeForward: return "rope.fwd";
    case ProfileOp::kRopeBackward: return "rope.bwd";
    case ProfileOp::kSwiGluForward: return "swiglu.fwd";
    case ProfileOp::kSwiGluBackward: return "swiglu.bwd";
    case ProfileOp::kGemmFirst: break;
  }
  return "?";
}

void ModelKernels::MatmulBackwardGelu(LinearRole role, ActTensor dinp, float* dweight, float* dbias, ActTensor dout,
                                      ActTensor inp, Param weight, ActTensor pre, int64_t N, int64_t C, int64_t OC) {
  MatmulBackward(role, dinp, dweight, dbias, dout, inp, weight, N, C, OC);
  GeluBackward(dinp, pre, dinp, N * C);
}

namespace {

[[noreturn]] void NoLlamaOps(const char* op) {
  std::fprintf(stderr, "pstar: internal error: %s has no kernel on this device\n", op);
  std::abort();
}

}  // namespace

void ModelKernels::RmsNormForward(ActTensor, float*, ActTensor, Param, float, int64_t, int64_t) {
  NoLlamaOps("RMSNorm");
}
void ModelKernels::ResidualRmsNormForward(ActTensor, ActTensor, float*, ActTensor, const float*, Param, float, int64_t,
                                          int64_t) {
  NoLlamaOps("RMSNorm");
}
void ModelKernels::RmsNormBackward(float*, ActTensor, float*, ActTensor, ActTensor, Param, const float*, int64_t,
                                   int64_t) {
  NoLlamaOps("RMSNorm");
}
void ModelKernels::RopeForward(ActTensor, const kernels::AttentionShape&, const RopeTable&) { NoLlamaOps("RoPE"); }
void ModelKernels::SwiGluForward(ActTensor, ActTensor, int64_t, int64_t) { NoLlamaOps("SwiGLU"); }
void ModelKernels::SwiGluBackward(ActTensor, ActTensor, ActTensor, int64_t, int64_t) { NoLlamaOps("SwiGLU"); }
void ModelKernels::EncoderPartForward(ActTensor, const int32_t*, Param, int64_t, int64_t, int64_t, int64_t, int64_t) {
  NoLlamaOps("a token table in row parts");
}
void ModelKernels::EncoderPartBackward(float*, const float*, const int32_t*, int64_t, int64_t, int64_t, int64_t,
                                       int64_t) {
  NoLlamaOps("a token table in row parts");
}
void ModelKernels::ClassifierPartForward(ActTensor, ActTensor, Param, int64_t, int64_t, int64_t, int64_t, int64_t) {
  NoLlamaOps("a classifier in row parts");
}
void ModelKernels::ClassifierPartBackward(float*, bool, float*, ActTensor, ActTensor, Param, int64_t, int64_t, int64_t,
                                          int64_t, int64_t) {
  NoLlamaOps("a classifier in row parts");
}
void ModelKernels::Narrow(ActTensor, const float*, int64_t) { NoLlamaOps("Narrow"); }

int64_t KernelScratchBytes(const ComputeSpec& compute, const GptConfig& config, int64_t batch, int64_t seq) {
  if (compute.device == ComputeDevice::kCpu) return 0;
  // One region shared by ops that run one after another on the compute
  // stream, after a 256-byte slot for the mean loss. Each term bounds what
  // the CUDA kernels ask for (checked when the scratch is set):
  const int64_t BT = batch * seq, C = config.n_embd;
  // The widest linear layer's output (4C in GPT-2).
  const int64_t wide = std::max({config.qkv_width(), config.mlp_in_width(), C});
  const bool half = compute.precision != Precision::kFp32;
  // Rowsums of dout·out per head; in a 16-bit run, room for the one-pass
  // backward's fp32 dq sums too (4 bytes per element of the attention's
  // output), which the tuning table may pick on the GPU at hand.
  const int64_t attention = kernels::GpuAttentionScratchElements(batch, seq, config.attn_width(), config.n_head, half) * 4;
  auto aligned = [](int64_t bytes) { return (bytes + 255) / 256 * 256; };
  // At most 256 row groups of weight and bias partials; in a 16-bit run then
  // the weight widened to fp32 (backward: the gradients are fp32).
  const int64_t layernorm = aligned(2 * 256 * C * 4) + (half ? aligned(C * 4) : 0);
  const int64_t encoder = (4 * BT + 2) * 4;        // sort keys for a power of two >= B*T
  const int64_t reduce = 4096 * 8;                 // the reductions' partials (doubles)
  // A 16-bit linear layer with an fp32 output (the projections' workspace)
  // widens its 16-bit bias into a 256-byte aligned piece; nothing else is
  // cast (the activations and their gradients are 16-bit already).
  const int64_t casts = half ? aligned(wide * 4) : 0;
  // A linear layer's bias gradient: fp32 partial sums of at most 256 row
  // groups for each of its columns.
  const int64_t bias = aligned(256 * wide * 4);
  return 256 + std::max({attention, layernorm, encoder, reduce, casts, bias});
}

#ifndef PSTAR_WITH_CUDA
Result<std::unique_ptr<ModelKernels>> MakeCudaModelKernels(void*, Precision) {
  return Status::FailedPrecondition("this pstar was built without CUDA; use runtime.device: cpu");
}
#endif

}  // namespace pstar
