// pstar export: a checkpoint's parameters as a Hugging Face GPT-2 model.
#include <cstdio>
#include <filesystem>

#include "worker/ckpt/checkpoint_dir.h"
#include "worker/ckpt/hf_export.h"
#include "worker/cli/commands.h"

namespace pstar::cli {

int ExportCommand(const std::vector<std::string>& args) {
  std::string root, output, step_text;
  for (size_t i = 0; i < args.size(); ++i) {
    const bool valued = args[i] == "--checkpoint" || args[i] == "--output" || args[i] == "--step";
    if (valued && i + 1 >= args.size()) return UsageError(args[i] + " needs a value");
    if (args[i] == "--checkpoint") root = args[++i];
    else if (args[i] == "--output") output = args[++i];
    else if (args[i] == "--step") step_text = args[++i];
    else return UsageError("export: unknown option '" + args[i] + "'");
  }
  if (root.empty() || output.empty()) return UsageError("export needs --checkpoint and --output");

  int64_t step = -1;
  if (!step_text.empty()) {
    size_t used = 0;
    try {
      step = std::stoll(step_text, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != step_text.size() || step < 0) {
      return UsageError("--step: expected a step number, got '" + step_text + "'");
    }
  } else {
    auto latest = ReadLatestStep(root);
    if (!latest.ok()) {
      if (latest.status().code() == StatusCode::kNotFound) {
        return ReportError(Status::NotFound(root + ": no checkpoint (no 'latest' file)"));
      }
      return ReportError(latest.status());
    }
    step = *latest;
  }
  const std::string step_dir = (std::filesystem::path(root) / StepDirName(step)).string();
  std::error_code ec;
  if (!std::filesystem::is_directory(step_dir, ec)) {
    return ReportError(Status::NotFound(step_dir + ": no such checkpoint"));
  }
  auto summary = ExportHuggingFaceGpt2(step_dir, output);
  if (!summary.ok()) return ReportError(summary.status());
  std::printf("exported step %lld (%lld parameters) to %s, %s and %s\n", static_cast<long long>(summary->step),
              static_cast<long long>(summary->parameters), summary->model_path.c_str(),
              summary->config_path.c_str(), summary->generation_config_path.c_str());
  return kExitOk;
}

}  // namespace pstar::cli
