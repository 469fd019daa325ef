#include "worker/data/gpt2_pretokenizer.h"

#include <algorithm>
#include <cstdint>

namespace pstar {
namespace {

enum class CharClass : uint8_t { kLetter, kNumber, kSpace, kOther };

struct Char {
  CharClass cls;
  uint32_t len;  // bytes
  char32_t cp;   // the code point; 0xFFFFFFFF for an invalid byte
};

CharClass ClassOf(char32_t cp) {
  if (cp < 0x80) {
    if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return CharClass::kLetter;
    if (cp >= '0' && cp <= '9') return CharClass::kNumber;
    if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D)) return CharClass::kSpace;  // ASCII's White_Space
    return CharClass::kOther;
  }
  struct Range {
    char32_t first, last;
    CharClass cls;
  };
  static constexpr Range kRanges[] = {
#include "worker/data/unicode_classes.inc"
  };
  const Range* r = std::upper_bound(std::begin(kRanges), std::end(kRanges), cp,
                                    [](char32_t c, const Range& range) { return c < range.first; });
  if (r == std::begin(kRanges)) return CharClass::kOther;
  --r;
  return cp <= r->last ? r->cls : CharClass::kOther;
}

// Strict UTF-8 (no overlongs, surrogates or code points past U+10FFFF);
// anything else is one invalid byte.
Char DecodeAt(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  const Char invalid{CharClass::kOther, 1, 0xFFFFFFFF};
  if (c < 0x80) return {ClassOf(c), 1, c};
  uint32_t len = 0;
  char32_t cp = 0, min = 0;
  if (c >= 0xC2 && c <= 0xDF) len = 2, cp = c & 0x1F, min = 0x80;
  else if (c >= 0xE0 && c <= 0xEF) len = 3, cp = c & 0x0F, min = 0x800;
  else if (c >= 0xF0 && c <= 0xF4) len = 4, cp = c & 0x07, min = 0x10000;
  else return invalid;
  if (i + len > s.size()) return invalid;
  for (uint32_t k = 1; k < len; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) return invalid;
    cp = (cp << 6) | (b(i + k) & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return invalid;
  return {ClassOf(cp), len, cp};
}

// The end of the run of characters of class `cls` that starts at `i`.
size_t RunEnd(std::string_view s, size_t i, CharClass cls) {
  while (i < s.size()) {
    const Char c = DecodeAt(s, i);
    if (c.cls != cls) break;
    i += c.len;
  }
  return i;
}

bool IsAsciiGraphic(unsigned char c) { return c >= 0x21 && c <= 0x7E; }
bool IsAsciiSpace(unsigned char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

}  // namespace

size_t Gpt2WordEnd(std::string_view s, size_t pos) {
  const size_t n = s.size();
  // 's 't 're 've 'm 'll 'd (ASCII, case-sensitive, as GPT-2's pattern).
  if (s[pos] == '\'' && pos + 1 < n) {
    const char a = s[pos + 1];
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return pos + 2;
    if (pos + 2 < n) {
      const char b = s[pos + 2];
      if ((a == 'l' && b == 'l') || (a == 'v' && b == 'e') || (a == 'r' && b == 'e')) return pos + 3;
    }
  }
  const Char c0 = DecodeAt(s, pos);
  // " ?X+" for X a letter, number or other run: one leading space joins it.
  if (c0.cp == U' ' && pos + 1 < n) {
    const Char c1 = DecodeAt(s, pos + 1);
    if (c1.cls != CharClass::kSpace) return RunEnd(s, pos + 1, c1.cls);
  }
  if (c0.cls != CharClass::kSpace) return RunEnd(s, pos, c0.cls);
  // \s+(?!\S) then \s+: a whitespace run gives up its last character to a
  // word that follows it, unless that leaves nothing.
  size_t last = pos, i = pos;
  while (i < n) {
    const Char c = DecodeAt(s, i);
    if (c.cls != CharClass::kSpace) break;
    last = i;
    i += c.len;
  }
  if (i == n || last == pos) return i;
  return last;
}

std::vector<std::string_view> Gpt2Words(std::string_view text) {
  std::vector<std::string_view> words;
  for (size_t pos = 0; pos < text.size();) {
    const size_t end = Gpt2WordEnd(text, pos);
    words.push_back(text.substr(pos, end - pos));
    pos = end;
  }
  return words;
}

std::vector<size_t> Gpt2SafeCuts(std::string_view text, size_t target_bytes) {
  // At p with text[p] ASCII whitespace and text[p-1] a visible ASCII
  // character, a word ends: no word holding a non-space character reaches
  // into whitespace, and matching from p on never looks back.
  std::vector<size_t> cuts;
  if (target_bytes == 0) target_bytes = 1;
  size_t p = target_bytes;
  while (p < text.size()) {
    while (p < text.size() &&
           !(IsAsciiSpace(static_cast<unsigned char>(text[p])) && IsAsciiGraphic(static_cast<unsigned char>(text[p - 1])))) {
      ++p;
    }
    if (p >= text.size()) break;
    cuts.push_back(p);
    p += target_bytes;
  }
  return cuts;
}

}  // namespace pstar
