// The 16-bit float formats a chunk's host home can be kept in, and host
// conversions to and from fp32 with the bits of kernels/half.h (widening is
// exact; narrowing rounds to nearest even).
#pragma once

#include <cstdint>

namespace pstar {

enum class HalfFormat : uint8_t { kBf16, kFp16 };

void NarrowToHalf(uint16_t* dst, const float* src, int64_t n, HalfFormat format);
void WidenFromHalf(float* dst, const uint16_t* src, int64_t n, HalfFormat format);

}  // namespace pstar
