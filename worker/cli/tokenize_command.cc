// pstar tokenize: text to a token shard (byte-level, GPT-2's BPE from its
// files, any supported Hugging Face tokenizer.json, or Llama 3's tiktoken
// rank file), and with --decode a shard back to text.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "worker/cli/commands.h"
#include "worker/core/file_util.h"
#include "worker/data/bpe_tokenizer.h"
#include "worker/data/token_shard.h"
#include "worker/data/token_source.h"

namespace pstar::cli {
namespace {

struct TokenizeArgs {
  std::vector<std::string> inputs;
  std::string output;
  std::string tokenizer;  // "byte", "gpt2", "hf" or "tiktoken"; empty: from the files given
  std::string vocab, merges, tokenizer_json, tiktoken;
  std::optional<std::string> separator;
  int threads = 0;
  bool decode = false;
};

Result<TokenizeArgs> ParseArgs(const std::vector<std::string>& args) {
  TokenizeArgs a;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& flag = args[i];
    if (flag == "--decode") {
      a.decode = true;
      continue;
    }
    const bool takes_value = flag == "--input" || flag == "--output" || flag == "--tokenizer" || flag == "--vocab" ||
                             flag == "--merges" || flag == "--tokenizer-json" || flag == "--tiktoken" || flag == "--document-separator" ||
                             flag == "--threads";
    if (!takes_value) return Status::InvalidArgument("tokenize: unknown option '" + flag + "'");
    if (i + 1 >= args.size()) return Status::InvalidArgument(flag + " needs a value");
    const std::string& v = args[++i];
    if (flag == "--input") a.inputs.push_back(v);
    else if (flag == "--output") a.output = v;
    else if (flag == "--tokenizer") a.tokenizer = v;
    else if (flag == "--vocab") a.vocab = v;
    else if (flag == "--merges") a.merges = v;
    else if (flag == "--tokenizer-json") a.tokenizer_json = v;
    else if (flag == "--tiktoken") a.tiktoken = v;
    else if (flag == "--document-separator") a.separator = v;
    else {
      char* end = nullptr;
      const long n = std::strtol(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || n < 1 || n > 1024) {
        return Status::InvalidArgument("--threads must be an integer in 1..1024, got '" + v + "'");
      }
      a.threads = int(n);
    }
  }
  if (a.inputs.empty() || a.output.empty()) return Status::InvalidArgument("tokenize needs --input and --output");
  const bool files_given = !a.vocab.empty() || !a.merges.empty() || !a.tokenizer_json.empty();
  if (a.tokenizer.empty()) {
    a.tokenizer = !a.tiktoken.empty() ? "tiktoken" : !files_given ? "byte" : a.vocab.empty() && a.merges.empty() ? "hf" : "gpt2";
  }
  if (a.tokenizer != "byte" && a.tokenizer != "gpt2" && a.tokenizer != "hf" && a.tokenizer != "tiktoken") {
    return Status::InvalidArgument("--tokenizer must be byte, gpt2, hf or tiktoken, got '" + a.tokenizer + "'");
  }
  if (a.tokenizer == "tiktoken") {
    if (files_given) return Status::InvalidArgument("--tokenizer tiktoken reads --tiktoken, not --vocab/--merges/--tokenizer-json");
    if (a.tiktoken.empty()) return Status::InvalidArgument("--tokenizer tiktoken needs --tiktoken RANK_FILE");
    if (a.separator && a.separator->empty()) return Status::InvalidArgument("--document-separator must not be empty");
  } else if (!a.tiktoken.empty()) {
    return Status::InvalidArgument("--tiktoken needs --tokenizer tiktoken (or no --tokenizer)");
  } else if (a.tokenizer == "byte") {
    if (files_given) return Status::InvalidArgument("--vocab, --merges and --tokenizer-json need --tokenizer gpt2 or hf");
    if (a.separator) return Status::InvalidArgument("--document-separator needs --tokenizer gpt2 or hf (bytes have no end-of-text token)");
  } else if (a.tokenizer == "hf") {
    if (!a.vocab.empty() || !a.merges.empty()) return Status::InvalidArgument("--tokenizer hf reads --tokenizer-json, not --vocab/--merges");
    if (a.tokenizer_json.empty()) return Status::InvalidArgument("--tokenizer hf needs --tokenizer-json FILE");
    if (a.separator && a.separator->empty()) return Status::InvalidArgument("--document-separator must not be empty");
  } else {
    const bool gpt2_files = !a.vocab.empty() || !a.merges.empty();
    if (gpt2_files && !a.tokenizer_json.empty()) {
      return Status::InvalidArgument("give either --vocab and --merges or --tokenizer-json, not both");
    }
    if (a.tokenizer_json.empty() && (a.vocab.empty() || a.merges.empty())) {
      return Status::InvalidArgument("--tokenizer gpt2 needs --vocab encoder.json and --merges vocab.bpe, or --tokenizer-json FILE");
    }
    if (a.separator && a.separator->empty()) return Status::InvalidArgument("--document-separator must not be empty");
  }
  if (a.decode && a.inputs.size() != 1) return Status::InvalidArgument("--decode takes one --input shard");
  if (a.decode && a.separator) return Status::InvalidArgument("--document-separator has no meaning with --decode");
  return a;
}

// The inputs, as files: a directory stands for its regular files in name order.
Result<std::vector<std::string>> ExpandInputs(const std::vector<std::string>& inputs) {
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  for (const std::string& in : inputs) {
    std::error_code ec;
    if (fs::is_directory(in, ec)) {
      std::vector<std::string> here;
      for (const auto& e : fs::directory_iterator(in, ec)) {
        if (e.is_regular_file()) here.push_back(e.path().string());
      }
      if (ec) return Status::NotFound(in + ": cannot list: " + ec.message());
      if (here.empty()) return Status::NotFound(in + ": directory holds no files");
      std::sort(here.begin(), here.end());
      files.insert(files.end(), here.begin(), here.end());
    } else {
      files.push_back(in);
    }
  }
  return files;
}

Status CheckOutputIsNotAnInput(const std::string& output, const std::vector<std::string>& inputs) {
  for (const std::string& in : inputs) {
    std::error_code ec;
    if (std::filesystem::equivalent(in, output, ec)) {
      return Status::InvalidArgument("--output " + output + " is the input file " + in + "; write it elsewhere");
    }
  }
  return Status::Ok();
}

Result<BpeTokenizer> LoadTokenizer(const TokenizeArgs& a) {
  if (!a.tiktoken.empty()) return BpeTokenizer::FromTiktokenFile(a.tiktoken);
  if (!a.tokenizer_json.empty()) return BpeTokenizer::FromTokenizerJson(a.tokenizer_json);
  return BpeTokenizer::FromGpt2Files(a.vocab, a.merges);
}

// A bar on stderr while a terminal watches; nothing otherwise.
class ProgressBar {
 public:
  explicit ProgressBar(int64_t total) : total_(total), tty_(::isatty(2) == 1), start_(Clock::now()) {}
  void Show(int64_t done, bool final = false) {
    if (!tty_) return;
    const auto now = Clock::now();
    if (!final && now - last_ < std::chrono::milliseconds(200)) return;
    last_ = now;
    const double s = std::chrono::duration<double>(now - start_).count();
    const double pct = total_ > 0 ? 100.0 * double(done) / double(total_) : 100.0;
    const int filled = int(pct / 100.0 * 30);
    std::fprintf(stderr, "\rtokenize [%-30s] %5.1f%%  %.1f/%.1f MB  %.1f MB/s%s", std::string(size_t(filled), '#').c_str(),
                 pct, double(done) / 1e6, double(total_) / 1e6, s > 0 ? double(done) / 1e6 / s : 0.0,
                 final ? "\n" : "");
    std::fflush(stderr);
  }

