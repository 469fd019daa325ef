// Shared by the CUDA kernels: launch checking and the element types.
//
// Every kernel entry point takes the stream it is queued on as its last
// argument and returns at once; nothing here synchronizes the host. A failed
// launch (bad configuration, no device) is a programming error and aborts
// with the kernel's name; errors of the kernels themselves surface at the
// next synchronization, which the backend checks.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace pstar::kernels::cuda {

// The 16-bit storage formats, as CUDA spells them. Kernels templated on an
// element type T are instantiated for float, bf16 and fp16; arithmetic is
// always fp32.
using bf16 = __nv_bfloat16;
using fp16 = __half;

// Aborts with `what` and CUDA's message when the last launch failed; under
// PSTAR_CUDA_SYNC=1 it also waits for the kernel (see SyncCheck).
void CheckLaunch(const char* what);

// PSTAR_CUDA_SYNC=1 (read once, at the first call) makes every launch and
// copy synchronous: SyncCheck then waits for the device and aborts naming
// `what` when the queued work faulted, so an asynchronous fault names its
// own kernel instead of the next launch. Without it SyncCheck does nothing.
// For finding faults only: it serializes the streams.
bool SyncEveryLaunch();
void SyncCheck(const char* what);

// Blocks of `threads` covering n elements.
inline unsigned BlocksFor(int64_t n, unsigned threads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

}  // namespace pstar::kernels::cuda
