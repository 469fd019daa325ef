// The instruction-set variants of the CPU kernels, and the one this process
// runs.
//
// Every kernel file but Adam's (which picks its own SIMD path) is compiled
// once per variant, each into a namespace of its own: the build renames `cpu`
// to `cpu_<variant>` for those objects, so the variants' symbols never meet.
// The public functions in pstar::kernels::cpu forward to the variant chosen
// here on first use (kernels/cpu/dispatch.cc). A -march=native build has one
// variant, `native`; a portable build (PSTAR_NATIVE_ARCH=OFF, as the images
// are built) has `x86-64`, `x86-64-v3` (AVX2 and FMA) and `x86-64-v4`
// (AVX-512) on x86-64, and one `baseline` elsewhere.
//
// A variant's bits are its own: one that contracts a * b + c into an FMA
// rounds differently from one that does not. The choice is fixed for the
// life of the process and is the same on every run on the same CPU, so a
// given build on a given machine keeps its same-bits-every-run promise; set
// PSTAR_CPU_ISA to pin a variant (for example on ranks of a job that span
// CPUs of different generations and should compute the same bits). OpenBLAS,
// which runs the GEMMs, picks its own kernels by CPU the same way, and they
// too round differently (AVX2's against AVX-512's): such ranks pin them with
// OPENBLAS_CORETYPE as well (BlasCoreName says which run).
#pragma once

#include <string>
#include <vector>

namespace pstar::kernels::cpu {

enum class CpuIsa { kNative, kBaseline, kX86_64, kX86_64_V3, kX86_64_V4 };

// "native", "baseline", "x86-64", "x86-64-v3", "x86-64-v4".
const char* CpuIsaName(CpuIsa isa);
// The variants this build compiled, the least demanding first.
std::vector<CpuIsa> BuiltCpuIsas();
// Whether this CPU, and the OS's saved vector state, can run the variant.
bool CpuIsaSupported(CpuIsa isa);
// The kernels OpenBLAS runs in this process ("Haswell", "SkylakeX", ...):
// the ones it picked for this CPU, or those OPENBLAS_CORETYPE names.
std::string BlasCoreName();

// The variant the kernels run: the one PSTAR_CPU_ISA names when this build
// has it and the CPU supports it, else the most capable built variant the CPU
// supports. Decided once, on the first call.
CpuIsa SelectedCpuIsa();
// Empty, or one line saying why PSTAR_CPU_ISA's value is not used (an
// unknown name, a variant this build lacks, one this CPU cannot run). The
// commands refuse to start on it rather than run another variant silently.
std::string CpuIsaRequestError();

}  // namespace pstar::kernels::cpu
