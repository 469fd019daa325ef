// Adam / AdamW update of one contiguous span, matching PyTorch's formulas:
//   g  = grad * grad_scale (+ l2 * p for coupled Adam)
//   p *= 1 - lr * decoupled_wd
//   m  = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps)
//
// AdamUpdate is vectorized by hand (AVX-512F or AVX2, picked once at run time
// from CPUID, so a portable build still gets them) and threaded with OpenMP
// for large spans. Every path performs the same IEEE operations in the same
// order as AdamUpdateReference, with no fused multiply-add, so all of them
// produce the same bits.
#pragma once

#include <cstdint>

namespace pstar::kernels::cpu {

struct AdamParams {
  float lr;
  float beta1;
  float beta2;
  float eps;
  float decoupled_weight_decay;  // AdamW
  float l2_weight_decay;         // classic Adam (added to the gradient)
  float grad_scale;              // unscale x clip coefficient, fused
  float bias_correction1;        // 1 - beta1^step
  float bias_correction2;        // 1 - beta2^step
};

// The storage format of 16-bit gradients; see kernels/half.h.
enum class HalfType { kFloat16, kBFloat16 };

// Updates param, exp_avg and exp_avg_sq in place for n elements.
void AdamUpdate(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                const AdamParams& p);
// The same with 16-bit gradients, widened exactly to fp32 as they are read.
void AdamUpdate(float* param, const uint16_t* grad, HalfType grad_type, float* exp_avg,
                float* exp_avg_sq, int64_t n, const AdamParams& p);

// Plain single-threaded scalar loops: the oracle the fast paths are tested
// against, bit for bit.
void AdamUpdateReference(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                         int64_t n, const AdamParams& p);
void AdamUpdateReference(float* param, const uint16_t* grad, HalfType grad_type, float* exp_avg,
                         float* exp_avg_sq, int64_t n, const AdamParams& p);

// The instruction-set paths. AdamUpdate uses the best one the CPU (and OS)
// supports, chosen on first use.
enum class AdamPath { kScalar, kAvx2, kAvx512 };

AdamPath AdamSelectedPath();
bool AdamPathSupported(AdamPath path);
const char* AdamPathName(AdamPath path);  // "scalar", "avx2", "avx512"
// The name of the selected path.
const char* AdamIsa();

// AdamUpdate pinned to one path, for tests and benchmarks; `path` must be
// supported.
void AdamUpdateOnPath(AdamPath path, float* param, const float* grad, float* exp_avg,
                      float* exp_avg_sq, int64_t n, const AdamParams& p);
void AdamUpdateOnPath(AdamPath path, float* param, const uint16_t* grad, HalfType grad_type,
                      float* exp_avg, float* exp_avg_sq, int64_t n, const AdamParams& p);

}  // namespace pstar::kernels::cpu
