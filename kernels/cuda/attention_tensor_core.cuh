// The tensor-core attention kernels (included by attention.cu inside its
// anonymous namespace, and by a host test that runs them on an emulation of
// threads, barriers and WMMA, so that their indexing, masking and
// synchronization are checked without a GPU). Written against what both
// provide: threadIdx, blockIdx, blockDim, __syncthreads, __syncwarp,
// WarpSum, WarpMax, ToFloat, FromFloat, min, TensorCoreSharedMemory() (the
// block's dynamic shared memory), nvcuda::wmma, and kBlock and kWarpSize.
#pragma once

// The tensor-core forward, for 16-bit elements and head sizes a multiple of
// 16: the same blocking (a block of 64 queries per thread block, key blocks
// of 64 up to the diagonal, the online softmax in fp32), with S = q k^T and
// O += P v as WMMA 16x16x16 products accumulating in fp32. Each of 4 warps
// owns 16 query rows; O lives in shared memory as fp32 so that a row's
// rescaling is a plain multiply. P is rounded to the element type for P v
// (as FlashAttention does), so the output differs from the CPU kernel's by
// that rounding, within the element type's tolerance; the row statistics
// and lse stay fp32. Head sizes that are not a multiple of 16, or whose tiles
// do not fit the device's shared memory (128 on sm_86/sm_89), take the
// CUDA-core kernels of attention.cu.
namespace wmma = nvcuda::wmma;
constexpr int kTcTile = 16;
constexpr int kTcWarps = kBlock / kTcTile;
constexpr int kTcPad = 8;       // 16-bit elements of row padding: WMMA's 16-byte ld rule, fewer bank conflicts
constexpr int kTcFloatPad = 4;  // fp32 row padding (the same 16 bytes)
constexpr int kTcLdS = kBlock + kTcFloatPad;
constexpr int kTcLdP = kBlock + kTcPad;

// The shared layout, in bytes: q, k and v tiles (elements of T), O and S
// (fp32), P (T). Every part starts 32-byte aligned, as WMMA's loads require.
size_t TensorCoreForwardSharedBytes(int hs, size_t elem) {
  return 3 * size_t(kBlock) * size_t(hs + kTcPad) * elem + size_t(kBlock) * size_t(hs + kTcFloatPad) * 4 +
         size_t(kBlock) * kTcLdS * 4 + size_t(kBlock) * kTcLdP * elem;
}

// Sixteen bytes, the widest load a thread issues.
struct alignas(16) TcVec16 {
  unsigned int word[4];
};

// The 16 bytes at p (16-byte aligned) in one load; on the host emulation a
// memcpy, which C++'s aliasing rules allow for any element type.
__device__ __forceinline__ TcVec16 LoadVec16(const void* p) {
#ifdef __CUDA_ARCH__
  return *static_cast<const TcVec16*>(p);
#else
  TcVec16 v;
  memcpy(&v, p, sizeof v);
  return v;
#endif
}

__device__ __forceinline__ void StoreVec16(void* p, const TcVec16& v) {
#ifdef __CUDA_ARCH__
  *static_cast<TcVec16*>(p) = v;
#else
  memcpy(p, &v, sizeof v);
#endif
}

