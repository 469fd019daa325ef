// Reductions used by the optimizer: sums of squares (for the global grad norm)
// and finiteness checks. Deterministic: fixed blocking, double accumulation.
// SumOfSquares adds in exactly the order of the CUDA kernel of the same name,
// so a gradient norm summed partly on a GPU and partly here has the same bits
// wherever each gradient happened to lie.
#pragma once
#include <cstdint>

namespace pstar::kernels::cpu {

double SumOfSquares(const float* x, int64_t n);
bool AllFinite(const float* x, int64_t n);

}  // namespace pstar::kernels::cpu
