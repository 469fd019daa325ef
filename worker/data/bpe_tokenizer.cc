#include "worker/data/bpe_tokenizer.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <queue>
#include <thread>
#include <tuple>

#include "worker/core/file_util.h"
#include "worker/data/gpt2_pretokenizer.h"
#include "worker/data/unicode_nfc.h"
#include "worker/data/utf8.h"

namespace pstar {
namespace {

// Ids at or past this are refused: a vocabulary file cannot make the tables
// absurdly large (GPT-2's is 50257; the largest in use are a few 100k).
constexpr int64_t kMaxVocab = int64_t(1) << 22;
constexpr char kEndOfText[] = "<|endoftext|>";
constexpr char kMetaspace[] = "\xE2\x96\x81";  // U+2581, SentencePiece's space

// GPT-2's byte-to-unicode map: printable Latin-1 bytes stand for themselves,
// the others for 256, 257, ... in byte order. unicode_to_byte is its inverse
// (-1 where no byte maps).
struct ByteUnicodeMap {
  char32_t byte_to_unicode[256];
  int unicode_to_byte[512];
  ByteUnicodeMap() {
    for (int& b : unicode_to_byte) b = -1;
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      byte_to_unicode[b] = printable ? char32_t(b) : char32_t(next++);
      unicode_to_byte[byte_to_unicode[b]] = b;
    }
  }
};

const ByteUnicodeMap& ByteMap() {
  static const ByteUnicodeMap map;
  return map;
}

// A token string in byte-to-unicode form (UTF-8) to its bytes.
Result<std::string> TokenStringToBytes(const std::string& s) {
  std::string out;
  const auto& map = ByteMap();
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    char32_t cp;
    size_t len;
    if (c < 0x80) cp = c, len = 1;
    else if ((c & 0xE0) == 0xC0 && i + 1 < s.size()) cp = ((c & 0x1F) << 6) | (s[i + 1] & 0x3F), len = 2;
    else cp = 0xFFFFFFFF, len = 1;
    if (cp >= 512 || map.unicode_to_byte[cp] < 0) {
      return Status::InvalidArgument("token '" + s + "' has a character outside GPT-2's byte-to-unicode map");
    }
    out.push_back(char(map.unicode_to_byte[cp]));
    i += len;
  }
  return out;
}

uint64_t PairKey(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

nlohmann::json ParseJsonFile(const std::string& path, const std::string& text, Status& status) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) status = Status::InvalidArgument(path + ": not valid JSON");
  return j;
}

// "<0xHH>", SentencePiece's byte-fallback token, to its byte (or -1).
int ByteFallbackValue(const std::string& s) {
  if (s.size() != 6 || s.compare(0, 3, "<0x") != 0 || s[5] != '>') return -1;
  int v = 0;
  for (int k = 3; k < 5; ++k) {
    const char c = s[size_t(k)];
    v <<= 4;
    if (c >= '0' && c <= '9') v |= c - '0';
    else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
    else return -1;
  }
  return v;
}

// Whitespace an added token's lstrip/rstrip takes in (ASCII's).
bool IsStripSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

void ReplaceAll(std::string& s, const std::string& from, const std::string& to) {
  if (from.empty()) return;
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  for (size_t hit; (hit = s.find(from, pos)) != std::string::npos; pos = hit + from.size()) {
    out.append(s, pos, hit - pos);
    out += to;
  }
  out.append(s, pos, std::string::npos);
  s = std::move(out);
}

std::string TypeOf(const nlohmann::json& j) {
  return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>() : "";
}

// The steps of stage `key`: none (null or absent), one, or a Sequence's
// (whose list is `list`).
std::vector<nlohmann::json> Steps(const nlohmann::json& j, const char* key, const char* list) {
  const nlohmann::json stage = j.value(key, nlohmann::json());
  if (TypeOf(stage) == "Sequence" && stage.contains(list) && stage[list].is_array()) {
    return std::vector<nlohmann::json>(stage[list].begin(), stage[list].end());
  }
  if (stage.is_null()) return {};
  return {stage};
}

// A byte string in GPT-2's byte-to-unicode spelling (UTF-8), the form the
// tables keep byte-level tokens in.
std::string BytesToTokenString(std::string_view bytes) {
  std::string out;
  const auto& map = ByteMap();
  for (unsigned char b : bytes) {
    const char32_t cp = map.byte_to_unicode[b];
    if (cp < 0x80) {
      out.push_back(char(cp));
    } else {
      out.push_back(char(0xC0 | (cp >> 6)));
      out.push_back(char(0x80 | (cp & 0x3F)));
    }
  }
  return out;
}

// Standard base64 (RFC 4648, padded), as tiktoken's rank files spell tokens;
// nullopt for anything else.
std::optional<std::string> DecodeBase64(std::string_view s) {
  if (s.empty() || s.size() % 4 != 0) return std::nullopt;
  const auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::string out;
  out.reserve(s.size() / 4 * 3);
  for (size_t i = 0; i < s.size(); i += 4) {
    const bool last = i + 4 == s.size();
    const int pad = last ? (s[i + 3] == '=') + (s[i + 2] == '=' && s[i + 3] == '=') : 0;
    uint32_t bits = 0;
    for (int k = 0; k < 4; ++k) {
      const int v = k >= 4 - pad ? 0 : value(s[i + size_t(k)]);
      if (v < 0) return std::nullopt;
      bits = (bits << 6) | uint32_t(v);
    }
    out.push_back(char(bits >> 16));
    if (pad < 2) out.push_back(char((bits >> 8) & 0xFF));
    if (pad < 1) out.push_back(char(bits & 0xFF));
    // The bits padding drops must be zero (one spelling per byte string).
    if ((pad == 1 && (bits & 0xFF) != 0) || (pad == 2 && (bits & 0xFFFF) != 0)) return std::nullopt;
  }
  return out;
}

// Llama 3's pre-tokenization pattern (Meta's tokenizer, and the Split of the
// tokenizer.json Hugging Face converted from it).
constexpr char kLlama3Pattern[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Llama 3.1's 256 special tokens after the ranks, in id order (the names of
// Llama 3.1 to 3.3; Llama 3.0 gave the same ids 128004, 128005, 128008 and
// 128010 on other reserved names: its data, BOS, EOS and chat tokens are the
// same ids).
std::vector<std::string> Llama3SpecialTokens() {
  std::vector<std::string> names = {"<|begin_of_text|>",   "<|end_of_text|>",
                                    "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
                                    "<|finetune_right_pad_id|>",    "<|reserved_special_token_2|>",
                                    "<|start_header_id|>", "<|end_header_id|>",
                                    "<|eom_id|>",          "<|eot_id|>",
                                    "<|python_tag|>"};
  for (int i = 3; names.size() < 256; ++i) names.push_back("<|reserved_special_token_" + std::to_string(i) + "|>");
  return names;
}

}  // namespace

