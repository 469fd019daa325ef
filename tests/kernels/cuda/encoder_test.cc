// The embedding against the CPU kernels: the forward pass, and the
// deterministic backward pass, whose fp32 results equal the CPU's bit for bit
// (both add the rows of each token and position in (b, t) order, starting from
// the existing gradient). Shapes cover odd channel counts (the
// element-by-element path), one position, a vocabulary of a few tokens
// repeated thousands of times, mostly distinct tokens, and more positions than
// one shared-memory sort tile (2048), so the global merge steps run; each
// with positions from 0 in every row and with packed examples' positions
// (restarting at random points: the position table's gradient then sums
// rows of many (b, t), as the token table's does).
#include "kernels/cuda/encoder.h"

#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <optional>
#include <random>
#include <type_traits>
#include <vector>

#include "kernels/encoder.h"
#include "kernels/half.h"
#include "tests/kernels/cuda/cuda_test_util.h"
#include "tests/kernels/cuda/element_test_util.h"

namespace pstar::test {
namespace {

namespace cpu = kernels::cpu;
namespace cuda = kernels::cuda;

constexpr cudaStream_t kStream = nullptr;

struct Shape {
  int64_t B, T, C, V, maxT;
};
constexpr Shape kShapes[] = {
    {1, 1, 1, 1, 1},        {2, 3, 8, 7, 5},       {3, 5, 13, 11, 9},  {4, 64, 96, 3, 64},
    {2, 1100, 16, 5, 1200}, {3, 700, 33, 50000, 700}, {8, 1030, 24, 257, 1030},
};

std::vector<int32_t> RandomTokens(const Shape& s, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> dist(0, int32_t(s.V - 1));
  std::vector<int32_t> tokens(size_t(s.B * s.T));
  for (auto& t : tokens) t = dist(rng);
  return tokens;
}

// Packed examples' positions: each row restarts from 0 at random points.
std::vector<int32_t> PackedPositions(const Shape& s, std::mt19937& rng) {
  std::vector<int32_t> positions(size_t(s.B * s.T));
  for (int64_t b = 0; b < s.B; ++b) {
    int32_t p = 0;
    for (int64_t t = 0; t < s.T; ++t) {
      if (rng() % 7 == 0) p = 0;
      positions[size_t(b * s.T + t)] = p++;
    }
  }
  return positions;
}

// Device positions, or null for "each row from 0".
struct Positions {
  std::vector<int32_t> host;
  std::optional<DeviceBuffer<int32_t>> device;
  const int32_t* cpu() const { return host.empty() ? nullptr : host.data(); }
  const int32_t* gpu() const { return device ? device->get() : nullptr; }
};
Positions MakePositions(bool packed, const Shape& s, std::mt19937& rng) {
  Positions p;
  if (packed) {
    p.host = PackedPositions(s, rng);
    p.device.emplace(p.host);
  }
  return p;
}

template <typename T>
class CudaEncoderTest : public ::testing::Test {};
TYPED_TEST_SUITE(CudaEncoderTest, ElementTypes, ElementName);

TYPED_TEST(CudaEncoderTest, ForwardMatchesCpu) {
  PSTAR_REQUIRE_GPU();
  using T = TypeParam;
  std::mt19937 rng(41);
  for (bool packed : {false, true}) {
    for (const Shape& s : kShapes) {
      SCOPED_TRACE(testing::Message() << "B=" << s.B << " T=" << s.T << " C=" << s.C << " V=" << s.V
                                      << (packed ? " packed" : ""));
      const auto tokens = RandomTokens(s, rng);
      const Positions pos = MakePositions(packed, s, rng);
      const auto wte = RandomValues<T>(size_t(s.V * s.C), rng);
      const auto wpe = RandomValues<T>(size_t(s.maxT * s.C), rng, 0.5f);
      DeviceBuffer<int32_t> dtokens(tokens);
      DeviceBuffer<T> dwte(ToElements<T>(wte)), dwpe(ToElements<T>(wpe)), dout(s.B * s.T * s.C);
      cuda::EncoderForward<T>(dout.get(), dtokens.get(), pos.gpu(), dwte.get(), dwpe.get(), s.B, s.T, s.C, kStream);
      ASSERT_NO_FATAL_FAILURE(SyncOrFail());
      std::vector<float> want(size_t(s.B * s.T * s.C));
      cpu::EncoderForward(want.data(), tokens.data(), pos.cpu(), wte.data(), wpe.data(), s.B, s.T, s.C);
      EXPECT_TRUE(AllClose(ToFloats(dout.Download()), want, Element<T>::kTolerance));
    }
  }
}

// 16-bit tables (16-bit parameter chunks) into a 16-bit output (a 16-bit
// run's residual stream): each element is the fp32 sum of two widened values
// rounded once, so the bits equal the CPU's 16-bit variant.
template <typename W>
void ExpectSixteenBitTablesGiveTheCpuBits() {
  std::mt19937 rng(43);
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(testing::Message() << "B=" << s.B << " T=" << s.T << " C=" << s.C << " V=" << s.V);
    const auto tokens = RandomTokens(s, rng);
    const auto wte = RandomValues<W>(size_t(s.V * s.C), rng);  // exact in W
    const auto wpe = RandomValues<W>(size_t(s.maxT * s.C), rng, 0.5f);
    DeviceBuffer<int32_t> dtokens(tokens);
    DeviceBuffer<W> dwte(ToElements<W>(wte)), dwpe(ToElements<W>(wpe));
    DeviceBuffer<W> dout(s.B * s.T * s.C);
    cuda::EncoderForward<W>(dout.get(), dtokens.get(), nullptr, dwte.get(), dwpe.get(), s.B, s.T, s.C, kStream);
    ASSERT_NO_FATAL_FAILURE(SyncOrFail());
    // The CPU's 16-bit variant over the same 16-bit tables.
    constexpr bool kBf16 = std::is_same_v<W, kernels::cuda::bf16>;
    auto bits = [](const std::vector<float>& v) {
      std::vector<uint16_t> h(v.size());
      for (size_t i = 0; i < v.size(); ++i) h[i] = kBf16 ? kernels::FloatToBFloat16(v[i]) : kernels::FloatToHalf(v[i]);
      return h;
    };
    const std::vector<uint16_t> wte16 = bits(wte), wpe16 = bits(wpe);
    std::vector<uint16_t> want(size_t(s.B * s.T * s.C));
    cpu::EncoderForward(want.data(), tokens.data(), nullptr, wte16.data(), wpe16.data(), kBf16, s.B, s.T, s.C);
    const std::vector<float> got = ToFloats(dout.Download());
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(bits({got[i]})[0], want[i]) << "element " << i;
    }
  }
}

