// The vectorized Adam paths against the scalar reference, bit for bit, and
// the fp16 / bf16 conversions against known values, exact nearest-rounding
// and, where the CPU has them, the x86 conversion instructions.
#include <gtest/gtest.h>
#include <omp.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/adam.h"
#include "kernels/half.h"
#include "tests/test_util.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define PSTAR_TEST_X86 1
#else
#define PSTAR_TEST_X86 0
#endif

namespace pstar::kernels {
namespace {

using cpu::AdamParams;
using cpu::AdamPath;
using cpu::HalfType;

uint32_t Bits(float f) { return std::bit_cast<uint32_t>(f); }

// One seed per test binary run, printed with every failure.
uint64_t Seed() {
  static const uint64_t seed = test::RunSeed();
  return seed;
}

std::string SeedNote() { return "seed " + std::to_string(Seed()) + " (rerun with PSTAR_TEST_SEED)"; }

// --- conversions -------------------------------------------------------------

TEST(Half, KnownValues) {
  EXPECT_EQ(HalfToFloat(0x3C00), 1.0f);
  EXPECT_EQ(HalfToFloat(0xC000), -2.0f);
  EXPECT_EQ(HalfToFloat(0x7BFF), 65504.0f);
  EXPECT_EQ(HalfToFloat(0x0400), std::ldexp(1.0f, -14));  // smallest normal
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(HalfToFloat(0x03FF), std::ldexp(1023.0f, -24));
  EXPECT_EQ(HalfToFloat(0x8001), -std::ldexp(1.0f, -24));
  EXPECT_EQ(Bits(HalfToFloat(0x0000)), 0x00000000u);
  EXPECT_EQ(Bits(HalfToFloat(0x8000)), 0x80000000u);
  EXPECT_EQ(HalfToFloat(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(HalfToFloat(0xFC00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7E00)));
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7C01)));  // signalling in, quiet out
  EXPECT_EQ(Bits(HalfToFloat(0x7C01)), 0x7FC02000u);

  EXPECT_EQ(FloatToHalf(1.0f), 0x3C00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xC000);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7BFF);
  EXPECT_EQ(FloatToHalf(65519.996f), 0x7BFF);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7C00);  // the tie goes to even: infinity
  EXPECT_EQ(FloatToHalf(1e9f), 0x7C00);
  EXPECT_EQ(FloatToHalf(-std::numeric_limits<float>::infinity()), 0xFC00);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)), 0x0000);                 // tie to even
  EXPECT_EQ(FloatToHalf(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(FloatToHalf(std::ldexp(3.0f, -25)), 0x0002);                 // 1.5 ulp: tie to even
  EXPECT_EQ(FloatToHalf(std::ldexp(1023.5f, -24)), 0x0400);              // rounds up to normal
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3C00);          // tie to even
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(3.0f, -11)), 0x3C02);          // tie to even
  EXPECT_EQ(FloatToHalf(1e-10f), 0x0000);
  EXPECT_EQ(FloatToHalf(-1e-10f), 0x8000);
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::quiet_NaN()) & 0x7E00, 0x7E00);

  EXPECT_EQ(BFloat16ToFloat(0x3F80), 1.0f);
  EXPECT_EQ(BFloat16ToFloat(0xC000), -2.0f);
  EXPECT_EQ(BFloat16ToFloat(0x0001), std::ldexp(1.0f, -133));  // smallest subnormal
  EXPECT_EQ(BFloat16ToFloat(0x7F7F), std::ldexp(255.0f, 120));  // largest finite
  EXPECT_EQ(BFloat16ToFloat(0x7F80), std::numeric_limits<float>::infinity());
  EXPECT_EQ(BFloat16ToFloat(0xFF80), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(0x7FC0)));

  EXPECT_EQ(FloatToBFloat16(1.0f), 0x3F80);
  EXPECT_EQ(FloatToBFloat16(std::bit_cast<float>(0x3F808000u)), 0x3F80);  // tie to even
  EXPECT_EQ(FloatToBFloat16(std::bit_cast<float>(0x3F818000u)), 0x3F82);  // tie to even
  EXPECT_EQ(FloatToBFloat16(std::bit_cast<float>(0x3F808001u)), 0x3F81);
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::max()), 0x7F80);  // overflows
  EXPECT_EQ(FloatToBFloat16(std::bit_cast<float>(0x00018000u)), 0x0002);  // subnormal tie
  EXPECT_EQ(FloatToBFloat16(-0.0f), 0x8000);
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(FloatToBFloat16(std::bit_cast<float>(0x7F800001u)), 0x7FC0);  // NaN stays NaN
}

