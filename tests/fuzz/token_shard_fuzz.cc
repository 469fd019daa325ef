// Token shards on arbitrary bytes: the header check against the file size,
// and reading every token an accepted shard claims to hold.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "tests/fuzz/fuzz_input_file.h"
#include "worker/data/token_shard.h"
#include "worker/data/token_source.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)pstar::ParseTokenShardHeader(data, int64_t(size), "fuzz");
  const std::string path = pstar::fuzz::WriteInput("shard.bin", data, size);
  auto source = pstar::OpenTokenShards(path, /*vocab_size=*/65536);
  if (source.ok()) {
    const int64_t n = std::min<int64_t>((*source)->size(), 1 << 16);
    std::vector<int32_t> tokens(size_t(std::max<int64_t>(n, 1)));
    if (n > 0) (*source)->Read(0, n, tokens.data());
  }
  return 0;
}
