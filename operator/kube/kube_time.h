// Timestamps in the API's formats: Time ("2026-01-02T03:04:05Z") and
// MicroTime ("2026-01-02T03:04:05.000000Z", used by Leases and Events).
#pragma once

#include <chrono>
#include <string>

#include "worker/core/status.h"

namespace pstar::op {

using WallTime = std::chrono::system_clock::time_point;

std::string FormatTime(WallTime t);       // RFC 3339, seconds, UTC
std::string FormatMicroTime(WallTime t);  // RFC 3339, microseconds, UTC
// Accepts RFC 3339 with optional fraction and "Z" or a "+hh:mm" offset.
Result<WallTime> ParseTime(const std::string& text);

}  // namespace pstar::op
