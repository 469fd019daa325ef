// pstar examples: what a job with data.source jsonl trains on, as JSON
// lines: each example's ids, which of them the loss counts, its text and
// the counted runs' text, or with --rows the packed rows' tokens, targets
// and positions.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <span>

#include "worker/cli/commands.h"
#include "worker/core/file_util.h"
#include "worker/train/trainer.h"

namespace pstar::cli {
namespace {

// The ids' text (they came from the tokenizer, so they decode).
std::string DecodedOrEmpty(const BpeTokenizer& t, std::span<const int32_t> ids) {
  auto text = t.Decode(ids);
  return text.ok() ? *text : std::string();
}

// One JSON line: bytes that are not UTF-8 (a run of ids may end inside a
// character) as U+FFFD, every other character as it is.
std::string Line(const nlohmann::json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

}  // namespace

int ExamplesCommand(const std::vector<std::string>& args) {
  auto job = ParseJobArgs("examples", args, {"--rows", "--validation"});
  if (!job.ok()) return UsageError(job.status().message());
  auto config = LoadJobConfig(*job);
  if (!config.ok()) return ReportError(config.status());
  const Config& c = *config;
  if (c.data.source != DataSourceKind::kJsonl) {
    return ReportError(Status::InvalidArgument("examples: the job's data.source is not jsonl"));
  }
  const bool validation = job->Has("--validation");
  if (validation && c.data.val_path.empty()) {
    return ReportError(Status::InvalidArgument("examples: --validation needs data.val_path"));
  }
  auto tokenizer = LoadDataTokenizer(c);
  if (!tokenizer.ok()) return ReportError(tokenizer.status());
  const BpeTokenizer& t = **tokenizer;
  const std::string& path = validation ? c.data.val_path : c.data.path;
  if (!job->Has("--rows")) {
    auto text = ReadRegularFile(path);
    if (!text.ok()) return ReportError(text.status());
    auto examples = ParseJsonlExamples(*text, path);
    if (!examples.ok()) return ReportError(examples.status());
    ChatFormat format = ChatFormatFor(t);
    if (c.data.chat_format != "auto") {
      auto f = ParseChatFormat(c.data.chat_format);
      if (!f.ok()) return ReportError(f.status());
      format = *f;
    }
    for (const ChatExample& ex : *examples) {
      auto e = TokenizeExample(ex, format, t, c.data.chat_date);
      if (!e.ok()) return ReportError(e.status().WithPrefix(path + " line " + std::to_string(ex.line)));
      // The text, and each run of counted ids as the text it decodes to:
      // what the loss learns, at a glance.
      nlohmann::json answers = nlohmann::json::array();
      for (size_t i = 0; i < e->ids.size();) {
        size_t end = i;
        while (end < e->ids.size() && e->counted[end] == e->counted[i]) ++end;
        if (e->counted[i]) {
          answers.push_back(DecodedOrEmpty(t, std::span<const int32_t>(e->ids.data() + i, end - i)));
        }
        i = end;
      }
      nlohmann::json j = {{"line", e->line},
                          {"format", ChatFormatName(format)},
                          {"ids", e->ids},
                          {"counted", e->counted},
                          {"text", DecodedOrEmpty(t, e->ids)},
                          {"answers", answers}};
      std::printf("%s\n", Line(j).c_str());
    }
    return kExitOk;
  }
  std::string note;
  auto rows = OpenPackedExamples(c, t, validation, &note);
  if (!rows.ok()) return ReportError(rows.status());
  const int64_t T = (*rows)->seq();
  std::vector<int32_t> tokens(static_cast<size_t>(T)), targets(tokens.size()), positions(tokens.size());
  for (int64_t r = 0; r < (*rows)->rows(); ++r) {
    (*rows)->Row(r, tokens.data(), targets.data(), positions.data());
    nlohmann::json j = {{"row", r}, {"tokens", tokens}, {"targets", targets}, {"positions", positions}};
    std::printf("%s\n", Line(j).c_str());
  }
  std::fprintf(stderr, "%s\n", note.c_str());
  return kExitOk;
}

}  // namespace pstar::cli
