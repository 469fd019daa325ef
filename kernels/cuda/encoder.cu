// Token + position embedding.
//
// The backward pass is deterministic without atomics. dwpe: one thread per
// (t, c) adds dout[b, t, c] for b = 0, 1, ... in order; with a positions
// array (packed examples), as dwte below with the positions for tokens.
// dwte: the positions
// are sorted by (token, position) on the device, so every token's positions
// form one run in (b, t) order; the first position of each run then walks the
// run, adding its dout rows one after the other. Both start from the existing
// gradient and add in fp32 in (b, t) order, exactly as the CPU kernel does, so
// fp32 results equal the CPU's bit for bit.
//
// Cost of dwte, for n = B * T positions and P = n rounded up to a power of
// two (at least 2): a bitonic sort of P 64-bit keys, P/2 * log2(P) *
// (log2(P) + 1) / 2 compare-exchanges. Tiles of kSortTile keys are sorted and
// merged in shared memory and only longer strides go through global memory:
// 2 + L + L(L+1)/2 launches for L = log2(P / kSortTile) (0 when P is at most
// kSortTile). Then one pass reading every dout row once, in blocks of
// (position, channel chunk); a token that occurs r times is summed serially
// over its r rows, so a very frequent token lengthens that pass.
// Scratch: 2 * P + 2 int32 (the keys, 8-byte aligned inside it).
#include "kernels/cuda/encoder.h"

#include <cstdint>

#include "kernels/cuda/element.cuh"

namespace pstar::kernels::cuda {
namespace {

constexpr unsigned kThreads = 256;
constexpr int kPer = 8;  // forward: consecutive channels per thread

// Keys sorted in shared memory by one block of kSortTile / 2 threads (16 KiB).
constexpr int64_t kSortTile = 2048;

template <typename T>
struct alignas(sizeof(T) * kPer) Pack {
  T v[kPer];
};

template <typename T>
bool PackAligned(const T* p) {
  return reinterpret_cast<uintptr_t>(p) % sizeof(Pack<T>) == 0;
}

// Each thread computes kPer consecutive elements of the flattened (B*T, C)
// output, for the tokens in table rows [row0, row0 + rows) (row r of the
// table at wte + (r - row0) * C); the others' rows are left as they are.
// wpe null: no position term; positions null: row t's position is t. `vec`:
// C is a multiple of kPer and every
// pointer is pack-aligned, so a thread's elements are one aligned pack of a
// single row.
template <typename T>
__global__ void EncoderForwardKernel(T* out, const int32_t* tokens, const int32_t* positions, const T* wte,
                                     const T* wpe, int64_t n, int64_t Tlen, int64_t C, int64_t row0, int64_t rows,
                                     bool vec) {
  const int64_t i0 = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * kPer;
  if (i0 >= n) return;
  if (vec) {  // then n is a multiple of kPer too
    const int64_t bt = i0 / C, c = i0 % C;
    const int64_t row = int64_t(tokens[bt]) - row0;
    if (row < 0 || row >= rows) return;
    const Pack<T> e = *reinterpret_cast<const Pack<T>*>(wte + row * C + c);
    Pack<T> o;
    if (wpe != nullptr) {
      const int64_t pos = positions != nullptr ? int64_t(positions[bt]) : bt % Tlen;
      const Pack<T> p = *reinterpret_cast<const Pack<T>*>(wpe + pos * C + c);
#pragma unroll
      for (int k = 0; k < kPer; ++k) o.v[k] = FromFloat<T>(ToFloat(e.v[k]) + ToFloat(p.v[k]));
    } else {
      o = e;
    }
    *reinterpret_cast<Pack<T>*>(out + i0) = o;
  } else {
    const int64_t end = n - i0 < kPer ? n : i0 + kPer;
    for (int64_t i = i0; i < end; ++i) {
      const int64_t bt = i / C, c = i % C;
      const int64_t row = int64_t(tokens[bt]) - row0;
      if (row < 0 || row >= rows) continue;
      const int64_t pos = positions != nullptr ? int64_t(positions[bt]) : bt % Tlen;
      const float p = wpe != nullptr ? ToFloat(wpe[pos * C + c]) : 0.0f;
      out[i] = wpe != nullptr ? FromFloat<T>(ToFloat(wte[row * C + c]) + p) : wte[row * C + c];
    }
  }
}

// dwpe[t, c] += dout[0, t, c] + dout[1, t, c] + ..., left to right.
template <typename T>
__global__ void PositionGradKernel(T* dwpe, const T* dout, int64_t B, int64_t Tlen, int64_t C) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;  // t * C + c
  if (i >= Tlen * C) return;
  float acc = ToFloat(dwpe[i]);
  for (int64_t b = 0; b < B; ++b) acc += ToFloat(dout[b * Tlen * C + i]);
  dwpe[i] = FromFloat<T>(acc);
}

// Key of position i: token in the high 32 bits, position in the low ones,
// so keys are distinct and sort by token, then position. Positions past n
// get the largest key and sort last.
__global__ void SortKeysInitKernel(uint64_t* keys, const int32_t* tokens, int64_t n, int64_t P) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= P) return;
  keys[i] = i < n ? (uint64_t(uint32_t(tokens[i])) << 32) | uint64_t(i) : ~uint64_t{0};
}

