#include "kernels/cuda/launch.h"

#include <cstdio>
#include <cstdlib>

namespace pstar::kernels::cuda {

void CheckLaunch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "pstar: CUDA kernel %s failed to launch: %s\n", what, cudaGetErrorString(e));
  std::abort();
}

}  // namespace pstar::kernels::cuda