// Every 16-bit pattern widens and narrows back to itself (NaNs to a NaN).
TEST(Half, RoundTripsEveryValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t x = uint16_t(h);
    const float f = HalfToFloat(x), b = BFloat16ToFloat(x);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(f)))) << h;
    } else {
      EXPECT_EQ(FloatToHalf(f), x) << h;
    }
    if (std::isnan(b)) {
      EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(b)))) << h;
    } else {
      EXPECT_EQ(FloatToBFloat16(b), x) << h;
    }
  }
}

// Checks that narrow(x) is the nearest representable value, ties to even,
// with exact double arithmetic. `widen` decodes; neighbours are +-1 in the
// magnitude bits.
template <typename Narrow, typename Widen>
void ExpectNearestEven(float x, Narrow narrow, Widen widen, uint16_t inf_bits) {
  const uint16_t r = narrow(x);
  const uint16_t mag = r & 0x7FFF;
  const double dx = std::fabs(double(x));
  const double got = std::fabs(double(widen(r)));
  if (mag == inf_bits) {  // overflow: x must be at least halfway past the largest finite
    const double max = widen(uint16_t(inf_bits - 1)), below = widen(uint16_t(inf_bits - 2));
    ASSERT_GE(dx, max + (max - below) / 2) << x;
    return;
  }
  ASSERT_EQ(std::signbit(widen(r)), std::signbit(x)) << x;
  const double err = std::fabs(dx - got);
  for (int d : {-1, 1}) {
    if (mag == 0 && d < 0) continue;
    const double other = widen(uint16_t(mag + d));
    const double other_err = std::fabs(dx - other);
    ASSERT_LE(err, other_err) << x << " -> 0x" << std::hex << r;
    if (err == other_err) {
      ASSERT_EQ(mag & 1, 0) << "tie not to even: " << x;
    }
  }
}

TEST(Half, NarrowingRoundsToNearestEven) {
  std::mt19937_64 rng(Seed());
  SCOPED_TRACE(SeedNote());
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::uniform_int_distribution<int> half_exp(-27, 17), bf_exp(-136, 127);
  for (int i = 0; i < 200000; ++i) {
    const float h = std::ldexp(unit(rng), half_exp(rng));
    ExpectNearestEven(h, FloatToHalf, HalfToFloat, 0x7C00);
    const float b = std::ldexp(unit(rng), bf_exp(rng));
    ExpectNearestEven(b, FloatToBFloat16, BFloat16ToFloat, 0x7F80);
    // Exact midpoints between neighbours, where the tie rule decides.
    const uint16_t k = uint16_t(rng() % 0x7BFF);
    const float mid = float((double(HalfToFloat(k)) + double(HalfToFloat(uint16_t(k + 1)))) / 2);
    ExpectNearestEven(mid, FloatToHalf, HalfToFloat, 0x7C00);
  }
}

#if PSTAR_TEST_X86
__attribute__((target("f16c"))) float HardwareHalfToFloat(uint16_t h) { return _cvtsh_ss(h); }
// F16C from CPUID leaf 1 (Clang's __builtin_cpu_supports has no "f16c").
bool CpuHasF16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
}

