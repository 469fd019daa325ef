// Adam on the CPU: hand-vectorized AVX-512F and AVX2 paths chosen at run
// time, a portable scalar path, and the plain reference loop.
//
// Bit-exactness: this file is compiled with -ffp-contract=off (see
// kernels/CMakeLists.txt) so no multiply and add are fused into an FMA, and
// the SIMD code spells out every operation in the reference's order. IEEE
// add, subtract, multiply, divide and square root are correctly rounded in
// scalar and SIMD alike, so each lane computes exactly what the reference
// computes. Flush-to-zero is never enabled, so subnormals agree as well.
// -fno-math-errno (sqrt of v >= 0 never sets errno) lets the compiler
// vectorize the scalar fallback path, which matters off x86.
//
// The update is memory-bound (it streams 28 bytes per parameter), so the
// work is one fused pass: each thread takes one contiguous, cache-line
// aligned block and the gradient is widened to fp32 in registers.
#include "kernels/adam.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "kernels/half.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define PSTAR_ADAM_X86 1
#else
#define PSTAR_ADAM_X86 0
#endif

namespace pstar::kernels::cpu {
namespace {

// Spans shorter than this per thread run on the calling thread: forking a
// team costs more than the update itself.
constexpr int64_t kMinElementsPerThread = int64_t{1} << 15;
constexpr int64_t kCacheLine = 64;

enum class GradKind { kF32, kF16, kBF16 };

// The per-call constants, derived from AdamParams exactly as the reference
// derives them.
struct Coeffs {
  float beta1, one_minus_b1, beta2, one_minus_b2;
  float grad_scale, l2, bc2_sqrt, eps, step_size, decay;
};

Coeffs MakeCoeffs(const AdamParams& a) {
  Coeffs c;
  c.beta1 = a.beta1;
  c.one_minus_b1 = 1.0f - a.beta1;
  c.beta2 = a.beta2;
  c.one_minus_b2 = 1.0f - a.beta2;
  c.grad_scale = a.grad_scale;
  c.l2 = a.l2_weight_decay;
  c.bc2_sqrt = std::sqrt(a.bias_correction2);
  c.eps = a.eps;
  c.step_size = a.lr / a.bias_correction1;
  c.decay = 1.0f - a.lr * a.decoupled_weight_decay;
  return c;
}

// Elements from p to the next `align`-byte boundary.
inline int64_t AlignGap(const float* p, int64_t align) {
  return int64_t((-reinterpret_cast<uintptr_t>(p)) & uintptr_t(align - 1)) / int64_t(sizeof(float));
}

template <GradKind K>
inline float GradAt(const void* grad, int64_t i) {
  if constexpr (K == GradKind::kF32) {
    return static_cast<const float*>(grad)[i];
  } else if constexpr (K == GradKind::kF16) {
    return HalfToFloat(static_cast<const uint16_t*>(grad)[i]);
  } else {
    return BFloat16ToFloat(static_cast<const uint16_t*>(grad)[i]);
  }
}

// One element, in the reference's order. Used by the scalar path and by the
// SIMD paths for their unaligned heads and short tails.
template <GradKind K>
inline void StepOne(const Coeffs& c, float* param, const void* grad, float* exp_avg,
                    float* exp_avg_sq, int64_t i) {
  const float p = param[i];
  const float g = GradAt<K>(grad, i) * c.grad_scale + c.l2 * p;
  const float m = c.beta1 * exp_avg[i] + c.one_minus_b1 * g;
  const float v = c.beta2 * exp_avg_sq[i] + c.one_minus_b2 * g * g;
  exp_avg[i] = m;
  exp_avg_sq[i] = v;
  const float denom = std::sqrt(v) / c.bc2_sqrt + c.eps;
  param[i] = p * c.decay - c.step_size * (m / denom);
}

// Updates elements [begin, end).
using SpanFn = void (*)(const Coeffs& c, float* param, const void* grad, float* exp_avg,
                        float* exp_avg_sq, int64_t begin, int64_t end);

template <GradKind K>
void ScalarSpan(const Coeffs& c, float* param, const void* grad, float* exp_avg,
                float* exp_avg_sq, int64_t begin, int64_t end) {
#pragma omp simd
  for (int64_t i = begin; i < end; ++i) StepOne<K>(c, param, grad, exp_avg, exp_avg_sq, i);
}

#if PSTAR_ADAM_X86

#define PSTAR_TARGET_AVX512 __attribute__((target("avx512f")))
#define PSTAR_TARGET_AVX2 __attribute__((target("avx2,f16c")))

// Software prefetch distance, in elements (2 KiB of each fp32 stream): the
// hardware prefetchers alone leave bandwidth unused with four read streams
// per core. No non-temporal stores: p, m and v are read first, so their
// lines are in cache when written (bench/RESULTS.md, CPU Adam).
constexpr int64_t kPrefetchAhead = 512;

template <GradKind K>
inline void PrefetchLine(const float* param, const void* grad, const float* exp_avg,
                         const float* exp_avg_sq, int64_t i) {
  _mm_prefetch(reinterpret_cast<const char*>(param + i), _MM_HINT_T0);
  if constexpr (K == GradKind::kF32) {
    _mm_prefetch(reinterpret_cast<const char*>(static_cast<const float*>(grad) + i), _MM_HINT_T0);
  } else {
    _mm_prefetch(reinterpret_cast<const char*>(static_cast<const uint16_t*>(grad) + i), _MM_HINT_T0);
  }
  _mm_prefetch(reinterpret_cast<const char*>(exp_avg + i), _MM_HINT_T0);
  _mm_prefetch(reinterpret_cast<const char*>(exp_avg_sq + i), _MM_HINT_T0);
}

// GCC 12 reports the deliberately undefined pass-through operand inside its
// own AVX-512 intrinsics as maybe-uninitialized (GCC bug 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

struct Avx512Coeffs {
  __m512 beta1, one_minus_b1, beta2, one_minus_b2, grad_scale, l2, bc2_sqrt, eps, step_size, decay;
};

PSTAR_TARGET_AVX512 inline Avx512Coeffs Broadcast512(const Coeffs& c) {
  return {_mm512_set1_ps(c.beta1),      _mm512_set1_ps(c.one_minus_b1), _mm512_set1_ps(c.beta2),
          _mm512_set1_ps(c.one_minus_b2), _mm512_set1_ps(c.grad_scale), _mm512_set1_ps(c.l2),
          _mm512_set1_ps(c.bc2_sqrt),   _mm512_set1_ps(c.eps),          _mm512_set1_ps(c.step_size),
          _mm512_set1_ps(c.decay)};
}

template <GradKind K>
PSTAR_TARGET_AVX512 inline __m512 LoadGrad16(const void* grad, int64_t i) {
  if constexpr (K == GradKind::kF32) {
    return _mm512_loadu_ps(static_cast<const float*>(grad) + i);
  } else {
    const __m256i h =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(grad) + i));
    if constexpr (K == GradKind::kF16) {
      return _mm512_cvtph_ps(h);
    } else {
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
  }
}

// Elements [i, i + 16): StepOne, one operation at a time, 16 lanes wide.
template <GradKind K>
PSTAR_TARGET_AVX512 inline void Avx512Block(const Avx512Coeffs& c, float* param, const void* grad,
                                            float* exp_avg, float* exp_avg_sq, int64_t i) {
  const __m512 p = _mm512_loadu_ps(param + i);
  const __m512 g =
      _mm512_add_ps(_mm512_mul_ps(LoadGrad16<K>(grad, i), c.grad_scale), _mm512_mul_ps(c.l2, p));
  const __m512 m = _mm512_add_ps(_mm512_mul_ps(c.beta1, _mm512_loadu_ps(exp_avg + i)),
                                 _mm512_mul_ps(c.one_minus_b1, g));
  const __m512 v = _mm512_add_ps(_mm512_mul_ps(c.beta2, _mm512_loadu_ps(exp_avg_sq + i)),
                                 _mm512_mul_ps(_mm512_mul_ps(c.one_minus_b2, g), g));
  _mm512_storeu_ps(exp_avg + i, m);
  _mm512_storeu_ps(exp_avg_sq + i, v);
  const __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(v), c.bc2_sqrt), c.eps);
  _mm512_storeu_ps(param + i, _mm512_sub_ps(_mm512_mul_ps(p, c.decay),
                                            _mm512_mul_ps(c.step_size, _mm512_div_ps(m, denom))));
}

