// What this build contains.
#pragma once

#include <string>

namespace pstar {

inline constexpr const char* kPstarVersion = "0.1.0";

// "not built" in CPU-only builds; otherwise the CUDA runtime version and the
// devices it finds (or why it finds none), each with the kernel tuning a run
// on it takes, and whether cuDNN's attention can run.
std::string CudaDeviceSummary();

}  // namespace pstar
