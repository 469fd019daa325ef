// KernelTuning: launch choices that only the GPU at hand can settle (threads
// per block, rows per block), per GPU kind. `scripts/gpu-session.sh OUT
// --tune` times every candidate of every knob (bench/cuda_tuning_bench.cu,
// built with PSTAR_CUDA_TUNING) and prints the winners as rows of
// kernels/cuda/tuning_table.inc, the one committed table the runtime reads
// at start-up. A GPU kind with no rows runs the defaults below. Every
// candidate computes the same values; they differ only in speed (and, for
// the sums, in the fixed order of their additions: a given GPU kind keeps
// giving the same bits run to run).
#pragma once

#include <string>
#include <vector>

namespace pstar::kernels::cuda {

struct KernelTuning {
  // Threads per block of the classifier's cross-entropy (one block per row
  // of the vocabulary).
  int cross_entropy_threads = 512;
  // Its loads and stores (CrossEntropyKernel): 0 one element per thread at
  // a time, 1 16 bytes.
  int cross_entropy_kernel = 0;
  // Rows of a bias gradient's row group (at least; at most 256 groups): one
  // block sums this many rows of 32 columns.
  int bias_grad_group_rows = 64;
  // The attention forward of 16-bit runs (AttentionForwardKernel): 0 the
  // WMMA tiles, 1 the mma.sync kernel (head sizes 64 and 128), 2 that kernel
  // with its q tile in a k/v buffer at head size 128, 3 that kernel with 128
  // queries a block on 8 warps, 4 cuDNN's fused graph (CudnnAttention; 1
  // where cuDNN cannot run it).
  int attention_forward = 0;
  // Its backward with 16-bit gradients (AttentionBackwardKernel): 0 the
  // WMMA tiles, 1 the two mma.sync passes, 2 the one five-product mma.sync
  // pass, 3 that pass compiled for 3 blocks per SM at head size 64, 4 the
  // two passes with the keys pass compiled so (3 and 4 are compile-time
  // variants: kernels/CMakeLists.txt builds them where the table names
  // one), 5 the two passes on 128 rows a block over 8 warps; 1 to 5 at
  // head sizes 64 and 128; 6 cuDNN's deterministic fused graph
  // (CudnnAttention; 1 where cuDNN cannot run it).
  int attention_backward = 0;
  // LayerNorm backward's per-row kernel (LayerNormKernel): 0 one element per
  // lane at a time, 1 16 bytes.
  int layernorm_backward_kernel = 0;
  // GELU's backward in 16-bit runs: 0 its own kernel after the fc_proj
  // input-gradient GEMM, 1 in that GEMM's cuBLASLt epilogue
  // (MatmulBackwardInputGelu).
  int gelu_backward_epilogue = 0;
  // The linear layers' weight-gradient GEMMs (not the classifier's): which
  // of cuBLASLt's heuristic's candidates runs, 0 its first
  // (MatmulBackwardWeight's algo_rank).
  int weight_grad_gemm_algo = 0;
  // The linear layers' bias gradients in 16-bit runs: 0 AddBiasGradient's
  // two passes (bias_grad_group_rows), 1 in the weight gradient GEMM's
  // cuBLASLt epilogue (MatmulBackwardWeightBiasGrad) plus an add.
  int bias_grad_epilogue = 0;
};

// A knob: its name in the table, the candidates the tuner times, and its
// field.
struct TuningKnob {
  const char* name;
  std::vector<int> candidates;
  int KernelTuning::*field;
};
const std::vector<TuningKnob>& TuningKnobs();

// One row of the table.
struct TuningRow {
  // cudaDeviceProp::name, exactly; or "sm_XY", every GPU of compute
  // capability X.Y, for the kinds of that architecture with no rows of
  // their own on that knob (measured on one kind, taken by its siblings).
  const char* gpu;
  const char* knob;   // a TuningKnob's name
  int value;          // one of its candidates
  const char* where;  // the call that measured it: date, command, device
};
const std::vector<TuningRow>& TuningTable();

// The defaults, overridden by the table's rows for the architecture
// ("sm_XY" of `compute_capability`, 10 * major + minor; 0: none), then by
// the rows for `gpu_name` itself.
KernelTuning TuningFor(const std::string& gpu_name, int compute_capability = 0);

// `spec`, "knob=value[,knob=value...]" (the environment's
// PSTAR_KERNEL_TUNING), applied over `tuning`: a choice for a GPU kind the
// table has no rows for, or one candidate tried in training. "" when every
// pair names a knob and one of its candidates (all applied); otherwise the
// first that does not, in one line, and `tuning` unchanged.
std::string ApplyTuningOverrides(const std::string& spec, KernelTuning* tuning);

// "" when every row names a GPU kind or architecture, a knob and one of its
// candidates; otherwise the first row that does not, in one line.
std::string CheckTuningRows(const std::vector<TuningRow>& rows);
// CheckTuningRows of the committed table.
std::string CheckTuningTable();

}  // namespace pstar::kernels::cuda