template <GradKind K>
PSTAR_TARGET_AVX512 void Avx512Span(const Coeffs& coeffs, float* param, const void* grad,
                                    float* exp_avg, float* exp_avg_sq, int64_t begin,
                                    int64_t end) {
  // Scalar up to the first cache-line-aligned parameter, so each block is
  // one line of param and the vector loads and stores never straddle lines.
  int64_t i = begin;
  for (const int64_t head = std::min(end, begin + AlignGap(param + begin, kCacheLine)); i < head; ++i) {
    StepOne<K>(coeffs, param, grad, exp_avg, exp_avg_sq, i);
  }
  const Avx512Coeffs c = Broadcast512(coeffs);
  for (; i + kPrefetchAhead + 16 <= end; i += 16) {
    PrefetchLine<K>(param, grad, exp_avg, exp_avg_sq, i + kPrefetchAhead);
    Avx512Block<K>(c, param, grad, exp_avg, exp_avg_sq, i);
  }
  for (; i + 16 <= end; i += 16) Avx512Block<K>(c, param, grad, exp_avg, exp_avg_sq, i);
  for (; i < end; ++i) StepOne<K>(coeffs, param, grad, exp_avg, exp_avg_sq, i);
}

#pragma GCC diagnostic pop

struct Avx2Coeffs {
  __m256 beta1, one_minus_b1, beta2, one_minus_b2, grad_scale, l2, bc2_sqrt, eps, step_size, decay;
};

