// A host emulation of what the tensor-core kernels use of CUDA, so that their
// code runs (slowly) on a machine without a GPU: one std::thread per CUDA
// thread of a block, std::barrier for __syncthreads and __syncwarp, warp
// reductions through a per-warp exchange, and WMMA fragments as whole 16x16
// matrices that lane 0 of a warp loads, multiplies and stores (between two
// warp barriers) for the warp: the kernels only ever hand fragments to WMMA
// calls, so the other lanes' copies are never read. It checks indexing,
// masking and the barriers' placement, not the hardware's fragment layouts,
// alignment or speed; the GPU tests do that.
//
// CUDA's built-in names (threadIdx, blockIdx, blockDim) must be plain names
// here, so they are thread_local variables that RunBlocks sets per emulated
// thread. Include this before the kernels, inside no namespace. Elements are
// float or Bf16 (below).
#pragma once

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "kernels/half.h"

namespace pstar::test::emulation {

struct Dim3 {
  unsigned x = 0, y = 0, z = 0;
};

constexpr int kWarpSize = 32;

// One block's shared state: its barriers, the warps' exchange slots and the
// dynamic shared memory.
struct Block {
  explicit Block(unsigned threads, size_t shared_bytes)
      : all(threads), exchange(threads), shared(shared_bytes + 128, 0xCD) {  // uninitialized, as on a GPU
    for (unsigned w = 0; w < (threads + kWarpSize - 1) / kWarpSize; ++w) {
      warps.push_back(std::make_unique<std::barrier<>>(std::min<unsigned>(kWarpSize, threads - w * kWarpSize)));
    }
  }
  std::barrier<> all;
  std::vector<std::unique_ptr<std::barrier<>>> warps;
  std::vector<float> exchange;
  std::vector<unsigned char> shared;
};

inline thread_local Block* current_block = nullptr;

}  // namespace pstar::test::emulation

inline thread_local pstar::test::emulation::Dim3 threadIdx, blockIdx, blockDim;

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(threads)
#define __align__(bytes)

inline void __syncthreads() { pstar::test::emulation::current_block->all.arrive_and_wait(); }
inline void __syncwarp() {
  pstar::test::emulation::current_block->warps[threadIdx.x / pstar::test::emulation::kWarpSize]->arrive_and_wait();
}

namespace pstar::test::emulation {

// Every lane gets the same result, as from CUDA's butterfly reductions.
template <typename Combine>
float WarpReduce(float v, float init, Combine combine) {
  Block& b = *current_block;
  const unsigned warp = threadIdx.x / kWarpSize;
  __syncwarp();
  b.exchange[threadIdx.x] = v;
  __syncwarp();
  float r = init;
  const unsigned first = warp * kWarpSize, last = std::min<unsigned>(first + kWarpSize, unsigned(b.exchange.size()));
  for (unsigned i = first; i < last; ++i) r = combine(r, b.exchange[i]);
  __syncwarp();
  return r;
}
inline float WarpSum(float v) {
  return WarpReduce(v, 0.0f, [](float a, float b) { return a + b; });
}
inline float WarpMax(float v) {
  return WarpReduce(v, -INFINITY, [](float a, float b) { return std::fmax(a, b); });
}
inline unsigned char* TensorCoreSharedMemory() { return current_block->shared.data(); }

// A 16-bit element for the kernels' 16-bit instantiations: bfloat16's bits,
// narrowed to nearest even as __float2bfloat16_rn does, so that their
// 16-byte loads, narrowing loads and 16-bit tile layouts run here too.
struct Bf16 {
  uint16_t bits = 0;
  Bf16() = default;
  explicit Bf16(float f) : bits(kernels::FloatToBFloat16(f)) {}
  explicit operator float() const { return kernels::BFloat16ToFloat(bits); }
};
static_assert(sizeof(Bf16) == 2, "a tile of Bf16 is laid out as the GPU's bf16");

inline float ToFloat(float x) { return x; }
inline float ToFloat(Bf16 x) { return float(x); }
template <typename T>
inline T FromFloat(float x) {
  return T(x);
}
using std::min;

// Runs kernel() as a grid of blocks, one block at a time, on one thread per
// CUDA thread (the same threads for every block; shared memory is refilled
// with garbage between blocks).
inline void RunBlocks(Dim3 grid, unsigned threads, size_t shared_bytes, const std::function<void()>& kernel) {
  Block block(threads, shared_bytes);
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      current_block = &block;
      threadIdx = {t, 0, 0};
      blockDim = {threads, 1, 1};
      for (unsigned by = 0; by < grid.y; ++by) {
        for (unsigned bx = 0; bx < grid.x; ++bx) {
          blockIdx = {bx, by, 0};
          kernel();
          block.all.arrive_and_wait();  // every thread is done with the block
          if (t == 0) std::fill(block.shared.begin(), block.shared.end(), 0xCD);
          block.all.arrive_and_wait();
        }
      }
    });
  }
  for (std::thread& th : pool) th.join();
}

}  // namespace pstar::test::emulation