Status BpeTokenizer::LoadModel(const std::vector<std::pair<std::string, int64_t>>& vocab,
                               const std::vector<std::pair<std::string, std::string>>& merges,
                               std::vector<AddedToken> added, const std::string& source) {
  const auto bad = [&](const std::string& what) { return Status::InvalidArgument(source + ": " + what); };
  int64_t max_id = -1;
  const auto check_id = [&](const std::string& str, int64_t id) -> Status {
    if (id < 0 || id >= kMaxVocab) {
      return bad("token '" + str + "' has id " + std::to_string(id) + ", outside 0.." + std::to_string(kMaxVocab - 1));
    }
    max_id = std::max(max_id, id);
    return Status::Ok();
  };
  for (const auto& [str, id] : vocab) PSTAR_RETURN_IF_ERROR(check_id(str, id));
  for (const AddedToken& a : added) PSTAR_RETURN_IF_ERROR(check_id(a.content, a.id));
  if (max_id < 0) return bad("the vocabulary is empty");
  token_text_.assign(size_t(max_id + 1), std::string());
  is_byte_token_.assign(size_t(max_id + 1), false);
  std::vector<bool> seen(size_t(max_id + 1), false);
  for (int& t : fallback_token_) t = -1;
  // The symbols a token string stands for: bytes for a byte-level model,
  // the text itself otherwise.
  const auto symbols = [&](const std::string& str) -> Result<std::string> {
    if (!byte_level_) return str;
    auto bytes = TokenStringToBytes(str);
    if (!bytes.ok()) return bytes.status().WithPrefix(source);
    return bytes;
  };
  for (const auto& [str, id] : vocab) {
    if (seen[size_t(id)]) return bad("id " + std::to_string(id) + " is used twice");
    seen[size_t(id)] = true;
    if (byte_level_ && str == kEndOfText) {  // GPT-2's encoder.json lists it among the tokens
      token_text_[size_t(id)] = str;
      const std::string& name = str;  // (a structured binding cannot be captured before C++20 in Clang 14)
      if (std::none_of(added.begin(), added.end(), [&](const AddedToken& a) { return a.content == name; })) {
        added.push_back({str, int32_t(id), true, false, false});
      }
      continue;
    }
    PSTAR_ASSIGN_OR_RETURN(std::string sym, symbols(str));
    if (sym.empty()) return bad("id " + std::to_string(id) + " is an empty token");
    if (!byte_level_) {
      const int b = ByteFallbackValue(str);
      if (b >= 0) {
        fallback_token_[b] = int32_t(id);
        is_byte_token_[size_t(id)] = true;
      }
    }
    token_text_[size_t(id)] = sym;
    id_of_.emplace(std::move(sym), int32_t(id));
  }
  for (const AddedToken& a : added) {
    if (a.content.empty()) return bad("added token " + std::to_string(a.id) + " is empty");
    const std::string& have = token_text_[size_t(a.id)];
    if (seen[size_t(a.id)] && have != a.content) {
      // An added token may restate a vocabulary token (Llama 2's <s>), not rename it.
      auto sym = symbols(a.content);
      if (!sym.ok() || *sym != have) {
        return bad("added token '" + a.content + "' has id " + std::to_string(a.id) + ", which the vocabulary gives another token");
      }
    }
    seen[size_t(a.id)] = true;
    token_text_[size_t(a.id)] = a.content;
  }
  // Longest first: the leftmost, longest added token wins, as in Hugging Face's tokenizers.
  std::stable_sort(added.begin(), added.end(),
                   [](const AddedToken& x, const AddedToken& y) { return x.content.size() > y.content.size(); });
  added_ = std::move(added);
  for (const AddedToken& a : added_) added_first_byte_[static_cast<unsigned char>(a.content[0])] = true;
  // The family's end-of-text token: GPT-2's and Qwen's, Llama 3's, SentencePiece's.
  for (const char* name : {kEndOfText, "<|end_of_text|>", "</s>"}) {
    auto it = std::find_if(added_.begin(), added_.end(), [&](const AddedToken& a) { return a.content == name; });
    if (it != added_.end()) {
      eot_ = it->id;
      break;
    }
  }
  if (byte_level_) {
    for (int b = 0; b < 256; ++b) {
      auto it = id_of_.find(std::string(1, char(b)));
      if (it == id_of_.end()) {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02X", b);
        return bad(std::string("the vocabulary has no token for byte ") + hex + " (not a byte-level BPE vocabulary)");
      }
      byte_token_[b] = it->second;
    }
  } else if (byte_fallback_) {
    for (int b = 0; b < 256; ++b) {
      if (fallback_token_[b] < 0) {
        char name[8];
        std::snprintf(name, sizeof name, "<0x%02X>", b);
        return bad(std::string("model.byte_fallback is true but the vocabulary has no ") + name + " token");
      }
    }
  }
  merges_.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    const auto& [a, b] = merges[r];
    auto sa = symbols(a), sb = symbols(b);
    if (!sa.ok()) return sa.status().WithPrefix("merge " + std::to_string(r + 1));
    if (!sb.ok()) return sb.status().WithPrefix("merge " + std::to_string(r + 1));
    auto ia = id_of_.find(*sa), ib = id_of_.find(*sb), im = id_of_.find(*sa + *sb);
    if (ia == id_of_.end() || ib == id_of_.end() || im == id_of_.end()) {
      return bad("merge " + std::to_string(r + 1) + " ('" + a + " " + b + "') names a token the vocabulary does not have");
    }
    // A pair listed twice keeps its first (lowest) rank, as the reference encoders do.
    merges_.emplace(PairKey(ia->second, ib->second), Merge{int32_t(r), im->second});
  }
  return Status::Ok();
}

