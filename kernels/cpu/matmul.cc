#include "kernels/matmul.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu/column_sum.h"
#include "kernels/cpu/isa_target.h"

PSTAR_CPU_ISA_BEGIN
namespace pstar::kernels::cpu {

namespace {

void BlasGemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
              int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              int(M), int(N), int(K), alpha, A, int(lda), B, int(ldb), beta, C, int(ldc));
}

}  // namespace

int64_t GemmTile(int64_t M, int64_t N) {
  const double edge = std::sqrt(double(M) * double(N) / 16.0);
  const int64_t rounded = (int64_t(std::ceil(edge)) + 63) / 64 * 64;
  return std::clamp<int64_t>(rounded, 64, 512);
}

void Gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  if (omp_in_parallel()) {
    BlasGemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  const int64_t tile = GemmTile(M, N);
  const int64_t row_tiles = (M + tile - 1) / tile;
  const int64_t col_tiles = (N + tile - 1) / tile;
  // A team of one thread is not "in parallel" for OpenBLAS, which then sizes
  // itself by omp_get_max_threads(): 1 here as well.
#pragma omp parallel for schedule(dynamic)
  for (int64_t t = 0; t < row_tiles * col_tiles; ++t) {
    const int64_t i0 = t / col_tiles * tile, j0 = t % col_tiles * tile;
    const int64_t rows = std::min(tile, M - i0), cols = std::min(tile, N - j0);
    // op(A) rows i0.. are A's rows (or columns, transposed); op(B) columns
    // j0.. are B's columns (or rows, transposed).
    const float* a = trans_a ? A + i0 : A + i0 * lda;
    const float* b = trans_b ? B + j0 * ldb : B + j0;
    BlasGemm(trans_a, trans_b, rows, cols, K, alpha, a, lda, b, ldb, beta, C + i0 * ldc + j0, ldc);
  }
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
PSTAR_CPU_ISA_END
