#include "operator/kube/quantity.h"

#include <cctype>
#include <limits>

namespace pstar::op {
namespace {

using i128 = __int128;
constexpr i128 kMax = std::numeric_limits<int64_t>::max();

// Parses `text` into units of 10^-scale, rounding up.
Result<int64_t> Parse(const std::string& text, int scale) {
  const std::string where = "quantity \"" + text + "\": ";
  size_t i = 0;
  bool negative = false;
  if (i < text.size() && (text[i] == '+' || text[i] == '-')) negative = text[i++] == '-';
  std::string digits;
  int frac = 0, ndigits = 0;
  bool dot = false;
  for (; i < text.size(); ++i) {
    char c = text[i];
    if (std::isdigit(static_cast<unsigned char>(c))) {
      ++ndigits;
      if (dot) ++frac;
      if (!(digits.empty() && c == '0')) digits.push_back(c);
    } else if (c == '.' && !dot) {
      dot = true;
    } else {
      break;
    }
  }
  if (ndigits == 0) return Status::InvalidArgument(where + "no number");
  std::string suffix = text.substr(i);
  int dexp = 0, bin_shift = 0;
  if (suffix.empty()) {
  } else if (suffix.size() == 2 && suffix[1] == 'i') {
    const std::string units = "KMGTPE";
    size_t k = units.find(suffix[0]);
    if (k == std::string::npos) return Status::InvalidArgument(where + "unknown suffix \"" + suffix + "\"");
    bin_shift = 10 * static_cast<int>(k + 1);
  } else if ((suffix[0] == 'e' || suffix[0] == 'E') && suffix.size() > 1) {
    size_t j = 1;
    bool neg_exp = false;
    if (suffix[j] == '+' || suffix[j] == '-') neg_exp = suffix[j++] == '-';
    if (j >= suffix.size() || suffix.size() - j > 3) return Status::InvalidArgument(where + "bad exponent");
    for (; j < suffix.size(); ++j) {
      if (!std::isdigit(static_cast<unsigned char>(suffix[j]))) return Status::InvalidArgument(where + "bad exponent");
      dexp = dexp * 10 + (suffix[j] - '0');
    }
    if (neg_exp) dexp = -dexp;
  } else if (suffix.size() == 1) {
    switch (suffix[0]) {
      case 'n': dexp = -9; break;
      case 'u': dexp = -6; break;
      case 'm': dexp = -3; break;
      case 'k': dexp = 3; break;
      case 'M': dexp = 6; break;
      case 'G': dexp = 9; break;
      case 'T': dexp = 12; break;
      case 'P': dexp = 15; break;
      case 'E': dexp = 18; break;
      default: return Status::InvalidArgument(where + "unknown suffix \"" + suffix + "\"");
    }
  } else {
    return Status::InvalidArgument(where + "unknown suffix \"" + suffix + "\"");
  }
  if (negative && !digits.empty()) return Status::InvalidArgument(where + "negative");
  if (digits.empty()) return int64_t{0};
  dexp += scale - frac;
  // Trailing zeros of the mantissa move into the exponent (keeps it small).
  while (digits.size() > 1 && digits.back() == '0') {
    digits.pop_back();
    ++dexp;
  }
  if (digits.size() > 30) return Status::InvalidArgument(where + "too many digits");
  i128 value = 0;
  for (char c : digits) value = value * 10 + (c - '0');
  const Status overflow = Status::InvalidArgument(where + "too large");
  for (int s = 0; s < bin_shift; ++s) {
    value *= 2;
    if (value > kMax) return overflow;
  }
  if (dexp > 0) {
    for (int s = 0; s < dexp; ++s) {
      value *= 10;
      if (value > kMax) return overflow;
    }
  } else if (dexp < 0) {
    if (dexp < -38) return int64_t{1};  // a tiny positive amount rounds up to one unit
    i128 div = 1;
    for (int s = 0; s < -dexp; ++s) div *= 10;
    value = (value + div - 1) / div;
  }
  if (value > kMax) return overflow;
  return static_cast<int64_t>(value);
}

}  // namespace

Result<int64_t> ParseQuantity(const std::string& text) { return Parse(text, 0); }

Result<int64_t> ParseCpuMillis(const std::string& text) { return Parse(text, 3); }

std::string FormatBytesQuantity(int64_t bytes) {
  if (bytes <= 0) return std::to_string(bytes);
  static const char* kUnits[] = {"Ki", "Mi", "Gi", "Ti", "Pi", "Ei"};
  int unit = -1;
  int64_t value = bytes;
  while (unit < 5 && value % 1024 == 0) {
    value /= 1024;
    ++unit;
  }
  return unit < 0 ? std::to_string(value) : std::to_string(value) + kUnits[unit];
}

}  // namespace pstar::op