Result<BpeTokenizer> BpeTokenizer::FromGpt2Files(const std::string& encoder_json, const std::string& vocab_bpe) {
  PSTAR_ASSIGN_OR_RETURN(std::string enc_text, ReadRegularFile(encoder_json));
  Status status;
  nlohmann::json enc = ParseJsonFile(encoder_json, enc_text, status);
  PSTAR_RETURN_IF_ERROR(status);
  if (!enc.is_object()) return Status::InvalidArgument(encoder_json + ": expected a JSON object of token -> id");
  std::vector<std::pair<std::string, int64_t>> vocab;
  vocab.reserve(enc.size());
  for (auto it = enc.begin(); it != enc.end(); ++it) {
    if (!it.value().is_number_integer()) {
      return Status::InvalidArgument(encoder_json + ": the id of token '" + it.key() + "' is not an integer");
    }
    vocab.emplace_back(it.key(), it.value().get<int64_t>());
  }
  PSTAR_ASSIGN_OR_RETURN(std::string bpe_text, ReadRegularFile(vocab_bpe));
  std::vector<std::pair<std::string, std::string>> merges;
  size_t line_no = 0;
  for (size_t pos = 0; pos < bpe_text.size();) {
    size_t end = bpe_text.find('\n', pos);
    if (end == std::string::npos) end = bpe_text.size();
    std::string line = bpe_text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (line_no == 1 && line.rfind("#version", 0) == 0)) continue;
    const size_t space = line.find(' ');
    if (space == std::string::npos || space == 0 || space + 1 >= line.size() ||
        line.find(' ', space + 1) != std::string::npos) {
      return Status::InvalidArgument(vocab_bpe + ": line " + std::to_string(line_no) +
                                     " is not a merge ('LEFT RIGHT')");
    }
    merges.emplace_back(line.substr(0, space), line.substr(space + 1));
  }
  const std::string source = encoder_json + " + " + vocab_bpe;
  BpeTokenizer t;
  t.pre_.push_back(PreStep{PreStep::Kind::kByteLevel, std::nullopt, true, false, "", "", false});
  PSTAR_RETURN_IF_ERROR(t.LoadModel(vocab, merges, {}, source));
  if (t.eot_ < 0 || t.token_text_[size_t(t.eot_)] != kEndOfText) return Status::InvalidArgument(source + ": the vocabulary has no " + std::string(kEndOfText) + " token");
  t.document_start_ = {t.eot_};
  t.vocab_strings_ = std::move(vocab);
  t.merge_strings_ = std::move(merges);
  return t;
}

Result<BpeTokenizer> BpeTokenizer::FromTokenizerJson(const std::string& path) {
  PSTAR_ASSIGN_OR_RETURN(std::string text, ReadRegularFile(path));
  return FromTokenizerJsonText(text, path);
}

