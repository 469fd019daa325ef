#include "worker/model/model_kernels.h"

#include <algorithm>

namespace pstar {

const char* ComputeDeviceName(ComputeDevice device) {
  return device == ComputeDevice::kCuda ? "cuda" : "cpu";
}

Result<ComputeDevice> ParseComputeDevice(const std::string& name) {
  if (name == "cpu") return ComputeDevice::kCpu;
  if (name == "cuda") return ComputeDevice::kCuda;
  return Status::InvalidArgument("unknown device \"" + name + "\" (cpu or cuda)");
}

int64_t KernelScratchBytes(ComputeDevice device, const GptConfig& config, int64_t batch, int64_t seq) {
  if (device == ComputeDevice::kCpu) return 0;
  // One region shared by ops that run one after another on the compute
  // stream, after a 256-byte slot for the mean loss. Each term bounds what
  // the CUDA kernels ask for (checked when the scratch is set):
  const int64_t BT = batch * seq, C = config.n_embd;
  const int64_t attention = 5 * BT * C * 4;        // permuted q, k, v and the head outputs
  const int64_t layernorm = 2 * 256 * C * 4;       // at most 256 row groups of weight and bias partials
  const int64_t encoder = (4 * BT + 2) * 4;        // sort keys for a power of two >= B*T
  const int64_t reduce = 4096 * 8;                 // the reductions' partials (doubles)
  return 256 + std::max({attention, layernorm, encoder, reduce});
}

#ifndef PSTAR_WITH_CUDA
Result<std::unique_ptr<ModelKernels>> MakeCudaModelKernels(void*) {
  return Status::FailedPrecondition("this pstar was built without CUDA; use runtime.device: cpu");
}
#endif

}  // namespace pstar
