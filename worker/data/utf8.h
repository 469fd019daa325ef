// Strict UTF-8 decoding and encoding, shared by the text code: no overlong
// forms, surrogates or code points past U+10FFFF; a byte that does not
// start a valid sequence decodes as one invalid byte.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace pstar {

struct Utf8Char {
  static constexpr char32_t kInvalid = 0xFFFFFFFF;
  char32_t cp;  // kInvalid for an invalid byte
  uint32_t len;  // bytes (1 for an invalid byte)
};

// The character that starts at byte `i` (< s.size()).
inline Utf8Char DecodeUtf8At(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) return {c, 1};
  uint32_t len = 0;
  char32_t cp = 0, min = 0;
  if (c >= 0xC2 && c <= 0xDF) len = 2, cp = c & 0x1F, min = 0x80;
  else if (c >= 0xE0 && c <= 0xEF) len = 3, cp = c & 0x0F, min = 0x800;
  else if (c >= 0xF0 && c <= 0xF4) len = 4, cp = c & 0x07, min = 0x10000;
  else return {Utf8Char::kInvalid, 1};
  if (i + len > s.size()) return {Utf8Char::kInvalid, 1};
  for (uint32_t k = 1; k < len; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) return {Utf8Char::kInvalid, 1};
    cp = (cp << 6) | (b(i + k) & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return {Utf8Char::kInvalid, 1};
  return {cp, len};
}

// Appends the UTF-8 form of the valid code point `cp`.
inline void AppendUtf8(char32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

// Whether `s` is entirely valid UTF-8.
inline bool IsValidUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const Utf8Char c = DecodeUtf8At(s, i);
    if (c.cp == Utf8Char::kInvalid) return false;
    i += c.len;
  }
  return true;
}

}  // namespace pstar
