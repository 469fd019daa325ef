#include "worker/core/build_info.h"

#ifdef PSTAR_WITH_CUDA
#include <cuda_runtime_api.h>

#include <cstdlib>

#include "kernels/cuda/cudnn_attention.h"
#include "kernels/cuda/tuning.h"
#endif

namespace pstar {

std::string CudaDeviceSummary() {
#ifdef PSTAR_WITH_CUDA
  int runtime = 0;
  cudaRuntimeGetVersion(&runtime);
  std::string out = "built (runtime " + std::to_string(runtime / 1000) + "." +
                    std::to_string(runtime % 1000 / 10) + ")";
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) return out + ", no device: " + cudaGetErrorString(err);
  namespace kc = kernels::cuda;
  const char* overrides = std::getenv("PSTAR_KERNEL_TUNING");
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    out += "\n  device " + std::to_string(i) + ": " + prop.name + ", " + std::to_string(prop.totalGlobalMem >> 20) +
           " MiB";
    // The kernel choices a run on it takes: the tuning table's, then the
    // environment's overrides.
    kc::KernelTuning tuning = kc::TuningFor(prop.name, prop.major * 10 + prop.minor);
    std::string problem;
    if (overrides != nullptr && overrides[0] != '\0') problem = kc::ApplyTuningOverrides(overrides, &tuning);
    std::string knobs;
    for (const kc::TuningKnob& knob : kc::TuningKnobs()) {
      knobs += (knobs.empty() ? "" : " ") + std::string(knob.name) + "=" + std::to_string(tuning.*(knob.field));
    }
    out += "\n    kernel tuning: " + knobs;
    if (!problem.empty()) out += "\n    PSTAR_KERNEL_TUNING refused: " + problem;
  }
  // cuDNN's fused attention (a tuning choice): whether it can run here.
  if (!kc::CudnnAttention::Built()) {
    out += "\ncudnn attention: not built (no cuDNN 9 headers when configured)";
  } else {
    std::string why;
    auto route = kc::CudnnAttention::Open(&why);
    out += "\ncudnn attention: built against " + std::to_string(kc::CudnnAttention::BuildVersion()) +
           (route != nullptr ? ", loaded " + std::to_string(route->version()) : ", unavailable here: " + why);
  }
  return out;
#else
  return "not built (CPU-only build)";
#endif
}

}  // namespace pstar