Result<BpeTokenizer> BpeTokenizer::FromTokenizerJsonText(const std::string& text, const std::string& path) {
  Status status;
  nlohmann::json j = ParseJsonFile(path, text, status);
  PSTAR_RETURN_IF_ERROR(status);
  const auto bad = [&](const std::string& what) { return Status::InvalidArgument(path + ": " + what); };
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object()) return bad("no \"model\" object");
  BpeTokenizer t;
  t.json_text_ = text;

  // normalizer
  for (const auto& n : Steps(j, "normalizer", "normalizers")) {
    const std::string type = TypeOf(n);
    if (type == "NFC") {
      t.normalizer_.push_back({NormStep::Kind::kNfc, "", ""});
    } else if (type == "Prepend" && n.contains("prepend") && n["prepend"].is_string()) {
      t.normalizer_.push_back({NormStep::Kind::kPrepend, n["prepend"].get<std::string>(), ""});
    } else if (type == "Replace" && n.contains("pattern") && n["pattern"].is_object() && n["pattern"].contains("String") &&
               n["pattern"]["String"].is_string() && n.contains("content") && n["content"].is_string()) {
      t.normalizer_.push_back({NormStep::Kind::kReplace, n["pattern"]["String"].get<std::string>(),
                               n["content"].get<std::string>()});
    } else {
      return bad("normalizer " + (type.empty() ? n.dump().substr(0, 80) : type) +
                 " is not supported (NFC, Prepend, Replace of a string, or a Sequence of them)");
    }
  }

  // pre_tokenizer
  const std::vector<nlohmann::json> pres = Steps(j, "pre_tokenizer", "pretokenizers");
  bool saw_byte_level = false;
  for (size_t k = 0; k < pres.size(); ++k) {
    const nlohmann::json& p = pres[k];
    const std::string type = TypeOf(p);
    PreStep step{PreStep::Kind::kSplit, std::nullopt, false, false, "", "", false};
    if (type == "Split") {
      if (!p.contains("pattern") || !p["pattern"].is_object() || !p["pattern"].contains("Regex") ||
          !p["pattern"]["Regex"].is_string()) {
        return bad("pre_tokenizer Split has no pattern.Regex string (a plain String pattern is not supported)");
      }
      if (p.value("behavior", "") != "Isolated" || p.value("invert", false)) {
        return bad("pre_tokenizer Split has behavior " + p.value("behavior", std::string("?")) +
                   (p.value("invert", false) ? " inverted" : "") + "; only Isolated, not inverted, is supported");
      }
      PSTAR_ASSIGN_OR_RETURN(RegexSplitter r, RegexSplitter::Compile(p["pattern"]["Regex"].get<std::string>(),
                                                                       path + ": pre_tokenizer Split"));
      step.regex = std::move(r);
    } else if (type == "ByteLevel") {
      step.kind = PreStep::Kind::kByteLevel;
      step.use_regex = p.value("use_regex", true);
      step.add_prefix_space = p.value("add_prefix_space", false);
      if (step.add_prefix_space && k != 0) {
        return bad("pre_tokenizer ByteLevel with add_prefix_space is supported only as the first step");
      }
      saw_byte_level = true;
    } else if (type == "Metaspace") {
      step.kind = PreStep::Kind::kMetaspace;
      step.replacement = p.value("replacement", std::string(kMetaspace));
      if (p.contains("prepend_scheme") && p["prepend_scheme"].is_string()) {
        step.prepend_scheme = p["prepend_scheme"].get<std::string>();
      } else {
        step.prepend_scheme = p.value("add_prefix_space", true) ? "always" : "never";
      }
      if (step.prepend_scheme != "always" && step.prepend_scheme != "first" && step.prepend_scheme != "never") {
        return bad("pre_tokenizer Metaspace has prepend_scheme '" + step.prepend_scheme + "' (always, first or never)");
      }
      step.split = p.value("split", true);
      if (k != 0) return bad("pre_tokenizer Metaspace is supported only as the first step");
      if (step.replacement.empty()) return bad("pre_tokenizer Metaspace has an empty replacement");
    } else {
      return bad("pre_tokenizer " + (type.empty() ? p.dump().substr(0, 80) : type) +
                 " is not supported (Split, ByteLevel, Metaspace, or a Sequence of them)");
    }
    t.pre_.push_back(std::move(step));
  }
  t.byte_level_ = saw_byte_level;
  t.gpt2_form_ = t.normalizer_.empty() && t.pre_.size() == 1 && t.pre_[0].kind == PreStep::Kind::kByteLevel &&
                 t.pre_[0].use_regex && !t.pre_[0].add_prefix_space;

  // model
  const nlohmann::json& model = j["model"];
  if (model.contains("type") && model["type"] != "BPE") {
    return bad("model.type is " + model["type"].dump() + "; only BPE models are supported");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(key) && !model[key].is_null() && model[key] != "") {
      return bad(std::string("model.") + key + " is " + model[key].dump() + "; only none is supported");
    }
  }
  if (model.contains("dropout") && !model["dropout"].is_null() && model["dropout"] != 0 && model["dropout"] != 0.0) {
    return bad("model.dropout is " + model["dropout"].dump() + "; BPE dropout is for training tokenizers, not supported");
  }
  t.ignore_merges_ = model.value("ignore_merges", false);
  t.byte_fallback_ = model.value("byte_fallback", false);
  t.fuse_unk_ = model.value("fuse_unk", false);
  if (!model.contains("vocab") || !model["vocab"].is_object()) return bad("model.vocab is not an object");
  if (!model.contains("merges") || !model["merges"].is_array()) return bad("model.merges is not an array");
  std::vector<std::pair<std::string, int64_t>> vocab;
  vocab.reserve(model["vocab"].size());
  for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
    if (!it.value().is_number_integer()) return bad("the id of token '" + it.key() + "' is not an integer");
    vocab.emplace_back(it.key(), it.value().get<int64_t>());
  }
  std::vector<AddedToken> added;
  if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
    if (!j["added_tokens"].is_array()) return bad("added_tokens is not an array");
    for (const auto& a : j["added_tokens"]) {
      if (!a.is_object() || !a.contains("content") || !a["content"].is_string() || !a.contains("id") ||
          !a["id"].is_number_integer()) {
        return bad("an added_tokens entry lacks a string content or an integer id");
      }
      const std::string content = a["content"].get<std::string>();
      if (a.value("single_word", false)) return bad("added token '" + content + "' has single_word true, not supported");
      added.push_back({content, int32_t(a["id"].get<int64_t>()), a.value("special", false), a.value("lstrip", false),
                       a.value("rstrip", false)});
    }
  }
  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(model["merges"].size());
  size_t index = 0;
  for (const auto& m : model["merges"]) {
    ++index;
    if (m.is_string()) {  // "LEFT RIGHT"
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || space == 0 || space + 1 >= s.size() ||
          s.find(' ', space + 1) != std::string::npos) {
        return bad("merge " + std::to_string(index) + " is not 'LEFT RIGHT'");
      }
      merges.emplace_back(s.substr(0, space), s.substr(space + 1));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {  // ["LEFT", "RIGHT"]
      merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      return bad("merge " + std::to_string(index) + " is neither 'LEFT RIGHT' nor [LEFT, RIGHT]");
    }
  }
  PSTAR_RETURN_IF_ERROR(t.LoadModel(vocab, merges, std::move(added), path));
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    const auto unk = t.TokenId(model["unk_token"].get<std::string>());
    if (!unk) return bad("model.unk_token " + model["unk_token"].dump() + " is not in the vocabulary");
    t.unk_ = *unk;
  }
  if (!t.byte_level_ && !t.byte_fallback_ && t.unk_ < 0) {
    return bad("the model is neither byte-level nor has byte_fallback or an unk_token: some text would not encode");
  }
  if (t.gpt2_form_) {
    t.vocab_strings_ = vocab;
    t.merge_strings_ = merges;
  }

  // post_processor: the template's tokens around a single sequence.
  for (const auto& p : Steps(j, "post_processor", "processors")) {
    const std::string type = TypeOf(p);
    if (type == "ByteLevel") continue;  // offsets only
    if (type != "TemplateProcessing") {
      return bad("post_processor " + (type.empty() ? p.dump().substr(0, 80) : type) +
                 " is not supported (TemplateProcessing, ByteLevel, or a Sequence of them)");
    }
    if (!p.contains("single") || !p["single"].is_array()) return bad("post_processor TemplateProcessing has no single template");
    bool after_sequence = false;
    for (const auto& item : p["single"]) {
      if (item.contains("Sequence")) {
        after_sequence = true;
        continue;
      }
      if (!item.contains("SpecialToken") || !item["SpecialToken"].contains("id") || !item["SpecialToken"]["id"].is_string()) {
        return bad("post_processor TemplateProcessing has an item that is neither a Sequence nor a SpecialToken");
      }
      const std::string name = item["SpecialToken"]["id"].get<std::string>();
      const nlohmann::json specials = p.value("special_tokens", nlohmann::json::object());
      std::vector<int32_t> ids;
      if (specials.contains(name) && specials[name].contains("ids") && specials[name]["ids"].is_array()) {
        for (const auto& id : specials[name]["ids"]) {
          if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= t.vocab_size()) {
            return bad("post_processor special token '" + name + "' has an id outside the vocabulary");
          }
          ids.push_back(int32_t(id.get<int64_t>()));
        }
      } else if (auto id = t.TokenId(name)) {
        ids.push_back(*id);
      } else {
        return bad("post_processor names special token '" + name + "', which the vocabulary does not have");
      }
      auto& to = after_sequence ? t.document_end_ : t.document_start_;
      to.insert(to.end(), ids.begin(), ids.end());
    }
  }
  if (t.document_start_.empty() && t.document_end_.empty() && t.eot_ >= 0) t.document_start_ = {t.eot_};
  if (t.document_start_.empty() && t.document_end_.empty()) {
    return bad("neither the post_processor nor an end-of-text token (<|endoftext|>, <|end_of_text|>, </s>) "
               "gives a token between documents");
  }

  // decoder
  const nlohmann::json dec = j.value("decoder", nlohmann::json());
  if (t.byte_level_) {
    if (!dec.is_null() && TypeOf(dec) != "ByteLevel") {
      return bad("decoder " + TypeOf(dec) + " does not match the byte-level pre-tokenizer (ByteLevel)");
    }
  } else if (TypeOf(dec) == "Metaspace") {
    t.decode_strip_leading_space_ = dec.value("prepend_scheme", dec.value("add_prefix_space", true) ? "always" : "never") != "never";
  } else if (TypeOf(dec) == "Sequence" && dec.contains("decoders") && dec["decoders"].is_array()) {
    for (const auto& d : dec["decoders"]) {
      const std::string type = TypeOf(d);
      if (type == "Replace" && d.contains("pattern") && d["pattern"].value("String", "") == kMetaspace &&
          d.value("content", "") == " ") {
        continue;
      }
      if (type == "ByteFallback" || type == "Fuse") continue;
      if (type == "Strip" && d.value("content", "") == " " && d.value("stop", 0) == 0 && d.value("start", 0) <= 1) {
        t.decode_strip_leading_space_ = d.value("start", 0) == 1;
        continue;
      }
      return bad("decoder step " + (type.empty() ? d.dump().substr(0, 80) : type) +
                 " is not supported (Replace of \xE2\x96\x81, ByteFallback, Fuse, Strip)");
    }
  } else {
    return bad("decoder " + (TypeOf(dec).empty() ? dec.dump().substr(0, 80) : TypeOf(dec)) +
               " is not supported for a SentencePiece-style model (Metaspace, or Replace/ByteFallback/Fuse/Strip)");
  }
  return t;
}