__attribute__((target("f16c"))) uint16_t HardwareFloatToHalf(float f) {
  return uint16_t(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
}

// The SIMD kernels widen with vcvtph2ps; the reference uses HalfToFloat.
TEST(Half, MatchesF16cInstructions) {
  if (!CpuHasF16c()) GTEST_SKIP() << "no F16C";
  for (uint32_t h = 0; h < 0x10000; ++h) {
    ASSERT_EQ(Bits(HalfToFloat(uint16_t(h))), Bits(HardwareHalfToFloat(uint16_t(h)))) << h;
  }
  std::mt19937 rng{uint32_t(Seed())};
  SCOPED_TRACE(SeedNote());
  for (int i = 0; i < 1 << 22; ++i) {
    // Random bit patterns, and patterns concentrated on the half range.
    const uint32_t u = i % 2 ? rng() : (0x33000000u + rng() % 0x15000000u) ^ (rng() & 0x80000000u);
    const float f = std::bit_cast<float>(u);
    ASSERT_EQ(FloatToHalf(f), HardwareFloatToHalf(f)) << std::hex << u;
  }
}
#endif

// --- Adam --------------------------------------------------------------------

struct Config {
  const char* name;
  float grad_scale;
  float decoupled_wd;
  float l2_wd;
};

// Plain, decoupled (AdamW) and coupled (L2) decay, with and without a fused
// loss-scale unscale times clip coefficient.
const Config kConfigs[] = {
    {"plain", 1.0f, 0.0f, 0.0f},
    {"adamw", 1.0f, 0.1f, 0.0f},
    {"adamw_unscale_clip", 1.0f / 1024 * 0.37f, 0.1f, 0.0f},
    {"l2_unscale_clip", 1.0f / 1024 * 0.37f, 0.0f, 0.01f},
};

AdamParams ParamsFor(const Config& c, int step) {
  AdamParams a{};
  a.lr = 3e-4f * float(step);  // a changing schedule
  a.beta1 = 0.9f;
  a.beta2 = 0.95f;
  a.eps = 1e-8f;
  a.decoupled_weight_decay = c.decoupled_wd;
  a.l2_weight_decay = c.l2_wd;
  a.grad_scale = c.grad_scale;
  a.bias_correction1 = float(1.0 - std::pow(0.9, step));
  a.bias_correction2 = float(1.0 - std::pow(0.95, step));
  return a;
}

// The gradient storage formats under test.
enum class GradFormat { kF32, kF16, kBF16 };
const char* Name(GradFormat f) {
  return f == GradFormat::kF32 ? "fp32" : f == GradFormat::kF16 ? "fp16" : "bf16";
}

// Random state for one run. The optimizer state starts at zero, as in
// training; the gradients include zeros, values whose square underflows to
// a subnormal or zero, and (for fp16) subnormal halves, so the rare rounding
// paths are reached.
struct State {
  std::vector<float> param, exp_avg, exp_avg_sq, grad32;
  std::vector<uint16_t> grad16;
};

State MakeState(int64_t n, GradFormat format, float grad_magnitude, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> pick(0, 99);
  State s;
  s.param.resize(n);
  s.exp_avg.assign(n, 0.0f);
  s.exp_avg_sq.assign(n, 0.0f);
  s.grad32.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    s.param[i] = normal(rng) * 0.02f;
    float g = normal(rng) * grad_magnitude;
    switch (pick(rng)) {
      case 0: g = 0.0f; break;
      case 1: g = -0.0f; break;
      case 2: g = std::ldexp(normal(rng), -70); break;  // g*g is subnormal or zero
      case 3: g = std::ldexp(normal(rng), -20); break;  // a subnormal half
      default: break;
    }
    s.grad32[i] = g;
  }
  if (format != GradFormat::kF32) {
    s.grad16.resize(n);
    for (int64_t i = 0; i < n; ++i) {
      s.grad16[i] = format == GradFormat::kF16 ? FloatToHalf(s.grad32[i]) : FloatToBFloat16(s.grad32[i]);
    }
  }
  return s;
}

// Pass `path` < 0 for the dispatched AdamUpdate.
void Update(int path, GradFormat format, State& s, int64_t n, const AdamParams& a) {
  const HalfType half = format == GradFormat::kF16 ? HalfType::kFloat16 : HalfType::kBFloat16;
  if (path < 0) {
    if (format == GradFormat::kF32) {
      cpu::AdamUpdate(s.param.data(), s.grad32.data(), s.exp_avg.data(), s.exp_avg_sq.data(), n, a);
    } else {
      cpu::AdamUpdate(s.param.data(), s.grad16.data(), half, s.exp_avg.data(), s.exp_avg_sq.data(), n, a);
    }
  } else if (format == GradFormat::kF32) {
    cpu::AdamUpdateOnPath(AdamPath(path), s.param.data(), s.grad32.data(), s.exp_avg.data(),
                          s.exp_avg_sq.data(), n, a);
  } else {
    cpu::AdamUpdateOnPath(AdamPath(path), s.param.data(), s.grad16.data(), half, s.exp_avg.data(),
                          s.exp_avg_sq.data(), n, a);
  }
}

void Reference(GradFormat format, State& s, int64_t n, const AdamParams& a) {
  if (format == GradFormat::kF32) {
    cpu::AdamUpdateReference(s.param.data(), s.grad32.data(), s.exp_avg.data(), s.exp_avg_sq.data(), n, a);
  } else {
    cpu::AdamUpdateReference(s.param.data(), s.grad16.data(),
                             format == GradFormat::kF16 ? HalfType::kFloat16 : HalfType::kBFloat16,
                             s.exp_avg.data(), s.exp_avg_sq.data(), n, a);
  }
}

