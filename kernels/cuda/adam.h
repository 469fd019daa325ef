// The fused Adam / AdamW update on the GPU: the formulas and parameter block
// of kernels/adam.h (kernels::cpu::AdamParams), fp32 master weights and
// moments, gradients in fp32, bf16 or fp16, widened as they are read.
// Optionally writes the updated weights rounded to the gradients' type into
// `param_copy`: the working copy a mixed-precision model computes with.
#pragma once

#include <cstdint>

#include "kernels/adam.h"
#include "kernels/cuda/launch.h"

namespace pstar::kernels::cuda {

using AdamParams = kernels::cpu::AdamParams;

// Updates param, exp_avg and exp_avg_sq in place for n elements, doing the
// same IEEE operations in the same order as kernels::cpu::AdamUpdateReference
// (no fused multiply-add), so fp32 results match the CPU bit for bit.
// param_copy may be null.
template <typename G>
void AdamUpdate(float* param, G* param_copy, const G* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                const AdamParams& p, cudaStream_t stream);

}  // namespace pstar::kernels::cuda