// The lower index i of pair t in a bitonic step of stride j (a power of two):
// t with a zero inserted at bit j, so i has bit j clear and its partner is
// i + j. Pairs 0 .. P/2 - 1 cover every index once.
__device__ __forceinline__ int64_t PairLow(int64_t t, int64_t j) { return ((t & ~(j - 1)) << 1) | (t & (j - 1)); }

// Bitonic compare-exchange of keys i < l in the direction of stage k: the
// block of k keys holding i sorts ascending when bit k of i is clear.
__device__ __forceinline__ void CompareExchange(uint64_t& a, uint64_t& b, bool ascending) {
  if ((a > b) == ascending) {
    const uint64_t x = a;
    a = b;
    b = x;
  }
}

// One step (k, j) with j >= kSortTile over all P keys in global memory; one
// thread per pair, P / 2 threads.
__global__ void BitonicGlobalStepKernel(uint64_t* keys, int64_t P, int64_t k, int64_t j) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= P / 2) return;
  const int64_t i = PairLow(t, j);
  CompareExchange(keys[i], keys[i + j], (i & k) == 0);
}

// Stages k = k_first, 2 k_first, ..., k_last, each with its steps j from
// min(k, tile) / 2 down to 1, on tiles of `tile` keys (a power of two, at most
// kSortTile) held in shared memory; one block of tile / 2 threads per tile.
// Steps with j < tile never cross a tile, so a block needs no other.
__global__ void BitonicTileKernel(uint64_t* keys, int64_t tile, int64_t k_first, int64_t k_last) {
  __shared__ uint64_t s[kSortTile];
  const int64_t base = int64_t(blockIdx.x) * tile;
  const int64_t t = threadIdx.x;  // pair index, 0 .. tile / 2 - 1
  s[t] = keys[base + t];
  s[t + tile / 2] = keys[base + t + tile / 2];
  __syncthreads();
  for (int64_t k = k_first; k <= k_last; k *= 2) {
    for (int64_t j = (k < tile ? k : tile) / 2; j > 0; j /= 2) {
      const int64_t i = PairLow(t, j);
      CompareExchange(s[i], s[i + j], ((base + i) & k) == 0);
      __syncthreads();
    }
  }
  keys[base + t] = s[t];
  keys[base + t + tile / 2] = s[t + tile / 2];
}

// Block (s, chunk): when sorted key s is the first of its token's run and
// the token is in table rows [row0, row0 + rows), adds the run's dout rows,
// in position order, into that token's row of dwte (row r at
// dwte + (r - row0) * C), for
// the chunk's channels. Other blocks return at once. The run is read
// kRunStep rows at a time, so that many loads are in flight; the rows of a
// step that belong to the run are a prefix of it (the keys are sorted) and
// are added in order.
constexpr int kRunStep = 4;

