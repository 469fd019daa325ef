// Kubernetes resource quantities ("64Gi", "500M", "1.5G", "100m", "1e3"):
// parsing to integers and formatting memory sizes back.
#pragma once

#include <cstdint>
#include <string>

#include "worker/core/status.h"

namespace pstar::op {

// A quantity as a whole number of base units (bytes for memory), rounded up
// like the API server does ("100m" -> 1, "1.5Ki" -> 1536). Errors on bad
// syntax, negative values and overflow.
Result<int64_t> ParseQuantity(const std::string& text);

// A CPU quantity in millicores ("2" -> 2000, "100m" -> 100, "0.5" -> 500).
Result<int64_t> ParseCpuMillis(const std::string& text);

// The shortest exact binary form: 12Gi, 1536Mi, else plain bytes ("1000").
std::string FormatBytesQuantity(int64_t bytes);

}  // namespace pstar::op