TEST(CudaEncoderSixteenBitTables, Bf16TablesGiveTheCpuBits) {
  PSTAR_REQUIRE_GPU();
  ExpectSixteenBitTablesGiveTheCpuBits<kernels::cuda::bf16>();
}

TEST(CudaEncoderSixteenBitTables, Fp16TablesGiveTheCpuBits) {
  PSTAR_REQUIRE_GPU();
  ExpectSixteenBitTablesGiveTheCpuBits<kernels::cuda::fp16>();
}

// Runs EncoderBackward on copies of dwte and dwpe with int32 scratch that
// starts 4 bytes past an 8-byte boundary (the kernel realigns its keys),
// followed by guard words that must survive. Returns the gradients.
template <typename T>
void RunBackward(const Shape& s, const std::vector<int32_t>& tokens, const Positions& pos,
                 const std::vector<float>& dout, std::vector<float>& dwte, std::vector<float>& dwpe) {
  constexpr int32_t kGuard = 0x5A5A5A5A;
  constexpr int64_t kGuards = 64;
  const int64_t need = cuda::EncoderBackwardScratchElements(s.B, s.T);
  std::vector<int32_t> scratch(size_t(1 + need + kGuards), kGuard);
  DeviceBuffer<int32_t> dscratch(scratch), dtokens(tokens);
  DeviceBuffer<T> ddout(ToElements<T>(dout)), ddwte(ToElements<T>(dwte)), ddwpe(ToElements<T>(dwpe));
  cuda::EncoderBackward<T>(ddwte.get(), ddwpe.get(), dscratch.get() + 1, ddout.get(), dtokens.get(), pos.gpu(), s.B,
                           s.T, s.C, kStream);
  ASSERT_NO_FATAL_FAILURE(SyncOrFail());
  dwte = ToFloats(ddwte.Download());
  dwpe = ToFloats(ddwpe.Download());
  scratch = dscratch.Download();
  for (int64_t i = 1 + need; i < 1 + need + kGuards; ++i) ASSERT_EQ(scratch[size_t(i)], kGuard) << "scratch overrun";
}