template <typename T>
__global__ void TokenGradKernel(T* dwte, const uint64_t* keys, const T* dout, int64_t n, int64_t C, int64_t row0,
                                int64_t rows) {
  const int64_t s = blockIdx.x;
  const int64_t c = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const uint32_t token = uint32_t(keys[s] >> 32);
  if (s > 0 && uint32_t(keys[s - 1] >> 32) == token) return;
  const int64_t table_row = int64_t(token) - row0;
  if (table_row < 0 || table_row >= rows) return;
  T* row = dwte + table_row * C;
  float acc = ToFloat(row[c]);
  for (int64_t r = s;; r += kRunStep) {
    float d[kRunStep];
    bool in_run[kRunStep];
#pragma unroll
    for (int u = 0; u < kRunStep; ++u) {
      const uint64_t key = r + u < n ? keys[r + u] : ~uint64_t{0};
      in_run[u] = r + u < n && uint32_t(key >> 32) == token;
      d[u] = in_run[u] ? ToFloat(dout[int64_t(key & 0xFFFFFFFFu) * C + c]) : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kRunStep; ++u) {
      if (in_run[u]) acc += d[u];
    }
    if (!in_run[kRunStep - 1]) break;
  }
  row[c] = FromFloat<T>(acc);
}

// Keys to sort: n rounded up to a power of two, at least 2.
int64_t SortSize(int64_t n) {
  int64_t p = 2;
  while (p < n) p *= 2;
  return p;
}

}  // namespace

namespace {

template <typename T>
void EncoderRows(T* out, const int32_t* tokens, const int32_t* positions, const T* wte, const T* wpe, int64_t row0,
                 int64_t rows, int64_t B, int64_t Tlen, int64_t C, cudaStream_t stream, const char* what) {
  const int64_t n = B * Tlen * C;
  if (n <= 0) return;
  const bool vec = C % kPer == 0 && PackAligned(out) && PackAligned(wte) && (wpe == nullptr || PackAligned(wpe));
  EncoderForwardKernel<<<BlocksFor((n + kPer - 1) / kPer, kThreads), kThreads, 0, stream>>>(
      out, tokens, positions, wte, wpe, n, Tlen, C, row0, rows, vec);
  CheckLaunch(what);
}

// The keys sorted by (token, position), then each run of a token in
// [row0, row0 + rows) added into its row.
template <typename T>
void TokenGrad(T* dwte, int32_t* scratch, const T* dout, const int32_t* tokens, int64_t row0, int64_t rows,
               int64_t n, int64_t C, cudaStream_t stream) {
  uint64_t* keys = reinterpret_cast<uint64_t*>(scratch + (reinterpret_cast<uintptr_t>(scratch) % 8 == 0 ? 0 : 1));
  const int64_t P = SortSize(n);
  const int64_t tile = P < kSortTile ? P : kSortTile;
  const unsigned tiles = static_cast<unsigned>(P / tile);
  const unsigned tile_threads = static_cast<unsigned>(tile / 2);
  SortKeysInitKernel<<<BlocksFor(P, kThreads), kThreads, 0, stream>>>(keys, tokens, n, P);
  CheckLaunch("EncoderBackward (sort keys)");
  BitonicTileKernel<<<tiles, tile_threads, 0, stream>>>(keys, tile, 2, tile);
  CheckLaunch("EncoderBackward (sort tiles)");
  for (int64_t k = 2 * tile; k <= P; k *= 2) {
    for (int64_t j = k / 2; j >= tile; j /= 2) {
      BitonicGlobalStepKernel<<<BlocksFor(P / 2, kThreads), kThreads, 0, stream>>>(keys, P, k, j);
      CheckLaunch("EncoderBackward (sort merge)");
    }
    BitonicTileKernel<<<tiles, tile_threads, 0, stream>>>(keys, tile, k, k);
    CheckLaunch("EncoderBackward (sort tiles)");
  }
  const dim3 grid(static_cast<unsigned>(n), BlocksFor(C, kThreads));
  TokenGradKernel<<<grid, kThreads, 0, stream>>>(dwte, keys, dout, n, C, row0, rows);
  CheckLaunch("EncoderBackward (dwte)");
}

constexpr int64_t kWholeTable = INT64_MAX;

}  // namespace

