// Unicode Normalization Form C (UAX #15), the normalizer Qwen2.5's and
// Qwen3's tokenizer.json name: canonical decomposition, canonical ordering
// of combining marks, then canonical composition. Tables generated from the
// Unicode Character Database (unicode_nfc.inc, scripts/dev/gen_unicode_nfc.py),
// the same version as the pre-tokenizer's character classes.
#pragma once

#include <string>
#include <string_view>

namespace pstar {

// `text` in NFC. Bytes that are not valid UTF-8 pass through unchanged and
// end a run (nothing composes across them), so any byte string is accepted.
std::string NfcNormalize(std::string_view text);

// Whether NfcNormalize would return `text` unchanged, decided without
// normalizing: true when no character's NFC_QC is No or Maybe and the
// combining marks are in canonical order (UAX #15's quick check), as in
// ASCII and most text.
bool IsQuickNfc(std::string_view text);

// The Unicode version of the tables, e.g. "15.0.0".
const char* NfcUnicodeVersion();

}  // namespace pstar