PSTAR_TARGET_AVX2 inline Avx2Coeffs Broadcast256(const Coeffs& c) {
  return {_mm256_set1_ps(c.beta1),      _mm256_set1_ps(c.one_minus_b1), _mm256_set1_ps(c.beta2),
          _mm256_set1_ps(c.one_minus_b2), _mm256_set1_ps(c.grad_scale), _mm256_set1_ps(c.l2),
          _mm256_set1_ps(c.bc2_sqrt),   _mm256_set1_ps(c.eps),          _mm256_set1_ps(c.step_size),
          _mm256_set1_ps(c.decay)};
}

template <GradKind K>
PSTAR_TARGET_AVX2 inline __m256 LoadGrad8(const void* grad, int64_t i) {
  if constexpr (K == GradKind::kF32) {
    return _mm256_loadu_ps(static_cast<const float*>(grad) + i);
  } else {
    const __m128i h =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(grad) + i));
    if constexpr (K == GradKind::kF16) {
      return _mm256_cvtph_ps(h);
    } else {
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
  }
}

// Elements [i, i + 8), as Avx512Block.
template <GradKind K>
PSTAR_TARGET_AVX2 inline void Avx2Block(const Avx2Coeffs& c, float* param, const void* grad,
                                        float* exp_avg, float* exp_avg_sq, int64_t i) {
  const __m256 p = _mm256_loadu_ps(param + i);
  const __m256 g =
      _mm256_add_ps(_mm256_mul_ps(LoadGrad8<K>(grad, i), c.grad_scale), _mm256_mul_ps(c.l2, p));
  const __m256 m = _mm256_add_ps(_mm256_mul_ps(c.beta1, _mm256_loadu_ps(exp_avg + i)),
                                 _mm256_mul_ps(c.one_minus_b1, g));
  const __m256 v = _mm256_add_ps(_mm256_mul_ps(c.beta2, _mm256_loadu_ps(exp_avg_sq + i)),
                                 _mm256_mul_ps(_mm256_mul_ps(c.one_minus_b2, g), g));
  _mm256_storeu_ps(exp_avg + i, m);
  _mm256_storeu_ps(exp_avg_sq + i, v);
  const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(v), c.bc2_sqrt), c.eps);
  _mm256_storeu_ps(param + i, _mm256_sub_ps(_mm256_mul_ps(p, c.decay),
                                            _mm256_mul_ps(c.step_size, _mm256_div_ps(m, denom))));
}

