// Exact conversions between fp32 and the two 16-bit float formats, IEEE
// binary16 ("half") and bfloat16, by bit manipulation alone, so they give the
// same bits on every CPU and under every build flag.
//
// Widening is exact. Narrowing rounds to nearest, ties to even, and handles
// subnormals, overflow to infinity and signed zeros. NaNs stay NaN and come
// out quiet with the high payload bits kept, which is what the x86 conversion
// instructions (F16C, AVX-512) do; the SIMD kernels rely on that agreement.
#pragma once

#include <bit>
#include <cstdint>

// Every instruction-set variant of the CPU kernels compiles these inline
// functions with its own flags (kernels/cpu/isa.h): the inline namespace,
// named per variant, keeps a copy the compiler did not inline from standing
// in for another variant's.
#ifndef PSTAR_CPU_ISA_TAG
#define PSTAR_CPU_ISA_TAG isa_default
#endif

namespace pstar::kernels {
inline namespace PSTAR_CPU_ISA_TAG {

inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  if (exp == 0x1F) {  // inf, or NaN made quiet
    return std::bit_cast<float>(sign | 0x7F800000u | (mant == 0 ? 0u : 0x400000u | (mant << 13)));
  }
  if (exp != 0) return std::bit_cast<float>(sign | ((exp + 112) << 23) | (mant << 13));
  if (mant == 0) return std::bit_cast<float>(sign);
  // Subnormal: mant * 2^-24. Shift the leading one up to bit 10 (the implicit
  // bit of a normal number) and lower the exponent to match.
  const int shift = std::countl_zero(mant) - 21;
  mant = (mant << shift) & 0x3FFu;
  return std::bit_cast<float>(sign | (uint32_t(113 - shift) << 23) | (mant << 13));
}

inline uint16_t FloatToHalf(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return uint16_t(sign | 0x7E00u | ((a >> 13) & 0x3FFu));  // NaN
  // 65520 (0x477FF000) lies halfway between 65504, the largest half, and
  // 2^16; the tie goes to the even neighbour, which is infinity.
  if (a >= 0x477FF000u) return uint16_t(sign | 0x7C00u);
  if (a >= 0x38800000u) {  // a normal half: rebias the exponent, round 13 bits
    uint32_t h = (a - 0x38000000u) >> 13;
    const uint32_t rest = a & 0x1FFFu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // may carry into the exponent
    return uint16_t(sign | h);
  }
  // Below 2^-14: a subnormal half, a multiple of 2^-24. With the implicit bit,
  // the value is m * 2^(e - 150), that is m >> (126 - e) units of 2^-24.
  const uint32_t e = a >> 23;
  if (e < 102) return sign;  // below 2^-25, which itself ties to zero
  const uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
  const uint32_t shift = 126 - e;  // 14..24
  uint32_t h = m >> shift;
  const uint32_t rest = m & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  if (rest > half || (rest == half && (h & 1u))) ++h;  // 0x400 is the smallest normal
  return uint16_t(sign | h);
}

// bfloat16 is the top half of an fp32, so widening is a shift; NaN payloads,
// signalling ones included, pass through unchanged.
inline float BFloat16ToFloat(uint16_t b) { return std::bit_cast<float>(uint32_t(b) << 16); }

inline uint16_t FloatToBFloat16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return uint16_t((u >> 16) | 0x40u);  // quiet NaN
  // Adding 0x7FFF, plus one when the kept part is odd, carries into bit 16
  // exactly when the dropped half is above the midpoint or at it and odd.
  // Overflow carries into the exponent and lands on infinity, as it should.
  return uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// The conversions as function objects, one type each, for kernels templated
// on how they load and store elements: each instantiation then inlines its
// own conversion (a function pointer would be one shared, indirect call).
struct KeepFloat {
  float operator()(float x) const { return x; }
};
struct WidenBf16 {
  float operator()(uint16_t h) const { return BFloat16ToFloat(h); }
};
struct WidenHalf {
  float operator()(uint16_t h) const { return HalfToFloat(h); }
};
struct NarrowBf16 {
  uint16_t operator()(float x) const { return FloatToBFloat16(x); }
};
struct NarrowHalf {
  uint16_t operator()(float x) const { return FloatToHalf(x); }
};

}  // namespace PSTAR_CPU_ISA_TAG
}  // namespace pstar::kernels
