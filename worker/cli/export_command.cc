// pstar export: a checkpoint's parameters as a Hugging Face model directory.
#include <cstdio>
#include <filesystem>

#include "worker/ckpt/hf_export.h"
#include "worker/cli/commands.h"
#include "worker/core/bytes.h"

namespace pstar::cli {

int ExportCommand(const std::vector<std::string>& args) {
  std::string root, output, step_text, dtype_text, shard_text;
  for (size_t i = 0; i < args.size(); ++i) {
    const bool valued = args[i] == "--checkpoint" || args[i] == "--output" || args[i] == "--step" ||
                        args[i] == "--dtype" || args[i] == "--max-shard-size";
    if (valued && i + 1 >= args.size()) return UsageError(args[i] + " needs a value");
    if (args[i] == "--checkpoint") root = args[++i];
    else if (args[i] == "--output") output = args[++i];
    else if (args[i] == "--step") step_text = args[++i];
    else if (args[i] == "--dtype") dtype_text = args[++i];
    else if (args[i] == "--max-shard-size") shard_text = args[++i];
    else return UsageError("export: unknown option '" + args[i] + "'");
  }
  if (root.empty() || output.empty()) return UsageError("export needs --checkpoint and --output");
  HfExportOptions options;
  if (dtype_text == "fp32") options.dtype = Dtype::kF32;
  else if (dtype_text == "bf16") options.dtype = Dtype::kBF16;
  else if (dtype_text == "fp16") options.dtype = Dtype::kF16;
  else if (!dtype_text.empty()) return UsageError("export: --dtype must be fp32, bf16 or fp16, got '" + dtype_text + "'");
  if (!shard_text.empty()) {
    auto bytes = ParseBytes(shard_text);
    if (!bytes.ok() || *bytes <= 0) {
      return UsageError("export: --max-shard-size must be a positive byte count (\"5GB\", \"500MiB\"), got '" +
                        shard_text + "'");
    }
    options.max_shard_bytes = *bytes;
  }

  auto step_dir = CheckpointStepDir(root, step_text);
  if (!step_dir.ok()) return ReportError(step_dir.status());
  auto summary = ExportHuggingFace(*step_dir, output, options);
  if (!summary.ok()) return ReportError(summary.status());
  std::printf("exported step %lld (%lld parameters, %s) to %s: %zu weight file(s)%s, %s and %s\n",
              static_cast<long long>(summary->step), static_cast<long long>(summary->parameters),
              DtypeName(summary->dtype), output.c_str(), summary->weight_paths.size(),
              summary->index_path.empty() ? "" : " with model.safetensors.index.json", summary->config_path.c_str(),
              summary->generation_config_path.c_str());
  if (!summary->carried_paths.empty()) {
    std::printf("from the imported directory:");
    for (const std::string& p : summary->carried_paths) std::printf(" %s", p.c_str());
    std::printf("\n");
  }
  if (!summary->tokenizer_paths.empty()) {
    std::printf("tokenizer (as the run recorded it):");
    for (const std::string& p : summary->tokenizer_paths) std::printf(" %s", p.c_str());
    std::printf("\n");
  }
  return kExitOk;
}

}  // namespace pstar::cli
