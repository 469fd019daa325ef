// Files written whole or not at all: write to a temp file beside the target,
// fsync it, rename over the target, fsync the directory.
#pragma once

#include <string>
#include <string_view>

#include "worker/core/status.h"

namespace pstar {

Status WriteFileAtomically(const std::string& path, std::string_view contents);

// Reads a whole file; NotFound / DataLoss name the path.
Result<std::string> ReadFile(const std::string& path);

}  // namespace pstar