Result<BpeTokenizer> BpeTokenizer::FromTiktokenFile(const std::string& path) {
  PSTAR_ASSIGN_OR_RETURN(std::string text, ReadRegularFile(path));
  return FromTiktokenText(text, path);
}

Result<BpeTokenizer> BpeTokenizer::FromTiktokenText(const std::string& text, const std::string& source) {
  const auto bad = [&](const std::string& what) { return Status::InvalidArgument(source + ": " + what); };
  if (text.size() >= 2 && text[0] == '{') return bad("is JSON, not a tiktoken rank file (a tokenizer.json is data.tokenizer hf)");
  std::vector<std::pair<std::string, int64_t>> vocab;
  std::unordered_map<std::string, size_t> line_of;
  size_t line_no = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    const std::string where = "line " + std::to_string(line_no);
    const size_t space = line.find(' ');
    if (space == std::string_view::npos || line.find(' ', space + 1) != std::string_view::npos) {
      return bad(where + " is not 'BASE64 RANK'");
    }
    const std::optional<std::string> bytes = DecodeBase64(line.substr(0, space));
    if (!bytes) return bad(where + ": '" + std::string(line.substr(0, std::min<size_t>(space, 40))) + "' is not base64");
    const std::string_view rank_text = line.substr(space + 1);
    int64_t rank = 0;
    if (rank_text.empty() || rank_text.size() > 9) return bad(where + ": the rank is not a number below 10^9");
    for (char c : rank_text) {
      if (c < '0' || c > '9') return bad(where + ": the rank '" + std::string(rank_text) + "' is not a number");
      rank = rank * 10 + (c - '0');
    }
    auto [it, fresh] = line_of.emplace(*bytes, line_no);
    if (!fresh) return bad(where + " repeats the token of line " + std::to_string(it->second));
    vocab.emplace_back(BytesToTokenString(*bytes), rank);
  }
  const int64_t n = int64_t(vocab.size());
  if (n == 0) return bad("holds no ranks");
  if (n + 256 > kMaxVocab) return bad("holds " + std::to_string(n) + " ranks, more than pstar reads");
  std::vector<bool> seen(size_t(n), false);
  for (const auto& [str, rank] : vocab) {
    if (rank >= n || seen[size_t(rank)]) {
      return bad("the ranks are not 0.." + std::to_string(n - 1) + " once each (rank " + std::to_string(rank) +
                 (rank >= n ? " is past the end)" : " is given twice)"));
    }
    seen[size_t(rank)] = true;
  }
  std::vector<AddedToken> added;
  const std::vector<std::string> specials = Llama3SpecialTokens();
  for (size_t k = 0; k < specials.size(); ++k) added.push_back({specials[k], int32_t(n + int64_t(k)), true, false, false});

  BpeTokenizer t;
  t.tiktoken_ranks_ = text;
  t.ignore_merges_ = true;  // tiktoken's encoder takes a word that is a token whole
  t.gpt2_form_ = false;
  PSTAR_ASSIGN_OR_RETURN(RegexSplitter split, RegexSplitter::Compile(kLlama3Pattern, source + ": Llama 3's pattern"));
  t.pre_.push_back(PreStep{PreStep::Kind::kSplit, std::move(split), false, false, "", "", false});
  t.pre_.push_back(PreStep{PreStep::Kind::kByteLevel, std::nullopt, false, false, "", "", false});
  PSTAR_RETURN_IF_ERROR(t.LoadModel(vocab, {}, std::move(added), source));
  // tiktoken's merges: any two adjacent parts whose joined bytes are a
  // token, at that token's rank. Every split of every token into two tokens
  // is such a pair; a pair joins into one token only, so it has one rank.
  for (int32_t id = 0; id < int32_t(n); ++id) {
    const std::string& bytes = t.token_text_[size_t(id)];
    for (size_t k = 1; k < bytes.size(); ++k) {
      auto left = t.id_of_.find(bytes.substr(0, k));
      if (left == t.id_of_.end()) continue;
      auto right = t.id_of_.find(bytes.substr(k));
      if (right == t.id_of_.end()) continue;
      t.merges_.emplace(PairKey(left->second, right->second), Merge{id, id});
    }
  }
  t.document_start_ = {int32_t(n)};  // <|begin_of_text|>
  return t;
}

Result<BpeTokenizer> BpeTokenizer::FromSaved(const std::string& kind, const std::string& text, const std::string& source) {
  if (kind == "tiktoken") return FromTiktokenText(text, source);
  return FromTokenizerJsonText(text, source);
}

bool BpeTokenizer::lossless() const {
  if (!byte_level_ || !normalizer_.empty()) return false;
  for (const PreStep& p : pre_) {
    if (p.add_prefix_space) return false;
  }
  for (const AddedToken& a : added_) {
    if (a.lstrip || a.rstrip) return false;
  }
  return true;
}

std::optional<int32_t> BpeTokenizer::TokenId(std::string_view content) const {
  for (const AddedToken& a : added_) {
    if (a.content == content) return a.id;
  }
  auto it = id_of_.find(std::string(content));
  if (it != id_of_.end()) return it->second;
  return std::nullopt;
}

