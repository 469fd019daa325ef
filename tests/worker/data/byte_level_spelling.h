// GPT-2's byte-to-unicode spelling of token strings, for the tests that
// write small byte-level tokenizer.json files.
#pragma once

#include <string>

namespace pstar::test {

inline std::string ByteLevelSpelling(const std::string& bytes) {
  std::string out;
  for (unsigned char b : bytes) {
    int code = b;
    const auto printable = [](int x) { return (x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE; };
    if (!printable(b)) {
      int n = 0;
      for (int x = 0; x < b; ++x) n += printable(x) ? 0 : 1;
      code = 256 + n;
    }
    if (code < 0x80) out.push_back(char(code));
    else out += {char(0xC0 | (code >> 6)), char(0x80 | (code & 0x3F))};
  }
  return out;
}

}  // namespace pstar::test
