// Causal multi-head self-attention with no T×T storage (the FlashAttention-2
// algorithm). Queries and keys are taken in blocks of kAttentionBlock
// positions and only blocks on or below the diagonal are computed. Forward
// keeps the output and, per (batch, head, query), the log-sum-exp of that
// query's scaled scores; backward recomputes the probabilities block by block
// from q, k and the log-sum-exp. Memory is linear in T.
//
// qkv (B, T, 3C) holds q | k | v, head h at columns h*hs of each third
// (hs = C/NH). out (B, T, C). lse (B, NH, T). With grouped-query attention
// (AttentionShape) a row holds NH query heads, then NKV key heads, then NKV
// value heads, and query head h reads kv head h / (NH / NKV).
#ifndef PSTAR_KERNELS_ATTENTION_H_
#define PSTAR_KERNELS_ATTENTION_H_
#include <cstdint>

namespace pstar::kernels {

// B sequences of T positions; NH query heads and NKV key/value heads (NKV
// divides NH; equal is multi-head attention) of hs columns each.
// `positions` (B*T, in the kernels' memory), where rows hold packed
// examples: each token's position in its example (0 at its first token,
// so 0 <= positions[b, t] <= t), and a query at t attends to the keys
// [t - positions[b, t], t] of its own example only (the variable-length form
// of FlashAttention's, as segment starts). Null: each row is one sequence.
struct AttentionShape {
  int64_t B = 0, T = 0, NH = 0, NKV = 0, hs = 0;
  const int32_t* positions = nullptr;
  int64_t RowElements() const { return (NH + 2 * NKV) * hs; }  // one position's q|k|v
};

// The rows of an AttentionShape as the CUDA kernels (and their host
// emulations) index them: elements of a q|k|v row and of an out row, the
// query heads and the key/value heads. Query head h of a (batch, position)
// sits at column h * hs of its q|k|v row, key head g at (NH + g) * hs, value
// head g at (NH + NKV + g) * hs, and reads key/value head h / (NH / NKV).
struct QkvRows {
  int64_t qkv = 0, out = 0;
  int NH = 0, NKV = 0;
  const int32_t* positions = nullptr;  // AttentionShape::positions
};
inline QkvRows RowsOf(const AttentionShape& s) {
  return {s.RowElements(), s.NH * s.hs, int(s.NH), int(s.NKV), s.positions};
}

// The first key the query at position t (< T) of row b sees: its example's
// first position where rows hold packed examples, else 0. Every kernel
// masks the keys before it as it masks those after the query. constexpr, so
// the CUDA kernels call it too (--expt-relaxed-constexpr).
constexpr int64_t FirstVisibleKey(const int32_t* positions, int64_t b, int64_t T, int64_t t) {
  return positions != nullptr ? t - positions[b * T + t] : 0;
}

// The one blocking of both backends (the CUDA kernels tile by it too).
inline constexpr int64_t kAttentionBlock = 64;
// The largest head size (C / NH) the CUDA kernels take: each lane of a warp
// keeps kMaxGpuAttentionHeadSize / 32 columns of a row's accumulators in
// registers, and backward's four fp32 tiles of 64 rows (130 KiB at 128) fit
// the shared memory of sm_80 and sm_90, the architectures the build targets
// (sm_86/sm_89 allow 99 KiB: head sizes up to 96 there).
inline constexpr int64_t kMaxGpuAttentionHeadSize = 128;

// fp32 elements of scratch the CUDA backward needs (the planner sizes the
// GPU's scratch by it; kernels/cuda/attention.h says which kernel is which):
// a rowsum of dout·out per (batch, head, position), and with `one_pass` at
// head sizes 64 and 128 the fp32 sum of dq for every (batch, position,
// column), one count per (batch, head, query block) and a ticket counter,
// each part 16-byte aligned.
inline int64_t GpuAttentionScratchElements(int64_t B, int64_t T, int64_t C, int64_t NH, bool one_pass) {
  auto aligned = [](int64_t elements) { return (elements + 3) / 4 * 4; };
  const int64_t rowsums = aligned(B * NH * T);
  const int64_t hs = NH > 0 ? C / NH : 0;
  if (!one_pass || (hs != 64 && hs != 128)) return rowsums;
  const int64_t counts = aligned(B * NH * ((T + kAttentionBlock - 1) / kAttentionBlock) + 1);
  return rowsums + counts + B * T * C;
}

}  // namespace pstar::kernels
#endif  // PSTAR_KERNELS_ATTENTION_H_

// The kernels' declarations stay outside the include guard: kernels/cpu/dispatch.cc
// includes this header once more per instruction-set variant, with `cpu`
// renamed to the variant's namespace (kernels/cpu/isa.h).

namespace pstar::kernels::cpu {

// OpenMP over (batch, head, query block); each block's keys in order, so the
// bits depend on the shape alone, not on the thread count.
void AttentionForward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t C,
                      int64_t NH);
// dqkv is overwritten; out and lse are the forward's. OpenMP over (batch,
// head); inside a head the key blocks and then the query blocks in order.
void AttentionBackward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                       int64_t B, int64_t T, int64_t C, int64_t NH);
// Grouped-query forms over a q|k|v row of `shape` (out (B, T, NH * hs)).
// With NKV = NH the same bits as the multi-head forms. Backward runs one
// task per (batch, kv head), which writes that head's dk and dv and its
// query heads' dq.
void AttentionForward(float* out, float* lse, const float* qkv, const AttentionShape& shape);
void AttentionBackward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                       const AttentionShape& shape);
void AttentionForward(uint16_t* out, float* lse, const uint16_t* qkv, bool bf16, const AttentionShape& shape);
void AttentionBackward(float* dqkv, const float* dout, const uint16_t* qkv, const uint16_t* out, bool bf16,
                       const float* lse, const AttentionShape& shape);
// The same two over a 16-bit run's activations: qkv and out 16-bit
// (bfloat16 when `bf16`, else IEEE half), widened exactly as they are read;
// forward rounds out once (nearest even); lse and the gradients are fp32.
// Exactly the fp32 kernels over the widened tensors.
void AttentionForward(uint16_t* out, float* lse, const uint16_t* qkv, bool bf16, int64_t B, int64_t T, int64_t C,
                      int64_t NH);
void AttentionBackward(float* dqkv, const float* dout, const uint16_t* qkv, const uint16_t* out, bool bf16,
                       const float* lse, int64_t B, int64_t T, int64_t C, int64_t NH);

}  // namespace pstar::kernels::cpu
