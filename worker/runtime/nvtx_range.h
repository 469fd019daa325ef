// NvtxRange: a named range on the calling thread's timeline, from
// construction to destruction, for NVIDIA's profilers (nsys, Nsight). In a
// build with CUDA it is an NVTX v3 push and pop (header-only; when no
// profiler is attached each is a check of one pointer); without CUDA it
// compiles to nothing. The names are those of the profile summary (see
// docs/profiling.md), so both views of a run speak the same language.
#pragma once

#ifdef PSTAR_WITH_CUDA
#include <nvtx3/nvToolsExt.h>
#endif

namespace pstar {

class NvtxRange {
 public:
  // `name` must outlive the range (a string literal).
  explicit NvtxRange(const char* name) {
#ifdef PSTAR_WITH_CUDA
    nvtxRangePushA(name);
#else
    (void)name;
#endif
  }
  ~NvtxRange() {
#ifdef PSTAR_WITH_CUDA
    nvtxRangePop();
#endif
  }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

}  // namespace pstar
