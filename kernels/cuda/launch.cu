#include "kernels/cuda/launch.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace pstar::kernels::cuda {

void CheckLaunch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    std::fprintf(stderr, "pstar: CUDA kernel %s failed to launch: %s\n", what, cudaGetErrorString(e));
    std::abort();
  }
  SyncCheck(what);
}

bool SyncEveryLaunch() {
  static const bool sync = [] {
    const char* v = std::getenv("PSTAR_CUDA_SYNC");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  return sync;
}

void SyncCheck(const char* what) {
  if (!SyncEveryLaunch()) return;
  const cudaError_t e = cudaDeviceSynchronize();
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "pstar: CUDA work of %s failed (PSTAR_CUDA_SYNC=1 checks each launch and copy): %s\n", what,
               cudaGetErrorString(e));
  std::abort();
}

}  // namespace pstar::kernels::cuda
