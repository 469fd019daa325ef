#include "kernels/cuda/matmul.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "kernels/cuda/element.cuh"

namespace pstar::kernels::cuda {
namespace {

// A failed cuBLAS call means a bad argument or a broken device: a programming
// error, so say which call failed and stop.
void CheckBlas(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  std::fprintf(stderr, "pstar: %s failed: %s (%s)\n", what, cublasLtGetStatusName(status),
               cublasLtGetStatusString(status));
  std::abort();
}

void CheckCuda(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return;
  std::fprintf(stderr, "pstar: %s failed: %s\n", what, cudaGetErrorString(error));
  std::abort();
}

template <typename T>
struct BlasType;
template <>
struct BlasType<float> {
  static constexpr cudaDataType_t value = CUDA_R_32F;
};
template <>
struct BlasType<bf16> {
  static constexpr cudaDataType_t value = CUDA_R_16BF;
};
template <>
struct BlasType<fp16> {
  static constexpr cudaDataType_t value = CUDA_R_16F;
};

// Owners of the cuBLASLt descriptors, which are pointers to opaque structs.
struct LayoutDestroy {
  void operator()(cublasLtMatrixLayoutOpaque_t* p) const { cublasLtMatrixLayoutDestroy(p); }
};
struct MatmulDescDestroy {
  void operator()(cublasLtMatmulDescOpaque_t* p) const { cublasLtMatmulDescDestroy(p); }
};
struct PreferenceDestroy {
  void operator()(cublasLtMatmulPreferenceOpaque_t* p) const { cublasLtMatmulPreferenceDestroy(p); }
};
using Layout = std::unique_ptr<cublasLtMatrixLayoutOpaque_t, LayoutDestroy>;
using MatmulDesc = std::unique_ptr<cublasLtMatmulDescOpaque_t, MatmulDescDestroy>;
using Preference = std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, PreferenceDestroy>;

// A column-major (rows, cols) layout with leading dimension ld, repeated
// `batch` times at `stride` elements.
Layout MakeLayout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld, int64_t batch,
                  int64_t stride) {
  cublasLtMatrixLayout_t raw = nullptr;
  CheckBlas(cublasLtMatrixLayoutCreate(&raw, type, uint64_t(rows), uint64_t(cols), ld),
            "cublasLtMatrixLayoutCreate");
  Layout layout(raw);
  if (batch > 1) {
    const int32_t count = int32_t(batch);
    CheckBlas(cublasLtMatrixLayoutSetAttribute(raw, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)),
              "cublasLtMatrixLayoutSetAttribute(BATCH_COUNT)");
    CheckBlas(cublasLtMatrixLayoutSetAttribute(raw, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                               sizeof(stride)),
              "cublasLtMatrixLayoutSetAttribute(STRIDED_BATCH_OFFSET)");
  }
  return layout;
}

// The alignment in bytes (a power of two, at most 64) that every matrix of
// a batch starting at p meets, so the heuristic only offers algorithms that
// can read it. Capped at 64 bytes, the alignment of chunk slots: above it a
// weight's alignment would depend on which slot it was loaded into, and with
// it the algorithm and the bits, so results would vary with the device budget.
uint32_t Alignment(const void* p, int64_t stride, size_t elem_bytes, int64_t batch) {
  uint64_t bits = uint64_t(reinterpret_cast<uintptr_t>(p)) | 64u;
  if (batch > 1) bits |= uint64_t(stride) * elem_bytes;
  return uint32_t(bits & (~bits + 1));
}

void SetAlignment(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, uint32_t bytes,
                  const char* what) {
  CheckBlas(cublasLtMatmulPreferenceSetAttribute(pref, attr, &bytes, sizeof(bytes)), what);
}

