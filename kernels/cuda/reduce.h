// Reductions the step needs, on the GPU, results left in device memory (the
// host reads them once per step): sums of squares for the global gradient
// norm, the non-finite check for the loss scaler, and the loss.
// Deterministic: a fixed grid writes partials to scratch and one block sums
// them in a fixed order, in double.
#pragma once

#include <cstdint>

#include "kernels/cuda/launch.h"

namespace pstar::kernels::cuda {

// Elements of double scratch each reduction needs (a constant).
int64_t ReduceScratchElements();

// *out += sum x[i]^2 (out is one device double).
template <typename T>
void SumOfSquares(double* out, double* scratch, const T* x, int64_t n, cudaStream_t stream);

// Sets *flag to 1 when any x[i] is inf or NaN; leaves it as is otherwise.
template <typename T>
void FlagNonFinite(int32_t* flag, const T* x, int64_t n, cudaStream_t stream);

// *out += sum x[i] (out is one device double): the training loss, summed
// over micro-batches on the device and read once per step.
void Sum(double* out, double* scratch, const float* x, int64_t n, cudaStream_t stream);

}  // namespace pstar::kernels::cuda
