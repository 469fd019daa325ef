// The FlashAttention-2-class forward for 16-bit elements at head sizes 64 and
// 128 (included by attention.cu inside its anonymous namespace, and by a host
// test that runs it on an emulation of threads, mma.sync, ldmatrix, cp.async
// and shuffles). Written against what both provide: threadIdx, blockIdx,
// blockDim, __syncthreads, TensorCoreSharedMemory(), FromFloat, min, kBlock,
// kWarpSize and the primitives of mma_primitives.cuh.
//
// The blocking is the other kernels' (64 queries per thread block, key blocks
// of 64 up to the diagonal, the online softmax in fp32), or 128 queries on 8
// warps (each k and v tile then serves twice the rows), with what a
// FlashAttention-2 kernel keeps where:
// - each warp owns 16 query rows; its q fragments, S (16 x 64) and the
//   O accumulator (16 x head size) live in registers, never in shared memory;
// - S = q k^T and O += P v are m16n8k16 mma.sync products in fp32, their
//   operands read with ldmatrix (v transposed on the way);
// - P goes from S's accumulator registers straight into the A operand of
//   P v (the accumulator of two adjacent n-tiles is laid out as one A
//   fragment), rounded to the element type as FlashAttention does;
// - k and v tiles are double-buffered: the next key block's cp.async copies
//   run under this block's products;
// - on the key blocks the diagonal crosses a warp computes only the 8-key
//   n-tiles its rows can see (2w + 2 of 8 for warp w of 4), in both
//   products, and none of a block its rows cannot see;
// - the softmax runs in base 2 (exp2 of scores pre-scaled by log2(e)), each
//   row's max and sum over the 4 lanes that hold it by two shuffles.
// Rows sit 8 elements (16 bytes) past their width in shared memory, so the 8
// row addresses of an ldmatrix fall in different banks and every row starts
// 16-byte aligned. The caller checks what the copies need: qkv 16-byte
// aligned and C a multiple of 8.
#pragma once

constexpr int kMmaWarps = 4;
constexpr int kMmaPad = 8;

template <int HS>
constexpr int MmaLd() {
  return HS + kMmaPad;
}

// The q tile (16 rows a warp) and two buffers each of k and v, 16-bit
// elements; with kSharedQ the q tile lies in the second k buffer (four
// tiles of 64 rows).
template <int HS, bool kSharedQ = false, int kWarps = kMmaWarps>
constexpr size_t MmaForwardSharedBytes() {
  return (size_t(kSharedQ ? 0 : 16 * kWarps) + size_t(4 * kBlock)) * size_t(MmaLd<HS>()) * 2;
}

// rows x HS elements of src (rows ld_src apart) into a tile of kRows rows,
// 16 bytes per cp.async, zeros past `rows`. Every thread issues its share;
// the caller commits the group.
template <int HS, int kRows = kBlock, typename T>
__device__ __forceinline__ void MmaLoadTile(T* tile, const T* src, int64_t ld_src, int rows) {
  constexpr int kPieces = HS / 8;
  for (int e = int(threadIdx.x); e < kRows * kPieces; e += int(blockDim.x)) {
    const int r = e / kPieces, d = (e % kPieces) * 8;
    const bool live = r < rows;
    CpAsync16(tile + r * MmaLd<HS>() + d, live ? src + int64_t(r) * ld_src + d : src, live);
  }
}

// A warp's 16 q rows of the q tile as A fragments: matrices (rows 0-7,
// 8-15) x (columns 0-7, 8-15) of each 16-column step.
template <int HS, typename T>
__device__ __forceinline__ void MmaLoadQueryFragments(uint32_t (&qf)[HS / 16][4], const T* qs, int warp, int lane) {
  const int mi = lane / 8, mr = lane % 8;
#pragma unroll
  for (int kk = 0; kk < HS / 16; ++kk) {
    LdMatrixX4(qf[kk], qs + (warp * 16 + (mi & 1) * 8 + mr) * MmaLd<HS>() + kk * 16 + (mi >> 1) * 8);
  }
}

