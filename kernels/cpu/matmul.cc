#include "kernels/matmul.h"

#include <cblas.h>

#include "kernels/cpu/column_sum.h"

namespace pstar::kernels::cpu {

void Gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              int(M), int(N), int(K), alpha, A, int(lda), B, int(ldb), beta, C, int(ldc));
}

void MatmulForward(float* out, const float* inp, const float* weight, const float* bias,
                   int64_t N, int64_t C, int64_t OC) {
  float beta = 0.0f;
  if (bias != nullptr) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      float* o = out + n * OC;
      for (int64_t j = 0; j < OC; ++j) o[j] = bias[j];
    }
    beta = 1.0f;
  }
  Gemm(false, true, N, OC, C, 1.0f, inp, C, weight, C, beta, out, OC);
}

void MatmulBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                    const float* inp, const float* weight, int64_t N, int64_t C, int64_t OC) {
  Gemm(false, false, N, C, OC, 1.0f, dout, OC, weight, C, 0.0f, dinp, C);
  Gemm(true, false, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
  if (dbias != nullptr) {
    AccumulateColumns(dbias, N, OC, [&](int64_t n, int64_t j) { return dout[n * OC + j]; });
  }
}

}  // namespace pstar::kernels::cpu
