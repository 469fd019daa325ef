// Causal self-attention on the GPU with no T×T storage: the algorithm,
// blocking and layouts of kernels/attention.h (FlashAttention-2), in fp32
// arithmetic on elements of T, with grouped-query heads as the
// AttentionShape says: qkv (B, T, (NH + 2 NKV) hs), out (B, T, NH hs), lse
// (B, NH, T) in fp32 whatever T is. Head sizes up to kMaxGpuAttentionHeadSize;
// NKV divides NH (equal: multi-head attention, whose bits the grouped forms
// keep).
//
// A thread block takes one (batch, query head) and one block of
// kAttentionBlock queries, or one (batch, key/value head) and one block of
// keys, whose dK and dV it alone writes, walking the query blocks of each of
// the group's query heads in turn (no atomics); its warps take a few rows each; the tiles of q, k, v and dout
// it works on sit in shared memory as fp32. Backward runs two passes that each
// recompute the probabilities, dk and dv per key block and dq per query block,
// so every gradient element has one writer and a fixed order of additions: no
// atomics, the same bits on every run.
#pragma once

#include <cstdint>

#include "kernels/attention.h"
#include "kernels/cuda/launch.h"

namespace pstar::kernels::cuda {

// Which forward a 16-bit run takes where both apply (the KernelTuning knob
// attention_forward: the tuner times both on the GPU at hand). kMma, the
// mma.sync kernel with registers for S and O and double-buffered k and v
// tiles, takes head sizes 64 and 128 with qkv 16-byte aligned and C a
// multiple of 8; elsewhere, and for fp32, the WMMA or CUDA-core kernels run.
// kMmaSharedQ is kMma with the q tile in a k/v buffer at head size 128 (four
// tiles of shared memory instead of five, for more resident blocks; the same
// bits); at head size 64 it runs as kMma. kMmaWide is kMma with 128 queries a
// block on 8 warps (each k and v tile loaded once for twice the rows; the
// same bits). kCudnn is cuDNN's fused graph (kernels/cuda/cudnn_attention.h),
// which its owner runs; these functions run kMma in its place.
enum class AttentionForwardKernel : int { kTensorCore = 0, kMma = 1, kMmaSharedQ = 2, kMmaWide = 3, kCudnn = 4 };

template <typename T>
void AttentionForward(T* out, float* lse, const T* qkv, const AttentionShape& shape, cudaStream_t stream,
                      AttentionForwardKernel kernel = AttentionForwardKernel::kTensorCore);

// Which backward a 16-bit run with 16-bit gradients takes where more than one
// applies (the knob attention_backward; the tuner times them all): kMma, the
// two mma.sync passes (seven products) with their accumulators in
// registers, and kMmaOnePass, one mma.sync pass of five products that adds
// each key block's share of dq into an fp32 sum in a fixed order, take head
// sizes 64 and 128 with every tensor 16-byte aligned and C a multiple of 8.
// All are deterministic; each gives its own bits. The occupancy variants
// are compiled for 3 resident blocks per SM at head size 64 (registers
// capped at 168, some spilled), with their base kernel's bits:
// kMmaOnePassOccupancy of kMmaOnePass, kMmaOccupancy of kMma's keys pass
// (its queries pass is kMma's). They are compile-time variants, built only
// where they may be chosen (AttentionOccupancyVariantsBuilt); elsewhere, and
// at head size 128, each runs as its base kernel. kMmaWide is kMma with 128
// keys a block in the keys pass and 128 queries in the queries pass, on 8
// warps (each streamed tile serves twice the rows; kMma's bits). kCudnn is
// cuDNN's deterministic fused graph (kernels/cuda/cudnn_attention.h), which
// its owner runs; these functions run kMma in its place.
enum class AttentionBackwardKernel : int {
  kTensorCore = 0,
  kMma = 1,
  kMmaOnePass = 2,
  kMmaOnePassOccupancy = 3,
  kMmaOccupancy = 4,
  kMmaWide = 5,
  kCudnn = 6
};

// Whether this build compiled the occupancy variants: a PSTAR_CUDA_TUNING
// build, or one whose tuning table names one (kernels/CMakeLists.txt).
bool AttentionOccupancyVariantsBuilt();

// fp32 elements of scratch the backward pass needs: the rowsums of dout·out,
// and for kMmaOnePass (at the head sizes it takes) the fp32 dq sums and their
// counts (kernels::GpuAttentionScratchElements).
int64_t AttentionScratchElements(const AttentionShape& shape,
                                 AttentionBackwardKernel kernel = AttentionBackwardKernel::kTensorCore);

// dqkv is overwritten; out and lse are the forward's. The forward's tensors
// (qkv, out) may be 16-bit (A) where the gradients are fp32 (T = float): a
// 16-bit run's activations.
template <typename T, typename A = T>
void AttentionBackward(T* dqkv, float* scratch, const T* dout, const A* qkv, const A* out, const float* lse,
                       const AttentionShape& shape, cudaStream_t stream,
                       AttentionBackwardKernel kernel = AttentionBackwardKernel::kTensorCore);

// Grouped heads' gradients summed per key/value head (cuDNN's backward
// writes one per query head, fp32): for the B sequences of T positions,
// dst[(b T + t) row + g hs + d] = the sum over i < group, in order, of
// heads[((b H + g group + i) T + t) hs + d], in fp32 and rounded once to T,
// for the H / group key/value heads g (overwritten; dst is a q|k|v row's
// first key or value column of the call's first key/value head, rows `row`
// apart).
template <typename T>
void AddGroupedHeads(T* dst, int64_t row, const float* heads, int64_t B, int64_t H, int64_t Tlen, int64_t hs,
                     int64_t group, cudaStream_t stream);

}  // namespace pstar::kernels::cuda