// C = beta * C on `batch` row-major (M, N) matrices: the product of an empty
// inner dimension, which cuBLASLt does not take. beta == 0 writes zeros.
template <typename T>
__global__ void ScaleMatrices(T* C, int64_t M, int64_t N, int64_t ldc, int64_t stride_c, int64_t batch,
                              float beta) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= batch * M * N) return;
  const int64_t col = i % N;
  const int64_t row = (i / N) % M;
  const int64_t b = i / (M * N);
  T* c = C + b * stride_c + row * ldc + col;
  *c = FromFloat<T>(beta == 0.0f ? 0.0f : beta * ToFloat(*c));
}

// out[n, j] = bias[j] for the (N, OC) output, which the GEMM then adds to.
template <typename T>
__global__ void BroadcastRows(T* out, const T* bias, int64_t N, int64_t OC) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < N * OC) out[i] = bias[i % OC];
}

// Column sums of a row-major (N, C) matrix in two passes over the whole GPU,
// in fp32 and a fixed order: the rows are cut into at most 256 groups of at
// least KernelTuning::bias_grad_group_rows rows (BiasGroupRows),
// a block sums one group's rows for kColumnTile adjacent columns (threadIdx.x,
// so row reads are coalesced; thread y sums rows y, y + kRowPhases, ... of
// the group in order, then thread y == 0 adds the kRowPhases partials in
// order of y) into partials[g, c]; then one thread per column adds the
// groups' partials in group order to acc[c]. The order depends only on N and
// C, so every run gives the same bits, and (N / group rows) x (C / 32)
// blocks keep every SM busy where one block per column tile (24 blocks for
// GPT-2's 768 columns) left most of a large GPU idle.
constexpr int kColumnTile = 32;
constexpr int kRowPhases = 8;
constexpr int64_t kMaxBiasGroups = 256;
constexpr int64_t kSmallestBiasGroupRows = 32;  // the fewest rows a group may take (KernelTuning's candidates)

int64_t BiasGroupRows(int64_t N, int64_t min_rows) {
  const int64_t spread = (N + kMaxBiasGroups - 1) / kMaxBiasGroups;
  return spread > min_rows ? spread : min_rows;
}

int64_t BiasGroups(int64_t N, int64_t min_rows) {
  return N <= 0 ? 0 : (N + BiasGroupRows(N, min_rows) - 1) / BiasGroupRows(N, min_rows);
}

template <typename M>
__global__ void ColumnPartialSums(float* partials, const M* m, int64_t N, int64_t C, int64_t group_rows) {
  __shared__ float partial[kRowPhases][kColumnTile];
  const int64_t g = blockIdx.y;
  const int64_t c = int64_t(blockIdx.x) * kColumnTile + threadIdx.x;
  const int64_t first = g * group_rows;
  const int64_t last = first + group_rows < N ? first + group_rows : N;
  float sum = 0.0f;
  if (c < C) {
    // Unrolled so that a thread has several loads in flight; the adds stay in row order.
#pragma unroll 4
    for (int64_t n = first + threadIdx.y; n < last; n += kRowPhases) sum += ToFloat(m[n * C + c]);
  }
  partial[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float total = 0.0f;
    for (int y = 0; y < kRowPhases; ++y) total += partial[y][threadIdx.x];
    partials[g * C + c] = total;
  }
}

template <typename T>
__global__ void AddColumnTotals(T* acc, const float* partials, int64_t groups, int64_t C) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float total = 0.0f;
  for (int64_t g = 0; g < groups; ++g) total += partials[g * C + c];
  acc[c] = FromFloat<T>(ToFloat(acc[c]) + total);
}

constexpr unsigned kThreads = 256;

}  // namespace

BlasContext::BlasContext(size_t workspace_bytes) : workspace_bytes_(workspace_bytes) {
  CheckBlas(cublasLtCreate(&handle_), "cublasLtCreate");
  if (workspace_bytes_ > 0) {
    CheckCuda(cudaMalloc(&workspace_, workspace_bytes_), "cudaMalloc of the cuBLASLt workspace");
  }
}

BlasContext::~BlasContext() {
  if (workspace_ != nullptr) cudaFree(workspace_);
  if (handle_ != nullptr) cublasLtDestroy(handle_);
}

