// The fused Adam update, one pass over param, grad, exp_avg and exp_avg_sq.
//
// Bit-exactness with kernels::cpu::AdamUpdateReference: every operation is
// written as a correctly rounded _rn intrinsic (add, multiply, divide, square
// root), which the compiler never contracts into a fused multiply-add, in the
// reference's order; this file is also compiled with --fmad=false (device)
// and -ffp-contract=off (host, for the per-call constants), see
// kernels/CMakeLists.txt. Denormals are kept (no -ftz), as on the CPU.
#include "kernels/cuda/adam.h"

#include <cmath>
#include <cstdint>

#include "kernels/cuda/element.cuh"

namespace pstar::kernels::cuda {
namespace {

constexpr unsigned kThreads = 256;
constexpr int kPer = 4;  // elements per thread: one 16-byte access per fp32 stream

// The per-call constants, derived on the host exactly as the reference
// derives them (IEEE float division and square root).
struct Coeffs {
  float beta1, one_minus_b1, beta2, one_minus_b2;
  float grad_scale, l2, bc2_sqrt, eps, step_size, decay;
};

Coeffs MakeCoeffs(const AdamParams& a) {
  Coeffs c;
  c.step_size = a.lr / a.bias_correction1;
  c.bc2_sqrt = std::sqrt(a.bias_correction2);
  c.decay = 1.0f - a.lr * a.decoupled_weight_decay;
  c.one_minus_b1 = 1.0f - a.beta1;
  c.one_minus_b2 = 1.0f - a.beta2;
  c.beta1 = a.beta1;
  c.beta2 = a.beta2;
  c.grad_scale = a.grad_scale;
  c.l2 = a.l2_weight_decay;
  c.eps = a.eps;
  return c;
}

// One element, operation for operation as the reference:
//   g = grad * grad_scale + l2 * p
//   m = beta1 * m + (1 - beta1) * g
//   v = beta2 * v + ((1 - beta2) * g) * g
//   p = p * decay - step_size * (m / (sqrt(v) / sqrt(bc2) + eps))
// Returns the new p; updates m and v in place.
__device__ __forceinline__ float Step(const Coeffs& c, float p, float grad, float& m, float& v) {
  const float g = __fadd_rn(__fmul_rn(grad, c.grad_scale), __fmul_rn(c.l2, p));
  m = __fadd_rn(__fmul_rn(c.beta1, m), __fmul_rn(c.one_minus_b1, g));
  v = __fadd_rn(__fmul_rn(c.beta2, v), __fmul_rn(__fmul_rn(c.one_minus_b2, g), g));
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), c.bc2_sqrt), c.eps);
  return __fsub_rn(__fmul_rn(p, c.decay), __fmul_rn(c.step_size, __fdiv_rn(m, denom)));
}

template <typename G>
struct alignas(sizeof(G) * kPer) GradPack {
  G v[kPer];
};

// Each thread updates kPer consecutive elements: vector accesses when `vec`
// (all pointers aligned to their packs) and the pack is whole, one by one
// otherwise. param_copy may be null.
template <typename G>
__global__ void __launch_bounds__(kThreads)
    AdamKernel(float* param, G* param_copy, const G* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
               bool vec, Coeffs c) {
  const int64_t i0 = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * kPer;
  if (i0 >= n) return;
  if (vec && i0 + kPer <= n) {
    float4 p = *reinterpret_cast<const float4*>(param + i0);
    float4 m = *reinterpret_cast<const float4*>(exp_avg + i0);
    float4 v = *reinterpret_cast<const float4*>(exp_avg_sq + i0);
    const GradPack<G> g = *reinterpret_cast<const GradPack<G>*>(grad + i0);
    p.x = Step(c, p.x, ToFloat(g.v[0]), m.x, v.x);
    p.y = Step(c, p.y, ToFloat(g.v[1]), m.y, v.y);
    p.z = Step(c, p.z, ToFloat(g.v[2]), m.z, v.z);
    p.w = Step(c, p.w, ToFloat(g.v[3]), m.w, v.w);
    *reinterpret_cast<float4*>(param + i0) = p;
    *reinterpret_cast<float4*>(exp_avg + i0) = m;
    *reinterpret_cast<float4*>(exp_avg_sq + i0) = v;
    if (param_copy != nullptr) {
      GradPack<G> out;
      out.v[0] = FromFloat<G>(p.x);
      out.v[1] = FromFloat<G>(p.y);
      out.v[2] = FromFloat<G>(p.z);
      out.v[3] = FromFloat<G>(p.w);
      *reinterpret_cast<GradPack<G>*>(param_copy + i0) = out;
    }
  } else {
    const int64_t end = n - i0 < kPer ? n : i0 + kPer;
    for (int64_t i = i0; i < end; ++i) {
      float m = exp_avg[i], v = exp_avg_sq[i];
      const float p = Step(c, param[i], ToFloat(grad[i]), m, v);
      param[i] = p;
      exp_avg[i] = m;
      exp_avg_sq[i] = v;
      if (param_copy != nullptr) param_copy[i] = FromFloat<G>(p);
    }
  }
}

bool Aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

}  // namespace

template <typename G>
void AdamUpdate(float* param, G* param_copy, const G* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                const AdamParams& p, cudaStream_t stream) {
  if (n <= 0) return;
  const bool vec = Aligned(param, sizeof(float4)) && Aligned(exp_avg, sizeof(float4)) &&
                   Aligned(exp_avg_sq, sizeof(float4)) && Aligned(grad, sizeof(GradPack<G>)) &&
                   Aligned(param_copy, sizeof(GradPack<G>));
  AdamKernel<<<BlocksFor((n + kPer - 1) / kPer, kThreads), kThreads, 0, stream>>>(
      param, param_copy, grad, exp_avg, exp_avg_sq, n, vec, MakeCoeffs(p));
  CheckLaunch("AdamUpdate");
}

#define PSTAR_ADAM(G)                                                                                    \
  template void AdamUpdate<G>(float*, G*, const G*, float*, float*, int64_t, const AdamParams&, cudaStream_t);
PSTAR_ADAM(float)
PSTAR_ADAM(bf16)
PSTAR_ADAM(fp16)
#undef PSTAR_ADAM

}  // namespace pstar::kernels::cuda