// Two 8-lane blocks per cache line of param, one prefetch per line.
template <GradKind K>
PSTAR_TARGET_AVX2 void Avx2Span(const Coeffs& coeffs, float* param, const void* grad,
                                float* exp_avg, float* exp_avg_sq, int64_t begin, int64_t end) {
  int64_t i = begin;
  for (const int64_t head = std::min(end, begin + AlignGap(param + begin, kCacheLine)); i < head; ++i) {
    StepOne<K>(coeffs, param, grad, exp_avg, exp_avg_sq, i);
  }
  const Avx2Coeffs c = Broadcast256(coeffs);
  for (; i + kPrefetchAhead + 16 <= end; i += 16) {
    PrefetchLine<K>(param, grad, exp_avg, exp_avg_sq, i + kPrefetchAhead);
    Avx2Block<K>(c, param, grad, exp_avg, exp_avg_sq, i);
    Avx2Block<K>(c, param, grad, exp_avg, exp_avg_sq, i + 8);
  }
  for (; i + 8 <= end; i += 8) Avx2Block<K>(c, param, grad, exp_avg, exp_avg_sq, i);
  for (; i < end; ++i) StepOne<K>(coeffs, param, grad, exp_avg, exp_avg_sq, i);
}

#endif  // PSTAR_ADAM_X86

template <GradKind K>
SpanFn SpanFor(AdamPath path) {
  switch (path) {
#if PSTAR_ADAM_X86
    case AdamPath::kAvx512:
      return &Avx512Span<K>;
    case AdamPath::kAvx2:
      return &Avx2Span<K>;
#endif
    default:
      return &ScalarSpan<K>;
  }
}

SpanFn SpanFor(AdamPath path, GradKind kind) {
  switch (kind) {
    case GradKind::kF16:
      return SpanFor<GradKind::kF16>(path);
    case GradKind::kBF16:
      return SpanFor<GradKind::kBF16>(path);
    default:
      return SpanFor<GradKind::kF32>(path);
  }
}

GradKind KindOf(HalfType t) {
  return t == HalfType::kFloat16 ? GradKind::kF16 : GradKind::kBF16;
}

// Splits [0, n) into one contiguous block per thread, with every inner
// boundary on a cache line of param so no two threads write the same line.
void Run(AdamPath path, GradKind kind, float* param, const void* grad, float* exp_avg,
         float* exp_avg_sq, int64_t n, const AdamParams& a) {
  if (n <= 0) return;
  const Coeffs c = MakeCoeffs(a);
  const SpanFn span = SpanFor(path, kind);
  const int64_t threads =
      omp_in_parallel() ? 1 : std::min<int64_t>(omp_get_max_threads(), n / kMinElementsPerThread);
  if (threads <= 1) {
    span(c, param, grad, exp_avg, exp_avg_sq, 0, n);
    return;
  }
  constexpr int64_t kLine = kCacheLine / int64_t(sizeof(float));
  const int64_t head = std::min(n, AlignGap(param, kCacheLine));
  const int64_t lines = (n - head) / kLine;
#pragma omp parallel num_threads(int(threads))
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t begin = t == 0 ? 0 : head + lines * t / nt * kLine;
    const int64_t end = t == nt - 1 ? n : head + lines * (t + 1) / nt * kLine;
    span(c, param, grad, exp_avg, exp_avg_sq, begin, end);
  }
}

void CheckSupported(AdamPath path) {
  if (!AdamPathSupported(path)) {
    std::fprintf(stderr, "AdamUpdateOnPath: path %s is not supported on this CPU\n",
                 AdamPathName(path));
    std::abort();
  }
}

