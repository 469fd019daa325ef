// pstar tokenize: byte-level text to a token shard.
#include <cstdio>
#include <filesystem>

#include "worker/cli/commands.h"
#include "worker/core/file_util.h"
#include "worker/data/token_shard.h"
#include "worker/data/token_source.h"

namespace pstar::cli {

int TokenizeCommand(const std::vector<std::string>& args) {
  std::string input, output;
  for (size_t i = 0; i < args.size(); ++i) {
    if ((args[i] == "--input" || args[i] == "--output") && i + 1 >= args.size()) {
      return UsageError(args[i] + " needs a value");
    }
    if (args[i] == "--input") input = args[++i];
    else if (args[i] == "--output") output = args[++i];
    else return UsageError("tokenize: unknown option '" + args[i] + "'");
  }
  if (input.empty() || output.empty()) return UsageError("tokenize needs --input and --output");
  std::error_code ec;
  if (std::filesystem::equivalent(input, output, ec)) {
    return ReportError(Status::InvalidArgument("--output " + output + " is the input file; write the shard elsewhere"));
  }
  auto text = ReadRegularFile(input);
  if (!text.ok()) return ReportError(text.status());
  const std::vector<int32_t> tokens = ByteTokenize(*text);
  Status s = WriteTokenShard(output, tokens, 256);
  if (!s.ok()) return ReportError(s);
  std::printf("wrote %zu tokens (vocab 256) to %s\n", tokens.size(), output.c_str());
  return kExitOk;
}

}  // namespace pstar::cli
