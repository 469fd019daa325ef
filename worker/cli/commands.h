// The `pstar` subcommands. Each returns the process exit code:
// 0 success, 1 runtime failure, 2 bad input (usage, config, data), 130 interrupted.
#pragma once

#include <string>
#include <vector>

#include "worker/core/status.h"

namespace pstar::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitBadInput = 2;
inline constexpr int kExitInterrupted = 130;

int TrainCommand(const std::vector<std::string>& args);
int TokenizeCommand(const std::vector<std::string>& args);
int InfoCommand(const std::vector<std::string>& args);

// Prints "pstar: error: <message>" on one line and returns the exit code for it.
int ReportError(const Status& status);
int UsageError(const std::string& message);

}  // namespace pstar::cli