void BpeTokenizer::MergeLong(std::vector<int32_t>& ids) const {
  // The same merges in the same order as MergeSymbols (the lowest rank
  // first, the leftmost of equals), in O(n log n): a min-heap of (rank, left
  // position) over a linked list of symbols. An entry whose pair has changed
  // since it was pushed is skipped (a rank names one merged token, and no
  // token is its own part, so an unchanged rank means a pair that still
  // merges into the same token).
  const int32_t n = int32_t(ids.size());
  std::vector<int32_t> next(ids.size()), prev(ids.size());
  std::vector<bool> alive(ids.size(), true);
  for (int32_t i = 0; i < n; ++i) {
    next[size_t(i)] = i + 1;
    prev[size_t(i)] = i - 1;
  }
  const auto rank_of = [&](int32_t a, int32_t b, Merge* merge) {
    auto it = merges_.find(PairKey(a, b));
    if (it == merges_.end()) return INT_MAX;
    if (merge != nullptr) *merge = it->second;
    return it->second.rank;
  };
  using Entry = std::pair<int32_t, int32_t>;  // (rank, left position)
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  for (int32_t i = 0; i + 1 < n; ++i) {
    const int r = rank_of(ids[size_t(i)], ids[size_t(i + 1)], nullptr);
    if (r != INT_MAX) heap.emplace(r, i);
  }
  while (!heap.empty()) {
    const auto [r, i] = heap.top();
    heap.pop();
    const int32_t j = next[size_t(i)];
    if (!alive[size_t(i)] || j >= n) continue;
    Merge merge{};
    if (rank_of(ids[size_t(i)], ids[size_t(j)], &merge) != r) continue;  // stale
    ids[size_t(i)] = merge.id;
    alive[size_t(j)] = false;
    next[size_t(i)] = next[size_t(j)];
    if (next[size_t(i)] < n) prev[size_t(next[size_t(i)])] = i;
    if (prev[size_t(i)] >= 0) {
      const int32_t h = prev[size_t(i)];
      const int rl = rank_of(ids[size_t(h)], ids[size_t(i)], nullptr);
      if (rl != INT_MAX) heap.emplace(rl, h);
    }
    if (next[size_t(i)] < n) {
      const int rr = rank_of(ids[size_t(i)], ids[size_t(next[size_t(i)])], nullptr);
      if (rr != INT_MAX) heap.emplace(rr, i);
    }
  }
  size_t w = 0;
  for (int32_t i = 0; i < n; i = next[size_t(i)]) ids[w++] = ids[size_t(i)];
  ids.resize(w);
}

void BpeTokenizer::MergeSymbols(std::vector<int32_t>& ids) const {
  // Long words (a minified blob, a DNA sequence) would make the simple loop
  // below quadratic: minutes for a megabyte.
  if (ids.size() > kLongWordSymbols) return MergeLong(ids);
  const auto rank_at = [&](size_t i, Merge* merge) {
    auto it = merges_.find(PairKey(ids[i], ids[i + 1]));
    if (it == merges_.end()) return INT_MAX;
    if (merge != nullptr) *merge = it->second;
    return it->second.rank;
  };
  int ranks[kLongWordSymbols];
  size_t n_ranks = ids.size() > 1 ? ids.size() - 1 : 0;
  for (size_t i = 0; i < n_ranks; ++i) ranks[i] = rank_at(i, nullptr);
  // The lowest-ranked pair merges first (the leftmost of equals); only the
  // two pairs beside a merge change rank.
  while (n_ranks > 0) {
    size_t best = 0;
    for (size_t i = 1; i < n_ranks; ++i) {
      if (ranks[i] < ranks[best]) best = i;
    }
    if (ranks[best] == INT_MAX) break;
    Merge merge{};
    rank_at(best, &merge);
    ids[best] = merge.id;
    ids.erase(ids.begin() + std::ptrdiff_t(best) + 1);
    std::copy(ranks + best + 1, ranks + n_ranks, ranks + best);
    --n_ranks;
    if (best < n_ranks) ranks[best] = rank_at(best, nullptr);
    if (best > 0) ranks[best - 1] = rank_at(best - 1, nullptr);
  }
}

void BpeTokenizer::AppendUnknown(std::string_view ch, std::vector<int32_t>& ids) const {
  if (byte_fallback_) {
    for (char c : ch) ids.push_back(fallback_token_[static_cast<unsigned char>(c)]);
    return;
  }
  if (fuse_unk_ && !ids.empty() && ids.back() == unk_) return;
  ids.push_back(unk_);
}

