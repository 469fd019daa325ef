// Token-shard files: a 32-byte little-endian header, then the tokens.
//   0  char[8]  magic "PSTARTOK"
//   8  uint32   version (1)
//   12 uint32   bytes per token (2 or 4)
//   16 uint64   number of tokens
//   24 uint32   vocabulary size the tokens were made for
//   28 uint32   reserved (0)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "worker/core/status.h"

namespace pstar {

inline constexpr char kTokenShardMagic[8] = {'P', 'S', 'T', 'A', 'R', 'T', 'O', 'K'};
inline constexpr uint32_t kTokenShardVersion = 1;
inline constexpr int64_t kTokenShardHeaderBytes = 32;

struct TokenShardHeader {
  uint32_t token_bytes = 0;
  uint64_t num_tokens = 0;
  uint32_t vocab_size = 0;
};

// Parses and checks a header against the file's size; names `path` in errors.
Result<TokenShardHeader> ParseTokenShardHeader(const unsigned char* data, int64_t file_bytes,
                                               const std::string& path);

// Writes `tokens` as a shard (uint16 when vocab_size <= 65536, else uint32).
// The file appears complete or not at all (temp file, fsync, rename).
Status WriteTokenShard(const std::string& path, const std::vector<int32_t>& tokens,
                       uint32_t vocab_size);

}  // namespace pstar