 private:
  using Clock = std::chrono::steady_clock;
  int64_t total_;
  bool tty_;
  Clock::time_point start_, last_{};
};

int Decode(const TokenizeArgs& a) {
  if (Status s = CheckOutputIsNotAnInput(a.output, a.inputs); !s.ok()) return ReportError(s);
  int64_t vocab = 256;
  std::optional<BpeTokenizer> bpe;
  if (a.tokenizer != "byte") {
    auto t = LoadTokenizer(a);
    if (!t.ok()) return ReportError(t.status());
    vocab = t->vocab_size();
    bpe.emplace(std::move(*t));
  }
  auto source = OpenTokenShards(a.inputs[0], vocab);
  if (!source.ok()) return ReportError(source.status());
  std::vector<int32_t> ids(size_t((*source)->size()));
  (*source)->Read(0, int64_t(ids.size()), ids.data());
  std::string text;
  if (bpe) {
    auto d = bpe->Decode(ids);
    if (!d.ok()) return ReportError(d.status().WithPrefix(a.inputs[0]));
    text = std::move(*d);
  } else {
    text = ByteDetokenize(ids);
  }
  if (Status s = WriteFileAtomically(a.output, text); !s.ok()) return ReportError(s);
  std::printf("wrote %zu bytes from %zu tokens to %s\n", text.size(), ids.size(), a.output.c_str());
  return kExitOk;
}

}  // namespace