// rows x hs elements (rows ld_src apart) into a tile of A, ld apart, rounded
// to A where the source is wider; zeros past rows. Where every source row
// (and, for a plain copy, every tile row) starts 16-byte aligned and hs fills
// whole 16-byte pieces (the usual case: 16-bit heads of a multiple of 8, fp32
// ones of a multiple of 4), each thread moves 16 bytes at a time; otherwise
// one element at a time.
template <typename A, typename S>
__device__ void LoadTileAs(A* tile, int ld, const S* src, int64_t ld_src, int rows, int hs) {
  constexpr int kVec = int(sizeof(TcVec16) / sizeof(S));  // source elements per piece
  constexpr int kTileVec = int(sizeof(TcVec16) / sizeof(A));  // tile elements per piece
  const bool aligned = hs % kVec == 0 && ld_src % kVec == 0 &&
                       reinterpret_cast<uintptr_t>(src) % sizeof(TcVec16) == 0 &&
                       (!std::is_same_v<A, S> ||
                        (ld % kTileVec == 0 && reinterpret_cast<uintptr_t>(tile) % sizeof(TcVec16) == 0));
  if (aligned) {
    const int per_row = hs / kVec;
    for (int e = int(threadIdx.x); e < kBlock * per_row; e += int(blockDim.x)) {
      const int r = e / per_row, d = (e % per_row) * kVec;
      TcVec16 piece = {};
      if (r < rows) piece = LoadVec16(src + int64_t(r) * ld_src + d);
      if constexpr (std::is_same_v<A, S>) {
        StoreVec16(tile + r * ld + d, piece);  // checked above: tile rows start 16-byte aligned
      } else {
        S values[kVec];
        memcpy(values, &piece, sizeof piece);
#pragma unroll
        for (int k = 0; k < kVec; ++k) tile[r * ld + d + k] = FromFloat<A>(ToFloat(values[k]));
      }
    }
    return;
  }
  for (int e = int(threadIdx.x); e < kBlock * hs; e += int(blockDim.x)) {
    const int r = e / hs, d = e % hs;
    tile[r * ld + d] = FromFloat<A>(r < rows ? ToFloat(src[int64_t(r) * ld_src + d]) : 0.0f);
  }
}

// out (16 x 64, fp32, ld kTcLdS) = a (16 x hs, row-major) b^T, b's 64 rows
// read as a column-major b^T.
template <typename A>
__device__ void TileProductNT(float* out, const A* a, const A* b, int ld, int hs) {
  for (int n = 0; n < kBlock; n += kTcTile) {
    wmma::fragment<wmma::accumulator, kTcTile, kTcTile, kTcTile, float> acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int kk = 0; kk < hs; kk += kTcTile) {
      wmma::fragment<wmma::matrix_a, kTcTile, kTcTile, kTcTile, A, wmma::row_major> fa;
      wmma::fragment<wmma::matrix_b, kTcTile, kTcTile, kTcTile, A, wmma::col_major> fb;
      wmma::load_matrix_sync(fa, a + kk, unsigned(ld));
      wmma::load_matrix_sync(fb, b + n * ld + kk, unsigned(ld));
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(out + n, acc, unsigned(kTcLdS), wmma::mem_row_major);
  }
}

