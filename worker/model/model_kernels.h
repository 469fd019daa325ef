// ModelKernels: the ops the GPT model runs, on the device that holds its
// activations and resident chunks. The CPU implementation calls the
// reference kernels (kernels/cpu); the CUDA one queues the CUDA kernels
// (kernels/cuda) on the backend's compute stream and never waits, except
// where a value must reach the host (the loss and the gradient norm, once per
// step).
//
// Every pointer an op takes is in the device's memory: the activation arena
// (the non-model region of the device tier) or a chunk made resident by a
// ParamStore::Use. Semantics (overwrite vs accumulate, layouts) are those of
// the CPU kernels.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "kernels/attention.h"
#include "worker/core/status.h"
#include "worker/model/compute.h"
#include "worker/model/gpt_config.h"
#include "worker/model/profile_op.h"

namespace pstar {


// A parameter tensor as an op reads it on the device: fp32, or 16 bits of
// the run's precision (16-bit parameter chunks; kernels widen as they read).
// At most one is set; neither for an absent bias.
struct Param {
  const float* f32 = nullptr;
  const uint16_t* h16 = nullptr;
  bool empty() const { return f32 == nullptr && h16 == nullptr; }
};

// An activation as the model stores it: the residual stream (the encoder's
// output and each residual add's), the outputs of LayerNorm, attention and
// GELU, and the GEMM outputs a layer keeps (qkv, the MLP's pre-activation).
// fp32 in an fp32 run; in a bf16/fp16 run it is stored in that format,
// computed in fp32 and rounded once by the op that writes it; readers widen
// it exactly. For the GEMMs it is the operand they multiply anyway: half the
// bytes, no cast per GEMM. Exactly one pointer is set.
struct ActTensor {
  float* f32 = nullptr;
  uint16_t* h16 = nullptr;
  // The same tensor from element `offset` on.
  ActTensor At(int64_t offset) const {
    return {f32 != nullptr ? f32 + offset : nullptr, h16 != nullptr ? h16 + offset : nullptr};
  }
};

// The gradients of activations (dout and dinp of the backward ops) are
// ActTensors in the run's format too: fp32 in an fp32 run, 16 bits in a
// 16-bit run, so no linear layer widens or narrows its dout. The one
// exception is the residual stream's gradient, which every layer adds to:
// fp32 (LayerNormBackward's dinp, EncoderBackward's dout), with a 16-bit copy
// written beside it for the GEMMs that read it.

// RoPE's tables on the device (kernels/rope.h): cos and sin (positions,
// head_size / 2) fp32, and each token's position (B*T int32).
struct RopeTable {
  const float* cos = nullptr;
  const float* sin = nullptr;
  const int32_t* positions = nullptr;
};

// Where and how the model computes.
struct ComputeSpec {
  ComputeDevice device = ComputeDevice::kCpu;
  Precision precision = Precision::kFp32;
};

// Bytes of scratch a device's kernels need for a (batch, seq) micro-batch,
// beyond the model's own activations: permuted attention heads, partial sums
// of the deterministic reductions, 16-bit copies of a linear layer's operands.
// Plain arithmetic, so planners without a GPU (the operator) size CUDA jobs
// exactly as the worker will.
int64_t KernelScratchBytes(const ComputeSpec& compute, const GptConfig& config, int64_t batch, int64_t seq);

class ModelKernels {
 public:
  virtual ~ModelKernels() = default;

  virtual ComputeDevice device() const = 0;
  virtual Precision precision() const = 0;
  ComputeSpec compute() const { return {device(), precision()}; }

  // Where the ops report their work (ProfileOp spans), or null: nothing is
  // timed. Every op brackets each piece of work it queues with an OpScope.
  void SetTimer(OpTimer* timer) { timer_ = timer; }

  // The scratch region (KernelScratchBytes bytes, 64-byte aligned, in the
  // device's memory); must be set before the first op.
  virtual void SetScratch(void* scratch, int64_t bytes) = 0;

  // Host → device memory, in order with the ops.
  virtual void Upload(int32_t* dst, const int32_t* src, int64_t n) = 0;
  virtual void Upload(float* dst, const float* src, int64_t n) = 0;
  // Device → host: `rows` rows of `cols` values, `ld` apart in src (fp32, or
  // 16 bits in a 16-bit run, widened), packed into dst as floats (waits for
  // the ops before it). Not on a training step's path.
  virtual void DownloadRows(float* dst, ActTensor src, int64_t rows, int64_t cols, int64_t ld) = 0;
  virtual void Zero(float* dst, int64_t n) = 0;
  // The loss accumulator, in the device's memory: AddToLossSum adds the sum
  // of n floats to it without waiting; TakeLossSum returns it as a host value
  // (waiting for the ops before it) and resets it to zero. One wait per step.
  virtual void AddToLossSum(const float* x, int64_t n) = 0;
  virtual double TakeLossSum() = 0;
  // A training step's one wait for the device: sums[i] = the sum of x^2 over
  // span i, in double, as host values (bit for bit kernels::cpu::SumOfSquares
  // on every device), and the loss accumulator's value, returned and reset
  // to zero as TakeLossSum does.
  struct Span {
    const float* data = nullptr;
    int64_t n = 0;
  };
  virtual double TakeStepSums(std::span<const Span> spans, double* sums) = 0;
  // x[i] rounded to the precision's 16-bit format (nearest even, the bits of
  // kernels/half.h), in place: gradients kept in 16 bits. Nothing in fp32.
  virtual void RoundToPrecision(float* x, int64_t n) = 0;