// kSharedQ: the q tile is copied into the second k buffer and read into
// registers before the first prefetch reuses that buffer, so the block
// needs four tiles of shared memory instead of five (at head size 128, 70
// KiB instead of 87: three blocks per SM where registers allow three); the
// same arithmetic in the same order, so the same bits.
// kWarps: 16 query rows a warp, 4 (64 queries a block) or 8 (128). Each row
// meets the same key blocks in the same order either way (a block its rows
// cannot see is skipped), so the same bits.
template <typename T, int HS, bool kSharedQ = false, int kWarps = kMmaWarps>
__global__ void __launch_bounds__(kWarps* kWarpSize)
    MmaFlashForward(T* out, float* lse, const T* qkv, int64_t Tlen, QkvRows L, float scale_log2) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  static_assert(!kSharedQ || kWarps == kMmaWarps, "the q tile fits a k buffer only at 64 queries");
  constexpr int kQueries = 16 * kWarps;
  constexpr int ld = MmaLd<HS>();
  constexpr int kSteps = HS / 16;    // k-steps of q k^T
  constexpr int kDimTiles = HS / 8;  // n-tiles of O
  constexpr float kLn2 = 0.69314718055994531f;
  T* base = reinterpret_cast<T*>(TensorCoreSharedMemory());
  T* ks = kSharedQ ? base : base + kQueries * ld;  // two buffers
  T* vs = ks + 2 * kBlock * ld;                  // two buffers
  T* qs = kSharedQ ? ks + kBlock * ld : base;

  const int NH = L.NH;
  const int64_t C = L.out, bh = blockIdx.x, b = bh / NH, h = bh % NH;
  const int64_t kv = h / (NH / L.NKV);  // the key/value head h reads
  const int64_t nq = (Tlen + kQueries - 1) / kQueries;
  const int64_t i = nq - 1 - int64_t(blockIdx.y);  // the longest rows first
  const int64_t r0 = i * kQueries, C3 = L.qkv;
  const int rows = int(min(int64_t(kQueries), Tlen - r0));
  const int64_t last = (r0 + rows - 1) / kBlock;  // the key block of the block's last row
  const T* q = qkv + b * Tlen * C3 + h * HS;
  const T* keys = qkv + b * Tlen * C3 + (NH + kv) * HS;
  const T* values = keys + int64_t(L.NKV) * HS;
  const int warp = int(threadIdx.x) / kWarpSize, lane = int(threadIdx.x) % kWarpSize;
  const int g = lane / 4, tq = lane % 4;   // the fragments' row group and thread in the group
  const int mi = lane / 8, mr = lane % 8;  // ldmatrix: the matrix this lane addresses, and its row

  MmaLoadTile<HS, kQueries>(qs, q + r0 * C3, C3, rows);
  const int cols0 = int(min(int64_t(kBlock), Tlen));
  MmaLoadTile<HS>(ks, keys, C3, cols0);
  MmaLoadTile<HS>(vs, values, C3, cols0);
  CpAsyncCommit();

  uint32_t qf[kSteps][4];
  if constexpr (kSharedQ) {
    CpAsyncWait<0>();
    __syncthreads();
    MmaLoadQueryFragments<HS>(qf, qs, warp, lane);
    __syncthreads();  // every warp holds its q before the first prefetch overwrites the tile
  }
  float o[kDimTiles][4];
#pragma unroll
  for (int dt = 0; dt < kDimTiles; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // rows g and g + 8; m in base 2
  const int64_t t_row[2] = {r0 + warp * 16 + g, r0 + warp * 16 + g + 8};
  const int64_t first_key[2] = {t_row[0] < Tlen ? FirstVisibleKey(L.positions, b, Tlen, t_row[0]) : 0,
                                t_row[1] < Tlen ? FirstVisibleKey(L.positions, b, Tlen, t_row[1]) : 0};

  for (int64_t j = 0; j <= last; ++j) {
    const int buf = int(j & 1);
    if (j < last) {  // the next key block into the other buffer, under this one's products
      const int64_t c1 = (j + 1) * kBlock;
      const int cols1 = int(min(int64_t(kBlock), Tlen - c1));
      MmaLoadTile<HS>(ks + (1 - buf) * kBlock * ld, keys + c1 * C3, C3, cols1);
      MmaLoadTile<HS>(vs + (1 - buf) * kBlock * ld, values + c1 * C3, C3, cols1);
      CpAsyncCommit();
      CpAsyncWait<1>();  // all but that group have landed
    } else {
      CpAsyncWait<0>();
    }
    __syncthreads();
    if (!kSharedQ && j == 0) MmaLoadQueryFragments<HS>(qf, qs, warp, lane);
    const T* kt = ks + buf * kBlock * ld;
    const T* vt = vs + buf * kBlock * ld;
    const int64_t c0 = j * kBlock;
    // Warp w's rows see keys up to r0 + 16 w + 15: the n-tiles that hold any.
    const int64_t reach = r0 + 16 * warp + 15 - c0;
    const int tiles = reach < 0 ? 0 : int(min(int64_t(8), reach / 8 + 1));
    if (tiles > 0) {
      // S (16 x 64) = q k^T: k's rows are B's columns, read as they lie.
      float s[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk) {
#pragma unroll
      for (int nt = 0; nt < 8; nt += 2) {
        if (nt < tiles) {
          uint32_t kb[4];  // n-tiles nt and nt + 1, each both k halves
          LdMatrixX4(kb, kt + ((nt + (mi >> 1)) * 8 + mr) * ld + kk * 16 + (mi & 1) * 8);
          MmaM16N8K16<T>(s[nt], qf[kk], kb);
          MmaM16N8K16<T>(s[nt + 1], qf[kk], kb + 2);
        }
      }
    }

    // The online softmax: scale, mask, the rows' new maxima over their quad.
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t key = c0 + nt * 8 + 2 * tq + (e & 1);
        const float v =
            nt < tiles && key <= t_row[e / 2] && key >= first_key[e / 2] ? s[nt][e] * scale_log2 : -INFINITY;
        s[nt][e] = v;
        mx[e / 2] = fmaxf(mx[e / 2], v);
      }
    }
    float alpha[2], rowsum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], ShflXor(mx[r], 1));
      mx[r] = fmaxf(mx[r], ShflXor(mx[r], 2));
      // No key of the row's example so far: nothing to add, nothing to rescale.
      alpha[r] = mx[r] == -INFINITY ? 1.0f : exp2f(m[r] - mx[r]);
      m[r] = mx[r];
    }
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float p = m[e / 2] == -INFINITY ? 0.0f : exp2f(s[nt][e] - m[e / 2]);
        s[nt][e] = p;
        rowsum[e / 2] += p;
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) l[r] = l[r] * alpha[r] + rowsum[r];
#pragma unroll
    for (int dt = 0; dt < kDimTiles; ++dt) {
      o[dt][0] *= alpha[0];
      o[dt][1] *= alpha[0];
      o[dt][2] *= alpha[1];
      o[dt][3] *= alpha[1];
    }

    // O += P v, 16 keys a step: P's A fragment from S's registers; v's
    // rows are B's k, read transposed.
