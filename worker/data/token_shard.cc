#include "worker/data/token_shard.h"

#include <cstring>

#include "worker/core/file_util.h"

namespace pstar {

namespace {
template <typename T>
T Load(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}
template <typename T>
void Store(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}
}  // namespace

namespace {
Result<TokenShardHeader> ParseLlmcHeader(const unsigned char* data, int64_t file_bytes, const std::string& path) {
  if (file_bytes < kLlmcShardHeaderBytes) {
    return Status::DataLoss(path + ": truncated llm.c token shard (" + std::to_string(file_bytes) +
                            " bytes, the header alone is 1024)");
  }
  const int32_t magic = Load<int32_t>(data);
  const int32_t version = Load<int32_t>(data + 4);
  const int32_t expected = magic == kLlmcShardMagic ? 1 : 7;
  if (version != expected) {
    return Status::DataLoss(path + ": unsupported llm.c token shard version " + std::to_string(version) +
                            " (magic " + std::to_string(magic) + " has version " + std::to_string(expected) + ")");
  }
  const int32_t count = Load<int32_t>(data + 8);
  if (count < 0) return Status::DataLoss(path + ": llm.c token shard with a negative token count " + std::to_string(count));
  TokenShardHeader h;
  h.header_bytes = kLlmcShardHeaderBytes;
  h.token_bytes = magic == kLlmcShardMagic ? 2 : 4;
  h.num_tokens = uint64_t(count);
  h.vocab_size = 0;
  const uint64_t payload = uint64_t(file_bytes - kLlmcShardHeaderBytes);
  if (h.num_tokens * h.token_bytes != payload) {
    return Status::DataLoss(path + ": truncated llm.c token shard: header says " + std::to_string(h.num_tokens) +
                            " tokens (" + std::to_string(h.num_tokens * h.token_bytes) + " bytes) but " +
                            std::to_string(payload) + " bytes follow the header");
  }
  return h;
}
}  // namespace

Result<TokenShardHeader> ParseTokenShardHeader(const unsigned char* data, int64_t file_bytes,
                                               const std::string& path) {
  if (file_bytes >= 4) {
    const int32_t magic = Load<int32_t>(data);
    if (magic == kLlmcShardMagic || magic == kLlmcShardMagicUint32) return ParseLlmcHeader(data, file_bytes, path);
  }
  if (file_bytes < kTokenShardHeaderBytes) {
    return Status::DataLoss(path + ": truncated token shard (" + std::to_string(file_bytes) +
                            " bytes, the header alone is 32)");
  }
  if (std::memcmp(data, kTokenShardMagic, 8) != 0) {
    return Status::DataLoss(path + ": not a token shard (bad magic: neither pstar's PSTARTOK nor llm.c's " +
                            std::to_string(kLlmcShardMagic) + "; make one with 'pstar tokenize')");
  }
  uint32_t version = Load<uint32_t>(data + 8);
  if (version != kTokenShardVersion) {
    return Status::DataLoss(path + ": unsupported token shard version " + std::to_string(version));
  }
  TokenShardHeader h;
  h.token_bytes = Load<uint32_t>(data + 12);
  h.num_tokens = Load<uint64_t>(data + 16);
  h.vocab_size = Load<uint32_t>(data + 24);
  if (h.token_bytes != 2 && h.token_bytes != 4) {
    return Status::DataLoss(path + ": bad token width " + std::to_string(h.token_bytes) +
                            " (must be 2 or 4 bytes)");
  }
  const uint64_t payload = uint64_t(file_bytes - kTokenShardHeaderBytes);
  if (h.num_tokens > payload / h.token_bytes || h.num_tokens * h.token_bytes != payload) {
    return Status::DataLoss(path + ": truncated token shard: header says " +
                            std::to_string(h.num_tokens) + " tokens (" +
                            std::to_string(h.num_tokens * h.token_bytes) + " bytes) but " +
                            std::to_string(payload) + " bytes follow the header");
  }
  return h;
}

Status WriteTokenShard(const std::string& path, const std::vector<int32_t>& tokens,
                       uint32_t vocab_size) {
  const uint32_t width = vocab_size <= 65536 ? 2 : 4;
  std::string out;
  out.reserve(size_t(kTokenShardHeaderBytes) + tokens.size() * width);
  out.append(kTokenShardMagic, 8);
  Store<uint32_t>(out, kTokenShardVersion);
  Store<uint32_t>(out, width);
  Store<uint64_t>(out, tokens.size());
  Store<uint32_t>(out, vocab_size);
  Store<uint32_t>(out, 0);
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || uint32_t(tokens[i]) >= vocab_size) {
      return Status::InvalidArgument("token " + std::to_string(tokens[i]) + " at position " +
                                     std::to_string(i) + " is outside the vocabulary of " +
                                     std::to_string(vocab_size));
    }
    if (width == 2) Store<uint16_t>(out, uint16_t(tokens[i]));
    else Store<uint32_t>(out, uint32_t(tokens[i]));
  }
  return WriteFileAtomically(path, out);
}

}  // namespace pstar
