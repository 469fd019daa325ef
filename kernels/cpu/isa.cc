#include "kernels/cpu/isa.h"

#include <cblas.h>

#include <cstdlib>
#include <string_view>

namespace pstar::kernels::cpu {
namespace {

struct Selection {
  CpuIsa isa;
  std::string error;
};

bool X86Supports(CpuIsa isa) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  // The features each level's -march may use that a CPU can lack while it
  // has the level below; every CPU with AVX2, FMA and BMI2 also has F16C,
  // LZCNT and MOVBE. libgcc and compiler-rt check the OS's XSAVE state too.
  const bool v3 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi") &&
                  __builtin_cpu_supports("bmi2");
  if (isa == CpuIsa::kX86_64_V3) return v3;
  if (isa == CpuIsa::kX86_64_V4) {
    return v3 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vl");
  }
  return true;
#else
  return isa != CpuIsa::kX86_64_V3 && isa != CpuIsa::kX86_64_V4;
#endif
}

Selection Select() {
  const std::vector<CpuIsa> built = BuiltCpuIsas();
  CpuIsa best = built.front();
  for (CpuIsa isa : built) {
    if (CpuIsaSupported(isa)) best = isa;
  }
  const char* env = std::getenv("PSTAR_CPU_ISA");
  if (env == nullptr || *env == '\0') return {best, ""};
  const std::string_view want(env);
  std::string names;
  for (CpuIsa isa : built) {
    if (want == CpuIsaName(isa)) {
      if (CpuIsaSupported(isa)) return {isa, ""};
      return {best, "PSTAR_CPU_ISA=" + std::string(want) + ": this CPU cannot run that variant (the best it can is " +
                        CpuIsaName(best) + ")"};
    }
    names += names.empty() ? "" : ", ";
    names += CpuIsaName(isa);
  }
  return {best,
          "PSTAR_CPU_ISA=" + std::string(want) + ": not a CPU kernel variant of this build (it has " + names + ")"};
}

const Selection& TheSelection() {
  static const Selection selection = Select();
  return selection;
}

}  // namespace

const char* CpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kNative:
      return "native";
    case CpuIsa::kBaseline:
      return "baseline";
    case CpuIsa::kX86_64:
      return "x86-64";
    case CpuIsa::kX86_64_V3:
      return "x86-64-v3";
    case CpuIsa::kX86_64_V4:
      return "x86-64-v4";
  }
  return "unknown";
}

std::vector<CpuIsa> BuiltCpuIsas() {
  std::vector<CpuIsa> built;
#ifdef PSTAR_CPU_VARIANT_native
  built.push_back(CpuIsa::kNative);
#endif
#ifdef PSTAR_CPU_VARIANT_baseline
  built.push_back(CpuIsa::kBaseline);
#endif
#ifdef PSTAR_CPU_VARIANT_x86_64
  built.push_back(CpuIsa::kX86_64);
#endif
#ifdef PSTAR_CPU_VARIANT_x86_64_v3
  built.push_back(CpuIsa::kX86_64_V3);
#endif
#ifdef PSTAR_CPU_VARIANT_x86_64_v4
  built.push_back(CpuIsa::kX86_64_V4);
#endif
  return built;
}

bool CpuIsaSupported(CpuIsa isa) { return X86Supports(isa); }

std::string BlasCoreName() {
  const char* name = openblas_get_corename();
  return name == nullptr ? "unknown" : name;
}

CpuIsa SelectedCpuIsa() { return TheSelection().isa; }

std::string CpuIsaRequestError() { return TheSelection().error; }

}  // namespace pstar::kernels::cpu
