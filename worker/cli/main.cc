// pstar: the PatrickStar worker CLI.
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/cpu/isa.h"
#include "worker/cli/commands.h"
#include "worker/core/build_info.h"

namespace {

struct CommandHelp {
  const char* name;
  const char* synopsis;  // the usage line(s) after "pstar "
  const char* summary;   // one line for the command list
  const char* details;   // the options, for `pstar help COMMAND`
};

constexpr CommandHelp kCommands[] = {
    {"train",
     "train [--config FILE] [--set KEY=VALUE]... [--print-config] [--profile] [--log-format text|json] "
     "[--chunk-events FILE] [--comm-alone]",
     "train a GPT; without --config, the built-in default job",
     "  --config FILE      the job's YAML config (docs/config.md); default: the built-in default job\n"
     "  --set KEY=VALUE    override one config key, e.g. --set train.steps=50 (repeatable)\n"
     "  --print-config     print the effective config, every key, and exit\n"
     "  --profile          print time per op family, chunk copy direction and collective at the end\n"
     "  --log-format json  progress lines as one JSON object each (step, loss, lr, grad_norm, tokens_per_s,\n"
     "                     ms_per_step, elapsed_s, eta_s, h2d_bytes, d2h_bytes, ...; validations: step,\n"
     "                     val_loss, eval_s)\n"
     "  --chunk-events FILE  write every step's chunk uses, gradient-final points, optimizer updates and\n"
     "                     waits for them as CSV (seq,step,event,chunk,time_s) when the run ends\n"
     "  --comm-alone       with several ranks: replay the last step's gathers and reduce-scatters without\n"
     "                     compute when training ends, and print their time (the step's communication alone)\n"
     "Ranks come from RANK, WORLD_SIZE, MASTER_ADDR, ... (see pstar launch); Ctrl-C stops after the step.\n"},
    {"plan",
     "plan [--config FILE] [--set KEY=VALUE]... [--world-size N] [--json] [--payload] [--scale [CLUSTER FLAGS]]",
     "print the job's memory plan: chunks, bytes per tier, minimum memory; or its step time at scale",
     "  --config FILE      the job's YAML config; default: the built-in default job\n"
     "  --set KEY=VALUE    override one config key (repeatable)\n"
     "  --world-size N     plan one of N data-parallel ranks (default 1)\n"
     "  --json             print the plan (or with --scale, the table) as one JSON object\n"
     "  --payload          with --world-size N: run the job's chunk traffic for a few steps as rank 0 and\n"
     "                     print the all-gather and reduce-scatter bytes a rank sends per step (CPU jobs)\n"
     "  --scale            predict the step on 1, 2, 4, ... GPUs up to the cluster's: compute, PCIe copies,\n"
     "                     collectives (and what overlap leaves exposed), host Adam, disk, tokens/s and the\n"
     "                     largest model of the job's width that fits (batch is per GPU); not with\n"
     "                     --world-size or --payload\n"
     "  cluster flags: --nodes N (128) or --gpus N (whole nodes) --gpus-per-node G (8) --intra-bw GB/s (370)\n"
     "                 --inter-bw Gbit/s (400) --tflops T --pcie-bw GB/s --adam-rate params/s (measured)\n"
     "                 --disk-bw GB/s (2) --gpu-memory BYTES (80GiB) --host-memory BYTES (256GiB per GPU)\n"},
    {"tokenize",
     "tokenize --input TEXT [--input TEXT]... --output SHARD.bin [--tokenizer byte|gpt2|hf|tiktoken]\n"
     "         [--vocab encoder.json --merges vocab.bpe | --tokenizer-json FILE | --tiktoken FILE]\n"
     "         [--document-separator STRING] [--threads N] [--decode]",
     "write a token shard from text files: bytes, GPT-2's BPE, or a model's tokenizer.json",
     "  --input TEXT       a regular file, or a directory of them (name order); repeatable\n"
     "  --output SHARD     the token shard to write (replaced atomically; never an input)\n"
     "  --tokenizer T      byte (one token per byte, vocabulary 256; the default), gpt2 (GPT-2's\n"
     "                     files), hf (a tokenizer.json: Llama 2/3, Qwen2.5/3, Mistral, GPT-2) or\n"
     "                     tiktoken (Llama 3's rank file)\n"
     "  --vocab FILE       GPT-2's encoder.json (with --merges; implies --tokenizer gpt2)\n"
     "  --merges FILE      GPT-2's vocab.bpe\n"
     "  --tokenizer-json F a Hugging Face tokenizer.json (implies --tokenizer hf)\n"
     "  --tiktoken FILE    Llama 3's tiktoken rank file, Meta's original/tokenizer.model\n"
     "                     (implies --tokenizer tiktoken)\n"
     "  --document-separator S  cut each file into documents at S (dropped); before every\n"
     "                     document goes the tokenizer's start (<|endoftext|>, <|begin_of_text|>,\n"
     "                     <s>); each file is one document without this. A special token's text\n"
     "                     in the input is encoded as text\n"
     "  --threads N        encoding threads (default: every core)\n"
     "  --decode           the reverse: --input is a shard, --output the text it decodes to\n"},
    {"export", "export --checkpoint ROOT [--step N] --output DIR [--dtype fp32|bf16|fp16] [--max-shard-size BYTES]",
     "write a checkpoint's weights as a Hugging Face model directory (Llama, Qwen2, Mistral, GPT-2)",
     "  --checkpoint ROOT  a checkpoint directory (checkpoint.dir of the run)\n"
     "  --step N           the step to export (default: the latest)\n"
     "  --output DIR       where the weights, config.json and generation_config.json go\n"
     "  --dtype D          the weights' type (default: bf16 for the Llama family, fp32 for GPT-2)\n"
     "  --max-shard-size B most bytes per weight file (default 5GB); more makes\n"
     "                     model-0000K-of-0000N.safetensors and model.safetensors.index.json\n"},
    {"sample",
     "sample --checkpoint ROOT [--step N] --prompt TEXT | --prompt-ids IDS [--tokens N] [--temperature T]\n"
     "         [--top-k K] [--seed S] [--vocab encoder.json --merges vocab.bpe | --tokenizer-json FILE]",
     "generate text (or token ids) from a checkpoint with the tokenizer its run used",
     "  --checkpoint ROOT  a checkpoint directory (checkpoint.dir of the run)\n"
     "  --step N           the step to sample from (default: the latest)\n"
     "  --prompt TEXT      the start of the text (GPT-2's tokenizer: may be empty)\n"
     "  --prompt-ids IDS   token ids instead (\"12 7 3\"): prints the prompt's and the new ids, no tokenizer\n"
     "  --tokens N         new tokens at most (default 64; GPT-2's <|endoftext|> ends sooner)\n"
     "  --temperature T    0 is greedy (the most likely token each time); default 1\n"
     "  --top-k K          draw from the K most likely tokens only; 0 (default) is all\n"
     "  --seed S           the same seed, checkpoint and prompt give the same text (default 0)\n"
     "  --vocab, --merges, --tokenizer-json  a tokenizer for a checkpoint that recorded none\n"},
    {"examples", "examples [--config FILE] [--set KEY=VALUE]... [--rows] [--validation]",
     "print what a data.source jsonl job trains on, one JSON object a line",
     "  --config FILE      the job's YAML config; default: the built-in default job\n"
     "  --set KEY=VALUE    override one config key (repeatable)\n"
     "  (default)          each example of data.path in its chat format: line, format, ids, counted\n"
     "                     (1 for each id the loss counts: the answers and the end token after each),\n"
     "                     text (the example as the model reads it) and answers (each counted run's text)\n"
     "  --rows             the packed rows instead: tokens, targets (-1: not counted) and positions\n"
     "  --validation       data.val_path's examples or rows\n"},
    {"info", "info", "print the build and the compute devices", ""},
    {"launch",
     "launch --nproc-per-node N [--nnodes M] [--node-rank K] [--master-addr A]\n"
     "         [--master-port P] [--rdzv-id ID] [--standalone] -- <command> [options]",
     "run N ranks of a pstar command on this node (e.g. -- train --config FILE)",
     "  --nproc-per-node N  ranks on this node\n"
     "  --nnodes M          nodes in the job (default 1)\n"
     "  --node-rank K       this node's index (default 0)\n"
     "  --master-addr A     the host of rank 0's rendezvous store (default 127.0.0.1)\n"
     "  --master-port P     its port (default 29500)\n"
     "  --rdzv-id ID        the rendezvous id that keeps jobs apart (default pstar)\n"
     "  --standalone        one node, the rendezvous on a free local port\n"
     "torchrun's spellings work too: --nproc_per_node, --node_rank, --master_addr, ...\n"},
};

const CommandHelp* FindCommand(const std::string& name) {
  for (const CommandHelp& c : kCommands) {
    if (name == c.name) return &c;
  }
  return nullptr;
}

void PrintUsage(std::FILE* out) {
  std::fputs("usage: pstar <command> [options]\n       pstar help <command> | --version\n\ncommands:\n", out);
  for (const CommandHelp& c : kCommands) std::fprintf(out, "  %s\n        %s\n", c.synopsis, c.summary);
}

void PrintCommandHelp(const CommandHelp& c) {
  std::printf("usage: pstar %s\n\n%s\n%s", c.synopsis, c.summary, c.details[0] ? "\noptions:\n" : "");
  std::fputs(c.details, stdout);
}

// --help or -h among a command's own arguments (not after launch's `--`).
bool AsksForHelp(const std::vector<std::string>& args) {
  for (const std::string& a : args) {
    if (a == "--") return false;
    if (a == "--help" || a == "-h") return true;
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    PrintUsage(stderr);
    return pstar::cli::kExitBadInput;
  }
  if (args[0] == "--version" || args[0] == "version") {
    std::printf("pstar %s\n", pstar::kPstarVersion);
    return pstar::cli::kExitOk;
  }
  if (args[0] == "help" || args[0] == "--help" || args[0] == "-h") {
    if (args.size() < 2) {
      PrintUsage(stdout);
      return pstar::cli::kExitOk;
    }
    const CommandHelp* c = FindCommand(args[1]);
    if (c == nullptr) return pstar::cli::UsageError("help: unknown command '" + args[1] + "' (try 'pstar help')");
    PrintCommandHelp(*c);
    return pstar::cli::kExitOk;
  }
  std::string command = args[0];
  args.erase(args.begin());
  // A PSTAR_CPU_ISA the kernels cannot honour is refused, not run as another
  // variant, whose bits would differ from what the user pinned.
  if (const std::string isa_error = pstar::kernels::cpu::CpuIsaRequestError(); !isa_error.empty()) {
    return pstar::cli::UsageError(isa_error);
  }
  if (const CommandHelp* c = FindCommand(command); c != nullptr && AsksForHelp(args)) {
    PrintCommandHelp(*c);
    return pstar::cli::kExitOk;
  }
  if (command == "train") return pstar::cli::TrainCommand(args);
  if (command == "plan") return pstar::cli::PlanCommand(args);
  if (command == "tokenize") return pstar::cli::TokenizeCommand(args);
  if (command == "sample") return pstar::cli::SampleCommand(args);
  if (command == "examples") return pstar::cli::ExamplesCommand(args);
  if (command == "export") return pstar::cli::ExportCommand(args);
  if (command == "info") return pstar::cli::InfoCommand(args);
  if (command == "launch") return pstar::cli::LaunchCommand(args);
  return pstar::cli::UsageError("unknown command '" + command + "' (try 'pstar help')");
}