#pragma unroll
    for (int kstep = 0; kstep < 4; ++kstep) {
      if (2 * kstep < tiles) {
        const uint32_t pa[4] = {PackPair<T>(s[2 * kstep][0], s[2 * kstep][1]),
                                PackPair<T>(s[2 * kstep][2], s[2 * kstep][3]),
                                PackPair<T>(s[2 * kstep + 1][0], s[2 * kstep + 1][1]),
                                PackPair<T>(s[2 * kstep + 1][2], s[2 * kstep + 1][3])};
#pragma unroll
        for (int dt = 0; dt < kDimTiles; dt += 2) {
          uint32_t vb[4];  // n-tiles dt and dt + 1, each both k halves
          LdMatrixX4Trans(vb, vt + (kstep * 16 + (mi & 1) * 8 + mr) * ld + (dt + (mi >> 1)) * 8);
          MmaM16N8K16<T>(o[dt], pa, vb);
          MmaM16N8K16<T>(o[dt + 1], pa, vb + 2);
        }
      }
    }
    }
    __syncthreads();  // every warp is done with this buffer before the next copies into it
  }

  // Each row's sum over its quad, then out = O / l and lse = max + log(l).
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += ShflXor(l[r], 1);
    l[r] += ShflXor(l[r], 2);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = warp * 16 + g + 8 * r;
    if (row >= rows) continue;
    const float inv = 1.0f / l[r];
    T* o_row = out + (b * Tlen + t_row[r]) * C + h * HS;
#pragma unroll
    for (int dt = 0; dt < kDimTiles; ++dt) {
      o_row[dt * 8 + 2 * tq] = FromFloat<T>(o[dt][2 * r] * inv);
      o_row[dt * 8 + 2 * tq + 1] = FromFloat<T>(o[dt][2 * r + 1] * inv);
    }
    if (tq == 0) lse[bh * Tlen + t_row[r]] = (m[r] + log2f(l[r])) * kLn2;
  }
#endif
}

// The mma.sync backward for 16-bit activations and gradients at head sizes
// 64 and 128, in one of two deterministic forms:
// - two passes, as the other kernels (keys: dK and dV per key block;
//   queries: dQ per query block; every gradient element has one writer):
//   seven products, S and dP computed in both passes;
// - one pass of five products (kWithQueries): the keys pass also forms each
//   query block's share of dQ from its dS (through a shared tile) and adds
//   it into an fp32 accumulator in a fixed order, key block i first and key
//   block 0 last, which narrows the sum into dqkv. A count per (batch, head,
//   query block) orders the additions: key block j waits until the i - j
//   blocks above it have added theirs. Blocks take their (batch, head, key
//   block) by a ticket, in the order they start, highest key block first,
//   so each waits only on blocks that started before it, and a block
//   reaches query block i one step after the block above it did: in a
//   steady state no block waits.
// Each form keeps its accumulators in registers, every product an m16n8k16
// mma.sync fed by ldmatrix, P and dS passed from accumulator registers into
// A fragments, the streamed tiles double-buffered by cp.async, and on the
// diagonal block only the n-tiles and k-steps that hold live pairs
// computed. dsum is the rowsum of dout * out (RowDots), lse the forward's.

