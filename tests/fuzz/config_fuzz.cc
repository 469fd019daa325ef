// The job config parser on arbitrary text: every input is accepted or
// refused with a Status, never a crash, hang or unbounded allocation.
#include <cstddef>
#include <cstdint>
#include <string>

#include "worker/config/config.h"
#include "worker/plan/memory_plan.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto config = pstar::ParseConfig(text, "fuzz", {});
  // An accepted config must also plan (bounded arithmetic over its sizes).
  if (config.ok()) (void)pstar::PlanMemory(*config);
  return 0;
}