int TokenizeCommand(const std::vector<std::string>& args) {
  auto parsed = ParseArgs(args);
  if (!parsed.ok()) return UsageError(parsed.status().message());
  const TokenizeArgs& a = *parsed;
  if (a.decode) return Decode(a);
  auto files = ExpandInputs(a.inputs);
  if (!files.ok()) return ReportError(files.status());
  if (Status s = CheckOutputIsNotAnInput(a.output, *files); !s.ok()) return ReportError(s);

  if (a.tokenizer == "byte") {
    std::vector<int32_t> tokens;
    for (const std::string& f : *files) {
      auto text = ReadRegularFile(f);
      if (!text.ok()) return ReportError(text.status());
      const std::vector<int32_t> t = ByteTokenize(*text);
      tokens.insert(tokens.end(), t.begin(), t.end());
    }
    if (Status s = WriteTokenShard(a.output, tokens, 256); !s.ok()) return ReportError(s);
    std::printf("wrote %zu tokens (byte, vocab 256) to %s\n", tokens.size(), a.output.c_str());
    return kExitOk;
  }

  auto tokenizer = LoadTokenizer(a);
  if (!tokenizer.ok()) return ReportError(tokenizer.status());
  // Documents: each file, cut further at the separator (which is dropped);
  // empty ones are skipped.
  std::vector<std::string> texts;
  int64_t total_bytes = 0;
  for (const std::string& f : *files) {
    auto text = ReadRegularFile(f);
    if (!text.ok()) return ReportError(text.status());
    total_bytes += int64_t(text->size());
    texts.push_back(std::move(*text));
  }
  std::vector<std::string_view> documents;
  for (const std::string& text : texts) {
    std::vector<std::string_view> docs;
    if (a.separator) {
      for (size_t pos = 0;;) {
        const size_t at = text.find(*a.separator, pos);
        docs.push_back(std::string_view(text).substr(pos, at == std::string::npos ? std::string::npos : at - pos));
        if (at == std::string::npos) break;
        pos = at + a.separator->size();
      }
    } else {
      docs.push_back(text);
    }
    for (std::string_view doc : docs) {
      if (!doc.empty()) documents.push_back(doc);
    }
  }
  const int64_t n_documents = int64_t(documents.size());
  ProgressBar bar(total_bytes);
  const std::vector<int32_t> tokens =
      EncodeDocuments(*tokenizer, documents, a.threads, [&](int64_t done) { bar.Show(done); });
  bar.Show(total_bytes, /*final=*/true);
  if (Status s = WriteTokenShard(a.output, tokens, uint32_t(tokenizer->vocab_size())); !s.ok()) return ReportError(s);
  std::printf("wrote %zu tokens (%s, vocab %d) from %lld documents, %lld bytes, to %s\n", tokens.size(),
              a.tokenizer.c_str(), tokenizer->vocab_size(), static_cast<long long>(n_documents), static_cast<long long>(total_bytes),
              a.output.c_str());
  return kExitOk;
}

}  // namespace pstar::cli
