// Reductions used by the optimizer: sums of squares (for the global grad norm)
// and finiteness checks. Deterministic: fixed blocking, double accumulation.
// SumOfSquares adds in exactly the order of the CUDA kernel of the same name,
// so a gradient norm summed partly on a GPU and partly here has the same bits
// wherever each gradient happened to lie.
#ifndef PSTAR_KERNELS_REDUCE_H_
#define PSTAR_KERNELS_REDUCE_H_
#include <cstdint>
#endif  // PSTAR_KERNELS_REDUCE_H_

// The kernels' declarations stay outside the include guard: kernels/cpu/dispatch.cc
// includes this header once more per instruction-set variant, with `cpu`
// renamed to the variant's namespace (kernels/cpu/isa.h).

namespace pstar::kernels::cpu {

double SumOfSquares(const float* x, int64_t n);
bool AllFinite(const float* x, int64_t n);

}  // namespace pstar::kernels::cpu
