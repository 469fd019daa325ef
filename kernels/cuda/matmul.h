// Linear layers and GEMMs on the GPU through cuBLASLt, for fp32, bf16 and
// fp16 operands with fp32 accumulation (and fp32 compute for fp32 operands:
// no TF32, so fp32 results track the CPU kernels). Same layouts and
// semantics as kernels/matmul.h: W stored (OC, C), x (N, C), y (N, OC),
// row-major.
#pragma once

#include <cublasLt.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <set>

#include "kernels/cuda/launch.h"

namespace pstar::kernels::cuda {

// The cuBLASLt handle and its workspace on the current device, made once at
// start-up (no allocation per call). Not thread-safe: one per stream owner.
class BlasContext {
 public:
  static constexpr size_t kDefaultWorkspaceBytes = size_t(32) << 20;
  explicit BlasContext(size_t workspace_bytes = kDefaultWorkspaceBytes);
  ~BlasContext();
  BlasContext(const BlasContext&) = delete;
  BlasContext& operator=(const BlasContext&) = delete;

  cublasLtHandle_t handle() const { return handle_; }
  void* workspace() const { return workspace_; }
  size_t workspace_bytes() const { return workspace_bytes_; }

  // The algorithm cuBLASLt's heuristic chose for a GEMM of this shape
  // (types, transposes, sizes, leading dimensions, strides, batch, operand
  // alignments, epilogue, the rank asked for): queried once, reused by every later call of the
  // same shape, which a training step repeats every layer and every step.
  // The heuristic gives the same answer for the same key, so caching changes
  // no bits. A key it offered nothing for is remembered too (the caller then
  // takes another way, without asking again).
  using GemmKey = std::array<int64_t, 19>;
  const cublasLtMatmulAlgo_t* FindAlgo(const GemmKey& key) const {
    auto it = algos_.find(key);
    return it == algos_.end() ? nullptr : &it->second;
  }
  void RememberAlgo(const GemmKey& key, const cublasLtMatmulAlgo_t& algo) { algos_[key] = algo; }
  bool KnownUnsupported(const GemmKey& key) const { return unsupported_.count(key) > 0; }
  void RememberUnsupported(const GemmKey& key) { unsupported_.insert(key); }
  size_t cached_algos() const { return algos_.size(); }

