#include "worker/ckpt/crc64.h"

#include <array>
#include <bit>
#include <cstdio>
#include <cstring>

namespace pstar {

namespace {

constexpr uint64_t kPolyReflected = 0xc96c5795d7870f42ull;

// Slicing-by-8 tables, built at compile time: table[0] is the classic
// byte-at-a-time table; table[k][b] is the CRC of byte b followed by k zeros.
using Tables = std::array<std::array<uint64_t, 256>, 8>;

constexpr Tables MakeTables() {
  Tables t{};
  for (uint64_t b = 0; b < 256; ++b) {
    uint64_t crc = b;
    for (int bit = 0; bit < 8; ++bit) crc = (crc & 1) ? (crc >> 1) ^ kPolyReflected : crc >> 1;
    t[0][b] = crc;
  }
  for (int k = 1; k < 8; ++k) {
    for (int b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xff];
  }
  return t;
}

constexpr Tables kTables = MakeTables();

}  // namespace

void Crc64::Update(const void* data, size_t bytes) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  uint64_t crc = state_;
  // Eight bytes at a time (little-endian load), then the tail byte by byte.
  while (bytes >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    if constexpr (std::endian::native == std::endian::big) word = __builtin_bswap64(word);
    crc ^= word;
    crc = kTables[7][crc & 0xff] ^ kTables[6][(crc >> 8) & 0xff] ^ kTables[5][(crc >> 16) & 0xff] ^
          kTables[4][(crc >> 24) & 0xff] ^ kTables[3][(crc >> 32) & 0xff] ^ kTables[2][(crc >> 40) & 0xff] ^
          kTables[1][(crc >> 48) & 0xff] ^ kTables[0][crc >> 56];
    p += 8;
    bytes -= 8;
  }
  while (bytes-- > 0) crc = kTables[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
  state_ = crc;
}

std::string FormatCrc64(uint64_t value) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "crc64:%016llx", static_cast<unsigned long long>(value));
  return buf;
}

}  // namespace pstar
