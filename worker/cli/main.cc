// pstar: the PatrickStar worker CLI.
#include <cstdio>
#include <string>
#include <vector>

#include "worker/cli/commands.h"

namespace {

constexpr const char* kUsage =
    "usage: pstar <command> [options]\n"
    "\n"
    "commands:\n"
    "  train [--config FILE] [--set KEY=VALUE]... [--print-config] [--profile]\n"
    "        train a GPT; without --config, the built-in default job\n"
    "  plan  [--config FILE] [--set KEY=VALUE]... [--world-size N] [--json]\n"
    "        print the job's memory plan: chunks, bytes per tier, minimum memory\n"
    "  tokenize --input TEXT --output SHARD.bin\n"
    "        write a byte-level token shard from a text file\n"
    "  export --checkpoint ROOT [--step N] --output DIR\n"
    "        write a checkpoint's weights as a Hugging Face GPT-2 model\n"
    "  info  print the build and the compute devices\n"
    "  launch --nproc-per-node N [--nnodes M] [--node-rank K] [--master-addr A]\n"
    "         [--master-port P] [--rdzv-id ID] -- <command> [options]\n"
    "        run N ranks of a pstar command on this node (e.g. -- train --config FILE)\n";

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "help" || args[0] == "--help" || args[0] == "-h") {
    std::fputs(kUsage, args.empty() ? stderr : stdout);
    return args.empty() ? pstar::cli::kExitBadInput : pstar::cli::kExitOk;
  }
  std::string command = args[0];
  args.erase(args.begin());
  if (command == "train") return pstar::cli::TrainCommand(args);
  if (command == "plan") return pstar::cli::PlanCommand(args);
  if (command == "tokenize") return pstar::cli::TokenizeCommand(args);
  if (command == "export") return pstar::cli::ExportCommand(args);
  if (command == "info") return pstar::cli::InfoCommand(args);
  if (command == "launch") return pstar::cli::LaunchCommand(args);
  return pstar::cli::UsageError("unknown command '" + command + "' (try 'pstar help')");
}