// Bitwise equality; two NaNs count as equal (x86 may propagate either
// operand's payload, and the compiler may commute operands).
void ExpectSameBits(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (Bits(got[i]) == Bits(want[i]) || (std::isnan(got[i]) && std::isnan(want[i]))) continue;
    FAIL() << what << "[" << i << "] = " << got[i] << " (0x" << std::hex << Bits(got[i])
           << "), reference " << std::dec << want[i] << " (0x" << std::hex << Bits(want[i]) << ")";
  }
}

std::vector<int> PathsToTest() {
  std::vector<int> paths = {-1};  // dispatched
  for (AdamPath p : {AdamPath::kScalar, AdamPath::kAvx2, AdamPath::kAvx512}) {
    if (cpu::AdamPathSupported(p)) paths.push_back(int(p));
  }
  return paths;
}

std::string PathName(int path) { return path < 0 ? "dispatched" : cpu::AdamPathName(AdamPath(path)); }

// Runs `steps` updates on the reference, then on every path from the same
// start, and compares param, exp_avg and exp_avg_sq after each step.
void CheckAgainstReference(int64_t n, GradFormat format, const Config& config, int steps,
                           uint64_t salt) {
  std::mt19937_64 rng(Seed() ^ (salt * 0x9E3779B97F4A7C15ull));
  const float magnitude = config.grad_scale == 1.0f ? 1.0f : 1024.0f;  // loss-scaled grads
  const State start = MakeState(n, format, magnitude, rng);
  std::vector<State> want(steps + 1, start);
  for (int step = 1; step <= steps; ++step) {
    want[step] = want[step - 1];
    Reference(format, want[step], n, ParamsFor(config, step));
  }
  for (int path : PathsToTest()) {
    SCOPED_TRACE(std::string("path ") + PathName(path) + ", grads " + Name(format) + ", config " +
                 config.name + ", n " + std::to_string(n) + ", " + SeedNote());
    State got = start;
    for (int step = 1; step <= steps; ++step) {
      Update(path, format, got, n, ParamsFor(config, step));
      SCOPED_TRACE("step " + std::to_string(step));
      ExpectSameBits(got.exp_avg, want[step].exp_avg, "exp_avg");
      ExpectSameBits(got.exp_avg_sq, want[step].exp_avg_sq, "exp_avg_sq");
      ExpectSameBits(got.param, want[step].param, "param");
      if (::testing::Test::HasFailure()) return;
    }
  }
}

class AdamSimd : public ::testing::TestWithParam<int64_t> {};

TEST_P(AdamSimd, MatchesReferenceBitwise) {
  const int64_t n = GetParam();
  uint64_t salt = uint64_t(n) * 16;
  for (GradFormat format : {GradFormat::kF32, GradFormat::kF16, GradFormat::kBF16}) {
    for (const Config& config : kConfigs) {
      CheckAgainstReference(n, format, config, 3, ++salt);
      if (HasFailure()) return;
    }
  }
}

// The largest splits the work among 32 threads; under AddressSanitizer
// (several times slower, and run on every pinned variant) among 4, past
// 65537's 2.
INSTANTIATE_TEST_SUITE_P(Sizes, AdamSimd,
                         ::testing::Values(1, 15, 16, 17, 1000, 65537,
                                           (int64_t{1} << (test::kAddressSanitizer ? 17 : 20)) + 3));

// Spans that start off a cache line, with grad and state misaligned
// differently, and thread counts that do not divide the work evenly.
TEST(Adam, MisalignedSpansAndOddThreadCounts) {
  const int64_t n = (int64_t{1} << 17) + 11;
  std::mt19937_64 rng(Seed() ^ 0xA11A);
  const State base = MakeState(n + 16, GradFormat::kF16, 1.0f, rng);
  const int saved = omp_get_max_threads();
  for (int threads : {1, 3, 5}) {
    omp_set_num_threads(threads);
    for (int offset : {1, 3, 7, 13}) {
      for (int path : PathsToTest()) {
        SCOPED_TRACE(PathName(path) + " threads " + std::to_string(threads) + " offset " +
                     std::to_string(offset) + ", " + SeedNote());
        const AdamParams a = ParamsFor(kConfigs[2], 2);
        // param at +offset, grads at +(offset+5)%16, state at +(2*offset)%16.
        State got = base, want = base;
        const int og = (offset + 5) % 16, os = (2 * offset) % 16;
        auto run = [&](State& s, bool reference) {
          float* p = s.param.data() + offset;
          float* m = s.exp_avg.data() + os;
          float* v = s.exp_avg_sq.data() + os;
          if (reference) {
            cpu::AdamUpdateReference(p, s.grad32.data() + og, m, v, n, a);
            cpu::AdamUpdateReference(p, s.grad16.data() + og, HalfType::kFloat16, m, v, n, a);
          } else if (path < 0) {
            cpu::AdamUpdate(p, s.grad32.data() + og, m, v, n, a);
            cpu::AdamUpdate(p, s.grad16.data() + og, HalfType::kFloat16, m, v, n, a);
          } else {
            cpu::AdamUpdateOnPath(AdamPath(path), p, s.grad32.data() + og, m, v, n, a);
            cpu::AdamUpdateOnPath(AdamPath(path), p, s.grad16.data() + og, HalfType::kFloat16, m, v, n, a);
          }
        };
        run(got, false);
        run(want, true);
        ExpectSameBits(got.param, want.param, "param");
        ExpectSameBits(got.exp_avg, want.exp_avg, "exp_avg");
        ExpectSameBits(got.exp_avg_sq, want.exp_avg_sq, "exp_avg_sq");
      }
    }
  }
  omp_set_num_threads(saved);
}