// acc (16 x hs, fp32, ld ld_acc) += a (16 x 64, ld kTcLdP) b (64 x hs, ld ld_b).
template <typename A>
__device__ void TileProductAccumulate(float* acc_tile, int ld_acc, const A* a, const A* b, int ld_b, int hs) {
  for (int dt = 0; dt < hs; dt += kTcTile) {
    wmma::fragment<wmma::accumulator, kTcTile, kTcTile, kTcTile, float> acc;
    wmma::load_matrix_sync(acc, acc_tile + dt, unsigned(ld_acc), wmma::mem_row_major);
    for (int kk = 0; kk < kBlock; kk += kTcTile) {
      wmma::fragment<wmma::matrix_a, kTcTile, kTcTile, kTcTile, A, wmma::row_major> fa;
      wmma::fragment<wmma::matrix_b, kTcTile, kTcTile, kTcTile, A, wmma::row_major> fb;
      wmma::load_matrix_sync(fa, a + kk, unsigned(kTcLdP));
      wmma::load_matrix_sync(fb, b + kk * ld_b + dt, unsigned(ld_b));
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(acc_tile + dt, acc, unsigned(ld_acc), wmma::mem_row_major);
  }
}

template <typename T>
__global__ void __launch_bounds__(kTcWarps * kWarpSize)
    TensorCoreFlashForward(T* out, float* lse, const T* qkv, int64_t Tlen, QkvRows L, int hs, float scale) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  unsigned char* tc_smem = TensorCoreSharedMemory();
  const int ld_t = hs + kTcPad, ld_o = hs + kTcFloatPad;
  T* qs = reinterpret_cast<T*>(tc_smem);
  T* ks = qs + kBlock * ld_t;
  T* vs = ks + kBlock * ld_t;
  float* os = reinterpret_cast<float*>(vs + kBlock * ld_t);
  float* ss = os + kBlock * ld_o;
  T* ps = reinterpret_cast<T*>(ss + kBlock * kTcLdS);

  const int NH = L.NH;
  const int64_t C = L.out, bh = blockIdx.x, b = bh / NH, h = bh % NH;
  const int64_t kv = h / (NH / L.NKV);  // the key/value head h reads
  const int64_t nb = (Tlen + kBlock - 1) / kBlock;
  const int64_t i = nb - 1 - int64_t(blockIdx.y);
  const int64_t r0 = i * kBlock, C3 = L.qkv;
  const int rows = int(min(int64_t(kBlock), Tlen - r0));
  const T* q = qkv + b * Tlen * C3 + h * hs;
  const T* keys = qkv + b * Tlen * C3 + (NH + kv) * hs;
  const T* values = keys + int64_t(L.NKV) * hs;
  const int warp = int(threadIdx.x) / kWarpSize, lane = int(threadIdx.x) % kWarpSize;
  LoadTileAs(qs, ld_t, q + r0 * C3, C3, rows, hs);
  for (int e = int(threadIdx.x); e < kBlock * hs; e += int(blockDim.x)) os[(e / hs) * ld_o + e % hs] = 0.0f;

  T* qw = qs + warp * kTcTile * ld_t;
  float* ow = os + warp * kTcTile * ld_o;
  float* sw = ss + warp * kTcTile * kTcLdS;
  T* pw = ps + warp * kTcTile * kTcLdP;
  float m[kTcTile], l[kTcTile];
#pragma unroll
  for (int rr = 0; rr < kTcTile; ++rr) {
    m[rr] = -INFINITY;
    l[rr] = 0.0f;
  }
  for (int64_t j = 0; j <= i; ++j) {
    const int64_t c0 = j * kBlock;
    const int cols = int(min(int64_t(kBlock), Tlen - c0));
    __syncthreads();  // the previous key block is no longer read
    LoadTileAs(ks, ld_t, keys + c0 * C3, C3, cols, hs);
    LoadTileAs(vs, ld_t, values + c0 * C3, C3, cols, hs);
    __syncthreads();
    TileProductNT(sw, qw, ks, ld_t, hs);  // S (16 x 64) = q k^T
    __syncwarp();
    // The online softmax of each row, two keys per lane; P rounded into pw.
    float alpha[kTcTile];
#pragma unroll
    for (int rr = 0; rr < kTcTile; ++rr) {
      const int64_t t = r0 + warp * kTcTile + rr;
      const int64_t first = t < Tlen ? FirstVisibleKey(L.positions, b, Tlen, t) : 0;
      float s[2];
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int c = lane + half * kWarpSize;
        s[half] = c < cols && c0 + c <= t && c0 + c >= first ? sw[rr * kTcLdS + c] * scale : -INFINITY;
      }
      const float mx = fmaxf(m[rr], WarpMax(fmaxf(s[0], s[1])));
      // No key of the query's example so far: nothing to add, nothing to rescale.
      const bool none = mx == -INFINITY;
      const float p0 = none ? 0.0f : expf(s[0] - mx), p1 = none ? 0.0f : expf(s[1] - mx);
      alpha[rr] = none ? 1.0f : expf(m[rr] - mx);
      l[rr] = l[rr] * alpha[rr] + WarpSum(p0 + p1);
      m[rr] = mx;
      pw[rr * kTcLdP + lane] = FromFloat<T>(p0);
      pw[rr * kTcLdP + lane + kWarpSize] = FromFloat<T>(p1);
    }
#pragma unroll
    for (int rr = 0; rr < kTcTile; ++rr) {
      for (int d = lane; d < hs; d += kWarpSize) ow[rr * ld_o + d] *= alpha[rr];
    }
    __syncwarp();
    TileProductAccumulate(ow, ld_o, pw, vs, ld_t, hs);  // O (16 x hs) += P (16 x 64) v
    __syncwarp();
  }
#pragma unroll
  for (int rr = 0; rr < kTcTile; ++rr) {
    const int r = warp * kTcTile + rr;
    if (r >= rows) continue;  // the whole warp
    const int64_t t = r0 + r;
    const float inv = 1.0f / l[rr];
    T* o = out + (b * Tlen + t) * C + h * hs;
    for (int d = lane; d < hs; d += kWarpSize) o[d] = FromFloat<T>(ow[rr * ld_o + d] * inv);
    if (lane == 0) lse[bh * Tlen + t] = m[rr] + logf(l[rr]);
  }