namespace {

// A cuBLASLt epilogue of one matrix: the bias added per row of C (N values
// of C's type, beta 0), GELU's derivative at `aux` (a matrix of C's type and
// shape, row pitch aux_ld) multiplied in (beta 0), or the column sums of
// the product's second operand over K written to `bias` (BGRADB: our A, K
// rows; beta as given). kind CUBLASLT_EPILOGUE_DEFAULT is none.
template <typename TC>
struct Epilogue {
  cublasLtEpilogue_t kind = CUBLASLT_EPILOGUE_DEFAULT;
  const TC* bias = nullptr;
  TC* aux = nullptr;
  int64_t aux_ld = 0;
};

// The GEMM of every public entry point: operands of type T, C of type TC
// (T, or fp32 for mixed precision). With an epilogue it is cuBLASLt's: for
// the bias, C = alpha op(A) op(B) + bias per row, one rounding. Returns
// false, having done nothing, when cuBLASLt offers no algorithm for that
// epilogue (or K is 0 with one); true otherwise. algo_rank picks the
// heuristic's candidate (0 its first, at most kMaxAlgoRank; its last where it
// offers fewer).
constexpr int kMaxAlgoRank = 7;

template <typename T, typename TC>
bool GemmAnyOutput(BlasContext& blas, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                   const T* A, int64_t lda, int64_t stride_a, const T* B, int64_t ldb, int64_t stride_b,
                   float beta, TC* C, int64_t ldc, int64_t stride_c, int64_t batch, cudaStream_t stream,
                   const Epilogue<TC>& epilogue = {}, int algo_rank = 0) {
  const bool with_epilogue = epilogue.kind != CUBLASLT_EPILOGUE_DEFAULT;
  if (M <= 0 || N <= 0 || batch <= 0) return true;
  if (batch > INT32_MAX) {
    std::fprintf(stderr, "pstar: GEMM batch of %lld matrices is too large\n", static_cast<long long>(batch));
    std::abort();
  }
  if (K <= 0) {
    if (with_epilogue) return false;  // the caller's separate passes then give C
    if (beta == 1.0f) return true;
    ScaleMatrices<<<BlocksFor(batch * M * N, kThreads), kThreads, 0, stream>>>(C, M, N, ldc, stride_c, batch,
                                                                               beta);
    CheckLaunch("ScaleMatrices");
    return true;
  }
  constexpr cudaDataType_t type = BlasType<T>::value;
  constexpr cudaDataType_t out_type = BlasType<TC>::value;

  // cuBLAS is column-major. A row-major (r, c) matrix with leading dimension
  // ld is, in the same memory, the column-major (c, r) matrix with that ld:
  // its transpose. So the row-major C = op(A) op(B) is computed as the
  // column-major C^T (N, M) = op(B)^T op(A)^T: cuBLAS's first operand is our B
  // (transposed when trans_b), its second our A (transposed when trans_a).
  // Layouts describe the stored matrices, before the operation.
  const Layout first = MakeLayout(type, trans_b ? K : N, trans_b ? N : K, ldb, batch, stride_b);
  const Layout second = MakeLayout(type, trans_a ? M : K, trans_a ? K : M, lda, batch, stride_a);
  const Layout out = MakeLayout(out_type, N, M, ldc, batch, stride_c);

  // fp32 accumulation and fp32 alpha/beta for every element type; for fp32
  // operands this is true fp32 (no TF32).
  cublasLtMatmulDesc_t desc_raw = nullptr;
  CheckBlas(cublasLtMatmulDescCreate(&desc_raw, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  const MatmulDesc desc(desc_raw);
  const cublasOperation_t op_first = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_second = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  CheckBlas(cublasLtMatmulDescSetAttribute(desc_raw, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof(op_first)),
            "cublasLtMatmulDescSetAttribute(TRANSA)");
  CheckBlas(cublasLtMatmulDescSetAttribute(desc_raw, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof(op_second)),
            "cublasLtMatmulDescSetAttribute(TRANSB)");
  if (with_epilogue) {
    CheckBlas(cublasLtMatmulDescSetAttribute(desc_raw, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue.kind,
                                             sizeof(epilogue.kind)),
              "cublasLtMatmulDescSetAttribute(EPILOGUE)");
  }
  if (epilogue.bias != nullptr) {
    // cuBLAS's rows are our columns: the bias runs along them, broadcast over our rows.
    CheckBlas(cublasLtMatmulDescSetAttribute(desc_raw, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &epilogue.bias,
                                             sizeof(epilogue.bias)),
              "cublasLtMatmulDescSetAttribute(BIAS_POINTER)");
    const cudaDataType_t bias_type = out_type;
    CheckBlas(cublasLtMatmulDescSetAttribute(desc_raw, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                             sizeof(bias_type)),
              "cublasLtMatmulDescSetAttribute(BIAS_DATA_TYPE)");
  }
  if (epilogue.aux != nullptr) {
    // The aux matrix is laid out as C: cuBLAS's column pitch is our row pitch.
    CheckBlas(cublasLtMatmulDescSetAttribute(desc_raw, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &epilogue.aux,
                                             sizeof(epilogue.aux)),
              "cublasLtMatmulDescSetAttribute(EPILOGUE_AUX_POINTER)");
    CheckBlas(cublasLtMatmulDescSetAttribute(desc_raw, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &epilogue.aux_ld,
                                             sizeof(epilogue.aux_ld)),
              "cublasLtMatmulDescSetAttribute(EPILOGUE_AUX_LD)");
  }

  const int rank = algo_rank < 0 ? 0 : (algo_rank > kMaxAlgoRank ? kMaxAlgoRank : algo_rank);
  const uint32_t align_a = Alignment(B, stride_b, sizeof(T), batch);
  const uint32_t align_b = Alignment(A, stride_a, sizeof(T), batch);
  const uint32_t align_c = Alignment(C, stride_c, sizeof(TC), batch);
  const BlasContext::GemmKey key = {int64_t(type), int64_t(out_type), int64_t(trans_a), int64_t(trans_b), M, N, K,
                                    lda, ldb, ldc, stride_a, stride_b, stride_c, batch, int64_t(align_a),
                                    int64_t(align_b), int64_t(align_c), int64_t(epilogue.kind), int64_t(rank)};
  if (const cublasLtMatmulAlgo_t* known = blas.FindAlgo(key)) {
    CheckBlas(cublasLtMatmul(blas.handle(), desc_raw, &alpha, B, first.get(), A, second.get(), &beta, C, out.get(),
                             C, out.get(), known, blas.workspace(), blas.workspace_bytes(), stream),
              "cublasLtMatmul");
    SyncCheck("cublasLtMatmul");
    return true;
  }
  if (blas.KnownUnsupported(key)) return false;

  cublasLtMatmulPreference_t pref_raw = nullptr;
  CheckBlas(cublasLtMatmulPreferenceCreate(&pref_raw), "cublasLtMatmulPreferenceCreate");
  const Preference pref(pref_raw);
  const uint64_t workspace_bytes = blas.workspace_bytes();
  CheckBlas(cublasLtMatmulPreferenceSetAttribute(pref_raw, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &workspace_bytes, sizeof(workspace_bytes)),
            "cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)");
  SetAlignment(pref_raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a,
               "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT_A_BYTES)");
  SetAlignment(pref_raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b,
               "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT_B_BYTES)");
  SetAlignment(pref_raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c,
               "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT_C_BYTES)");
  SetAlignment(pref_raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_c,
               "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT_D_BYTES)");

  cublasLtMatmulHeuristicResult_t candidates[kMaxAlgoRank + 1] = {};
  cublasLtMatmulHeuristicResult_t heuristic = {};
  const auto query = [&] {
    int found = 0;
    const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(blas.handle(), desc_raw, first.get(), second.get(),
                                                                 out.get(), out.get(), pref_raw, rank + 1, candidates,
                                                                 &found);
    // NOT_SUPPORTED is how cuBLASLt says "no algorithm for these constraints".
    if (status == CUBLAS_STATUS_NOT_SUPPORTED) return false;
    CheckBlas(status, "cublasLtMatmulAlgoGetHeuristic");
    // The candidate of that rank, or the last usable one before it.
    for (int i = std::min(found, rank + 1) - 1; i >= 0; --i) {
      if (candidates[i].state == CUBLAS_STATUS_SUCCESS) {
        heuristic = candidates[i];
        return true;
      }
    }
    return false;
  };
  // Split-K partial sums go to the workspace in fp32 and are added in a
  // fixed order: no in-place reduction through the output, which would round
  // 16-bit outputs once per split and is not promised to be ordered. Algorithms
  // without a split always qualify. Any scheme is the fallback should nothing
  // be offered.
  const uint32_t fp32_partials = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  CheckBlas(cublasLtMatmulPreferenceSetAttribute(pref_raw, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                                 &fp32_partials, sizeof(fp32_partials)),
            "cublasLtMatmulPreferenceSetAttribute(REDUCTION_SCHEME_MASK)");
  bool ok = query();
  if (!ok) {
    const uint32_t any_scheme = CUBLASLT_REDUCTION_SCHEME_MASK;
    CheckBlas(cublasLtMatmulPreferenceSetAttribute(pref_raw, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                                   &any_scheme, sizeof(any_scheme)),
              "cublasLtMatmulPreferenceSetAttribute(REDUCTION_SCHEME_MASK)");
    ok = query();
  }
  if (!ok && with_epilogue) {
    blas.RememberUnsupported(key);
    return false;
  }
  if (!ok) {
    std::fprintf(stderr,
                 "pstar: cuBLASLt offers no algorithm for GEMM M=%lld N=%lld K=%lld trans_a=%d trans_b=%d "
                 "lda=%lld ldb=%lld ldc=%lld batch=%lld\n",
                 static_cast<long long>(M), static_cast<long long>(N), static_cast<long long>(K), int(trans_a),
                 int(trans_b), static_cast<long long>(lda), static_cast<long long>(ldb),
                 static_cast<long long>(ldc), static_cast<long long>(batch));
    std::abort();
  }
  blas.RememberAlgo(key, heuristic.algo);
  // C is both the input and the output (D): an in-place update.
  CheckBlas(cublasLtMatmul(blas.handle(), desc_raw, &alpha, B, first.get(), A, second.get(), &beta, C, out.get(),
                           C, out.get(), &heuristic.algo, blas.workspace(), blas.workspace_bytes(), stream),
            "cublasLtMatmul");
  SyncCheck("cublasLtMatmul");
  return true;
}

}  // namespace

template <typename T>
void GemmStridedBatched(BlasContext& blas, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                        float alpha, const T* A, int64_t lda, int64_t stride_a, const T* B, int64_t ldb,
                        int64_t stride_b, float beta, T* C, int64_t ldc, int64_t stride_c, int64_t batch,
                        cudaStream_t stream) {
  GemmAnyOutput<T, T>(blas, trans_a, trans_b, M, N, K, alpha, A, lda, stride_a, B, ldb, stride_b, beta, C, ldc,
                      stride_c, batch, stream);
}

template <typename T>
void Gemm(BlasContext& blas, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
          const T* A, int64_t lda, const T* B, int64_t ldb, float beta, T* C, int64_t ldc,
          cudaStream_t stream) {
  GemmStridedBatched(blas, trans_a, trans_b, M, N, K, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1, stream);
}

template <typename T, typename TO>
void GemmTo(BlasContext& blas, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const T* A,
            int64_t lda, const T* B, int64_t ldb, float beta, TO* C, int64_t ldc, cudaStream_t stream) {
  GemmAnyOutput<T, TO>(blas, trans_a, trans_b, M, N, K, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1, stream);
}

template <typename T, typename TO>
void MatmulBackwardInput(BlasContext& blas, TO* dinp, const T* dout, const T* weight, int64_t N, int64_t C,
                         int64_t OC, cudaStream_t stream) {
  GemmAnyOutput<T, TO>(blas, false, false, N, C, OC, 1.0f, dout, OC, 0, weight, C, 0, 0.0f, dinp, C, 0, 1,
                       stream);  // (N, C)
}

template <typename T, typename TO>
void MatmulBackwardWeight(BlasContext& blas, TO* dweight, const T* dout, const T* inp, int64_t N, int64_t C,
                          int64_t OC, cudaStream_t stream, int algo_rank) {
  GemmAnyOutput<T, TO>(blas, true, false, OC, C, N, 1.0f, dout, OC, 0, inp, C, 0, 1.0f, dweight, C, 0, 1, stream, {},
                       algo_rank);  // (OC, C)
}

int64_t BiasGradientScratchElements(int64_t N, int64_t OC) {
  return OC <= 0 ? 0 : BiasGroups(N, kSmallestBiasGroupRows) * OC;
}

template <typename TO, typename TD>
void AddBiasGradient(TO* dbias, float* scratch, const TD* dout, int64_t N, int64_t OC, cudaStream_t stream,
                     int group_rows) {
  if (OC <= 0 || N <= 0) return;
  const int64_t min_rows = group_rows > kSmallestBiasGroupRows ? group_rows : kSmallestBiasGroupRows;
  const int64_t groups = BiasGroups(N, min_rows);
  const dim3 grid(BlocksFor(OC, kColumnTile), unsigned(groups));
  ColumnPartialSums<<<grid, dim3(kColumnTile, kRowPhases), 0, stream>>>(scratch, dout, N, OC,
                                                                       BiasGroupRows(N, min_rows));
  CheckLaunch("AddBiasGradient (partials)");
  AddColumnTotals<<<BlocksFor(OC, kThreads), kThreads, 0, stream>>>(dbias, scratch, groups, OC);
  CheckLaunch("AddBiasGradient (totals)");
}

#define PSTAR_INSTANTIATE_BACKWARD_PIECES(T, TO)                                                              \
  template void MatmulBackwardInput<T, TO>(BlasContext&, TO*, const T*, const T*, int64_t, int64_t, int64_t,  \
                                           cudaStream_t);                                                     \
  template void MatmulBackwardWeight<T, TO>(BlasContext&, TO*, const T*, const T*, int64_t, int64_t, int64_t, \
                                            cudaStream_t, int);

PSTAR_INSTANTIATE_BACKWARD_PIECES(float, float)
PSTAR_INSTANTIATE_BACKWARD_PIECES(bf16, bf16)
PSTAR_INSTANTIATE_BACKWARD_PIECES(fp16, fp16)
PSTAR_INSTANTIATE_BACKWARD_PIECES(bf16, float)
PSTAR_INSTANTIATE_BACKWARD_PIECES(fp16, float)
template void AddBiasGradient<float, float>(float*, float*, const float*, int64_t, int64_t, cudaStream_t, int);
template void AddBiasGradient<bf16, bf16>(bf16*, float*, const bf16*, int64_t, int64_t, cudaStream_t, int);
template void AddBiasGradient<fp16, fp16>(fp16*, float*, const fp16*, int64_t, int64_t, cudaStream_t, int);
template void AddBiasGradient<float, bf16>(float*, float*, const bf16*, int64_t, int64_t, cudaStream_t, int);
template void AddBiasGradient<float, fp16>(float*, float*, const fp16*, int64_t, int64_t, cudaStream_t, int);

#undef PSTAR_INSTANTIATE_BACKWARD_PIECES

namespace {

// The linear layer for operands of type T and outputs, bias and gradients of
// type TO (T itself, or fp32 for mixed precision). The bias is the GEMM's
// epilogue, or, where that is not offered, goes into out first and the GEMM
// adds to it: either way bias + x.w is rounded once, as on the CPU.
template <typename T, typename TO>
void LinearForward(BlasContext& blas, TO* out, const T* inp, const T* weight, const TO* bias, int64_t N,
                   int64_t C, int64_t OC, cudaStream_t stream) {
  // cuBLASLt's bias epilogue wants the bias 16-byte aligned.
  if (bias != nullptr && reinterpret_cast<uintptr_t>(bias) % 16 == 0 &&
      GemmAnyOutput<T, TO>(blas, false, true, N, OC, C, 1.0f, inp, C, 0, weight, C, 0, 0.0f, out, OC, 0, 1, stream,
                           Epilogue<TO>{CUBLASLT_EPILOGUE_BIAS, bias})) {
    return;
  }
  float beta = 0.0f;
  if (bias != nullptr && N * OC > 0) {
    BroadcastRows<<<BlocksFor(N * OC, kThreads), kThreads, 0, stream>>>(out, bias, N, OC);
    CheckLaunch("BroadcastRows");
    beta = 1.0f;
  }
  GemmAnyOutput<T, TO>(blas, false, true, N, OC, C, 1.0f, inp, C, 0, weight, C, 0, beta, out, OC, 0, 1, stream);
}

template <typename T>
void LinearBackward(BlasContext& blas, T* dinp, T* dweight, T* dbias, float* scratch, const T* dout, const T* inp,
                    const T* weight, int64_t N, int64_t C, int64_t OC, cudaStream_t stream) {
  MatmulBackwardInput<T, T>(blas, dinp, dout, weight, N, C, OC, stream);
  MatmulBackwardWeight<T, T>(blas, dweight, dout, inp, N, C, OC, stream);
  if (dbias != nullptr) AddBiasGradient<T, T>(dbias, scratch, dout, N, OC, stream);
}

}  // namespace

template <typename T>
void MatmulForward(BlasContext& blas, T* out, const T* inp, const T* weight, const T* bias, int64_t N,
                   int64_t C, int64_t OC, cudaStream_t stream) {
  LinearForward<T, T>(blas, out, inp, weight, bias, N, C, OC, stream);
}

template <typename T>
void MatmulBackward(BlasContext& blas, T* dinp, T* dweight, T* dbias, float* scratch, const T* dout, const T* inp,
                    const T* weight, int64_t N, int64_t C, int64_t OC, cudaStream_t stream) {
  LinearBackward<T>(blas, dinp, dweight, dbias, scratch, dout, inp, weight, N, C, OC, stream);
}

template <typename T>
void MatmulForwardMixed(BlasContext& blas, float* out, const T* inp, const T* weight, const float* bias, int64_t N,
                        int64_t C, int64_t OC, cudaStream_t stream) {
  LinearForward<T, float>(blas, out, inp, weight, bias, N, C, OC, stream);
}

namespace {

// What cuBLASLt's GELU epilogues ask of their matrices: 16-byte aligned
// pointers and pitches that are multiples of 8 elements.
bool GeluEpilogueFits(const void* a, const void* b, int64_t ld) {
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return aligned(a) && aligned(b) && ld % 8 == 0;
}

}  // namespace

template <typename T>
bool MatmulBackwardInputGelu(BlasContext& blas, T* dinp, const T* dout, const T* weight, const T* pre, int64_t N,
                             int64_t C, int64_t OC, cudaStream_t stream) {
  if (!GeluEpilogueFits(dinp, pre, C)) return false;
  // cuBLASLt reads the aux matrix here; its pointer attribute is not const.
  return GemmAnyOutput<T, T>(blas, false, false, N, C, OC, 1.0f, dout, OC, 0, weight, C, 0, 0.0f, dinp, C, 0, 1,
                             stream, Epilogue<T>{CUBLASLT_EPILOGUE_DGELU, nullptr, const_cast<T*>(pre), C});
}

template <typename T>
bool MatmulBackwardWeightBiasGrad(BlasContext& blas, float* dweight, float* dbias_sum, const T* dout, const T* inp,
                                  int64_t N, int64_t C, int64_t OC, cudaStream_t stream, int algo_rank) {
  if (reinterpret_cast<uintptr_t>(dbias_sum) % 16 != 0 || OC % 8 != 0) return false;
  // dweight (OC, C) += dout^T inp: cuBLAS's second operand is dout, whose
  // columns (our OC) are D's columns; BGRADB sums them over K (our N rows).
  return GemmAnyOutput<T, float>(blas, true, false, OC, C, N, 1.0f, dout, OC, 0, inp, C, 0, 1.0f, dweight, C, 0, 1,
                                 stream, Epilogue<float>{CUBLASLT_EPILOGUE_BGRADB, dbias_sum}, algo_rank);
}

template bool MatmulBackwardWeightBiasGrad<bf16>(BlasContext&, float*, float*, const bf16*, const bf16*, int64_t,
                                                 int64_t, int64_t, cudaStream_t, int);
template bool MatmulBackwardWeightBiasGrad<fp16>(BlasContext&, float*, float*, const fp16*, const fp16*, int64_t,
                                                 int64_t, int64_t, cudaStream_t, int);
template bool MatmulBackwardInputGelu<bf16>(BlasContext&, bf16*, const bf16*, const bf16*, const bf16*, int64_t,
                                            int64_t, int64_t, cudaStream_t);
template bool MatmulBackwardInputGelu<fp16>(BlasContext&, fp16*, const fp16*, const fp16*, const fp16*, int64_t,
                                            int64_t, int64_t, cudaStream_t);

#define PSTAR_GEMM_TO(T, TO)                                                                                 \
  template void GemmTo<T, TO>(BlasContext&, bool, bool, int64_t, int64_t, int64_t, float, const T*, int64_t,        \
                              const T*, int64_t, float, TO*, int64_t, cudaStream_t);
PSTAR_GEMM_TO(float, float)
PSTAR_GEMM_TO(bf16, bf16)
PSTAR_GEMM_TO(fp16, fp16)
PSTAR_GEMM_TO(bf16, float)
PSTAR_GEMM_TO(fp16, float)
#undef PSTAR_GEMM_TO

template void MatmulForwardMixed<bf16>(BlasContext&, float*, const bf16*, const bf16*, const float*, int64_t,
                                       int64_t, int64_t, cudaStream_t);
template void MatmulForwardMixed<fp16>(BlasContext&, float*, const fp16*, const fp16*, const float*, int64_t,
                                       int64_t, int64_t, cudaStream_t);

#define PSTAR_INSTANTIATE_MATMUL(T)                                                                          \
  template void Gemm<T>(BlasContext&, bool, bool, int64_t, int64_t, int64_t, float, const T*, int64_t,       \
                        const T*, int64_t, float, T*, int64_t, cudaStream_t);                                \
  template void GemmStridedBatched<T>(BlasContext&, bool, bool, int64_t, int64_t, int64_t, float, const T*,  \
                                      int64_t, int64_t, const T*, int64_t, int64_t, float, T*, int64_t,      \
                                      int64_t, int64_t, cudaStream_t);                                       \
  template void MatmulForward<T>(BlasContext&, T*, const T*, const T*, const T*, int64_t, int64_t, int64_t,  \
                                 cudaStream_t);                                                              \
  template void MatmulBackward<T>(BlasContext&, T*, T*, T*, float*, const T*, const T*, const T*, int64_t,   \
                                  int64_t, int64_t, cudaStream_t);

PSTAR_INSTANTIATE_MATMUL(float)
PSTAR_INSTANTIATE_MATMUL(bf16)
PSTAR_INSTANTIATE_MATMUL(fp16)

#undef PSTAR_INSTANTIATE_MATMUL

}  // namespace pstar::kernels::cuda
