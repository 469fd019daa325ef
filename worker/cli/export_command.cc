// pstar export: a checkpoint's parameters as a Hugging Face GPT-2 model.
#include <cstdio>
#include <filesystem>

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

  auto step_dir = CheckpointStepDir(root, step_text);
  if (!step_dir.ok()) return ReportError(step_dir.status());
  auto summary = ExportHuggingFaceGpt2(*step_dir, output);
  if (!summary.ok()) return ReportError(summary.status());
  std::printf("exported step %lld (%lld parameters) to %s, %s and %s\n", static_cast<long long>(summary->step),
              static_cast<long long>(summary->parameters), summary->model_path.c_str(),
              summary->config_path.c_str(), summary->generation_config_path.c_str());
  if (!summary->tokenizer_paths.empty()) {
    std::printf("tokenizer (GPT-2's, as the run recorded it):");
    for (const std::string& p : summary->tokenizer_paths) std::printf(" %s", p.c_str());
    std::printf("\n");
  }
  return kExitOk;
}

}  // namespace pstar::cli
