#include "worker/core/build_info.h"

#ifdef PSTAR_WITH_CUDA
#include <cuda_runtime_api.h>
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
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) == cudaSuccess) {
      out += "\n  device " + std::to_string(i) + ": " + prop.name + ", " +
             std::to_string(prop.totalGlobalMem >> 20) + " MiB";
    }
  }
  return out;
#else
  return "not built (CPU-only build)";
#endif
}

}  // namespace pstar