#endif
}

// The tensor-core backward, for 16-bit activations (A) and head sizes a
// multiple of 16; the gradients (T) may be fp32. The same two passes as the
// CUDA-core kernels of attention.cu, each product on the tensor cores: keys (4 warps of
// 16 keys; per query block S^T = k q^T, P^T, dV += P^T dout, dP^T = v dout^T,
// dS^T, dK += dS^T q) and queries (4 warps of 16 queries; S, P, dP, dS,
// dQ += dS k). dout, P and dS are rounded to A for the products (as
// FlashAttention does), everything accumulates in fp32, and the
// probabilities of a warp's 16 rows stay in registers between the two
// products that need them (two columns per lane).
size_t TensorCoreBackwardKeysSharedBytes(int hs, size_t elem) {
  return 4 * size_t(kBlock) * size_t(hs + kTcPad) * elem + 2 * size_t(kBlock) * 4 + size_t(kBlock) * kTcLdS * 4 +
         size_t(kBlock) * kTcLdP * elem + 2 * size_t(kBlock) * size_t(hs + kTcFloatPad) * 4;
}
size_t TensorCoreBackwardQueriesSharedBytes(int hs, size_t elem) {
  return 4 * size_t(kBlock) * size_t(hs + kTcPad) * elem + size_t(kBlock) * kTcLdS * 4 +
         size_t(kBlock) * kTcLdP * elem + size_t(kBlock) * size_t(hs + kTcFloatPad) * 4;
}

