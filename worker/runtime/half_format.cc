#include "worker/runtime/half_format.h"

#include "kernels/half.h"

namespace pstar {

void NarrowToHalf(uint16_t* dst, const float* src, int64_t n, HalfFormat format) {
  // Elementwise, so the bits do not depend on the threads; parallel for
  // whole chunks (params narrowed on their way to a GPU).
  if (format == HalfFormat::kBf16) {
#pragma omp parallel for schedule(static) if (n >= (int64_t{1} << 20))
    for (int64_t i = 0; i < n; ++i) dst[i] = kernels::FloatToBFloat16(src[i]);
  } else {
#pragma omp parallel for schedule(static) if (n >= (int64_t{1} << 20))
    for (int64_t i = 0; i < n; ++i) dst[i] = kernels::FloatToHalf(src[i]);
  }
}

void WidenFromHalf(float* dst, const uint16_t* src, int64_t n, HalfFormat format) {
  if (format == HalfFormat::kBf16) {
    for (int64_t i = 0; i < n; ++i) dst[i] = kernels::BFloat16ToFloat(src[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = kernels::HalfToFloat(src[i]);
  }
}

}  // namespace pstar
