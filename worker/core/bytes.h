// Byte counts for people: "1.5 GiB" for output, and "512MiB" / "2GB" / "1048576"
// accepted in configs.
#pragma once

#include <cstdint>
#include <string>

#include "worker/core/status.h"

namespace pstar {

// Binary units with one decimal: "0 B", "12.0 KiB", "1.5 GiB".
std::string FormatBytes(int64_t bytes);

// A plain count, or a number with a unit: B, KB/MB/GB/TB (powers of 1000),
// KiB/MiB/GiB/TiB (powers of 1024); fractions allowed ("1.5GiB"), spaces too.
Result<int64_t> ParseBytes(const std::string& text);

}  // namespace pstar
