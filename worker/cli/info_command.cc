// pstar info: what this binary was built with and which devices it sees.
#include <omp.h>

#include <cstdio>
#include <string>

#include "kernels/adam.h"
#include "kernels/cpu/isa.h"
#include "worker/cli/commands.h"
#include "worker/core/build_info.h"

namespace pstar::cli {

int InfoCommand(const std::vector<std::string>& args) {
  if (!args.empty()) return UsageError("info takes no options");
  std::printf("pstar %s\n", kPstarVersion);
  namespace kc = kernels::cpu;
  std::printf("cpu: %d threads (OpenMP), BLAS: OpenBLAS, %s kernels (OPENBLAS_CORETYPE pins them)\n",
              omp_get_max_threads(), kc::BlasCoreName().c_str());
  std::string built;
  for (kc::CpuIsa isa : kc::BuiltCpuIsas()) {
    built += built.empty() ? "" : ", ";
    built += kc::CpuIsaName(isa);
    if (!kc::CpuIsaSupported(isa)) built += " (not on this cpu)";
  }
  std::printf("cpu kernels: %s (built: %s; PSTAR_CPU_ISA pins one), adam: %s\n", kc::CpuIsaName(kc::SelectedCpuIsa()),
              built.c_str(), kc::AdamIsa());
  std::printf("cuda: %s\n", CudaDeviceSummary().c_str());
  return kExitOk;
}

}  // namespace pstar::cli
