// Reductions used by the optimizer: sums of squares (for the global grad norm)
// and finiteness checks. Deterministic: fixed blocking, double accumulation.
#pragma once
#include <cstdint>

namespace pstar::kernels::cpu {

double SumOfSquares(const float* x, int64_t n);
bool AllFinite(const float* x, int64_t n);

}  // namespace pstar::kernels::cpu