 private:
  std::map<GemmKey, cublasLtMatmulAlgo_t> algos_;
  std::set<GemmKey> unsupported_;
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
};

// C(M,N) = alpha * op(A) op(B) + beta * C, row-major with explicit leading
// dimensions, as kernels::cpu::Gemm.
template <typename T>
void Gemm(BlasContext& blas, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
          const T* A, int64_t lda, const T* B, int64_t ldb, float beta, T* C, int64_t ldc,
          cudaStream_t stream);

// Gemm with C of a type of its own: TO = T, or fp32 from 16-bit operands
// (fp32 accumulation and output; the row parts' classifier gradients).
template <typename T, typename TO>
void GemmTo(BlasContext& blas, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const T* A,
            int64_t lda, const T* B, int64_t ldb, float beta, TO* C, int64_t ldc, cudaStream_t stream);

// Gemm on `batch` independent matrices at fixed strides (in elements): the
// i-th product reads A + i*stride_a and B + i*stride_b and updates
// C + i*stride_c. The per-head GEMMs of attention.
template <typename T>
void GemmStridedBatched(BlasContext& blas, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                        float alpha, const T* A, int64_t lda, int64_t stride_a, const T* B, int64_t ldb,
                        int64_t stride_b, float beta, T* C, int64_t ldc, int64_t stride_c, int64_t batch,
                        cudaStream_t stream);

// out = inp @ weight^T + bias (bias may be null), rounded once to T. The
// bias is cuBLASLt's epilogue (CUBLASLT_EPILOGUE_BIAS: added to the fp32
// accumulator, no pass of its own) when the bias is 16-byte aligned and
// cuBLASLt has an algorithm for it; otherwise it is written into out first
// and the GEMM adds to it (beta 1), which rounds the same way.
template <typename T>
void MatmulForward(BlasContext& blas, T* out, const T* inp, const T* weight, const T* bias, int64_t N,
                   int64_t C, int64_t OC, cudaStream_t stream);

// dinp = dout @ weight (overwritten); dweight += dout^T @ inp; dbias +=
// colsum(dout) (dbias may be null; scratch holds BiasGradientScratchElements
// floats). Deterministic: the same inputs give the same bits on every run.
template <typename T>
void MatmulBackward(BlasContext& blas, T* dinp, T* dweight, T* dbias, float* scratch, const T* dout, const T* inp,
                    const T* weight, int64_t N, int64_t C, int64_t OC, cudaStream_t stream);

// Mixed precision linear layers: 16-bit operands (T is bf16 or fp16, already
// rounded by the caller), fp32 accumulation, and fp32 outputs, bias and
// gradients. out = inp @ weight^T + bias (bias may be null).
template <typename T>
void MatmulForwardMixed(BlasContext& blas, float* out, const T* inp, const T* weight, const float* bias, int64_t N,
                        int64_t C, int64_t OC, cudaStream_t stream);

// The fc_proj layer's input gradient with GELU's backward in the GEMM's
// epilogue (cuBLASLt's DGELU), for 16-bit T: dinp = (dout @ weight) *
// GELU'(pre), rounded once, in one pass where MatmulBackwardInput then
// GeluBackward take two (and round the product first). cuBLASLt's GELU' is
// its own evaluation of the tanh form's derivative, so dinp matches the
// separate kernels to T's rounding, not bit for bit (the GPU tests bound
// it); it is deterministic. Returns false, having done nothing, where
// cuBLASLt offers no algorithm or the matrices do not fit the epilogue
// (dinp and pre 16-byte aligned, C a multiple of 8); the caller then runs
// the separate kernels.
template <typename T>
bool MatmulBackwardInputGelu(BlasContext& blas, T* dinp, const T* dout, const T* weight, const T* pre, int64_t N,
                             int64_t C, int64_t OC, cudaStream_t stream);

// A 16-bit run's weight gradient with its bias gradient in the GEMM's
// epilogue (cuBLASLt's BGRADB): dweight (fp32, OC x C) += dout^T @ inp and
// dbias_sum (OC fp32, overwritten, 16-byte aligned) = colsum(dout), summed
// in cuBLASLt's order (deterministic for one algorithm; the GPU tests check
// the bits repeat), in one pass where AddBiasGradient takes two more.
// Returns false, having done nothing, where cuBLASLt offers no algorithm or
// OC is not a multiple of 8; the caller then runs the separate kernels.
template <typename T>
bool MatmulBackwardWeightBiasGrad(BlasContext& blas, float* dweight, float* dbias_sum, const T* dout, const T* inp,
                                  int64_t N, int64_t C, int64_t OC, cudaStream_t stream, int algo_rank = 0);

// The pieces of the backwards above, for callers that time them apart:
// dinp = dout @ weight (overwritten); dweight += dout^T @ inp; dbias +=
// colsum(dout) in a fixed order. T is the GEMM operands' type and TO the
// outputs' (T, or fp32 for mixed precision); the bias gradient's dout (TD)
// may be 16-bit where the gradient is fp32 (a 16-bit run's activation
// gradients, summed in fp32).
template <typename T, typename TO>
void MatmulBackwardInput(BlasContext& blas, TO* dinp, const T* dout, const T* weight, int64_t N, int64_t C,
                         int64_t OC, cudaStream_t stream);
//
// The weight gradients take `algo_rank`: which of cuBLASLt's heuristic's
// candidates runs (0 its first; KernelTuning::weight_grad_gemm_algo, which
// the tuner times, since the first is weakest where the output has few
// tiles and K is long); where it offers fewer, its last. The heuristic's list
// is the same for the same shape, so a rank is one algorithm: its own bits,
// the same ones run to run.
template <typename T, typename TO>
void MatmulBackwardWeight(BlasContext& blas, TO* dweight, const T* dout, const T* inp, int64_t N, int64_t C,
                          int64_t OC, cudaStream_t stream, int algo_rank = 0);
// The bias gradient runs over the whole GPU in two passes through `scratch`
// (BiasGradientScratchElements floats, at most 256 x OC): fixed-order
// partial sums of row groups of at least `group_rows` rows (32 or more;
// KernelTuning), then their totals in group order.
int64_t BiasGradientScratchElements(int64_t N, int64_t OC);
template <typename TO, typename TD = TO>
void AddBiasGradient(TO* dbias, float* scratch, const TD* dout, int64_t N, int64_t OC, cudaStream_t stream,
                     int group_rows = 64);

}  // namespace pstar::kernels::cuda
