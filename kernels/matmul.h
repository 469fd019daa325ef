// Linear layer y = x W^T + b with W stored (OC, C) as in PyTorch. x (N, C), y (N, OC).
// GEMMs go through BLAS, split by Gemm below so that results do not depend on
// the thread count; bias sums are deterministic.
#ifndef PSTAR_KERNELS_MATMUL_H_
#define PSTAR_KERNELS_MATMUL_H_
#include <cstdint>
#endif  // PSTAR_KERNELS_MATMUL_H_

// The kernels' declarations stay outside the include guard: kernels/cpu/dispatch.cc
// includes this header once more per instruction-set variant, with `cpu`
// renamed to the variant's namespace (kernels/cpu/isa.h).

namespace pstar::kernels::cpu {

// out = inp @ weight^T + bias (bias may be null).
void MatmulForward(float* out, const float* inp, const float* weight, const float* bias,
                   int64_t N, int64_t C, int64_t OC);
// dinp = dout @ weight (overwritten); dweight += dout^T @ inp; dbias += colsum(dout).
void MatmulBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                    const float* inp, const float* weight, int64_t N, int64_t C, int64_t OC);

// C(M,N) = alpha * op(A) op(B) + beta * C, row-major, with explicit leading dimensions.
//
// The bits must not depend on how many threads run (BLAS libraries may pick
// other kernels or splits by thread count), so C is cut into square tiles
// whose size GemmTile picks from (M, N) alone, K never split, and OpenMP
// hands out the tiles; each tile is one BLAS call made inside the parallel
// region, where OpenBLAS's OpenMP flavour runs single-threaded. Called inside
// an enclosing parallel region (attention's per-head GEMMs), it is one
// single-threaded BLAS call.
//
// The tile edge: about 16 tiles (enough to balance the threads of a node),
// a multiple of 64 in [64, 512].
int64_t GemmTile(int64_t M, int64_t N);
void Gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

}  // namespace pstar::kernels::cpu