// A 16-bit gradient updates exactly as its fp32 value would.
TEST(Adam, HalfGradientsEqualFp32OfConvertedValues) {
  const int64_t n = 100003;
  for (GradFormat format : {GradFormat::kF16, GradFormat::kBF16}) {
    SCOPED_TRACE(std::string(Name(format)) + ", " + SeedNote());
    std::mt19937_64 rng(Seed() ^ uint64_t(format));
    State half = MakeState(n, format, 1.0f, rng);
    for (int64_t i = 0; i < n; ++i) {
      half.grad32[i] = format == GradFormat::kF16 ? HalfToFloat(half.grad16[i]) : BFloat16ToFloat(half.grad16[i]);
    }
    State fp32 = half;
    for (int step = 1; step <= 3; ++step) {
      const AdamParams a = ParamsFor(kConfigs[3], step);
      Update(-1, format, half, n, a);
      Update(-1, GradFormat::kF32, fp32, n, a);
    }
    ExpectSameBits(half.param, fp32.param, "param");
    ExpectSameBits(half.exp_avg, fp32.exp_avg, "exp_avg");
    ExpectSameBits(half.exp_avg_sq, fp32.exp_avg_sq, "exp_avg_sq");
  }
}

// Infinite and NaN gradients (an overflowed loss-scaled step) poison only
// their own elements, identically on every path.
TEST(Adam, NonFiniteGradientsMatchReference) {
  const int64_t n = 4099;
  std::mt19937_64 rng(Seed() ^ 0xF1F1);
  State start = MakeState(n, GradFormat::kF16, 1.0f, rng);
  for (int64_t i = 0; i < n; i += 97) {
    start.grad32[i] = i % 2 ? std::numeric_limits<float>::infinity() : std::nanf("");
    start.grad16[i] = i % 2 ? 0xFC00 : 0x7E01;
  }
  for (int path : PathsToTest()) {
    SCOPED_TRACE(PathName(path) + ", " + SeedNote());
    for (GradFormat format : {GradFormat::kF32, GradFormat::kF16}) {
      State got = start, want = start;
      const AdamParams a = ParamsFor(kConfigs[1], 1);
      Update(path, format, got, n, a);
      Reference(format, want, n, a);
      ExpectSameBits(got.param, want.param, "param");
      ExpectSameBits(got.exp_avg, want.exp_avg, "exp_avg");
      ExpectSameBits(got.exp_avg_sq, want.exp_avg_sq, "exp_avg_sq");
      EXPECT_TRUE(std::isnan(got.param[0]));
      EXPECT_TRUE(std::isfinite(got.param[1]));
    }
  }
}

TEST(Adam, SelectsTheBestSupportedPath) {
  const std::string isa = cpu::AdamIsa();
  EXPECT_EQ(isa, cpu::AdamPathName(cpu::AdamSelectedPath()));
  EXPECT_TRUE(cpu::AdamPathSupported(AdamPath::kScalar));
#if PSTAR_TEST_X86
  if (__builtin_cpu_supports("avx512f")) {
    EXPECT_EQ(isa, "avx512");
  } else if (__builtin_cpu_supports("avx2") && CpuHasF16c()) {
    EXPECT_EQ(isa, "avx2");
  } else {
    EXPECT_EQ(isa, "scalar");
  }
#else
  EXPECT_EQ(isa, "scalar");
#endif
  std::printf("Adam ISA path: %s\n", isa.c_str());
}

}  // namespace
}  // namespace pstar::kernels
