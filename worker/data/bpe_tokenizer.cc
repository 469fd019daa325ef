#include "worker/data/bpe_tokenizer.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <queue>
#include <thread>

#include "worker/core/file_util.h"
#include "worker/data/gpt2_pretokenizer.h"

namespace pstar {
namespace {

// Ids at or past this are refused: a vocabulary file cannot make the tables
// absurdly large (GPT-2's is 50257; the largest in use are a few 100k).
constexpr int64_t kMaxVocab = int64_t(1) << 22;
constexpr char kEndOfText[] = "<|endoftext|>";

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

}  // namespace

Result<BpeTokenizer> BpeTokenizer::Build(const std::vector<std::pair<std::string, int64_t>>& vocab,
                                         const std::vector<std::pair<std::string, std::string>>& merges,
                                         const std::string& source) {
  BpeTokenizer t;
  t.vocab_strings_ = vocab;
  t.merge_strings_ = merges;
  std::unordered_map<std::string, int32_t> id_of;  // token bytes -> id
  int64_t max_id = -1;
  for (const auto& [str, id] : vocab) {
    if (id < 0 || id >= kMaxVocab) {
      return Status::InvalidArgument(source + ": token '" + str + "' has id " + std::to_string(id) +
                                     ", outside 0.." + std::to_string(kMaxVocab - 1));
    }
    max_id = std::max(max_id, id);
  }
  if (max_id < 0) return Status::InvalidArgument(source + ": the vocabulary is empty");
  t.token_bytes_.assign(size_t(max_id + 1), std::string());
  std::vector<bool> seen(size_t(max_id + 1), false);
  for (const auto& [str, id] : vocab) {
    if (seen[size_t(id)]) return Status::InvalidArgument(source + ": id " + std::to_string(id) + " is used twice");
    seen[size_t(id)] = true;
    if (str == kEndOfText) {
      t.eot_ = int32_t(id);
      t.token_bytes_[size_t(id)] = str;
      continue;
    }
    auto bytes = TokenStringToBytes(str);
    if (!bytes.ok()) return bytes.status().WithPrefix(source);
    if (bytes->empty()) return Status::InvalidArgument(source + ": id " + std::to_string(id) + " is an empty token");
    t.token_bytes_[size_t(id)] = *bytes;
    id_of.emplace(*bytes, int32_t(id));
  }
  if (t.eot_ < 0) return Status::InvalidArgument(source + ": the vocabulary has no " + std::string(kEndOfText) + " token");
  for (int b = 0; b < 256; ++b) {
    auto it = id_of.find(std::string(1, char(b)));
    if (it == id_of.end()) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02X", b);
      return Status::InvalidArgument(source + ": the vocabulary has no token for byte " + hex +
                                     " (not a byte-level BPE vocabulary)");
    }
    t.byte_token_[b] = it->second;
  }
  t.merges_.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    const auto& [a, b] = merges[r];
    auto ab = TokenStringToBytes(a), bb = TokenStringToBytes(b);
    if (!ab.ok()) return ab.status().WithPrefix(source + ": merge " + std::to_string(r + 1));
    if (!bb.ok()) return bb.status().WithPrefix(source + ": merge " + std::to_string(r + 1));
    auto ia = id_of.find(*ab), ib = id_of.find(*bb), im = id_of.find(*ab + *bb);
    if (ia == id_of.end() || ib == id_of.end() || im == id_of.end()) {
      return Status::InvalidArgument(source + ": merge " + std::to_string(r + 1) + " ('" + a + " " + b +
                                     "') names a token the vocabulary does not have");
    }
    // A pair listed twice keeps its first (lowest) rank, as GPT-2's encoder does.
    t.merges_.emplace(PairKey(ia->second, ib->second), Merge{int32_t(r), im->second});
  }
  return t;
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
  return Build(vocab, merges, encoder_json + " + " + vocab_bpe);
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
  const nlohmann::json& model = j["model"];
  if (model.contains("type") && model["type"] != "BPE") {
    return bad("model.type is " + model["type"].dump() + "; only a BPE model (the GPT-2 family) is supported");
  }
  const nlohmann::json pre = j.value("pre_tokenizer", nlohmann::json());
  if (!pre.is_object() || pre.value("type", "") != "ByteLevel") {
    return bad("pre_tokenizer is not ByteLevel; only GPT-2's byte-level pre-tokenization is supported");
  }
  if (pre.value("add_prefix_space", false)) {
    return bad("pre_tokenizer.add_prefix_space is true; GPT-2 encodes text as it is (false)");
  }
  if (!model.contains("vocab") || !model["vocab"].is_object()) return bad("model.vocab is not an object");
  if (!model.contains("merges") || !model["merges"].is_array()) return bad("model.merges is not an array");
  std::vector<std::pair<std::string, int64_t>> vocab;
  for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
    if (!it.value().is_number_integer()) return bad("the id of token '" + it.key() + "' is not an integer");
    vocab.emplace_back(it.key(), it.value().get<int64_t>());
  }
  if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
    for (const auto& added : j["added_tokens"]) {
      if (!added.is_object() || !added.contains("content") || !added["content"].is_string() ||
          !added.contains("id") || !added["id"].is_number_integer()) {
        return bad("an added_tokens entry lacks a string content or an integer id");
      }
      const std::string content = added["content"].get<std::string>();
      if (!model["vocab"].contains(content)) vocab.emplace_back(content, added["id"].get<int64_t>());
    }
  }
  std::vector<std::pair<std::string, std::string>> merges;
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
  return Build(vocab, merges, path);
}

