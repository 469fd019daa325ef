// The `pstar` subcommands. Each returns the process exit code:
// 0 success, 1 runtime failure, 2 bad input (usage, config, data), 130 interrupted.
#pragma once

#include <string>
#include <vector>

#include "worker/config/config.h"
#include "worker/core/status.h"

namespace pstar::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitBadInput = 2;
inline constexpr int kExitInterrupted = 130;

int TrainCommand(const std::vector<std::string>& args);
int PlanCommand(const std::vector<std::string>& args);
int TokenizeCommand(const std::vector<std::string>& args);
int InfoCommand(const std::vector<std::string>& args);
int LaunchCommand(const std::vector<std::string>& args);
int ExportCommand(const std::vector<std::string>& args);
int SampleCommand(const std::vector<std::string>& args);
int ExamplesCommand(const std::vector<std::string>& args);

// The step directory of checkpoint root `root`: step `step_text` (a number),
// or the latest when it is empty. NotFound names what is missing;
// InvalidArgument starting "--step" a bad number.
Result<std::string> CheckpointStepDir(const std::string& root, const std::string& step_text);

// The job options train and plan share: --config FILE, --set KEY=VALUE (repeated),
// and the command's own `flags`, which take no value.
struct JobArgs {
  std::string config_path;  // empty: the built-in default job
  std::vector<std::string> overrides;
  std::vector<std::string> flags;
  bool Has(const std::string& flag) const {
    for (const auto& f : flags) if (f == flag) return true;
    return false;
  }
};
Result<JobArgs> ParseJobArgs(const std::string& command, const std::vector<std::string>& args,
                             const std::vector<std::string>& flags);
Result<Config> LoadJobConfig(const JobArgs& job);

// Prints "pstar: error: <message>" on one line and returns the exit code for it.
int ReportError(const Status& status);
int UsageError(const std::string& message);

}  // namespace pstar::cli
