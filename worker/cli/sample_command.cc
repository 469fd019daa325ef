// pstar sample: text from a checkpoint, with the tokenizer its run used; or,
// with --prompt-ids, token ids in and out (any checkpoint, no tokenizer).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>

#include "worker/ckpt/checkpoint.h"
#include "worker/ckpt/checkpoint_dir.h"
#include "worker/cli/commands.h"
#include "worker/data/bpe_tokenizer.h"
#include "worker/data/token_source.h"
#include "worker/model/sampler.h"

namespace pstar::cli {
namespace {

Result<double> ParseNumber(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  const double d = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || !std::isfinite(d) || d < 0) {
    return Status::InvalidArgument(flag + " must be a number >= 0, got '" + v + "'");
  }
  return d;
}

Result<int64_t> ParseCount(const std::string& flag, const std::string& v, int64_t max) {
  char* end = nullptr;
  const long long n = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || n < 0 || n > max) {
    return Status::InvalidArgument(flag + " must be an integer in 0.." + std::to_string(max) + ", got '" + v + "'");
  }
  return int64_t(n);
}

// "12 7 3": whitespace-separated token ids, each below `vocab`.
Result<std::vector<int32_t>> ParseIds(const std::string& text, int64_t vocab) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < text.size()) {
    if (text[i] == ' ' || text[i] == '\t' || text[i] == ',') {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < text.size() && text[j] != ' ' && text[j] != '\t' && text[j] != ',') ++j;
    auto n = ParseCount("--prompt-ids", text.substr(i, j - i), vocab - 1);
    if (!n.ok()) return n.status();
    ids.push_back(int32_t(*n));
    i = j;
  }
  if (ids.empty()) return Status::InvalidArgument("--prompt-ids has no token ids");
  return ids;
}

// The tokens `g`'s weights at `step_dir` generate after `ids`.
Result<std::vector<int32_t>> GenerateFrom(const std::string& step_dir, const GptConfig& g,
                                          const std::vector<int32_t>& ids, const SampleOptions& options) {
  PSTAR_ASSIGN_OR_RETURN(std::vector<std::vector<float>> values, LoadWholeParams(step_dir, g));
  PSTAR_ASSIGN_OR_RETURN(std::unique_ptr<Sampler> sampler, Sampler::Create(g, values));
  return sampler->Generate(ids, options);
}

// Samples after `ids`; prints every id.
int SampleIds(const std::string& step_dir, const GptConfig& g, const std::vector<int32_t>& ids,
              const SampleOptions& options) {
  auto out = GenerateFrom(step_dir, g, ids, options);
  if (!out.ok()) return ReportError(out.status());
  std::string line;
  for (int32_t id : ids) line += (line.empty() ? "" : " ") + std::to_string(id);
  for (int32_t id : *out) line += " " + std::to_string(id);
  std::printf("%s\n", line.c_str());
  return kExitOk;
}

}  // namespace

