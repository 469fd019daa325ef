// CRC-64/XZ: the ECMA-182 polynomial, bit-reflected, with all-ones initial
// value and final xor, as used by xz and .NET. The checksum of checkpoint
// files: it catches truncation, bit flips and burst errors (any burst up to 64
// bits, and all other errors but one in 2^64); it is not a defence against
// deliberate tampering. Check value: Crc64::Of("123456789") == 0x995dc9bbdf1939fa.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace pstar {

class Crc64 {
 public:
  // Feeds the next bytes; a stream fed piece by piece gets the same value as
  // one fed whole.
  void Update(const void* data, size_t bytes);
  uint64_t value() const { return ~state_; }

  static uint64_t Of(std::string_view bytes) {
    Crc64 c;
    c.Update(bytes.data(), bytes.size());
    return c.value();
  }

 private:
  uint64_t state_ = ~uint64_t{0};
};

// "crc64:" followed by 16 lower-case hex digits: how manifests spell a checksum.
std::string FormatCrc64(uint64_t value);

}  // namespace pstar
