// Linear layer y = x W^T + b with W stored (OC, C) as in PyTorch. x (N, C), y (N, OC).
// GEMMs go through BLAS; bias sums are deterministic.
#pragma once
#include <cstdint>

namespace pstar::kernels::cpu {

// out = inp @ weight^T + bias (bias may be null).
void MatmulForward(float* out, const float* inp, const float* weight, const float* bias,
                   int64_t N, int64_t C, int64_t OC);
// dinp = dout @ weight (overwritten); dweight += dout^T @ inp; dbias += colsum(dout).
void MatmulBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                    const float* inp, const float* weight, int64_t N, int64_t C, int64_t OC);

// C(M,N) = alpha * op(A) op(B) + beta * C, row-major, with explicit leading dimensions.
void Gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

}  // namespace pstar::kernels::cpu