// The dS^T tile of the five-product pass: 64 keys x 64 queries, padded.
constexpr int kDsLd = int(kBlock) + kMmaPad;

// Keys pass: k and v tiles (16 rows a warp), then two buffers each of q and
// dout tiles, two buffers each of the query block's lse and dsum, and with
// kWithQueries the dS^T tile and the block's ticket (16 bytes).
template <int HS, bool kWithQueries = false, int kWarps = kMmaWarps>
constexpr size_t MmaBackwardKeysSharedBytes() {
  return (size_t(2 * 16 * kWarps) + size_t(4 * kBlock)) * size_t(MmaLd<HS>()) * 2 + size_t(4) * size_t(kBlock) * 4 +
         (kWithQueries ? size_t(kBlock) * size_t(kDsLd) * 2 + 16 : 0);
}
// Queries pass: q and dout tiles (16 rows a warp), then two buffers each of k
// and v tiles.
template <int HS, int kWarps = kMmaWarps>
constexpr size_t MmaBackwardQueriesSharedBytes() {
  return (size_t(2 * 16 * kWarps) + size_t(4 * kBlock)) * size_t(MmaLd<HS>()) * 2;
}

// A fragments of 16 rows of a tile (rows `row0`..+15), k-step kk.
template <int HS, typename T>
__device__ __forceinline__ void MmaLoadA(uint32_t* a, const T* tile, int row0, int kk) {
  const int lane = int(threadIdx.x) % kWarpSize, mi = lane / 8, mr = lane % 8;
  LdMatrixX4(a, tile + (row0 + (mi & 1) * 8 + mr) * MmaLd<HS>() + kk * 16 + (mi >> 1) * 8);
}
// B fragments of n-tiles nt and nt + 1 for a product with the tile's rows as
// B's columns (x tile^T), k-step kk.
template <int HS, typename T>
__device__ __forceinline__ void MmaLoadBRows(uint32_t* b, const T* tile, int nt, int kk) {
  const int lane = int(threadIdx.x) % kWarpSize, mi = lane / 8, mr = lane % 8;
  LdMatrixX4(b, tile + ((nt + (mi >> 1)) * 8 + mr) * MmaLd<HS>() + kk * 16 + (mi & 1) * 8);
}
// B fragments of n-tiles dt and dt + 1 for a product with the tile's rows as
// B's k (x tile), 16 rows from `row0`.
template <int HS, typename T>
__device__ __forceinline__ void MmaLoadBColumns(uint32_t* b, const T* tile, int row0, int dt) {
  const int lane = int(threadIdx.x) % kWarpSize, mi = lane / 8, mr = lane % 8;
  LdMatrixX4Trans(b, tile + (row0 + (mi & 1) * 8 + mr) * MmaLd<HS>() + (dt + (mi >> 1)) * 8);
}
// A fragments of 16 rows (from `row0`), k-step kk, of the transpose of a
// tile of kDsLd-element rows (the tile's rows are A's k, its columns A's rows).
template <typename T>
__device__ __forceinline__ void MmaLoadATransposed(uint32_t* a, const T* tile, int row0, int kk) {
  const int lane = int(threadIdx.x) % kWarpSize, mi = lane / 8, mr = lane % 8;
  LdMatrixX4Trans(a, tile + (kk * 16 + (mi >> 1) * 8 + mr) * kDsLd + row0 + (mi & 1) * 8);
}
// The A fragment of k-step `kstep` from an accumulator of 8 n-tiles.
template <typename T>
__device__ __forceinline__ void MmaAccumulatorAsA(uint32_t* a, const float (*acc)[4], int kstep) {
  a[0] = PackPair<T>(acc[2 * kstep][0], acc[2 * kstep][1]);
  a[1] = PackPair<T>(acc[2 * kstep][2], acc[2 * kstep][3]);
  a[2] = PackPair<T>(acc[2 * kstep + 1][0], acc[2 * kstep + 1][1]);
  a[3] = PackPair<T>(acc[2 * kstep + 1][2], acc[2 * kstep + 1][3]);
}

