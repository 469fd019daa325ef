// A Hugging Face model directory from arbitrary bytes: the input, split at
// its first two NUL bytes, is config.json, model.safetensors.index.json and
// the one shard the index may name; the config reader and the directory's
// opening validate everything before any tensor range is read.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "tests/fuzz/fuzz_input_file.h"
#include "worker/ckpt/hf_config.h"
#include "worker/ckpt/hf_weights.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  std::string_view parts[3];
  size_t at = 0;
  for (int i = 0; i < 3; ++i) {
    const size_t end = i < 2 ? input.find('\0', at) : std::string_view::npos;
    parts[i] = input.substr(std::min(at, input.size()), end == std::string_view::npos ? std::string_view::npos : end - at);
    at = end == std::string_view::npos ? input.size() : end + 1;
  }
  const std::string dir = pstar::fuzz::WorkDir() + "/hf";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const auto write = [&](const char* name, std::string_view bytes) {
    std::ofstream(dir + "/" + name, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
  };
  write("config.json", parts[0]);
  if (!parts[1].empty()) write("model.safetensors.index.json", parts[1]);
  write(parts[1].empty() ? "model.safetensors" : "model-00001-of-00001.safetensors", parts[2]);
  (void)pstar::ReadHfConfig(dir);
  auto weights = pstar::HfWeights::Open(dir);
  if (weights.ok()) {
    std::vector<uint16_t> staging(64);
    std::vector<float> values(4096);
    for (const auto& [name, t] : weights->tensors()) {
      (void)weights->ReadFloats(name, 0, std::min<int64_t>(t.numel, 4096), values.data(), staging);
    }
  }
  return 0;
}