template <typename T>
void EncoderForward(T* out, const int32_t* tokens, const int32_t* positions, const T* wte, const T* wpe, int64_t B,
                    int64_t Tlen, int64_t C, cudaStream_t stream) {
  EncoderRows(out, tokens, positions, wte, wpe, 0, kWholeTable, B, Tlen, C, stream, "EncoderForward");
}

template <typename T>
void EncoderPartForward(T* out, const int32_t* tokens, const T* part, int64_t row0, int64_t rows, int64_t B,
                        int64_t Tlen, int64_t C, cudaStream_t stream) {
  EncoderRows(out, tokens, static_cast<const int32_t*>(nullptr), part, static_cast<const T*>(nullptr), row0, rows, B,
              Tlen, C, stream, "EncoderPartForward");
}

int64_t EncoderBackwardScratchElements(int64_t B, int64_t Tlen) {
  const int64_t n = B * Tlen;
  if (n <= 0) return 0;
  return 2 * SortSize(n) + 2;  // P uint64 keys, plus room to align them to 8 bytes
}

template <typename T>
void EncoderBackward(T* dwte, T* dwpe, int32_t* scratch, const T* dout, const int32_t* tokens,
                     const int32_t* positions, int64_t B, int64_t Tlen, int64_t C, cudaStream_t stream) {
  const int64_t n = B * Tlen;
  if (n <= 0 || C <= 0) return;
  if (dwpe != nullptr && positions != nullptr) {
    // Each position's rows in (b, t) order, as the tokens' below (the
    // scratch is used by one sort after the other, on one stream).
    TokenGrad(dwpe, scratch, dout, positions, 0, kWholeTable, n, C, stream);
  } else if (dwpe != nullptr) {
    PositionGradKernel<<<BlocksFor(Tlen * C, kThreads), kThreads, 0, stream>>>(dwpe, dout, B, Tlen, C);
    CheckLaunch("EncoderBackward (dwpe)");
  }
  TokenGrad(dwte, scratch, dout, tokens, 0, kWholeTable, n, C, stream);
}

template <typename T>
void EncoderPartBackward(T* dpart, int32_t* scratch, const T* dout, const int32_t* tokens, int64_t row0, int64_t rows,
                         int64_t B, int64_t Tlen, int64_t C, cudaStream_t stream) {
  const int64_t n = B * Tlen;
  if (n <= 0 || C <= 0 || rows <= 0) return;
  TokenGrad(dpart, scratch, dout, tokens, row0, rows, n, C, stream);
}

#define PSTAR_ENCODER(T)                                                                                      \
  template void EncoderForward<T>(T*, const int32_t*, const int32_t*, const T*, const T*, int64_t, int64_t,  \
                                  int64_t, cudaStream_t);                                                     \
  template void EncoderBackward<T>(T*, T*, int32_t*, const T*, const int32_t*, const int32_t*, int64_t,       \
                                   int64_t, int64_t, cudaStream_t);                                            \
  template void EncoderPartForward<T>(T*, const int32_t*, const T*, int64_t, int64_t, int64_t, int64_t,       \
                                      int64_t, cudaStream_t);                                                  \
  template void EncoderPartBackward<T>(T*, int32_t*, const T*, const int32_t*, int64_t, int64_t, int64_t,     \
                                       int64_t, int64_t, cudaStream_t);
PSTAR_ENCODER(float)
PSTAR_ENCODER(bf16)
PSTAR_ENCODER(fp16)
#undef PSTAR_ENCODER

}  // namespace pstar::kernels::cuda