// The oracle: the formulas written out once more, independently of Coeffs
// and StepOne.
template <typename LoadGrad>
void ReferenceLoop(float* param, LoadGrad load_grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                   const AdamParams& a) {
  const float step_size = a.lr / a.bias_correction1;
  const float bc2_sqrt = std::sqrt(a.bias_correction2);
  const float decay = 1.0f - a.lr * a.decoupled_weight_decay;
  const float one_minus_b1 = 1.0f - a.beta1;
  const float one_minus_b2 = 1.0f - a.beta2;
  for (int64_t i = 0; i < n; ++i) {
    float p = param[i];
    float g = load_grad(i) * a.grad_scale + a.l2_weight_decay * p;
    float m = a.beta1 * exp_avg[i] + one_minus_b1 * g;
    float v = a.beta2 * exp_avg_sq[i] + one_minus_b2 * g * g;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    float denom = std::sqrt(v) / bc2_sqrt + a.eps;
    param[i] = p * decay - step_size * (m / denom);
  }
}

AdamPath DetectPath() {
  if (AdamPathSupported(AdamPath::kAvx512)) return AdamPath::kAvx512;
  if (AdamPathSupported(AdamPath::kAvx2)) return AdamPath::kAvx2;
  return AdamPath::kScalar;
}

}  // namespace

#if PSTAR_ADAM_X86
namespace {
// F16C from CPUID leaf 1 (ECX bit 29): Clang's __builtin_cpu_supports has no "f16c".
bool HasF16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
}
}  // namespace
#endif

bool AdamPathSupported(AdamPath path) {
#if PSTAR_ADAM_X86
  // Checks the OS (XCR0) enables the register state too, not just CPUID.
  __builtin_cpu_init();
  switch (path) {
    case AdamPath::kAvx512:
      return __builtin_cpu_supports("avx512f");
    case AdamPath::kAvx2:
      return __builtin_cpu_supports("avx2") && HasF16c();
    case AdamPath::kScalar:
      return true;
  }
  return false;
#else
  return path == AdamPath::kScalar;
#endif
}

AdamPath AdamSelectedPath() {
  static const AdamPath path = DetectPath();
  return path;
}

const char* AdamPathName(AdamPath path) {
  switch (path) {
    case AdamPath::kAvx512:
      return "avx512";
    case AdamPath::kAvx2:
      return "avx2";
    case AdamPath::kScalar:
      return "scalar";
  }
  return "unknown";
}

const char* AdamIsa() { return AdamPathName(AdamSelectedPath()); }

void AdamUpdate(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                const AdamParams& a) {
  Run(AdamSelectedPath(), GradKind::kF32, param, grad, exp_avg, exp_avg_sq, n, a);
}

void AdamUpdate(float* param, const uint16_t* grad, HalfType grad_type, float* exp_avg,
                float* exp_avg_sq, int64_t n, const AdamParams& a) {
  Run(AdamSelectedPath(), KindOf(grad_type), param, grad, exp_avg, exp_avg_sq, n, a);
}

void AdamUpdateOnPath(AdamPath path, float* param, const float* grad, float* exp_avg,
                      float* exp_avg_sq, int64_t n, const AdamParams& a) {
  CheckSupported(path);
  Run(path, GradKind::kF32, param, grad, exp_avg, exp_avg_sq, n, a);
}

void AdamUpdateOnPath(AdamPath path, float* param, const uint16_t* grad, HalfType grad_type,
                      float* exp_avg, float* exp_avg_sq, int64_t n, const AdamParams& a) {
  CheckSupported(path);
  Run(path, KindOf(grad_type), param, grad, exp_avg, exp_avg_sq, n, a);
}

void AdamUpdateReference(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                         int64_t n, const AdamParams& a) {
  ReferenceLoop(param, [grad](int64_t i) { return grad[i]; }, exp_avg, exp_avg_sq, n, a);
}

void AdamUpdateReference(float* param, const uint16_t* grad, HalfType grad_type, float* exp_avg,
                         float* exp_avg_sq, int64_t n, const AdamParams& a) {
  if (grad_type == HalfType::kFloat16) {
    ReferenceLoop(param, [grad](int64_t i) { return HalfToFloat(grad[i]); }, exp_avg, exp_avg_sq, n, a);
  } else {
    ReferenceLoop(param, [grad](int64_t i) { return BFloat16ToFloat(grad[i]); }, exp_avg,
                  exp_avg_sq, n, a);
  }
}

}  // namespace pstar::kernels::cpu
