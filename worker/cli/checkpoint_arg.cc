// --checkpoint ROOT [--step N], as export and sample take them.
#include <filesystem>

#include "worker/ckpt/checkpoint_dir.h"
#include "worker/cli/commands.h"

namespace pstar::cli {

Result<std::string> CheckpointStepDir(const std::string& root, const std::string& step_text) {
  int64_t step = -1;
  if (!step_text.empty()) {
    size_t used = 0;
    try {
      step = std::stoll(step_text, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != step_text.size() || step < 0) {
      return Status::InvalidArgument("--step: expected a step number, got '" + step_text + "'");
    }
  } else {
    auto latest = ReadLatestStep(root);
    if (!latest.ok()) {
      if (latest.status().code() == StatusCode::kNotFound) {
        return Status::NotFound(root + ": no checkpoint (no 'latest' file)");
      }
      return latest.status();
    }
    step = *latest;
  }
  const std::string step_dir = (std::filesystem::path(root) / StepDirName(step)).string();
  std::error_code ec;
  if (!std::filesystem::is_directory(step_dir, ec)) return Status::NotFound(step_dir + ": no such checkpoint");
  return step_dir;
}

}  // namespace pstar::cli
