// The warp-level instructions the mma.sync kernels (attention_mma.cuh) are
// written against, as inline PTX (sm_80 and later): the m16n8k16 tensor-core
// product with fp32 accumulators, ldmatrix (plain and transposed), cp.async
// (16 bytes, zero-filled past the source's end), the butterfly shuffle, and
// the counters that order blocks' additions into one fp32 accumulator
// (acquire and release at GPU scope, loads and stores that skip L1).
// tests/kernels/cuda/warp_emulation.h gives the same names on the host, with
// the per-lane fragment layouts of the PTX ISA, so the kernels' indexing is
// checked without a GPU.
//
// Fragment layouts (PTX ISA, "mma.m16n8k16"), lane = 4 g + t:
//   A (16 x 16, row-major): a[0] = row g, columns 2t and 2t+1 (low half
//     first); a[1] = row g+8, the same columns; a[2] and a[3] the same rows,
//     columns 2t+8 and 2t+9.
//   B (16 x 8, k x n): b[0] = rows (k) 2t and 2t+1 of column g; b[1] = rows
//     2t+8 and 2t+9.
//   C, D (16 x 8, fp32): d[0], d[1] = row g, columns 2t and 2t+1; d[2], d[3]
//     = row g+8.
// ldmatrix .x4: lanes 8i..8i+7 give the row addresses of 8 x 8 matrix i (16
// bytes each); register i of every lane receives row g, columns 2t and 2t+1
// of matrix i, or with .trans rows 2t and 2t+1 of column g.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace pstar::kernels::cuda {
namespace {

// d += a b for 16-bit A and B (bf16 or fp16), fp32 C and D.
template <typename T>
__device__ __forceinline__ void MmaM16N8K16(float* d, const uint32_t* a, const uint32_t* b);

template <>
__device__ __forceinline__ void MmaM16N8K16<__nv_bfloat16>(float* d, const uint32_t* a, const uint32_t* b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

template <>
__device__ __forceinline__ void MmaM16N8K16<__half>(float* d, const uint32_t* a, const uint32_t* b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

__device__ __forceinline__ uint32_t SharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8 x 8 matrices of 16-bit elements from shared memory; `row` is this
// lane's row address (lane 8i + r: row r of matrix i).
__device__ __forceinline__ void LdMatrixX4(uint32_t* r, const void* row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SharedAddress(row)));
#endif
}

__device__ __forceinline__ void LdMatrixX4Trans(uint32_t* r, const void* row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SharedAddress(row)));
#endif
}

// 16 bytes from global to shared memory without passing through registers;
// zeros where `valid` is false (src is then not read).
__device__ __forceinline__ void CpAsync16(void* dst, const void* src, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SharedAddress(dst)), "l"(src),
               "r"(valid ? 16 : 0));
#endif
}

// Closes the group of this thread's copies issued since the last commit.
__device__ __forceinline__ void CpAsyncCommit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}

// Waits until at most `kPending` of this thread's committed groups are in
// flight (the newest ones).
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
#endif
}

__device__ __forceinline__ float ShflXor(float v, int mask) { return __shfl_xor_sync(0xffffffffu, v, mask); }

// One 32-bit word (a packed pair) into shared memory, 4-byte aligned.
__device__ __forceinline__ void StoreShared32(void* p, uint32_t v) { *reinterpret_cast<uint32_t*>(p) = v; }

// Spins until *count (global memory) reads `want`, with acquire semantics at
// GPU scope: what the block that released `want` wrote before it is visible
// after. One thread calls it; a __syncthreads follows.
__device__ __forceinline__ void WaitForCount(const int* count, int want) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  int seen;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(seen) : "l"(count) : "memory");
  while (seen != want) {
    __nanosleep(64);  // leaves the SM's issue slots to the blocks that will release it
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(seen) : "l"(count) : "memory");
  }
#endif
}

// The next number of a counter in global memory (zero at launch): blocks
// that take their work in ticket order have, when one waits on work of a
// smaller ticket, started that work already, whatever order the GPU started
// the blocks in. One thread calls it.
__device__ __forceinline__ int TakeTicket(int* counter) { return atomicAdd(counter, 1); }

// Every thread's writes so far are visible at GPU scope before its later ones.
__device__ __forceinline__ void FenceDevice() { __threadfence(); }

// *count = value with release semantics at GPU scope. One thread calls it,
// after every thread's FenceDevice and a __syncthreads.
__device__ __forceinline__ void ReleaseCount(int* count, int value) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(count), "r"(value) : "memory");
#endif
}

// Two fp32 values from (to) global memory through L2 only: another block's
// writes, ordered by the counters above, are never read from a stale L1 line.
__device__ __forceinline__ float2 LoadPairL2(const float* p) { return __ldcg(reinterpret_cast<const float2*>(p)); }
__device__ __forceinline__ void StorePairL2(float* p, float2 v) { __stcg(reinterpret_cast<float2*>(p), v); }

// Two values rounded to T and packed as one register, `lo` in the low half.
template <typename T>
__device__ __forceinline__ uint32_t PackPair(float lo, float hi);

template <>
__device__ __forceinline__ uint32_t PackPair<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

template <>
__device__ __forceinline__ uint32_t PackPair<__half>(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

}  // namespace
}  // namespace pstar::kernels::cuda