// The grid is (B*NKV, key blocks): a block takes one key block of one
// key/value head and walks the query blocks of each of the group's query
// heads in turn. With kWithQueries, dq_sum (B*NH x T x HS fp32) and counts
// (B*NH x blocks, then the ticket counter; all zero at launch) order the dQ
// additions; otherwise both are unused. kMinBlocks asks the compiler for that many resident blocks per
// SM (registers capped to fit): the same arithmetic, so the same bits, at
// another balance of spills and occupancy. kWarps (two passes only): 16
// keys a warp, 64 or 128 a block; each key meets the same query blocks in
// the same order either way, so the same bits.
template <typename T, int HS, bool kWithQueries = false, int kMinBlocks = 1, int kWarps = kMmaWarps>
__global__ void __launch_bounds__(kWarps* kWarpSize, kMinBlocks)
    MmaFlashBackwardKeys(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* dsum, int64_t Tlen,
                         QkvRows L, float scale, float* dq_sum = nullptr, int* counts = nullptr) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  static_assert(!kWithQueries || kWarps == kMmaWarps, "the one pass orders its dq sums by 64-key blocks");
  constexpr int kKeys = 16 * kWarps;
  constexpr int ld = MmaLd<HS>();
  constexpr int kSteps = HS / 16, kDimTiles = HS / 8;
  constexpr float kLog2e = 1.4426950408889634f;
  T* ks = reinterpret_cast<T*>(TensorCoreSharedMemory());
  T* vs = ks + kKeys * ld;
  T* qs = vs + kKeys * ld;                                              // two buffers
  T* dos = qs + 2 * kBlock * ld;                                        // two buffers
  float* lse_s = reinterpret_cast<float*>(dos + 2 * kBlock * ld);       // two buffers
  float* dsum_s = lse_s + 2 * kBlock;                                   // two buffers
  [[maybe_unused]] T* dst = reinterpret_cast<T*>(dsum_s + 2 * kBlock);  // dS^T (kWithQueries)

  const int NH = L.NH, NKV = L.NKV, group = NH / NKV;
  const int64_t C = L.out, C3 = L.qkv;
  const int64_t nb = (Tlen + kBlock - 1) / kBlock;
  int64_t linear = int64_t(blockIdx.y) * gridDim.x + blockIdx.x;
  if constexpr (kWithQueries) {
    // The work in start order (a ticket), the highest key block first.
    int* ticket = reinterpret_cast<int*>(dst + kBlock * kDsLd);
    if (threadIdx.x == 0) *ticket = TakeTicket(counts + int64_t(gridDim.x) * group * nb);
    __syncthreads();
    linear = *ticket;
  }
  // One (batch, key/value head) per blockIdx.x.
  const int64_t bk = linear % gridDim.x, b = bk / NKV, kv = bk % NKV;
  const int64_t y = linear / gridDim.x;
  const int64_t j = kWithQueries ? nb - 1 - y : y;
  const int64_t c0 = j * kKeys;
  const int cols = int(min(int64_t(kKeys), Tlen - c0));
  const int64_t i0 = c0 / kBlock;  // the query block of the block's first key
  // Step s of the block's walk: query head kv * group + s / blocks of the
  // group, its query block i0 + s % blocks (each head's blocks in order,
  // the heads one after another: one writer per dK and dV element).
  const int64_t blocks = nb - i0, steps = group * blocks;
  const T* keys = qkv + b * Tlen * C3 + (NH + kv) * HS;
  const T* values = keys + int64_t(NKV) * HS;
  const int warp = int(threadIdx.x) / kWarpSize, lane = int(threadIdx.x) % kWarpSize;
  const int g = lane / 4, tq = lane % 4;
  const int64_t key[2] = {c0 + warp * 16 + g, c0 + warp * 16 + g + 8};
  const float scale_log2 = scale * kLog2e;

  // Step s's query head (its index in the batch's heads) and query block.
  auto head_of = [&](int64_t s) { return kv * group + s / blocks; };
  auto block_of = [&](int64_t s) { return i0 + s % blocks; };
  // Step s's query tiles and row statistics into buffer `buf`.
  auto load_queries = [&](int64_t s, int buf) {
    const int64_t h = head_of(s), bh = b * NH + h, i = block_of(s);
    const T* q = qkv + b * Tlen * C3 + h * HS;
    const T* dy = dout + b * Tlen * C + h * HS;
    const int64_t r0 = i * kBlock;
    const int rows = int(min(int64_t(kBlock), Tlen - r0));
    MmaLoadTile<HS>(qs + buf * kBlock * ld, q + r0 * C3, C3, rows);
    MmaLoadTile<HS>(dos + buf * kBlock * ld, dy + r0 * C, C, rows);
    for (int r = int(threadIdx.x); r < kBlock; r += int(blockDim.x)) {
      lse_s[buf * kBlock + r] = r < rows ? lse[bh * Tlen + r0 + r] * kLog2e : 0.0f;
      dsum_s[buf * kBlock + r] = r < rows ? dsum[bh * Tlen + r0 + r] : 0.0f;
    }
  };
  MmaLoadTile<HS, kKeys>(ks, keys + c0 * C3, C3, cols);
  MmaLoadTile<HS, kKeys>(vs, values + c0 * C3, C3, cols);
  load_queries(0, 0);
  CpAsyncCommit();

  float dk[kDimTiles][4], dv[kDimTiles][4];
