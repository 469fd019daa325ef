// Counter-based random numbers (Philox4x32-10): the value for a given
// (seed, stream, index) is a pure function, so any rank can initialize any
// slice of any tensor and get the same weights for every world size, chunk
// size and placement.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace pstar {

// One Philox4x32-10 block: 4 random words for `counter` under `key`.
std::array<uint32_t, 4> Philox4x32(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

// A stable 64-bit key for a name (FNV-1a), e.g. a tensor name.
uint64_t StableKey(std::string_view name);

// Standard normal sample number `index` of stream `stream` under `seed`.
double CounterNormal(uint64_t seed, uint64_t stream, uint64_t index);

// Uniform in [0, 1) for sample `index` of `stream` under `seed`.
double CounterUniform(uint64_t seed, uint64_t stream, uint64_t index);

// dst[i] = std * CounterNormal(seed, stream, first_index + i) for i < count.
void FillNormal(float* dst, int64_t count, float std, uint64_t seed, uint64_t stream,
                uint64_t first_index);

}  // namespace pstar
