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

// A span of fp32 values, as the multi-span reduction reads it from device
// memory.
struct DeviceSpan {
  const float* data;
  int64_t n;
};
// The most spans one SumsOfSquares call takes (the grid's y dimension).
inline constexpr int64_t kMaxSumSpans = 65535;
// Elements of double scratch SumsOfSquares needs for `count` spans.
int64_t SumsOfSquaresScratchElements(int64_t count);

// out[i] += sum spans[i].data[j]^2 for each of `count` spans (spans and out
// in device memory, count <= kMaxSumSpans), in two launches for all of them:
// each span's sum has the bits SumOfSquares gives it alone (the same grid
// per span, the same partials, the same order), so a gradient norm over many
// tensors costs two launches, not two per tensor.
void SumsOfSquares(double* out, double* scratch, const DeviceSpan* spans, int64_t count, cudaStream_t stream);

// Sets *flag to 1 when any x[i] is inf or NaN; leaves it as is otherwise.
template <typename T>
void FlagNonFinite(int32_t* flag, const T* x, int64_t n, cudaStream_t stream);

// *out += sum x[i] (out is one device double): the training loss, summed
// over micro-batches on the device and read once per step.
void Sum(double* out, double* scratch, const float* x, int64_t n, cudaStream_t stream);

}  // namespace pstar::kernels::cuda
