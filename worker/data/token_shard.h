// Token-shard files, in either of two formats told apart by their first bytes.
//
// pstar's own (what `pstar tokenize` writes): a 32-byte little-endian header,
// then the tokens.
//   0  char[8]  magic "PSTARTOK"
//   8  uint32   version (1)
//   12 uint32   bytes per token (2 or 4)
//   16 uint64   number of tokens
//   24 uint32   vocabulary size the tokens were made for
//   28 uint32   reserved (0)
//
// llm.c's (its data scripts write FineWeb, TinyStories, ... this way): 256
// little-endian int32, then the tokens.
//   0  int32    magic 20240520 (GPT-2 tokens, uint16) or 20240801 (uint32)
//   4  int32    version (1 with 20240520, 7 with 20240801)
//   8  int32    number of tokens
//   12..1023    unused
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "worker/core/status.h"

namespace pstar {

inline constexpr char kTokenShardMagic[8] = {'P', 'S', 'T', 'A', 'R', 'T', 'O', 'K'};
inline constexpr uint32_t kTokenShardVersion = 1;
inline constexpr int64_t kTokenShardHeaderBytes = 32;
inline constexpr int32_t kLlmcShardMagic = 20240520;        // uint16 tokens, version 1
inline constexpr int32_t kLlmcShardMagicUint32 = 20240801;  // uint32 tokens, version 7
inline constexpr int64_t kLlmcShardHeaderBytes = 256 * 4;

struct TokenShardHeader {
  int64_t header_bytes = kTokenShardHeaderBytes;  // where the tokens start
  uint32_t token_bytes = 0;
  uint64_t num_tokens = 0;
  uint32_t vocab_size = 0;  // 0: not recorded (llm.c's format)
};

// Parses and checks a header (either format) against the file's size; names
// `path` in errors.
Result<TokenShardHeader> ParseTokenShardHeader(const unsigned char* data, int64_t file_bytes,
                                               const std::string& path);

// Writes `tokens` as a shard (uint16 when vocab_size <= 65536, else uint32).
// The file appears complete or not at all (temp file, fsync, rename).
Status WriteTokenShard(const std::string& path, const std::vector<int32_t>& tokens,
                       uint32_t vocab_size);

}  // namespace pstar
