#include "kernels/encoder.h"

#include "kernels/cpu/column_sum.h"

namespace pstar::kernels::cpu {

void EncoderForward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                    int64_t B, int64_t T, int64_t C) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      float* o = out + (b * T + t) * C;
      const float* e = wte + int64_t(tokens[b * T + t]) * C;
      const float* p = wpe + t * C;
      for (int64_t c = 0; c < C; ++c) o[c] = e[c] + p[c];
    }
  }
}

void EncoderBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                     int64_t B, int64_t T, int64_t C) {
  // Each thread owns a range of channels and walks every row in order, so the
  // sum order per element is fixed and no two threads write the same element.
#pragma omp parallel
  {
    auto [c0, c1] = ThreadColumns(C);
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t t = 0; t < T; ++t) {
        const float* d = dout + (b * T + t) * C;
        float* e = dwte + int64_t(tokens[b * T + t]) * C;
        float* p = dwpe + t * C;
        for (int64_t c = c0; c < c1; ++c) {
          e[c] += d[c];
          p[c] += d[c];
        }
      }
    }
  }
}

}  // namespace pstar::kernels::cpu
