// The device a job computes on and the precision of its linear layers: what
// the config names (runtime.device, train.precision) and the model, the
// planner and the kernels act on.
#pragma once

#include <string>

#include "worker/core/status.h"

namespace pstar {

enum class ComputeDevice { kCpu, kCuda };
const char* ComputeDeviceName(ComputeDevice device);  // "cpu" or "cuda"

// The operand precision of the linear layers (the GEMMs, nearly all of the
// FLOPs): their inputs, weights and output gradients are rounded to it, and
// they accumulate in fp32. In bf16 and fp16 runs the parameters reach the
// device in that format too (16-bit parameter chunks, fp32 masters on the
// optimizer's side), so every op reads its weights in 16 bits and computes
// in fp32; and the activations a layer keeps (ActTensor) are kept in it.
// The projections' output workspace, the logits, the gradients and the
// optimizer states stay fp32.
enum class Precision { kFp32, kBf16, kFp16 };
const char* PrecisionName(Precision precision);  // "fp32", "bf16" or "fp16"
Result<Precision> ParsePrecision(const std::string& name);

}  // namespace pstar