void BpeTokenizer::EncodeWord(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_ || word.size() == 1) {
    auto it = id_of_.find(std::string(word));
    if (it != id_of_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  std::vector<int32_t> ids;
  ids.reserve(word.size());
  if (byte_level_) {
    for (char c : word) ids.push_back(byte_token_[static_cast<unsigned char>(c)]);
  } else {
    std::string ch;
    for (size_t i = 0; i < word.size();) {
      const Utf8Char c = DecodeUtf8At(word, i);
      ch.assign(word.substr(i, c.len));
      i += c.len;
      auto it = id_of_.find(ch);
      if (it != id_of_.end()) {
        ids.push_back(it->second);
      } else {
        AppendUnknown(ch, ids);
      }
    }
  }
  MergeSymbols(ids);
  out.insert(out.end(), ids.begin(), ids.end());
}

std::string BpeTokenizer::RewriteStretch(std::string_view text, bool first) const {
  std::string s(text);
  for (const NormStep& n : normalizer_) {
    switch (n.kind) {
      case NormStep::Kind::kNfc: s = NfcNormalize(s); break;
      case NormStep::Kind::kPrepend: if (!s.empty()) s.insert(0, n.a); break;
      case NormStep::Kind::kReplace: ReplaceAll(s, n.a, n.b); break;
    }
  }
  // Steps that rewrite the text come first (checked when the file is read).
  if (!pre_.empty() && pre_[0].kind == PreStep::Kind::kByteLevel && pre_[0].add_prefix_space && !s.empty() &&
      s[0] != ' ') {
    s.insert(0, " ");
  }
  if (!pre_.empty() && pre_[0].kind == PreStep::Kind::kMetaspace) {
    const PreStep& m = pre_[0];
    ReplaceAll(s, " ", m.replacement);
    const bool prepend = m.prepend_scheme == "always" || (m.prepend_scheme == "first" && first);
    if (prepend && s.compare(0, m.replacement.size(), m.replacement) != 0) s.insert(0, m.replacement);
  }
  return s;
}

size_t BpeTokenizer::TokenBytes(int32_t id) const {
  if (!byte_level_ && is_byte_token_[size_t(id)]) return 1;
  return token_text_[size_t(id)].size();
}

void BpeTokenizer::EncodeStretch(std::string_view text, bool first, std::vector<int32_t>& out,
                                 WordCache& cache, size_t mark, size_t* mark_token) const {
  if (text.empty()) return;
  // Words repeat: a cache for the call (bounded, so a text of unique words
  // cannot grow it without end).
  constexpr size_t kMaxCached = size_t(1) << 16;
  const auto encode_word = [&](std::string_view word) {
    if (word.size() == 1 && byte_level_) {
      out.push_back(byte_token_[static_cast<unsigned char>(word[0])]);
      return;
    }
    auto it = cache.spans.find(word);
    if (it != cache.spans.end()) {
      const auto [at, n] = it->second;
      out.insert(out.end(), cache.ids.begin() + std::ptrdiff_t(at), cache.ids.begin() + std::ptrdiff_t(at + n));
      return;
    }
    const size_t before = out.size();
    EncodeWord(word, out);
    if (cache.spans.size() >= kMaxCached) {
      cache.spans.clear();
      cache.ids.clear();
    }
    cache.spans.emplace(std::string(word), std::make_pair(cache.ids.size(), out.size() - before));
    cache.ids.insert(cache.ids.end(), out.begin() + std::ptrdiff_t(before), out.end());
  };
  // With a mark: its place in the text the words are cut from, and each
  // word checked against it as it is encoded.
  std::string s;
  size_t word_mark = std::string_view::npos;
  std::string_view base = text;
  const bool marked = mark < text.size() && mark_token != nullptr;
  const auto encode_marked = [&](std::string_view word) {
    const size_t before = out.size();
    encode_word(word);
    if (word_mark == std::string_view::npos) return;
    const size_t begin = size_t(word.data() - base.data()), end = begin + word.size();
    if (end <= word_mark) return;
    // The first token of this word whose bytes reach past the mark.
    size_t at = begin, k = before;
    while (k + 1 < out.size() && at + TokenBytes(out[k]) <= word_mark) at += TokenBytes(out[k++]);
    *mark_token = k;
    word_mark = std::string_view::npos;
  };
  // GPT-2's pattern straight over the text: no copy. The loop is compiled
  // apart for unmarked text (every encode but the chat formats'): the mark's
  // checks in it cost GPT-2's encoding 13% more CPU time.
  if (gpt2_form_) {
    const auto each_word = [&](const auto& encode) {
      for (size_t pos = 0; pos < text.size();) {
        const size_t end = Gpt2WordEnd(text, pos);
        encode(text.substr(pos, end - pos));
        pos = end;
      }
    };
    if (marked) {
      word_mark = mark;
      each_word(encode_marked);
    } else {
      each_word(encode_word);
    }
    return;
  }
  s = RewriteStretch(text, first);
  base = s;
  // The rewrites keep a prefix a prefix (NFC aside, where a mark between a
  // letter and its combining mark lands on the composed letter).
  if (marked) word_mark = mark == 0 ? 0 : std::min(RewriteStretch(text.substr(0, mark), first).size(), s.size() - 1);
  std::vector<std::string_view> pieces, next;
  if (!pre_.empty() && pre_[0].kind == PreStep::Kind::kMetaspace && pre_[0].split) {
    const PreStep& m = pre_[0];
    size_t begin = 0;
    for (size_t hit = s.find(m.replacement, 1); hit != std::string::npos; hit = s.find(m.replacement, hit + 1)) {
      pieces.push_back(std::string_view(s).substr(begin, hit - begin));
      begin = hit;
    }
    pieces.push_back(std::string_view(s).substr(begin));
  } else {
    pieces.push_back(s);
  }
  for (const PreStep& p : pre_) {
    if (p.kind == PreStep::Kind::kMetaspace) continue;
    if (p.kind == PreStep::Kind::kByteLevel && !p.use_regex) continue;  // bytes are the model's symbols already
    next.clear();
    for (std::string_view piece : pieces) {
      if (p.kind == PreStep::Kind::kSplit) {
        p.regex->Split(piece, next);
      } else {
        for (size_t pos = 0; pos < piece.size();) {
          const size_t end = Gpt2WordEnd(piece, pos);
          next.push_back(piece.substr(pos, end - pos));
          pos = end;
        }
      }
    }
    pieces.swap(next);
  }
  for (std::string_view word : pieces) encode_marked(word);
}

void BpeTokenizer::Encode(std::string_view text, std::vector<int32_t>& out, bool special) const {
  EncodeAll(text, special, out, std::string_view::npos, nullptr);
}

size_t BpeTokenizer::EncodeMarked(std::string_view text, size_t mark, std::vector<int32_t>& out) const {
  size_t mark_token = std::string_view::npos;
  EncodeAll(text, /*special=*/false, out, mark, &mark_token);
  return mark_token == std::string_view::npos ? out.size() : mark_token;
}

void BpeTokenizer::EncodeAll(std::string_view text, bool special, std::vector<int32_t>& out, size_t mark,
                             size_t* mark_token) const {
  WordCache cache;
  size_t stretch = 0;  // the start of the text not yet encoded
  // The mark in [from, to) of the text about to be encoded: in a stretch,
  // or on the added token that follows it.
  const auto stretch_mark = [&](size_t from, size_t to) {
    return mark_token != nullptr && *mark_token == std::string_view::npos && mark >= from && mark < to
               ? mark - from
               : std::string_view::npos;
  };
  for (size_t i = 0; i < text.size(); ++i) {
    if (!added_first_byte_[static_cast<unsigned char>(text[i])]) continue;
    const AddedToken* hit = nullptr;
    for (const AddedToken& a : added_) {
      if ((special || !a.special) && text.compare(i, a.content.size(), a.content) == 0) {
        hit = &a;
        break;
      }
    }
    if (hit == nullptr) continue;
    size_t begin = i, end = i + hit->content.size();
    if (hit->lstrip) {
      while (begin > stretch && IsStripSpace(text[begin - 1])) --begin;
    }
    if (hit->rstrip) {
      while (end < text.size() && IsStripSpace(text[end])) ++end;
    }
    EncodeStretch(text.substr(stretch, begin - stretch), stretch == 0, out, cache, stretch_mark(stretch, begin),
                  mark_token);
    if (stretch_mark(begin, end) != std::string_view::npos) *mark_token = out.size();
    out.push_back(hit->id);
    stretch = end;
    i = end - 1;
  }
  EncodeStretch(text.substr(stretch), stretch == 0, out, cache, stretch_mark(stretch, text.size()), mark_token);
}

Result<std::string> BpeTokenizer::Decode(std::span<const int32_t> ids) const {
  std::string out;
  for (const int32_t id : ids) {
    if (id < 0 || id >= vocab_size() || token_text_[size_t(id)].empty()) {
      return Status::InvalidArgument("token id " + std::to_string(id) + " is not in the vocabulary");
    }
    const std::string& text = token_text_[size_t(id)];
    if (byte_level_) {
      out += text;
    } else if (is_byte_token_[size_t(id)]) {
      out.push_back(char(ByteFallbackValue(text)));
    } else {
      std::string piece = text;
      ReplaceAll(piece, kMetaspace, " ");
      out += piece;
    }
  }
  if (decode_strip_leading_space_ && !out.empty() && out[0] == ' ') out.erase(0, 1);
  return out;
}

std::string BpeTokenizer::ToVocabJson() const {
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  for (const auto& [str, id] : vocab_strings_) vocab[str] = id;
  return vocab.dump();
}

std::string BpeTokenizer::ToMergesTxt() const {
  std::string out = "#version: 0.2\n";
  for (const auto& [a, b] : merge_strings_) out += a + " " + b + "\n";
  return out;
}

std::string BpeTokenizer::ToTokenizerJson() const {
  if (!json_text_.empty()) return json_text_;
  if (!tiktoken_ranks_.empty()) return TiktokenAsTokenizerJson();
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  for (const auto& [str, id] : vocab_strings_) vocab[str] = id;
  nlohmann::ordered_json merges = nlohmann::ordered_json::array();
  for (const auto& [a, b] : merge_strings_) merges.push_back(a + " " + b);
  const nlohmann::ordered_json byte_level = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  nlohmann::ordered_json j = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens",
       {{{"id", eot_}, {"content", kEndOfText}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
         {"normalized", true}, {"special", true}}}},
      {"normalizer", nullptr},
      {"pre_tokenizer", byte_level},
      {"post_processor", byte_level},
      {"decoder", byte_level},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", ""},
        {"end_of_word_suffix", ""}, {"fuse_unk", false}, {"vocab", vocab}, {"merges", merges}}}};
  return j.dump();
}

