// The CUDA backend: the device tier is one cudaMalloc block on one GPU, the
// host tier one pinned (page-locked, portable) block, and each StreamKind is
// a non-blocking CUDA stream, so copies in both directions overlap compute.
// Events carry no timing, except the profiler's timing events. Built only
// with the CUDA toolkit (PSTAR_WITH_CUDA).
//
// Calls return before their work is done; a failed copy, fill or event call,
// or a fault of the device, is kept and surfaces at CheckErrors().
#pragma once

#include <memory>
#include <string>

#include "worker/core/status.h"
#include "worker/runtime/device_backend.h"

namespace pstar {

// CUDA devices this process can use; 0 when there is no driver or no device.
// Never aborts.
int CudaDeviceCount();

// Total memory of CUDA device `device_ordinal` in bytes; 0 when it cannot be read.
int64_t CudaDeviceMemoryBytes(int device_ordinal);

// The name of CUDA device `device_ordinal` (cudaDeviceProp::name, the key of
// the kernel tuning table); "" when it cannot be read.
std::string CudaDeviceName(int device_ordinal);
// Its compute capability as 10 * major + minor (90 for sm_90); 0 when it
// cannot be read.
int CudaComputeCapability(int device_ordinal);

// A backend on device `device_ordinal`, which becomes the calling thread's
// current device. Fails, saying why, when that device does not exist or its
// streams cannot be created.
Result<std::unique_ptr<DeviceBackend>> MakeCudaBackend(int device_ordinal);

}  // namespace pstar