// WMMA, 16x16x16 only: lane 0 of each warp holds the whole tile.
namespace nvcuda::wmma {
inline bool HoldsTiles() { return threadIdx.x % pstar::test::emulation::kWarpSize == 0; }

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "the emulation has 16x16x16 tiles only");
  float x[16][16];
};

template <typename F>
void fill_fragment(F& f, float v) {
  if (!HoldsTiles()) return;
  for (auto& row : f.x) std::fill(std::begin(row), std::end(row), v);
}
template <int M, int N, int K, typename T>
void load_matrix_sync(fragment<matrix_a, M, N, K, T, row_major>& f, const T* p, unsigned ld) {
  if (!HoldsTiles()) return;
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) f.x[r][c] = float(p[r * ld + c]);
}
template <int M, int N, int K, typename T>
void load_matrix_sync(fragment<matrix_b, M, N, K, T, row_major>& f, const T* p, unsigned ld) {
  if (!HoldsTiles()) return;
  for (int k = 0; k < 16; ++k)
    for (int n = 0; n < 16; ++n) f.x[k][n] = float(p[k * ld + n]);
}
template <int M, int N, int K, typename T>
void load_matrix_sync(fragment<matrix_b, M, N, K, T, col_major>& f, const T* p, unsigned ld) {
  if (!HoldsTiles()) return;
  for (int k = 0; k < 16; ++k)
    for (int n = 0; n < 16; ++n) f.x[k][n] = float(p[k + n * ld]);
}
template <int M, int N, int K, typename T>
void load_matrix_sync(fragment<accumulator, M, N, K, T>& f, const float* p, unsigned ld, layout_t layout) {
  if (!HoldsTiles()) return;
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) f.x[r][c] = layout == mem_row_major ? p[r * ld + c] : p[r + c * ld];
}
template <int M, int N, int K, typename T>
void store_matrix_sync(float* p, const fragment<accumulator, M, N, K, T>& f, unsigned ld, layout_t layout) {
  __syncwarp();
  if (HoldsTiles()) {
    for (int r = 0; r < 16; ++r)
      for (int c = 0; c < 16; ++c) (layout == mem_row_major ? p[r * ld + c] : p[r + c * ld]) = f.x[r][c];
  }
  __syncwarp();
}
template <typename D, typename A, typename B, typename C>
void mma_sync(D& d, const A& a, const B& b, const C& c) {
  if (!HoldsTiles()) return;
  float out[16][16];
  for (int m = 0; m < 16; ++m) {
    for (int n = 0; n < 16; ++n) {
      float s = c.x[m][n];
      for (int k = 0; k < 16; ++k) s += a.x[m][k] * b.x[k][n];
      out[m][n] = s;
    }
  }
  std::memcpy(d.x, out, sizeof out);
}
}  // namespace nvcuda::wmma