std::vector<int32_t> EncodeDocuments(const BpeTokenizer& tokenizer, const std::vector<std::string_view>& documents,
                                     int threads, const std::function<void(int64_t)>& progress) {
  struct Piece {
    std::string_view text;
    bool starts_document, ends_document;
  };
  std::vector<Piece> pieces;
  for (std::string_view doc : documents) {
    size_t begin = 0;
    bool first = true;
    if (tokenizer.gpt2_pretokenizer()) {
      for (size_t cut : Gpt2SafeCuts(doc, size_t(1) << 20)) {
        pieces.push_back({doc.substr(begin, cut - begin), first, false});
        begin = cut;
        first = false;
      }
    }
    pieces.push_back({doc.substr(begin), first, true});
  }
  if (threads <= 0) threads = int(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::vector<int32_t>> encoded(pieces.size());
  std::atomic<size_t> next{0};
  std::atomic<int64_t> done_bytes{0};
  const auto work = [&] {
    for (size_t i = next++; i < pieces.size(); i = next++) {
      tokenizer.Encode(pieces[i].text, encoded[i]);
      done_bytes += int64_t(pieces[i].text.size());
    }
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < std::min<int>(threads, int(pieces.size())); ++t) pool.emplace_back(work);
  int64_t total = 0;
  for (const Piece& p : pieces) total += int64_t(p.text.size());
  if (progress) {
    while (done_bytes.load() < total) {
      progress(done_bytes.load());
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  for (auto& t : pool) t.join();
  if (progress) progress(done_bytes.load());
  const std::vector<int32_t>& start = tokenizer.DocumentStart();
  const std::vector<int32_t>& end = tokenizer.DocumentEnd();
  size_t count = 0;
  for (const auto& e : encoded) count += e.size();
  std::vector<int32_t> tokens;
  tokens.reserve(count + documents.size() * (start.size() + end.size()));
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (pieces[i].starts_document) tokens.insert(tokens.end(), start.begin(), start.end());
    tokens.insert(tokens.end(), encoded[i].begin(), encoded[i].end());
    if (pieces[i].ends_document) tokens.insert(tokens.end(), end.begin(), end.end());
  }
  return tokens;
}

std::string BpeTokenizer::TiktokenAsTokenizerJson() const {
  // transformers' conversion of a rank file: the vocabulary in id order;
  // the merges by the merged token's rank, a token's splits by the ids of
  // their left, then right, pieces.
  const int32_t n = document_start_[0];
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  for (int32_t id = 0; id < n; ++id) vocab[BytesToTokenString(token_text_[size_t(id)])] = id;
  struct Row {
    int32_t rank, left, right;
  };
  std::vector<Row> rows;
  rows.reserve(merges_.size());
  for (const auto& [key, merge] : merges_) rows.push_back({merge.rank, int32_t(key >> 32), int32_t(key & 0xFFFFFFFFu)});
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) {
    return std::tie(a.rank, a.left, a.right) < std::tie(b.rank, b.left, b.right);
  });
  nlohmann::ordered_json merges = nlohmann::ordered_json::array();
  for (const Row& r : rows) {
    merges.push_back({BytesToTokenString(token_text_[size_t(r.left)]), BytesToTokenString(token_text_[size_t(r.right)])});
  }
  nlohmann::ordered_json added = nlohmann::ordered_json::array();
  std::vector<const AddedToken*> specials;
  for (const AddedToken& a : added_) specials.push_back(&a);
  std::sort(specials.begin(), specials.end(), [](const AddedToken* a, const AddedToken* b) { return a->id < b->id; });
  for (const AddedToken* a : specials) {
    added.push_back({{"id", a->id}, {"content", a->content}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", false}, {"special", true}});
  }
  const std::string bos = token_text_[size_t(n)];
  const nlohmann::ordered_json bos_item = {{"SpecialToken", {{"id", bos}, {"type_id", 0}}}};
  nlohmann::ordered_json j = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"}, {"pattern", {{"Regex", kLlama3Pattern}}}, {"behavior", "Isolated"}, {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}}}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", {bos_item, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
        {"pair",
         {bos_item, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}, {{"SpecialToken", {{"id", bos}, {"type_id", 1}}}},
          {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
        {"special_tokens", {{bos, {{"id", bos}, {"ids", {n}}, {"tokens", {bos}}}}}}}},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", true},
        {"vocab", vocab}, {"merges", merges}}}};
  return j.dump() + "\n";
}

}  // namespace pstar