template <typename T, typename A>
__global__ void __launch_bounds__(kTcWarps * kWarpSize)
    TensorCoreBackwardKeys(T* dqkv, const T* dout, const A* qkv, const float* lse, const float* dsum, int64_t Tlen,
                           QkvRows L, int hs, float scale) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  unsigned char* tc_smem = TensorCoreSharedMemory();
  const int ld_t = hs + kTcPad, ld_o = hs + kTcFloatPad;
  A* ks = reinterpret_cast<A*>(tc_smem);
  A* vs = ks + kBlock * ld_t;
  A* qs = vs + kBlock * ld_t;
  A* dys = qs + kBlock * ld_t;
  float* lse_s = reinterpret_cast<float*>(dys + kBlock * ld_t);
  float* dsum_s = lse_s + kBlock;
  float* ss = dsum_s + kBlock;
  A* ps = reinterpret_cast<A*>(ss + kBlock * kTcLdS);
  float* dks = reinterpret_cast<float*>(ps + kBlock * kTcLdP);
  float* dvs = dks + kBlock * ld_o;

  const int NH = L.NH, NKV = L.NKV, group = NH / NKV;
  const int64_t C = L.out, bk = blockIdx.x, b = bk / NKV, kv = bk % NKV;
  const int64_t nb = (Tlen + kBlock - 1) / kBlock;
  const int64_t j = int64_t(blockIdx.y);
  const int64_t c0 = j * kBlock, C3 = L.qkv;
  const int cols = int(min(int64_t(kBlock), Tlen - c0));
  const A* keys = qkv + b * Tlen * C3 + (NH + kv) * hs;
  const A* values = keys + int64_t(NKV) * hs;
  const int warp = int(threadIdx.x) / kWarpSize, lane = int(threadIdx.x) % kWarpSize;
  LoadTileAs(ks, ld_t, keys + c0 * C3, C3, cols, hs);
  LoadTileAs(vs, ld_t, values + c0 * C3, C3, cols, hs);
  for (int e = int(threadIdx.x); e < kBlock * hs; e += int(blockDim.x)) {
    dks[(e / hs) * ld_o + e % hs] = 0.0f;
    dvs[(e / hs) * ld_o + e % hs] = 0.0f;
  }
  const A* kw = ks + warp * kTcTile * ld_t;
  const A* vw = vs + warp * kTcTile * ld_t;
  float* sw = ss + warp * kTcTile * kTcLdS;
  A* pw = ps + warp * kTcTile * kTcLdP;
  float* dkw = dks + warp * kTcTile * ld_o;
  float* dvw = dvs + warp * kTcTile * ld_o;
  // The group's query heads one after another, each over its query blocks:
  // one writer per dK and dV element, in a fixed order.
  for (int gq = 0; gq < group; ++gq) {
    const int64_t h = kv * group + gq, bh = b * NH + h;
    const A* q = qkv + b * Tlen * C3 + h * hs;
    const T* dy = dout + b * Tlen * C + h * hs;
    for (int64_t i = j; i < nb; ++i) {
      const int64_t r0 = i * kBlock;
      const int rows = int(min(int64_t(kBlock), Tlen - r0));
      __syncthreads();
      LoadTileAs(qs, ld_t, q + r0 * C3, C3, rows, hs);
      LoadTileAs(dys, ld_t, dy + r0 * C, C, rows, hs);
      for (int r = int(threadIdx.x); r < kBlock; r += int(blockDim.x)) {
        lse_s[r] = r < rows ? lse[bh * Tlen + r0 + r] : 0.0f;
        dsum_s[r] = r < rows ? dsum[bh * Tlen + r0 + r] : 0.0f;
      }
      __syncthreads();
      // P^T (16 keys x 64 queries), kept in registers and rounded into pw.
      TileProductNT(sw, kw, qs, ld_t, hs);
      __syncwarp();
      float p[kTcTile][2];
#pragma unroll
      for (int kk = 0; kk < kTcTile; ++kk) {
        const int key = warp * kTcTile + kk;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int r = lane + half * kWarpSize;
          const bool live = key < cols && r < rows && r0 + r >= c0 + key &&
                            c0 + key >= FirstVisibleKey(L.positions, b, Tlen, r0 + r);
          p[kk][half] = live ? expf(sw[kk * kTcLdS + r] * scale - lse_s[r]) : 0.0f;
          pw[kk * kTcLdP + r] = FromFloat<A>(p[kk][half]);
        }
      }
      __syncwarp();
      TileProductAccumulate(dvw, ld_o, pw, dys, ld_t, hs);  // dV += P^T dout
      // dP^T (16 x 64) = v dout^T, then dS^T = P^T (dP^T - D) scale into pw.
      TileProductNT(sw, vw, dys, ld_t, hs);
      __syncwarp();
#pragma unroll
      for (int kk = 0; kk < kTcTile; ++kk) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int r = lane + half * kWarpSize;
          pw[kk * kTcLdP + r] = FromFloat<A>(p[kk][half] * (sw[kk * kTcLdS + r] - dsum_s[r]) * scale);
        }
      }
      __syncwarp();
      TileProductAccumulate(dkw, ld_o, pw, qs, ld_t, hs);  // dK += dS^T q
      __syncwarp();
    }
  }
  T* base = dqkv + b * Tlen * C3;
#pragma unroll
  for (int kk = 0; kk < kTcTile; ++kk) {
    const int key = warp * kTcTile + kk;
    if (key >= cols) continue;  // the whole warp
    T* dk_row = base + (NH + kv) * hs + (c0 + key) * C3;
    T* dv_row = base + (NH + NKV + kv) * hs + (c0 + key) * C3;
    for (int d = lane; d < hs; d += kWarpSize) {
      dk_row[d] = FromFloat<T>(dkw[kk * ld_o + d]);
      dv_row[d] = FromFloat<T>(dvw[kk * ld_o + d]);
    }
  }
#endif
}

