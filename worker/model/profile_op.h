// ProfileOp: the rows of a training step's profile (`pstar train --profile`)
// and the names of its NVTX ranges. One row per kind of device work, split by
// pass and, for the linear layers, by the layer's role and the GEMM's pass
// (forward, input gradient, weight gradient), so the table says which GEMM
// or which pass took the time, not only "matmul".
//
// The kernels report their own work through an OpTimer (ModelKernels::
// SetTimer): each implementation brackets every piece of device work it
// queues (a GEMM, a cast, a bias-gradient sum) with an OpScope, so the split
// follows the kernels and no decorator has to guess it.
#pragma once

#include <cstdint>

#include "worker/runtime/nvtx_range.h"

namespace pstar {

// The linear layers of a decoder block (qkv; the attention's output
// projection; the MLP's first GEMM, fc or gate|up, and its second, fc_proj
// or down), and the classifier (the projection onto the vocabulary).
enum class LinearRole : int { kQkv = 0, kAttnProj, kFc, kFcProj, kClassifier };
inline constexpr int kNumLinearRoles = 5;
// "qkv", "attn_proj", "fc", "fc_proj", "classifier".
const char* LinearRoleName(LinearRole role);

// The three GEMMs of a linear layer.
enum class GemmPass : int { kForward = 0, kInputGrad, kWeightGrad };

enum class ProfileOp : int {
  kEncoderForward = 0,
  kEncoderBackward,
  kLayerNormForward,   // LayerNorm, and the residual add fused into ln_2
  kLayerNormBackward,
  kAttentionForward,
  kAttentionBackward,
  kGeluForward,        // the MLP's GELU, and its recompute in backward
  kGeluBackward,
  kResidual,           // the residual adds not fused into a LayerNorm
  kBiasGrad,           // the linear layers' bias gradients (column sums)
  kCast,               // operands converted between fp32 and 16 bits
  kCrossEntropy,       // the classifier's loss and dlogits
  kLossSum,            // the loss accumulated on the device
  kUpload,             // tokens and targets to the device
  kZero,               // zero-filled workspaces
  kGradNorm,           // the global gradient norm, all of it
  kAdam,               // the optimizer step, all of it
  kGradRound,          // gradients rounded to 16 bits (train.grad_precision: 16bit)
  kRmsNormForward,     // RMSNorm, and the residual add fused into post_attention_layernorm
  kRmsNormBackward,
  kRopeForward,        // q and k rotated by their positions
  kRopeBackward,       // dq and dk rotated back (inside the attention's backward)
  kSwiGluForward,      // the MLP's silu(gate) * up, and its recompute in backward
  kSwiGluBackward,
  kGemmFirst,          // then one row per (LinearRole, GemmPass): GemmOp()
};
inline constexpr int kNumProfileOps = int(ProfileOp::kGemmFirst) + 3 * kNumLinearRoles;

inline ProfileOp GemmOp(LinearRole role, GemmPass pass) {
  return ProfileOp(int(ProfileOp::kGemmFirst) + 3 * int(role) + int(pass));
}
// Whether `op` is one of the GEMM rows.
inline bool IsGemmOp(ProfileOp op) { return int(op) >= int(ProfileOp::kGemmFirst) && int(op) < kNumProfileOps; }

// The row's name: "encoder.fwd", "layernorm.bwd", "gemm.fc.dweight", ... (a
// string literal; docs/profiling.md lists them all).
const char* ProfileOpName(ProfileOp op);

// Receives the spans of device work (the Profiler). BeginOp marks the start
// of `op`'s work on the compute stream (or the host's, for host work) and
// returns a token that EndOp takes.
class OpTimer {
 public:
  virtual ~OpTimer() = default;
  virtual int64_t BeginOp(ProfileOp op) = 0;
  virtual void EndOp(int64_t token) = 0;
};

// One op's span for its lifetime: an NVTX range named by the op and, when a
// timer is attached, a timed span.
class OpScope {
 public:
  OpScope(OpTimer* timer, ProfileOp op)
      : range_(ProfileOpName(op)), timer_(timer), token_(timer != nullptr ? timer->BeginOp(op) : -1) {}
  ~OpScope() {
    if (timer_ != nullptr) timer_->EndOp(token_);
  }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  NvtxRange range_;
  OpTimer* timer_;
  int64_t token_;
};

}  // namespace pstar
