// safetensors files on arbitrary bytes: the header and every tensor's
// range are validated against the file before anything is read or sized.
#include <cstddef>
#include <cstdint>

#include "tests/fuzz/fuzz_input_file.h"
#include "worker/ckpt/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = pstar::fuzz::WriteInput("model.safetensors", data, size);
  (void)pstar::SafetensorsHeader::Read(path);
  auto file = pstar::SafetensorsFile::Read(path);
  if (file.ok()) {
    for (const auto& [name, tensor] : file->tensors()) {
      if (tensor.numel() <= (1 << 20)) (void)file->ToDoubles(name);
    }
  }
  return 0;
}
