// The planner's KernelScratchBytes (worker/model/model_kernels.h), plain
// arithmetic that the operator sizes pods by, against what each CUDA kernel
// asks its caller for (their *ScratchElements functions, which need no GPU):
// at every preset's shapes, in fp32 and bf16, every op's scratch fits,
// widened 16-bit weights included. Runs on any host.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "kernels/attention.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/encoder.h"
#include "kernels/cuda/layernorm.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/reduce.h"
#include "kernels/cuda/rmsnorm.h"
#include "worker/model/gpt_config.h"
#include "worker/model/model_kernels.h"

namespace pstar::test {
namespace {

namespace cuda = kernels::cuda;

int64_t Aligned(int64_t bytes) { return (bytes + 255) / 256 * 256; }

TEST(KernelScratch, CoversEveryCudaKernelsNeedAtEveryPresetsShapes) {
  int checked = 0;
  for (const GptPreset& preset : GptPresets()) {
    const GptConfig& g = preset.config;
    for (const int64_t seq : {int64_t(128), std::min<int64_t>(2048, g.max_seq_len)}) {
      for (const int64_t batch : {int64_t(1), int64_t(8)}) {
        for (const Precision precision : {Precision::kFp32, Precision::kBf16}) {
          SCOPED_TRACE(testing::Message() << preset.name << " seq " << seq << " batch " << batch << " "
                                          << (precision == Precision::kFp32 ? "fp32" : "bf16"));
          const bool half = precision != Precision::kFp32;
          const int64_t have = KernelScratchBytes({ComputeDevice::kCuda, precision}, g, batch, seq) - 256;
          const int64_t BT = batch * seq, C = g.n_embd;
          const int64_t widened = half ? Aligned(C * 4) : 0;  // a 16-bit norm weight as fp32
          const kernels::AttentionShape shape{batch, seq, g.n_head, g.kv_heads(), g.head_size()};
          const int64_t wide = std::max({g.qkv_width(), g.mlp_in_width(), C});
          const int64_t needs[] = {
              Aligned(cuda::LayerNormBackwardScratchElements(BT, C) * 4) + widened,
              Aligned(cuda::RmsNormBackwardScratchElements(BT, C) * 4) + widened,
              cuda::AttentionScratchElements(shape, half ? cuda::AttentionBackwardKernel::kMmaOnePass
                                                         : cuda::AttentionBackwardKernel::kTensorCore) *
                  4,
              cuda::EncoderBackwardScratchElements(batch, seq) * 4,
              cuda::BiasGradientScratchElements(BT, wide) * 4,
              cuda::ReduceScratchElements() * 8,
              half ? Aligned(wide * 4) : 0,  // a 16-bit bias widened for an fp32 output
          };
          for (size_t i = 0; i < std::size(needs); ++i) EXPECT_LE(needs[i], have) << "need " << i;
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 20);
}

}  // namespace
}  // namespace pstar::test