  // positions: each row's position-table row (packed examples restart
  // them); null: t. Ignored without a position table.
  virtual void EncoderForward(ActTensor out, const int32_t* tokens, const int32_t* positions, Param wte, Param wpe,
                              int64_t B, int64_t T,
                              int64_t C) = 0;
  virtual void EncoderBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                               const int32_t* positions, int64_t B,
                               int64_t T, int64_t C) = 0;
  // An ActTensor is in the run's format: fp32, or 16 bits in a 16-bit run.
  virtual void LayerNormForward(ActTensor out, float* mean, float* rstd, ActTensor inp, Param weight,
                                Param bias, int64_t N, int64_t C) = 0;
  // res = a + b and LayerNormForward of it in one pass (kernels/layernorm.h);
  // b is a projection's fp32 output. The profiler counts it as a LayerNorm.
  virtual void ResidualLayerNormForward(ActTensor res, ActTensor out, float* mean, float* rstd, ActTensor a,
                                        const float* b, Param weight, Param bias, int64_t N, int64_t C) = 0;
  // dinp (fp32: the residual stream's gradient, accumulated across layers)
  // += ...; with `dinp_copy` (an ActTensor, or empty), dinp's new values
  // rounded to the run's format too, in the same pass: the operand of the
  // next linear layer's backward GEMMs. dout is an activation gradient.
  virtual void LayerNormBackward(float* dinp, ActTensor dinp_copy, float* dweight, float* dbias, ActTensor dout,
                                 ActTensor inp, Param weight, const float* mean, const float* rstd, int64_t N,
                                 int64_t C) = 0;
  // out is an ActTensor in the run's format (qkv, the MLP's pre-activation,
  // the logits) or, in any run, fp32 (the projections' workspace).
  // `role` names the layer for the profile (GemmOp rows).
  virtual void MatmulForward(LinearRole role, ActTensor out, ActTensor inp, Param weight, Param bias, int64_t N,
                             int64_t C, int64_t OC) = 0;
  // dinp and dout are activation gradients: the GEMMs read dout as it is
  // and write dinp in the run's format, with no cast; the weight and bias
  // gradients (chunks) are fp32 and accumulate. Either half may be left out,
  // in two calls that give the same bits as one: with dinp empty (weight may
  // be empty then) only the weight and bias gradients, with dweight and
  // dbias null only dinp.
  virtual void MatmulBackward(LinearRole role, ActTensor dinp, float* dweight, float* dbias, ActTensor dout,
                              ActTensor inp, Param weight, int64_t N, int64_t C, int64_t OC) = 0;
  // Causal self-attention with no T×T storage (kernels/attention.h), with
  // grouped-query heads as `shape` says: lse (B, NH, T) is what forward keeps
  // besides out, and backward reads both. With `rope`, q and k were rotated
  // (RopeForward) and dq and dk are rotated back (RoPE's backward) before
  // dqkv is stored: dqkv is then the gradient of the GEMM's output.
  virtual void AttentionForward(ActTensor out, float* lse, ActTensor qkv, const kernels::AttentionShape& shape) = 0;
  virtual void AttentionBackward(ActTensor dqkv, ActTensor dout, ActTensor qkv, ActTensor out, const float* lse,
                                 const kernels::AttentionShape& shape, const RopeTable* rope) = 0;
  // The Llama family's ops (kernels/rmsnorm.h, rope.h, swiglu.h), with the
  // semantics of their LayerNorm and GELU counterparts above. A device
  // without them stops with an internal error; the model refuses such a
  // device before it runs (Gpt::Create).
  virtual void RmsNormForward(ActTensor out, float* rstd, ActTensor inp, Param weight, float eps, int64_t N,
                              int64_t C);
  virtual void ResidualRmsNormForward(ActTensor res, ActTensor out, float* rstd, ActTensor a, const float* b,
                                      Param weight, float eps, int64_t N, int64_t C);
  virtual void RmsNormBackward(float* dinp, ActTensor dinp_copy, float* dweight, ActTensor dout, ActTensor inp,
                               Param weight, const float* rstd, int64_t N, int64_t C);
  // Rotates the q and k heads of every row of qkv (B*T rows of
  // shape.RowElements()) in place.
  virtual void RopeForward(ActTensor qkv, const kernels::AttentionShape& shape, const RopeTable& rope);
  // out (N, F) = silu(gate) * up over gu (N, 2F); dgu (N, 2F) from dout (N, F).
  virtual void SwiGluForward(ActTensor out, ActTensor gu, int64_t N, int64_t F);
  virtual void SwiGluBackward(ActTensor dgu, ActTensor gu, ActTensor dout, int64_t N, int64_t F);
  // A vocabulary table in row parts (VocabPartRows): `part` holds its rows
  // [row0, row0 + rows). EncoderPartForward writes the tokens in those rows
  // (out = their part rows; no position table), EncoderPartBackward adds
  // their dout to the part's gradient: the parts in turn give the bits of
  // EncoderForward and EncoderBackward over the whole table.
  virtual void EncoderPartForward(ActTensor out, const int32_t* tokens, Param part, int64_t row0, int64_t rows,
                                  int64_t B, int64_t T, int64_t C);
  virtual void EncoderPartBackward(float* dpart, const float* dout, const int32_t* tokens, int64_t row0, int64_t rows,
                                   int64_t B, int64_t T, int64_t C);
  // The classifier over one part: logits columns [row0, row0 + rows) of N
  // rows Vp apart (the run's format) = inp @ part^T, as MatmulForward
  // computes and rounds them.
  virtual void ClassifierPartForward(ActTensor logits, ActTensor inp, Param part, int64_t N, int64_t C, int64_t row0,
                                     int64_t rows, int64_t Vp);
  // From those columns of dlogits: dinp (fp32, unless null) = (or with
  // `accumulate`, +=) dlogits[:, part] @ part; dpart (unless null) +=
  // dlogits[:, part]^T @ inp. The part (weight) may be empty without dinp.
  virtual void ClassifierPartBackward(float* dinp, bool accumulate, float* dpart, ActTensor dlogits, ActTensor inp,
                                      Param part, int64_t N, int64_t C, int64_t row0, int64_t rows, int64_t Vp);
  // out = x in the run's activation format (rounded once in a 16-bit run).
  virtual void Narrow(ActTensor out, const float* x, int64_t n);
  // Whether this device has the ops above.
  virtual bool HasLlamaOps() const { return false; }
  virtual void GeluForward(ActTensor out, ActTensor inp, int64_t n) = 0;
  // dinp may alias dout.
  virtual void GeluBackward(ActTensor dinp, ActTensor inp, ActTensor dout, int64_t n) = 0;
  // MatmulBackward of a layer whose input was GELU(pre), with GELU's
  // backward applied to dinp: dinp = (dout @ weight) * GELU'(pre). By
  // default the two ops; the CUDA kernels fuse them in 16-bit runs where the
  // tuning table says so.
  virtual void MatmulBackwardGelu(LinearRole role, ActTensor dinp, float* dweight, float* dbias, ActTensor dout,
                                  ActTensor inp, Param weight, ActTensor pre, int64_t N, int64_t C, int64_t OC);
  // out = a + b, b a projection's fp32 output; out may alias a.
  virtual void ResidualForward(ActTensor out, ActTensor a, const float* b, int64_t n) = 0;
  // The classifier's softmax cross-entropy in one pass (kernels/classifier.h):
  // logits rows are Vp apart, the columns past V vocabulary padding, in the
  // run's activation format. losses (may be null) gets each row's loss; with
  // `write_dlogits`, (softmax - onehot) * dloss is written over the logits.
  virtual void CrossEntropy(float* losses, ActTensor logits, const int32_t* targets, float dloss,
                            bool write_dlogits, int64_t N, int64_t V, int64_t Vp) = 0;

 protected:
  OpTimer* timer() const { return timer_; }

 private:
  OpTimer* timer_ = nullptr;
};

// The CPU kernels; a 16-bit precision is emulated by rounding the linear
// layers' operands (the same numbers the GPU multiplies), so mixed precision
// and the loss scaler run, and are tested, on any machine. 16-bit params and
// ActTensors are widened as they are read; fp32 params in a 16-bit precision
// are rounded where the GPU would multiply them in 16 bits. A 16-bit
// precision takes 16-bit ActTensors (activations and their gradients) only,
// an fp32 one fp32 only (except MatmulForward's output, fp32 in any run
// where it is a workspace).
std::unique_ptr<ModelKernels> MakeCpuModelKernels(Precision precision = Precision::kFp32);

// The CUDA kernels on `compute_stream` (a cudaStream_t) of the current
// device; 16-bit linear layers run on the tensor cores, and a 16-bit
// precision takes 16-bit params and ActTensors only (MatmulForward's output
// as above). Fails in a build without CUDA.
Result<std::unique_ptr<ModelKernels>> MakeCudaModelKernels(void* compute_stream,
                                                           Precision precision = Precision::kFp32);

}  // namespace pstar
