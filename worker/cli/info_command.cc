// pstar info: what this binary was built with and which devices it sees.
#include <omp.h>

#include <cstdio>

#include "worker/cli/commands.h"
#include "worker/core/build_info.h"

namespace pstar::cli {

int InfoCommand(const std::vector<std::string>& args) {
  if (!args.empty()) return UsageError("info takes no options");
  std::printf("pstar %s\n", kPstarVersion);
  std::printf("cpu: %d threads (OpenMP), BLAS: OpenBLAS\n", omp_get_max_threads());
  std::printf("cuda: %s\n", CudaDeviceSummary().c_str());
  return kExitOk;
}

}  // namespace pstar::cli