int SampleCommand(const std::vector<std::string>& args) {
  std::string root, step_text, vocab, merges, tokenizer_json;
  std::optional<std::string> prompt, prompt_ids;
  SampleOptions options;
  options.temperature = 1.0;
  options.top_k = 0;
  options.tokens = 64;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& flag = args[i];
    static const char* const kValued[] = {"--checkpoint", "--step", "--prompt", "--prompt-ids", "--tokens",
                                          "--temperature", "--top-k", "--seed", "--vocab", "--merges",
                                          "--tokenizer-json"};
    bool valued = false;
    for (const char* k : kValued) valued |= flag == k;
    if (!valued) return UsageError("sample: unknown option '" + flag + "'");
    if (i + 1 >= args.size()) return UsageError(flag + " needs a value");
    const std::string& v = args[++i];
    if (flag == "--checkpoint") root = v;
    else if (flag == "--step") step_text = v;
    else if (flag == "--prompt") prompt = v;
    else if (flag == "--prompt-ids") prompt_ids = v;
    else if (flag == "--vocab") vocab = v;
    else if (flag == "--merges") merges = v;
    else if (flag == "--tokenizer-json") tokenizer_json = v;
    else if (flag == "--temperature") {
      auto d = ParseNumber(flag, v);
      if (!d.ok()) return UsageError(d.status().message());
      options.temperature = *d;
    } else {
      auto n = ParseCount(flag, v, flag == "--seed" ? INT64_MAX : int64_t(1) << 20);
      if (!n.ok()) return UsageError(n.status().message());
      if (flag == "--tokens") options.tokens = *n;
      else if (flag == "--top-k") options.top_k = *n;
      else options.seed = uint64_t(*n);
    }
  }
  if (root.empty()) return UsageError("sample needs --checkpoint");
  if (prompt && prompt_ids) return UsageError("give either --prompt or --prompt-ids");
  if (!prompt && !prompt_ids) {
    return UsageError("sample needs --prompt (it may be empty with GPT-2's tokenizer) or --prompt-ids");
  }
  if ((!vocab.empty() || !merges.empty()) && (vocab.empty() || merges.empty())) {
    return UsageError("--vocab and --merges go together");
  }
  if (!tokenizer_json.empty() && !vocab.empty()) return UsageError("give either --vocab and --merges or --tokenizer-json");

  auto step_dir = CheckpointStepDir(root, step_text);
  if (!step_dir.ok()) return ReportError(step_dir.status());
  auto manifest = ReadManifest(*step_dir);
  if (!manifest.ok()) return ReportError(manifest.status());
  const GptConfig& g = manifest->state.model;
  if (prompt_ids) {
    if (!vocab.empty() || !merges.empty() || !tokenizer_json.empty()) {
      return UsageError("--prompt-ids takes no tokenizer (--vocab, --merges, --tokenizer-json)");
    }
    auto ids = ParseIds(*prompt_ids, g.vocab_size);
    if (!ids.ok()) return UsageError(ids.status().message());
    return SampleIds(*step_dir, g, *ids, options);
  }

  // The tokenizer: given on the command line, else the one the run recorded.
  std::optional<BpeTokenizer> bpe;
  if (!vocab.empty() || !tokenizer_json.empty()) {
    auto t = tokenizer_json.empty() ? BpeTokenizer::FromGpt2Files(vocab, merges) : BpeTokenizer::FromTokenizerJson(tokenizer_json);
    if (!t.ok()) return ReportError(t.status());
    bpe.emplace(std::move(*t));
  } else if (const std::string& kind = manifest->state.tokenizer; BpeTokenizer::IsBpeKind(kind)) {
    auto text = ReadCheckpointTokenizer(*step_dir);
    if (!text.ok()) return ReportError(text.status());
    auto t = BpeTokenizer::FromSaved(kind, *text, *step_dir + "/" + manifest->tokenizer_file.name);
    if (!t.ok()) return ReportError(t.status());
    bpe.emplace(std::move(*t));
  } else if (manifest->state.tokenizer == "none") {
    return ReportError(Status::InvalidArgument(
        *step_dir + ": the run recorded no tokenizer (its tokens were generated or came from shards); pass "
                    "--vocab and --merges, or --tokenizer-json"));
  }
  const int64_t tokenizer_vocab = bpe ? bpe->vocab_size() : 256;
  if (tokenizer_vocab > g.vocab_size) {
    return ReportError(Status::InvalidArgument("vocabulary mismatch: the tokenizer has " + std::to_string(tokenizer_vocab) +
                                               " tokens but the model " + std::to_string(g.vocab_size)));
  }
  std::vector<int32_t> ids = bpe ? bpe->Encode(*prompt) : ByteTokenize(*prompt);
  // Text starts after the tokenizer's document start (GPT-2's
  // <|endoftext|>, Llama's <|begin_of_text|>): an empty prompt is just that.
  if (bpe) ids.insert(ids.begin(), bpe->DocumentStart().begin(), bpe->DocumentStart().end());
  if (ids.empty()) return UsageError("--prompt is empty, and byte-level text has no start token to begin from");
  options.vocab_limit = tokenizer_vocab;
  options.stop_token = bpe ? bpe->eot() : -1;

  auto out = GenerateFrom(*step_dir, g, ids, options);
  if (!out.ok()) return ReportError(out.status());
  std::string text;
  if (bpe) {
    auto d = bpe->Decode(*out);
    if (!d.ok()) return ReportError(d.status());
    text = std::move(*d);
  } else {
    text = ByteDetokenize(*out);
  }
  std::fwrite(prompt->data(), 1, prompt->size(), stdout);
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fputc('\n', stdout);
  return kExitOk;
}

}  // namespace pstar::cli