#pragma unroll
  for (int dt = 0; dt < kDimTiles; ++dt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[dt][e] = dv[dt][e] = 0.0f;
  }
  for (int64_t s = 0; s < steps; ++s) {
    [[maybe_unused]] const int64_t h = head_of(s), bh = b * NH + h, i = block_of(s);
    const int buf = int(s & 1);
    if (s + 1 < steps) {
      load_queries(s + 1, 1 - buf);
      CpAsyncCommit();
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    __syncthreads();
    const T* qt = qs + buf * kBlock * ld;
    const T* dot = dos + buf * kBlock * ld;
    const float* lse_t = lse_s + buf * kBlock;
    const float* dsum_t = dsum_s + buf * kBlock;
    const int64_t r0 = i * kBlock;
    // Warp w's keys see queries from c0 + 16 w on: the n-tiles (and P's
    // k-steps) before that are all masked (all of them where first is 8).
    const int64_t behind = c0 + 16 * warp - r0;
    const int first = behind <= 0 ? 0 : int(min(int64_t(8), behind / 8));

    // S^T (16 keys x 64 queries) = k q^T, then P^T.
    float p[8][4], dp[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) p[nt][e] = dp[nt][e] = 0.0f;
    }
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk) {
      if (first >= 8) break;
      uint32_t ka[4], va[4];
      MmaLoadA<HS>(ka, ks, warp * 16, kk);
      MmaLoadA<HS>(va, vs, warp * 16, kk);
#pragma unroll
      for (int nt = 0; nt < 8; nt += 2) {
        if (nt >= first) {
          uint32_t qb[4], db[4];
          MmaLoadBRows<HS>(qb, qt, nt, kk);
          MmaLoadBRows<HS>(db, dot, nt, kk);
          MmaM16N8K16<T>(p[nt], ka, qb);
          MmaM16N8K16<T>(p[nt + 1], ka, qb + 2);
          MmaM16N8K16<T>(dp[nt], va, db);  // dP^T = v dout^T
          MmaM16N8K16<T>(dp[nt + 1], va, db + 2);
        }
      }
    }
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = nt * 8 + 2 * tq + (e & 1);
        const int64_t query = r0 + col;
        const bool live = nt >= first && query < Tlen && query >= key[e / 2] && key[e / 2] < Tlen &&
                          key[e / 2] >= FirstVisibleKey(L.positions, b, Tlen, query);
        const float pe = live ? exp2f(p[nt][e] * scale_log2 - lse_t[col]) : 0.0f;
        p[nt][e] = pe;
        dp[nt][e] = pe * (dp[nt][e] - dsum_t[col]) * scale;  // dS^T
      }
    }
    if constexpr (kWithQueries) {
      // This warp's 16 rows of dS^T into the shared tile, rounded as the dK
      // product's A fragments are, a pair of queries per word.
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          StoreShared32(dst + (warp * 16 + g + 8 * r) * kDsLd + nt * 8 + 2 * tq,
                        PackPair<T>(dp[nt][2 * r], dp[nt][2 * r + 1]));
        }
      }
    }
    // dV += P^T dout and dK += dS^T q, 16 queries a step.
