// What this build contains.
#pragma once

#include <string>

namespace pstar {

inline constexpr const char* kPstarVersion = "0.1.0";

// "not built" in CPU-only builds; otherwise the CUDA runtime version and the
// devices it finds (or why it finds none).
std::string CudaDeviceSummary();

}  // namespace pstar
