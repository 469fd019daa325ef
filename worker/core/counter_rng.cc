#include "worker/core/counter_rng.h"

#include <cmath>
#include <numbers>

namespace pstar {

std::array<uint32_t, 4> Philox4x32(std::array<uint32_t, 4> ctr, std::array<uint32_t, 2> key) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = uint64_t{kMul0} * ctr[0];
    uint64_t p1 = uint64_t{kMul1} * ctr[2];
    uint32_t hi0 = uint32_t(p0 >> 32), lo0 = uint32_t(p0);
    uint32_t hi1 = uint32_t(p1 >> 32), lo1 = uint32_t(p1);
    ctr = {hi1 ^ ctr[1] ^ key[0], lo1, hi0 ^ ctr[3] ^ key[1], lo0};
    key[0] += kWeyl0;
    key[1] += kWeyl1;
  }
  return ctr;
}

uint64_t StableKey(std::string_view name) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : name) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

static std::array<uint32_t, 4> Block(uint64_t seed, uint64_t stream, uint64_t index) {
  return Philox4x32({uint32_t(index), uint32_t(index >> 32), uint32_t(stream), uint32_t(stream >> 32)},
                    {uint32_t(seed), uint32_t(seed >> 32)});
}

double CounterUniform(uint64_t seed, uint64_t stream, uint64_t index) {
  auto r = Block(seed, stream, index);
  uint64_t bits = (uint64_t{r[0]} << 21) ^ r[1];  // 53 random bits
  return double(bits & ((1ull << 53) - 1)) * 0x1p-53;
}

double CounterNormal(uint64_t seed, uint64_t stream, uint64_t index) {
  auto r = Block(seed, stream, index);
  double u1 = (double(r[0]) + 1.0) * 0x1p-32;  // (0, 1]
  double u2 = double(r[1]) * 0x1p-32;          // [0, 1)
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

void FillNormal(float* dst, int64_t count, float std, uint64_t seed, uint64_t stream,
                uint64_t first_index) {
#pragma omp parallel for schedule(static) if (count > 65536)
  for (int64_t i = 0; i < count; ++i) {
    dst[i] = float(std * CounterNormal(seed, stream, first_index + uint64_t(i)));
  }
}

}  // namespace pstar
