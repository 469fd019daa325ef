// The fused Adam kernel against kernels::cpu::AdamUpdateReference, bit for
// bit: params, both moments and the rounded working copy, for fp32, bf16 and
// fp16 gradients, AdamW and coupled L2, over several steps, on pack-aligned
// pointers and one element in, with values down in the subnormals.
#include "kernels/cuda/adam.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

#include "kernels/adam.h"
#include "kernels/half.h"
#include "tests/kernels/cuda/cuda_test_util.h"
#include "tests/kernels/cuda/element_test_util.h"

namespace pstar::test {
namespace {

namespace cpu = kernels::cpu;
namespace cuda = kernels::cuda;

constexpr cudaStream_t kStream = nullptr;
constexpr int64_t kSizes[] = {1, 3, 4, 5, 1001, 4099, (int64_t{1} << 16) + 1};
constexpr int64_t kOffsets[] = {0, 1};  // 1: misaligned, element by element

template <typename T>
class CudaAdamTest : public ::testing::Test {};
TYPED_TEST_SUITE(CudaAdamTest, ElementTypes, ElementName);

// Counts the elements whose bits differ and reports the first few.
template <typename T>
::testing::AssertionResult SameBits(const std::vector<T>& got, const std::vector<T>& want, int64_t from) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 2);
  using U = std::conditional_t<sizeof(T) == 4, uint32_t, uint16_t>;
  int64_t bad = 0;
  auto failure = ::testing::AssertionFailure();
  for (size_t i = size_t(from); i < got.size(); ++i) {
    U g, w;
    std::memcpy(&g, &got[i], sizeof(U));
    std::memcpy(&w, &want[i], sizeof(U));
    if (g != w && ++bad <= 5) failure << "[" << i << "] got 0x" << std::hex << g << " want 0x" << w << std::dec << "; ";
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return failure << bad << " of " << got.size() - size_t(from) << " elements differ";
}

// Gradients as the CPU reference takes them: fp32, or 16-bit bits.
template <typename G>
std::vector<uint16_t> HalfBits(const std::vector<G>& g) {
  std::vector<uint16_t> bits(g.size());
  std::memcpy(bits.data(), g.data(), g.size() * sizeof(uint16_t));
  return bits;
}

template <typename G>
void Reference(std::vector<float>& p, const std::vector<G>& g, std::vector<float>& m, std::vector<float>& v,
               int64_t from, const cpu::AdamParams& a) {
  const int64_t n = int64_t(p.size()) - from;
  if constexpr (std::is_same_v<G, float>) {
    cpu::AdamUpdateReference(p.data() + from, g.data() + from, m.data() + from, v.data() + from, n, a);
  } else {
    const auto type = std::is_same_v<G, bf16> ? cpu::HalfType::kBFloat16 : cpu::HalfType::kFloat16;
    const auto bits = HalfBits(g);
    cpu::AdamUpdateReference(p.data() + from, bits.data() + from, type, m.data() + from, v.data() + from, n, a);
  }
}

cpu::AdamParams Params(int step, bool decoupled) {
  cpu::AdamParams a{};
  a.lr = 3e-4f * float(step);
  a.beta1 = 0.9f;
  a.beta2 = 0.95f;
  a.eps = 1e-8f;
  a.decoupled_weight_decay = decoupled ? 0.1f : 0.0f;
  a.l2_weight_decay = decoupled ? 0.0f : 0.01f;
  a.grad_scale = 1.0f / (1024.0f + float(step));  // not a power of two: rounds
  a.bias_correction1 = 1.0f - std::pow(0.9f, float(step));
  a.bias_correction2 = 1.0f - std::pow(0.95f, float(step));
  return a;
}

// Normal values with a few scaled into the fp32 subnormals and a few zeros.
std::vector<float> Values(size_t n, std::mt19937& rng, float scale) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    v[i] = dist(rng);
    if (i % 17 == 3) v[i] *= 1e-39f;
    if (i % 29 == 5) v[i] = 0.0f;
  }
  return v;
}

TYPED_TEST(CudaAdamTest, MatchesReferenceBitForBit) {
  PSTAR_REQUIRE_GPU();
  using G = TypeParam;
  std::mt19937 rng(31);
  for (int64_t n : kSizes) {
    for (int64_t off : kOffsets) {
      for (bool decoupled : {true, false}) {
        for (bool with_copy : {true, false}) {
          if (off >= n) continue;
          SCOPED_TRACE(testing::Message() << "n=" << n << " offset=" << off << " decoupled=" << decoupled
                                          << " param_copy=" << with_copy);
          std::vector<float> p = Values(size_t(n), rng, 0.05f), m = Values(size_t(n), rng, 1e-3f);
          std::vector<float> v = Values(size_t(n), rng, 1e-3f);
          for (float& x : v) x = x * x;  // second moments are non-negative
          DeviceBuffer<float> dp(p), dm(m), dv(v);
          DeviceBuffer<G> dcopy(n);
          for (int step = 1; step <= 3; ++step) {
            const cpu::AdamParams a = Params(step, decoupled);
            // The gradients are exact in G, as the device and the CPU read them.
            const std::vector<G> g = ToElements<G>(Values(size_t(n), rng, 2.0f));
            DeviceBuffer<G> dg(g);
            cuda::AdamUpdate<G>(dp.get() + off, with_copy ? dcopy.get() + off : nullptr, dg.get() + off,
                                dm.get() + off, dv.get() + off, n - off, a, kStream);
            ASSERT_NO_FATAL_FAILURE(SyncOrFail());
            Reference(p, g, m, v, off, a);
            const auto got_p = dp.Download();
            ASSERT_TRUE(SameBits(got_p, p, off)) << "param, step " << step;
            ASSERT_TRUE(SameBits(dm.Download(), m, off)) << "exp_avg, step " << step;
            ASSERT_TRUE(SameBits(dv.Download(), v, off)) << "exp_avg_sq, step " << step;
            if (with_copy) {
              ASSERT_TRUE(SameBits(dcopy.Download(), ToElements<G>(p), off)) << "param_copy, step " << step;
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace pstar::test