TYPED_TEST(CudaEncoderTest, BackwardMatchesCpu) {
  PSTAR_REQUIRE_GPU();
  using T = TypeParam;
  std::mt19937 rng(42);
  for (bool packed : {false, true}) {
    for (const Shape& s : kShapes) {
      SCOPED_TRACE(testing::Message() << "B=" << s.B << " T=" << s.T << " C=" << s.C << " V=" << s.V
                                      << (packed ? " packed" : ""));
      const auto tokens = RandomTokens(s, rng);
      const Positions pos = MakePositions(packed, s, rng);
      const auto dout = RandomValues<T>(size_t(s.B * s.T * s.C), rng);
      // Non-zero starting gradients: the kernel accumulates.
      const auto dwte0 = RandomValues<T>(size_t(s.V * s.C), rng);
      const auto dwpe0 = RandomValues<T>(size_t(s.maxT * s.C), rng);
      std::vector<float> got_wte = dwte0, got_wpe = dwpe0;
      ASSERT_NO_FATAL_FAILURE(RunBackward<T>(s, tokens, pos, dout, got_wte, got_wpe));
      std::vector<float> want_wte = dwte0, want_wpe = dwpe0;
      cpu::EncoderBackward(want_wte.data(), want_wpe.data(), dout.data(), tokens.data(), pos.cpu(), s.B, s.T, s.C);
      if constexpr (std::is_same_v<T, float>) {
        for (size_t i = 0; i < want_wte.size(); ++i) {
          ASSERT_EQ(std::bit_cast<uint32_t>(got_wte[i]), std::bit_cast<uint32_t>(want_wte[i])) << "dwte[" << i << "]";
        }
        for (size_t i = 0; i < want_wpe.size(); ++i) {
          ASSERT_EQ(std::bit_cast<uint32_t>(got_wpe[i]), std::bit_cast<uint32_t>(want_wpe[i])) << "dwpe[" << i << "]";
        }
      } else {
        // One rounding of the fp32 sum to T.
        EXPECT_TRUE(AllClose(got_wte, want_wte, Element<T>::kTolerance)) << "dwte";
        EXPECT_TRUE(AllClose(got_wpe, want_wpe, Element<T>::kTolerance)) << "dwpe";
      }
    }
  }
}

TYPED_TEST(CudaEncoderTest, BackwardIsDeterministic) {
  PSTAR_REQUIRE_GPU();
  using T = TypeParam;
  std::mt19937 rng(43);
  const Shape s = {8, 1030, 40, 20, 1030};  // 8240 positions, 20 tokens: long runs
  for (bool packed : {false, true}) {
    SCOPED_TRACE(packed ? "packed" : "unpacked");
    const auto tokens = RandomTokens(s, rng);
    const Positions pos = MakePositions(packed, s, rng);
    const auto dout = RandomValues<T>(size_t(s.B * s.T * s.C), rng, 4.0f);
    const auto dwte0 = RandomValues<T>(size_t(s.V * s.C), rng);
    const auto dwpe0 = RandomValues<T>(size_t(s.maxT * s.C), rng);
    std::vector<float> wte1 = dwte0, wpe1 = dwpe0, wte2 = dwte0, wpe2 = dwpe0;
    ASSERT_NO_FATAL_FAILURE(RunBackward<T>(s, tokens, pos, dout, wte1, wpe1));
    ASSERT_NO_FATAL_FAILURE(RunBackward<T>(s, tokens, pos, dout, wte2, wpe2));
    for (size_t i = 0; i < wte1.size(); ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(wte1[i]), std::bit_cast<uint32_t>(wte2[i])) << "dwte[" << i << "]";
    }
    for (size_t i = 0; i < wpe1.size(); ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(wpe1[i]), std::bit_cast<uint32_t>(wpe2[i])) << "dwpe[" << i << "]";
    }
  }
}

}  // namespace
}  // namespace pstar::test