#pragma unroll
    for (int kstep = 0; kstep < 4; ++kstep) {
      if (2 * kstep + 1 >= first) {
        uint32_t pa[4], sa[4];
        MmaAccumulatorAsA<T>(pa, p, kstep);
        MmaAccumulatorAsA<T>(sa, dp, kstep);
#pragma unroll
        for (int dt = 0; dt < kDimTiles; dt += 2) {
          uint32_t db[4], qb[4];
          MmaLoadBColumns<HS>(db, dot, kstep * 16, dt);
          MmaLoadBColumns<HS>(qb, qt, kstep * 16, dt);
          MmaM16N8K16<T>(dv[dt], pa, db);
          MmaM16N8K16<T>(dv[dt + 1], pa, db + 2);
          MmaM16N8K16<T>(dk[dt], sa, qb);
          MmaM16N8K16<T>(dk[dt + 1], sa, qb + 2);
        }
      }
    }
    if constexpr (kWithQueries) {
      __syncthreads();  // every warp's dS^T rows are in the tile
      // dQ (16 queries of warp w x HS) += dS k, 64 columns at a time; on the
      // diagonal warp w's queries see the keys of k-steps up to w only.
      const int turn = int(i - j);  // the key blocks above this one add first
      const int steps = i == j ? warp + 1 : 4;
#pragma unroll
      for (int dg = 0; dg < kDimTiles; dg += 8) {
        float dq[8][4];
#pragma unroll
        for (int dt = 0; dt < 8; ++dt) dq[dt][0] = dq[dt][1] = dq[dt][2] = dq[dt][3] = 0.0f;
#pragma unroll
        for (int kstep = 0; kstep < 4; ++kstep) {
          if (kstep < steps) {
            uint32_t sa[4];
            MmaLoadATransposed<T>(sa, dst, warp * 16, kstep);
#pragma unroll
            for (int dt = 0; dt < 8; dt += 2) {
              uint32_t kb[4];
              MmaLoadBColumns<HS>(kb, ks, kstep * 16, dg + dt);
              MmaM16N8K16<T>(dq[dt], sa, kb);
              MmaM16N8K16<T>(dq[dt + 1], sa, kb + 2);
            }
          }
        }
        if (dg == 0) {
          if (turn > 0 && threadIdx.x == 0) WaitForCount(counts + bh * nb + i, turn);
          __syncthreads();
        }
        // The first adder stores its share, the others add theirs to the
        // sum; key block 0, the last, narrows the total into dqkv.
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int64_t t = r0 + warp * 16 + g + 8 * r;
          if (t >= Tlen) continue;
          float* sum_row = dq_sum + (bh * Tlen + t) * HS;
          T* dq_row = dqkv + b * Tlen * C3 + h * HS + t * C3;
#pragma unroll
          for (int dt = 0; dt < 8; ++dt) {
            const int col = (dg + dt) * 8 + 2 * tq;
            float2 v{dq[dt][2 * r], dq[dt][2 * r + 1]};
            if (turn > 0) {
              const float2 before = LoadPairL2(sum_row + col);
              v = float2{before.x + v.x, before.y + v.y};
            }
            if (j == 0) {
              dq_row[col] = FromFloat<T>(v.x);
              dq_row[col + 1] = FromFloat<T>(v.y);
            } else {
              StorePairL2(sum_row + col, v);
            }
          }
        }
      }
      FenceDevice();
    }
    __syncthreads();  // every warp is done with this buffer before the next copies into it
    if constexpr (kWithQueries) {
      if (j > 0 && threadIdx.x == 0) ReleaseCount(counts + bh * nb + i, int(i - j) + 1);
    }
  }
  T* base = dqkv + b * Tlen * C3;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (key[r] >= Tlen) continue;
    T* dk_row = base + (NH + kv) * HS + key[r] * C3;
    T* dv_row = base + (NH + NKV + kv) * HS + key[r] * C3;
#pragma unroll
    for (int dt = 0; dt < kDimTiles; ++dt) {
      dk_row[dt * 8 + 2 * tq] = FromFloat<T>(dk[dt][2 * r]);
      dk_row[dt * 8 + 2 * tq + 1] = FromFloat<T>(dk[dt][2 * r + 1]);
      dv_row[dt * 8 + 2 * tq] = FromFloat<T>(dv[dt][2 * r]);
      dv_row[dt * 8 + 2 * tq + 1] = FromFloat<T>(dv[dt][2 * r + 1]);
    }
  }
#endif
}

// kWarps: 16 queries a warp, 64 or 128 a block, with the same bits.
template <typename T, int HS, int kWarps = kMmaWarps>
__global__ void __launch_bounds__(kWarps* kWarpSize)
    MmaFlashBackwardQueries(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* dsum, int64_t Tlen,
                            QkvRows L, float scale) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  constexpr int kQueries = 16 * kWarps;
  constexpr int ld = MmaLd<HS>();
  constexpr int kSteps = HS / 16, kDimTiles = HS / 8;
  constexpr float kLog2e = 1.4426950408889634f;
  T* qs = reinterpret_cast<T*>(TensorCoreSharedMemory());
  T* dos = qs + kQueries * ld;
  T* ks = dos + kQueries * ld;   // two buffers
  T* vs = ks + 2 * kBlock * ld;  // two buffers

  const int NH = L.NH;
  const int64_t C = L.out, bh = blockIdx.x, b = bh / NH, h = bh % NH;
  const int64_t kv = h / (NH / L.NKV);  // the key/value head h reads
  const int64_t nq = (Tlen + kQueries - 1) / kQueries;
  const int64_t i = nq - 1 - int64_t(blockIdx.y);  // the longest rows first
  const int64_t r0 = i * kQueries, C3 = L.qkv;
  const int rows = int(min(int64_t(kQueries), Tlen - r0));
  const int64_t last = (r0 + rows - 1) / kBlock;  // the key block of the block's last row
  const T* q = qkv + b * Tlen * C3 + h * HS;
  const T* keys = qkv + b * Tlen * C3 + (NH + kv) * HS;
  const T* values = keys + int64_t(L.NKV) * HS;
  const T* dy = dout + b * Tlen * C + h * HS;
  const int warp = int(threadIdx.x) / kWarpSize, lane = int(threadIdx.x) % kWarpSize;
  const int g = lane / 4, tq = lane % 4;
  const int64_t t_row[2] = {r0 + warp * 16 + g, r0 + warp * 16 + g + 8};
  float row_lse[2], row_dsum[2];
  int64_t first_key[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    first_key[r] = t_row[r] < Tlen ? FirstVisibleKey(L.positions, b, Tlen, t_row[r]) : 0;
    row_lse[r] = t_row[r] < Tlen ? lse[bh * Tlen + t_row[r]] * kLog2e : 0.0f;
    row_dsum[r] = t_row[r] < Tlen ? dsum[bh * Tlen + t_row[r]] : 0.0f;
  }
  const float scale_log2 = scale * kLog2e;

  MmaLoadTile<HS, kQueries>(qs, q + r0 * C3, C3, rows);
  MmaLoadTile<HS, kQueries>(dos, dy + r0 * C, C, rows);
  const int cols0 = int(min(int64_t(kBlock), Tlen));
  MmaLoadTile<HS>(ks, keys, C3, cols0);
  MmaLoadTile<HS>(vs, values, C3, cols0);
  CpAsyncCommit();

  float dq[kDimTiles][4];