void BpeTokenizer::EncodeLongWord(std::string_view word, std::vector<int32_t>& out) const {
  // The same merges in the same order as EncodeWord (the lowest rank first,
  // the leftmost of equals), in O(n log n): a min-heap of (rank, left
  // position) over a linked list of tokens. An entry whose pair has changed
  // since it was pushed is skipped (a rank names one pair, so an unchanged
  // rank means an unchanged pair).
  const int32_t n = int32_t(word.size());
  const size_t count = static_cast<size_t>(n);
  std::vector<int32_t> ids(count), next(count), prev(count);
  std::vector<bool> alive(count, true);
  for (int32_t i = 0; i < n; ++i) {
    ids[size_t(i)] = byte_token_[static_cast<unsigned char>(word[size_t(i)])];
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
  for (int32_t i = 0; i < n; i = next[size_t(i)]) out.push_back(ids[size_t(i)]);
}

void BpeTokenizer::EncodeWord(std::string_view word, std::vector<int32_t>& out) const {
  // Long words (a minified blob, a DNA sequence) would make the simple loop
  // below quadratic: minutes for a megabyte.
  if (word.size() > kLongWordBytes) return EncodeLongWord(word, out);
  std::vector<int32_t> ids(word.size());
  for (size_t i = 0; i < word.size(); ++i) ids[i] = byte_token_[static_cast<unsigned char>(word[i])];
  const auto rank_at = [&](size_t i, Merge* merge) {
    auto it = merges_.find(PairKey(ids[i], ids[i + 1]));
    if (it == merges_.end()) return INT_MAX;
    if (merge != nullptr) *merge = it->second;
    return it->second.rank;
  };
  std::vector<int> ranks(ids.size() > 1 ? ids.size() - 1 : 0);
  for (size_t i = 0; i < ranks.size(); ++i) ranks[i] = rank_at(i, nullptr);
  // The lowest-ranked pair merges first (the leftmost of equals); only the
  // two pairs beside a merge change rank.
  while (!ranks.empty()) {
    size_t best = 0;
    for (size_t i = 1; i < ranks.size(); ++i) {
      if (ranks[i] < ranks[best]) best = i;
    }
    if (ranks[best] == INT_MAX) break;
    Merge merge{};
    rank_at(best, &merge);
    ids[best] = merge.id;
    ids.erase(ids.begin() + std::ptrdiff_t(best) + 1);
    ranks.erase(ranks.begin() + std::ptrdiff_t(best));
    if (best < ranks.size()) ranks[best] = rank_at(best, nullptr);
    if (best > 0) ranks[best - 1] = rank_at(best - 1, nullptr);
  }
  out.insert(out.end(), ids.begin(), ids.end());
}

void BpeTokenizer::Encode(std::string_view text, std::vector<int32_t>& out) const {
  // Words repeat: a cache for this call (bounded, so a text of unique words
  // cannot grow it without end).
  constexpr size_t kMaxCached = size_t(1) << 16;
  std::unordered_map<std::string_view, std::pair<size_t, size_t>> cache;  // word -> span of `memo`
  std::vector<int32_t> memo;
  for (size_t pos = 0; pos < text.size();) {
    const size_t end = Gpt2WordEnd(text, pos);
    const std::string_view word = text.substr(pos, end - pos);
    pos = end;
    if (word.size() == 1) {
      out.push_back(byte_token_[static_cast<unsigned char>(word[0])]);
      continue;
    }
    auto it = cache.find(word);
    if (it != cache.end()) {
      out.insert(out.end(), memo.begin() + std::ptrdiff_t(it->second.first),
                 memo.begin() + std::ptrdiff_t(it->second.first + it->second.second));
      continue;
    }
    const size_t before = out.size();
    EncodeWord(word, out);
    if (cache.size() >= kMaxCached) {
      cache.clear();
      memo.clear();
    }
    cache.emplace(word, std::make_pair(memo.size(), out.size() - before));
    memo.insert(memo.end(), out.begin() + std::ptrdiff_t(before), out.end());
  }
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

Result<std::string> BpeTokenizer::Decode(std::span<const int32_t> ids) const {
  std::string out;
  for (const int32_t id : ids) {
    if (id < 0 || id >= vocab_size() || token_bytes_[size_t(id)].empty()) {
      return Status::InvalidArgument("token id " + std::to_string(id) + " is not in the vocabulary");
    }
    out += token_bytes_[size_t(id)];
  }
  return out;
}

std::vector<int32_t> EncodeDocuments(const BpeTokenizer& tokenizer, const std::vector<std::string_view>& documents,
                                     int threads, const std::function<void(int64_t)>& progress) {
  struct Piece {
    std::string_view text;
    bool starts_document;
  };
  std::vector<Piece> pieces;
  for (std::string_view doc : documents) {
    size_t begin = 0;
    bool first = true;
    for (size_t cut : Gpt2SafeCuts(doc, size_t(1) << 20)) {
      pieces.push_back({doc.substr(begin, cut - begin), first});
      begin = cut;
      first = false;
    }
    pieces.push_back({doc.substr(begin), first});
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
  size_t count = 0;
  for (const auto& e : encoded) count += e.size();
  std::vector<int32_t> tokens;
  tokens.reserve(count + documents.size());
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (pieces[i].starts_document) tokens.push_back(tokenizer.eot());
    tokens.insert(tokens.end(), encoded[i].begin(), encoded[i].end());
  }
  return tokens;
}

}  // namespace pstar
