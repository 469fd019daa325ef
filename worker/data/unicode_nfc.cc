#include "worker/data/unicode_nfc.h"

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <vector>

#include "worker/data/utf8.h"

namespace pstar {
namespace {

struct NfcCombiningClass {
  char32_t cp;
  uint8_t ccc;
};
struct NfcRange {
  char32_t first, last;
};
struct NfcDecomposition {
  char32_t cp;
  uint32_t offset, length;
};
struct NfcComposition {
  char32_t first, second, composite;
};

#include "worker/data/unicode_nfc.inc"

// Hangul syllables: LVT arithmetic (Unicode chapter 3.12).
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

uint8_t CombiningClass(char32_t cp) {
  if (cp < 0x300) return 0;
  const auto* it = std::lower_bound(std::begin(kNfcCombiningClass), std::end(kNfcCombiningClass), cp,
                                    [](const NfcCombiningClass& e, char32_t c) { return e.cp < c; });
  return it != std::end(kNfcCombiningClass) && it->cp == cp ? it->ccc : 0;
}

bool QuickCheckFails(char32_t cp) {
  if (cp < 0x300) return false;
  const auto* it = std::upper_bound(std::begin(kNfcQuickCheck), std::end(kNfcQuickCheck), cp,
                                    [](char32_t c, const NfcRange& r) { return c < r.first; });
  return it != std::begin(kNfcQuickCheck) && cp <= std::prev(it)->last;
}

void Decompose(char32_t cp, std::vector<char32_t>& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const char32_t s = cp - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out.push_back(kTBase + s % kTCount);
    return;
  }
  const auto* it = std::lower_bound(std::begin(kNfcDecomposition), std::end(kNfcDecomposition), cp,
                                    [](const NfcDecomposition& e, char32_t c) { return e.cp < c; });
  if (it == std::end(kNfcDecomposition) || it->cp != cp) {
    out.push_back(cp);
    return;
  }
  out.insert(out.end(), kNfcDecompositionData + it->offset, kNfcDecompositionData + it->offset + it->length);
}

// The primary composite of `a` and `b`, or 0.
char32_t Compose(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount) {
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  }
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase && b < kTBase + kTCount) {
    return a + (b - kTBase);
  }
  const auto* it = std::lower_bound(std::begin(kNfcComposition), std::end(kNfcComposition), std::make_pair(a, b),
                                    [](const NfcComposition& e, const std::pair<char32_t, char32_t>& k) {
                                      return e.first != k.first ? e.first < k.first : e.second < k.second;
                                    });
  return it != std::end(kNfcComposition) && it->first == a && it->second == b ? it->composite : 0;
}

// NFC of one run of valid code points, appended to `out` as UTF-8.
void NormalizeRun(std::vector<char32_t>& cps, std::string& out) {
  std::vector<char32_t> d;
  d.reserve(cps.size() + 8);
  for (char32_t cp : cps) Decompose(cp, d);
  // Canonical ordering: a stable sort by class within each run of marks.
  for (size_t i = 0; i < d.size();) {
    if (CombiningClass(d[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < d.size() && CombiningClass(d[j]) != 0) ++j;
    std::stable_sort(d.begin() + std::ptrdiff_t(i), d.begin() + std::ptrdiff_t(j),
                     [](char32_t x, char32_t y) { return CombiningClass(x) < CombiningClass(y); });
    i = j;
  }
  // Canonical composition: each character joins the last starter unless a
  // character between them blocks it (a class of its own or higher; marks
  // are in order, so the last one kept has the highest class so far).
  size_t starter = SIZE_MAX;
  int last_class = 256;  // nothing composes before the first starter
  size_t w = 0;
  for (size_t i = 0; i < d.size(); ++i) {
    const char32_t c = d[i];
    const int cls = CombiningClass(c);
    if (starter != SIZE_MAX && (last_class < cls || last_class == 0)) {
      const char32_t composite = Compose(d[starter], c);
      if (composite != 0) {
        d[starter] = composite;
        continue;
      }
    }
    if (cls == 0) starter = w;
    last_class = cls;
    d[w++] = c;
  }
  d.resize(w);
  for (char32_t cp : d) AppendUtf8(cp, out);
}

}  // namespace

const char* NfcUnicodeVersion() { return PSTAR_NFC_UNICODE_VERSION; }

bool IsQuickNfc(std::string_view text) {
  int last_class = 0;
  for (size_t i = 0; i < text.size();) {
    if (static_cast<unsigned char>(text[i]) < 0x80) {
      last_class = 0;
      ++i;
      continue;
    }
    const Utf8Char c = DecodeUtf8At(text, i);
    i += c.len;
    if (c.cp == Utf8Char::kInvalid) {
      last_class = 0;
      continue;
    }
    if (QuickCheckFails(c.cp)) return false;
    const int cls = CombiningClass(c.cp);
    if (cls != 0 && last_class > cls) return false;
    last_class = cls;
  }
  return true;
}

std::string NfcNormalize(std::string_view text) {
  if (IsQuickNfc(text)) return std::string(text);
  std::string out;
  out.reserve(text.size() + text.size() / 8);
  std::vector<char32_t> run;
  for (size_t i = 0; i < text.size();) {
    const Utf8Char c = DecodeUtf8At(text, i);
    if (c.cp == Utf8Char::kInvalid) {
      NormalizeRun(run, out);
      run.clear();
      out.push_back(text[i]);
    } else {
      run.push_back(c.cp);
    }
    i += c.len;
  }
  NormalizeRun(run, out);
  return out;
}

}  // namespace pstar
