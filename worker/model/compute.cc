#include "worker/model/compute.h"

namespace pstar {

const char* ComputeDeviceName(ComputeDevice device) {
  return device == ComputeDevice::kCuda ? "cuda" : "cpu";
}

const char* PrecisionName(Precision precision) {
  switch (precision) {
    case Precision::kFp32: return "fp32";
    case Precision::kBf16: return "bf16";
    case Precision::kFp16: return "fp16";
  }
  return "?";
}

Result<Precision> ParsePrecision(const std::string& name) {
  if (name == "fp32") return Precision::kFp32;
  if (name == "bf16") return Precision::kBf16;
  if (name == "fp16") return Precision::kFp16;
  return Status::InvalidArgument("unknown precision \"" + name + "\" (fp32, bf16 or fp16)");
}

}  // namespace pstar
