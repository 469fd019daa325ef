// NFC on cases that exercise each part of UAX #15: decomposition (singletons,
// recursive), canonical ordering, composition with blocking, exclusions,
// Hangul arithmetic, and bytes that are not UTF-8. The reference comparison
// over whole corpora is through Qwen's tokenizer (hf_tokenizer_test.py).
#include "worker/data/unicode_nfc.h"

#include <gtest/gtest.h>

#include <string>

namespace pstar {
namespace {

TEST(NfcNormalize, ComposesDecomposesAndOrders) {
  EXPECT_EQ(NfcNormalize("e\xCC\x81"), "\xC3\xA9");                     // e + U+0301 -> é
  EXPECT_EQ(NfcNormalize("\xE2\x84\xAB"), "\xC3\x85");                  // U+212B ANGSTROM SIGN -> Å (singleton)
  EXPECT_EQ(NfcNormalize("\xE1\xB8\x8B\xCC\xA3"), "\xE1\xB8\x8D\xCC\x87");  // ḋ + dot below -> ḍ + dot above
  EXPECT_EQ(NfcNormalize("a\xCC\x87\xCC\xA3"), "\xE1\xBA\xA1\xCC\x87");  // marks reordered, then ạ composes
  // Same class blocks: the second acute stays apart.
  EXPECT_EQ(NfcNormalize("e\xCC\x81\xCC\x81"), "\xC3\xA9\xCC\x81");
  // U+0958 (DEVANAGARI QA) is a composition exclusion: it stays decomposed.
  EXPECT_EQ(NfcNormalize("\xE0\xA5\x98"), "\xE0\xA4\x95\xE0\xA4\xBC");
  // Hangul: L + V + T jamo compose to one syllable, and a syllable stays.
  EXPECT_EQ(NfcNormalize("\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8"), "\xEA\xB0\x81");  // 각
  EXPECT_EQ(NfcNormalize("\xEA\xB0\x81"), "\xEA\xB0\x81");
  // A mark with no starter before it stays as it is.
  EXPECT_EQ(NfcNormalize("\xCC\x81" "a"), "\xCC\x81" "a");
}

TEST(NfcNormalize, LeavesNfcAndInvalidBytesAlone) {
  const std::string ascii = "plain ASCII text, 123 !?";
  EXPECT_TRUE(IsQuickNfc(ascii));
  EXPECT_EQ(NfcNormalize(ascii), ascii);
  EXPECT_TRUE(IsQuickNfc("\xE6\x97\xA5\xE6\x9C\xAC caf\xC3\xA9"));
  EXPECT_FALSE(IsQuickNfc("e\xCC\x81"));
  // Invalid bytes pass through and nothing composes across them.
  EXPECT_EQ(NfcNormalize("e\xFF\xCC\x81 e\xCC\x81"), "e\xFF\xCC\x81 \xC3\xA9");
  EXPECT_EQ(NfcNormalize(std::string("\xC3", 1)), std::string("\xC3", 1));
  EXPECT_STREQ(NfcUnicodeVersion(), "15.0.0");
}

}  // namespace
}  // namespace pstar