template <typename T, typename A>
__global__ void __launch_bounds__(kTcWarps * kWarpSize)
    TensorCoreBackwardQueries(T* dqkv, const T* dout, const A* qkv, const float* lse, const float* dsum,
                              int64_t Tlen, QkvRows L, int hs, float scale) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  unsigned char* tc_smem = TensorCoreSharedMemory();
  const int ld_t = hs + kTcPad, ld_o = hs + kTcFloatPad;
  A* qs = reinterpret_cast<A*>(tc_smem);
  A* dys = qs + kBlock * ld_t;
  A* ks = dys + kBlock * ld_t;
  A* vs = ks + kBlock * ld_t;
  float* ss = reinterpret_cast<float*>(vs + kBlock * ld_t);
  A* ps = reinterpret_cast<A*>(ss + kBlock * kTcLdS);
  float* dqs = reinterpret_cast<float*>(ps + kBlock * kTcLdP);

  const int NH = L.NH;
  const int64_t C = L.out, bh = blockIdx.x, b = bh / NH, h = bh % NH;
  const int64_t kv = h / (NH / L.NKV);  // the key/value head h reads
  const int64_t nb = (Tlen + kBlock - 1) / kBlock;
  const int64_t i = nb - 1 - int64_t(blockIdx.y);
  const int64_t r0 = i * kBlock, C3 = L.qkv;
  const int rows = int(min(int64_t(kBlock), Tlen - r0));
  const A* q = qkv + b * Tlen * C3 + h * hs;
  const A* keys = qkv + b * Tlen * C3 + (NH + kv) * hs;
  const A* values = keys + int64_t(L.NKV) * hs;
  const T* dy = dout + b * Tlen * C + h * hs;
  const int warp = int(threadIdx.x) / kWarpSize, lane = int(threadIdx.x) % kWarpSize;
  LoadTileAs(qs, ld_t, q + r0 * C3, C3, rows, hs);
  LoadTileAs(dys, ld_t, dy + r0 * C, C, rows, hs);
  for (int e = int(threadIdx.x); e < kBlock * hs; e += int(blockDim.x)) dqs[(e / hs) * ld_o + e % hs] = 0.0f;
  const A* qw = qs + warp * kTcTile * ld_t;
  const A* dyw = dys + warp * kTcTile * ld_t;
  float* sw = ss + warp * kTcTile * kTcLdS;
  A* pw = ps + warp * kTcTile * kTcLdP;
  float* dqw = dqs + warp * kTcTile * ld_o;
  float row_lse[kTcTile], row_dsum[kTcTile];
#pragma unroll
  for (int rr = 0; rr < kTcTile; ++rr) {
    const int r = warp * kTcTile + rr;
    row_lse[rr] = r < rows ? lse[bh * Tlen + r0 + r] : 0.0f;
    row_dsum[rr] = r < rows ? dsum[bh * Tlen + r0 + r] : 0.0f;
  }
  for (int64_t j = 0; j <= i; ++j) {
    const int64_t c0 = j * kBlock;
    const int cols = int(min(int64_t(kBlock), Tlen - c0));
    __syncthreads();
    LoadTileAs(ks, ld_t, keys + c0 * C3, C3, cols, hs);
    LoadTileAs(vs, ld_t, values + c0 * C3, C3, cols, hs);
    __syncthreads();
    TileProductNT(sw, qw, ks, ld_t, hs);  // S (16 queries x 64 keys)
    __syncwarp();
    float p[kTcTile][2];
#pragma unroll
    for (int rr = 0; rr < kTcTile; ++rr) {
      const int r = warp * kTcTile + rr;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int c = lane + half * kWarpSize;
        const bool live =
            r < rows && c < cols && c0 + c <= r0 + r && c0 + c >= FirstVisibleKey(L.positions, b, Tlen, r0 + r);
        p[rr][half] = live ? expf(sw[rr * kTcLdS + c] * scale - row_lse[rr]) : 0.0f;
      }
    }
    __syncwarp();
    TileProductNT(sw, dyw, vs, ld_t, hs);  // dP = dout v^T
    __syncwarp();
#pragma unroll
    for (int rr = 0; rr < kTcTile; ++rr) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int c = lane + half * kWarpSize;
        pw[rr * kTcLdP + c] = FromFloat<A>(p[rr][half] * (sw[rr * kTcLdS + c] - row_dsum[rr]) * scale);
      }
    }
    __syncwarp();
    TileProductAccumulate(dqw, ld_o, pw, ks, ld_t, hs);  // dQ += dS k
    __syncwarp();
  }
  T* base = dqkv + b * Tlen * C3 + h * hs;
#pragma unroll
  for (int rr = 0; rr < kTcTile; ++rr) {
    const int r = warp * kTcTile + rr;
    if (r >= rows) continue;  // the whole warp
    T* dq_row = base + (r0 + r) * C3;
    for (int d = lane; d < hs; d += kWarpSize) dq_row[d] = FromFloat<T>(dqw[rr * ld_o + d]);
  }
#endif
}
