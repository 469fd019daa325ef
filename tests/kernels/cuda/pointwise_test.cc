// GELU, the residual add and the conversions against the CPU kernels and
// kernels/half.h. Every op runs on pack-aligned pointers (the vector path) and
// on pointers one element in (the element-by-element path), at sizes with a
// partial last pack. Conversions are compared bit for bit.
#include "kernels/cuda/pointwise.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

#include "kernels/gelu.h"
#include "kernels/half.h"
#include "kernels/residual.h"
#include "tests/kernels/cuda/cuda_test_util.h"
#include "tests/kernels/cuda/element_test_util.h"

namespace pstar::test {
namespace {

namespace cpu = kernels::cpu;
namespace cuda = kernels::cuda;

constexpr cudaStream_t kStream = nullptr;
constexpr int64_t kSizes[] = {1, 7, 8, 9, 1000, 4099, (int64_t{1} << 16) + 3};
constexpr int64_t kOffsets[] = {0, 1};  // 1: misaligned, element by element

// v without its first `off` elements.
std::vector<float> Tail(const std::vector<float>& v, int64_t off) {
  return std::vector<float>(v.begin() + off, v.end());
}

template <typename T>
class CudaPointwiseTest : public ::testing::Test {};
TYPED_TEST_SUITE(CudaPointwiseTest, ElementTypes, ElementName);

TYPED_TEST(CudaPointwiseTest, GeluForwardMatchesCpu) {
  PSTAR_REQUIRE_GPU();
  using T = TypeParam;
  std::mt19937 rng(1);
  for (int64_t n : kSizes) {
    for (int64_t off : kOffsets) {
      if (off >= n) continue;
      SCOPED_TRACE(testing::Message() << "n=" << n << " offset=" << off);
      const auto x = RandomValues<T>(size_t(n), rng, 2.5f);
      DeviceBuffer<T> dx(ToElements<T>(x)), dy(n);
      cuda::GeluForward<T>(dy.get() + off, dx.get() + off, n - off, kStream);
      ASSERT_NO_FATAL_FAILURE(SyncOrFail());
      const auto got = ToFloats(dy.Download());
      std::vector<float> want(static_cast<size_t>(n));
      cpu::GeluForward(want.data() + off, x.data() + off, n - off);
      EXPECT_TRUE(AllClose(Tail(got, off), Tail(want, off), Element<T>::kTolerance));
    }
  }
}

TYPED_TEST(CudaPointwiseTest, GeluBackwardMatchesCpu) {
  PSTAR_REQUIRE_GPU();
  using T = TypeParam;
  std::mt19937 rng(2);
  for (int64_t n : kSizes) {
    for (int64_t off : kOffsets) {
      if (off >= n) continue;
      SCOPED_TRACE(testing::Message() << "n=" << n << " offset=" << off);
      const auto x = RandomValues<T>(size_t(n), rng, 2.5f);
      const auto dy = RandomValues<T>(size_t(n), rng);
      DeviceBuffer<T> dx(ToElements<T>(x)), ddy(ToElements<T>(dy)), ddx(n);
      cuda::GeluBackward<T>(ddx.get() + off, dx.get() + off, ddy.get() + off, n - off, kStream);
      ASSERT_NO_FATAL_FAILURE(SyncOrFail());
      const auto got = ToFloats(ddx.Download());
      std::vector<float> want(static_cast<size_t>(n));
      cpu::GeluBackward(want.data() + off, x.data() + off, dy.data() + off, n - off);
      // gelu'(x) is a sum of two O(1) terms that cancel near x = -0.75: the
      // error is judged against |dy|, the size of those terms times dy.
      double dy_scale = 0.0;
      for (int64_t i = off; i < n; ++i) dy_scale = std::max(dy_scale, std::abs(double(dy[size_t(i)])));
      EXPECT_TRUE(AllClose(Tail(got, off), Tail(want, off), Element<T>::kTolerance, dy_scale));
    }
  }
}

// dinp may alias dout: the gradient overwrites it in place.
TYPED_TEST(CudaPointwiseTest, GeluBackwardInPlace) {
  PSTAR_REQUIRE_GPU();
  using T = TypeParam;
  std::mt19937 rng(3);
  const int64_t n = 5003;
  const auto x = RandomValues<T>(size_t(n), rng, 2.5f);
  const auto dy = RandomValues<T>(size_t(n), rng);
  DeviceBuffer<T> dx(ToElements<T>(x)), ddy(ToElements<T>(dy));
  cuda::GeluBackward<T>(ddy.get(), dx.get(), ddy.get(), n, kStream);
  ASSERT_NO_FATAL_FAILURE(SyncOrFail());
  std::vector<float> want(static_cast<size_t>(n));
  cpu::GeluBackward(want.data(), x.data(), dy.data(), n);
  EXPECT_TRUE(AllClose(ToFloats(ddy.Download()), want, Element<T>::kTolerance));
}

TYPED_TEST(CudaPointwiseTest, ResidualMatchesCpu) {
  PSTAR_REQUIRE_GPU();
  using T = TypeParam;
  std::mt19937 rng(4);
  for (int64_t n : kSizes) {
    for (int64_t off : kOffsets) {
      if (off >= n) continue;
      SCOPED_TRACE(testing::Message() << "n=" << n << " offset=" << off);
      const auto a = RandomValues<T>(size_t(n), rng);
      const auto b = RandomValues<T>(size_t(n), rng, 3.0f);
      DeviceBuffer<T> da(ToElements<T>(a)), db(ToElements<T>(b)), dout(n);
      cuda::ResidualForward<T>(dout.get() + off, da.get() + off, db.get() + off, n - off, kStream);
      ASSERT_NO_FATAL_FAILURE(SyncOrFail());
      const auto got = ToFloats(dout.Download());
      std::vector<float> want(static_cast<size_t>(n));
      cpu::ResidualForward(want.data() + off, a.data() + off, b.data() + off, n - off);
      EXPECT_TRUE(AllClose(Tail(got, off), Tail(want, off), Element<T>::kTolerance));
    }
  }
}

// out may alias either input.
TYPED_TEST(CudaPointwiseTest, ResidualInPlace) {
  PSTAR_REQUIRE_GPU();
  using T = TypeParam;
  std::mt19937 rng(5);
  const int64_t n = 4101;
  const auto a = RandomValues<T>(size_t(n), rng);
  const auto b = RandomValues<T>(size_t(n), rng);
  std::vector<float> want(static_cast<size_t>(n));
  cpu::ResidualForward(want.data(), a.data(), b.data(), n);
  DeviceBuffer<T> da(ToElements<T>(a)), db(ToElements<T>(b));
  cuda::ResidualForward<T>(da.get(), da.get(), db.get(), n, kStream);
  ASSERT_NO_FATAL_FAILURE(SyncOrFail());
  EXPECT_TRUE(AllClose(ToFloats(da.Download()), want, Element<T>::kTolerance));
  da.Upload(ToElements<T>(a));
  cuda::ResidualForward<T>(db.get(), da.get(), db.get(), n, kStream);
  ASSERT_NO_FATAL_FAILURE(SyncOrFail());
  EXPECT_TRUE(AllClose(ToFloats(db.Download()), want, Element<T>::kTolerance));
}

// --- Conversions, bit for bit ------------------------------------------------

// The raw bits of an element type.
template <typename T>
using Bits = std::conditional_t<std::is_same_v<T, float>, uint32_t, uint16_t>;

template <typename T>
float Widen(Bits<T> b) {
  if constexpr (std::is_same_v<T, float>) {
    return std::bit_cast<float>(b);
  } else if constexpr (std::is_same_v<T, bf16>) {
    return kernels::BFloat16ToFloat(b);
  } else {
    return kernels::HalfToFloat(b);
  }
}

template <typename T>
Bits<T> Narrow(float f) {
  if constexpr (std::is_same_v<T, float>) {
    return std::bit_cast<uint32_t>(f);
  } else if constexpr (std::is_same_v<T, bf16>) {
    return kernels::FloatToBFloat16(f);
  } else {
    return kernels::FloatToHalf(f);
  }
}

// Every 16-bit pattern, for the 16-bit sources.
std::vector<uint16_t> AllHalfBits() {
  std::vector<uint16_t> v(65536);
  for (uint32_t i = 0; i < 65536; ++i) v[i] = uint16_t(i);
  return v;
}

// fp32 sources: both signs of zero, infinity, NaNs, float subnormals, the
// bf16 and fp16 ties (every midpoint between neighbours and its two float
// neighbours), the fp16 subnormal range and its tie to zero, the overflow
// edges of both formats, and random bit patterns of every exponent.
std::vector<uint32_t> FloatSourceBits() {
  std::vector<uint32_t> v;
  auto add = [&v](float f) {
    v.push_back(std::bit_cast<uint32_t>(f));
    v.push_back(std::bit_cast<uint32_t>(-f));
  };
  const float inf = std::numeric_limits<float>::infinity();
  for (float f : {0.0f, 1.0f, inf, std::numeric_limits<float>::max(), std::numeric_limits<float>::min(),
                  std::numeric_limits<float>::denorm_min(), 65504.0f, 65519.996f, 65520.0f, 65536.0f,
                  0x1p-24f, 0x1p-25f, std::nextafter(0x1p-25f, 1.0f), std::nextafter(0x1p-25f, 0.0f),
                  0x1.8p-24f, 0x1p-14f, std::nextafter(0x1p-14f, 0.0f)}) {
    add(f);
  }
  for (uint32_t u : {0x7F7F7FFFu, 0x7F7F8000u, 0x7F7FFFFFu, 0x7FC00000u, 0x7F800001u, 0x7FA00000u, 0x7FFFFFFFu}) {
    v.push_back(u);
    v.push_back(u | 0x80000000u);
  }
  // bf16 ties: the low half exactly 0x8000, and one below and above.
  for (uint32_t hi = 0; hi < 0x7F80u; hi += 7) {
    for (uint32_t lo : {0x7FFFu, 0x8000u, 0x8001u}) {
      v.push_back((hi << 16) | lo);
      v.push_back((hi << 16) | lo | 0x80000000u);
    }
  }
  // fp16 ties: the midpoint of every finite half and its successor
  // (subnormals included), exact in float, and its float neighbours.
  for (uint32_t h = 0; h < 0x7BFFu; ++h) {
    const float mid = (kernels::HalfToFloat(uint16_t(h)) + kernels::HalfToFloat(uint16_t(h + 1))) / 2.0f;
    add(mid);
    add(std::nextafter(mid, 0.0f));
    add(std::nextafter(mid, inf));
  }
  std::mt19937 rng(6);
  std::uniform_int_distribution<uint32_t> any;
  std::uniform_int_distribution<uint32_t> mantissa(0, 0x7FFFFFu);
  for (int i = 0; i < 200000; ++i) v.push_back(any(rng));
  // Float subnormals (bf16 keeps them) and the fp16 subnormal range.
  for (int i = 0; i < 20000; ++i) {
    v.push_back(mantissa(rng));
    v.push_back(((101u + uint32_t(i % 13)) << 23) | mantissa(rng));
  }
  return v;
}

template <typename T>
std::vector<Bits<T>> SourceBits() {
  if constexpr (std::is_same_v<T, float>) {
    return FloatSourceBits();
  } else {
    return AllHalfBits();
  }
}

template <typename To, typename From>
struct ConvertPair {
  using ToType = To;
  using FromType = From;
};

template <typename P>
class CudaConvertTest : public ::testing::Test {};
using ConvertPairs =
    ::testing::Types<ConvertPair<bf16, float>, ConvertPair<fp16, float>, ConvertPair<float, bf16>,
                     ConvertPair<float, fp16>, ConvertPair<fp16, bf16>, ConvertPair<bf16, fp16>,
                     ConvertPair<float, float>, ConvertPair<bf16, bf16>, ConvertPair<fp16, fp16>>;

struct ConvertPairName {
  template <typename P>
  static std::string GetName(int) {
    return ElementName::GetName<typename P::ToType>(0) + "_from_" + ElementName::GetName<typename P::FromType>(0);
  }
};
TYPED_TEST_SUITE(CudaConvertTest, ConvertPairs, ConvertPairName);

// The device gives the bits of Narrow<To>(Widen<From>(x)) (kernels/half.h);
// NaN gives a NaN, its payload unspecified.
TYPED_TEST(CudaConvertTest, MatchesHostConversionBitForBit) {
  PSTAR_REQUIRE_GPU();
  using To = typename TypeParam::ToType;
  using From = typename TypeParam::FromType;
  const std::vector<Bits<From>> in = SourceBits<From>();
  const int64_t n = int64_t(in.size());
  for (int64_t off : kOffsets) {
    SCOPED_TRACE(testing::Message() << "offset=" << off);
    DeviceBuffer<Bits<From>> din(in);
    DeviceBuffer<Bits<To>> dout(n);
    cuda::Convert<To, From>(reinterpret_cast<To*>(dout.get()) + off, reinterpret_cast<const From*>(din.get()) + off,
                            n - off, kStream);
    ASSERT_NO_FATAL_FAILURE(SyncOrFail());
    const std::vector<Bits<To>> got = dout.Download();
    int64_t bad = 0;
    for (int64_t i = off; i < n; ++i) {
      const float x = Widen<From>(in[size_t(i)]);
      const float y = Widen<To>(got[size_t(i)]);
      const bool ok = std::isnan(x) ? std::isnan(y) : got[size_t(i)] == Narrow<To>(x);
      if (!ok && ++bad <= 10) {
        ADD_FAILURE() << "input bits 0x" << std::hex << uint32_t(in[size_t(i)]) << " (" << x << "): got 0x"
                      << uint32_t(got[size_t(i)]) << ", want 0x" << uint32_t(Narrow<To>(x));
      }
    }
    EXPECT_EQ(bad, 0) << "of " << n - off << " values";
  }
}

// RoundThrough<T> leaves float(Narrow<T>(x)) in place: the bits of the host
// round trip through kernels/half.h, NaN staying NaN.
template <typename T>
class CudaRoundThroughTest : public ::testing::Test {};
using HalfTypes = ::testing::Types<bf16, fp16>;
TYPED_TEST_SUITE(CudaRoundThroughTest, HalfTypes, ElementName);

TYPED_TEST(CudaRoundThroughTest, MatchesTheHostRoundTripBitForBit) {
  PSTAR_REQUIRE_GPU();
  using T = TypeParam;
  const std::vector<Bits<float>> in = SourceBits<float>();
  const int64_t n = int64_t(in.size());
  for (int64_t off : kOffsets) {
    SCOPED_TRACE(testing::Message() << "offset=" << off);
    DeviceBuffer<Bits<float>> d(in);
    cuda::RoundThrough<T>(reinterpret_cast<float*>(d.get()) + off, n - off, kStream);
    ASSERT_NO_FATAL_FAILURE(SyncOrFail());
    const std::vector<Bits<float>> got = d.Download();
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float x = Widen<float>(in[size_t(i)]);
      const float want = i < off ? x : Widen<T>(Narrow<T>(x));
      const float y = Widen<float>(got[size_t(i)]);
      const bool ok = std::isnan(want) ? std::isnan(y) : got[size_t(i)] == Narrow<float>(want);
      if (!ok && ++bad <= 10) {
        ADD_FAILURE() << "input bits 0x" << std::hex << uint32_t(in[size_t(i)]) << ": got 0x"
                      << uint32_t(got[size_t(i)]);
      }
    }
    EXPECT_EQ(bad, 0) << "of " << n << " values";
  }
}

}  // namespace
}  // namespace pstar::test