#pragma unroll
  for (int dt = 0; dt < kDimTiles; ++dt) dq[dt][0] = dq[dt][1] = dq[dt][2] = dq[dt][3] = 0.0f;
  for (int64_t j = 0; j <= last; ++j) {
    const int buf = int(j & 1);
    if (j < last) {
      const int64_t c1 = (j + 1) * kBlock;
      const int cols1 = int(min(int64_t(kBlock), Tlen - c1));
      MmaLoadTile<HS>(ks + (1 - buf) * kBlock * ld, keys + c1 * C3, C3, cols1);
      MmaLoadTile<HS>(vs + (1 - buf) * kBlock * ld, values + c1 * C3, C3, cols1);
      CpAsyncCommit();
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    __syncthreads();
    const T* kt = ks + buf * kBlock * ld;
    const T* vt = vs + buf * kBlock * ld;
    const int64_t c0 = j * kBlock;
    // Warp w's rows see keys up to r0 + 16 w + 15: the n-tiles that hold any.
    const int64_t reach = r0 + 16 * warp + 15 - c0;
    const int tiles = reach < 0 ? 0 : int(min(int64_t(8), reach / 8 + 1));

    // S = q k^T and dP = dout v^T (16 queries x 64 keys).
    float p[8][4], ds[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) p[nt][e] = ds[nt][e] = 0.0f;
    }
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk) {
      if (tiles == 0) break;
      uint32_t qa[4], da[4];
      MmaLoadA<HS>(qa, qs, warp * 16, kk);
      MmaLoadA<HS>(da, dos, warp * 16, kk);
#pragma unroll
      for (int nt = 0; nt < 8; nt += 2) {
        if (nt < tiles) {
          uint32_t kb[4], vb[4];
          MmaLoadBRows<HS>(kb, kt, nt, kk);
          MmaLoadBRows<HS>(vb, vt, nt, kk);
          MmaM16N8K16<T>(p[nt], qa, kb);
          MmaM16N8K16<T>(p[nt + 1], qa, kb + 2);
          MmaM16N8K16<T>(ds[nt], da, vb);
          MmaM16N8K16<T>(ds[nt + 1], da, vb + 2);
        }
      }
    }
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t k_at = c0 + nt * 8 + 2 * tq + (e & 1);
        const int64_t t = t_row[e / 2];
        const bool live = nt < tiles && t < Tlen && k_at <= t && k_at >= first_key[e / 2];
        const float pe = live ? exp2f(p[nt][e] * scale_log2 - row_lse[e / 2]) : 0.0f;
        ds[nt][e] = pe * (ds[nt][e] - row_dsum[e / 2]) * scale;
      }
    }
    // dQ += dS k, 16 keys a step.
#pragma unroll
    for (int kstep = 0; kstep < 4; ++kstep) {
      if (2 * kstep < tiles) {
        uint32_t sa[4];
        MmaAccumulatorAsA<T>(sa, ds, kstep);
#pragma unroll
        for (int dt = 0; dt < kDimTiles; dt += 2) {
          uint32_t kb[4];
          MmaLoadBColumns<HS>(kb, kt, kstep * 16, dt);
          MmaM16N8K16<T>(dq[dt], sa, kb);
          MmaM16N8K16<T>(dq[dt + 1], sa, kb + 2);
        }
      }
    }
    __syncthreads();
  }
  T* base = dqkv + b * Tlen * C3 + h * HS;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (t_row[r] >= Tlen) continue;
    T* dq_row = base + t_row[r] * C3;
#pragma unroll
    for (int dt = 0; dt < kDimTiles; ++dt) {
      dq_row[dt * 8 + 2 * tq] = FromFloat<T>(dq[dt][2 * r]);
      dq_row[dt * 8 + 2 * tq + 1] = FromFloat<T>(dq[dt][2 * r + 1]);
    }
  }
#endif
}
