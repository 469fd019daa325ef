// A checkpoint's manifest.json on arbitrary bytes: refused with a Status
// naming the problem, or accepted with every number within bounds.
#include <cstddef>
#include <cstdint>

#include "tests/fuzz/fuzz_input_file.h"
#include "worker/ckpt/checkpoint_dir.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  pstar::fuzz::WriteInput("manifest.json", data, size);
  (void)pstar::ReadManifest(pstar::fuzz::WorkDir());
  return 0;
}
