// Causal attention through cuDNN 9's fused flash-attention graphs, built with
// its backend API: the alternative to kernels/cuda/attention.h that the
// tuning table picks (attention_forward 4, attention_backward 6) on a GPU
// kind where it measures faster. Same layouts and semantics, grouped-query
// heads included (kernels/attention.h's AttentionShape): qkv (B, T,
// (NH + 2 NKV) hs), out (B, T, NH hs), lse (B, NH, T) fp32, the natural
// log-sum-exp of each query's scaled scores (so either route's forward feeds
// either route's backward); bf16 and fp16 only; dqkv overwritten. With
// grouped heads a call's k and v tensors have the call's key/value heads,
// which cuDNN's matmuls broadcast to their query heads; its backward writes
// each query head's dK and dV (fp32) into the workspace and pstar's kernel
// (AddGroupedHeads) sums each group in a fixed order into dqkv, rounding once.
//
// The library is loaded at run time (libcudnn.so.9 through the loader's
// search path, or the file PSTAR_CUDNN_LIBRARY names), so a binary built with
// cuDNN's headers runs where the library is absent; Open says why not in one
// line and the caller runs its own kernels. A library older than the headers
// the build compiled against is refused the same way. Backward takes only
// engines cuDNN does not mark non-deterministic, and runs with cuDNN's
// deterministic dq accumulation: the same bits on every run of a shape.
//
// Not thread-safe: one per stream owner, as BlasContext. A graph is built
// (and its engine compiled) once per shape and kept.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "kernels/attention.h"

namespace pstar::kernels::cuda {

class CudnnAttention {
 public:
  // Whether this build compiled the route (cuDNN's headers were found;
  // kernels/CMakeLists.txt).
  static bool Built();
  // The cuDNN version the build compiled against (e.g. 91900), 0 when not
  // built.
  static int64_t BuildVersion();

  // Loads the library, checks its version and makes a handle on the current
  // device. Null with `why_not` set (one line) where any of that fails.
  static std::unique_ptr<CudnnAttention> Open(std::string* why_not);
  // For planning without a device (cuDNN 9.8's deviceless plans): the
  // graphs, the engine choice and the plans are made for the GPU that
  // `device_json` describes (cuDNN's device-properties JSON), nothing runs.
  // Checks the graphs against the real library on a host with no GPU.
  static std::unique_ptr<CudnnAttention> OpenForDevice(const std::string& device_json, std::string* why_not);
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // The loaded library's version (cudnnGetVersion()).
  int64_t version() const;
  // cuDNN's description of this handle's GPU (its device-properties JSON,
  // what OpenForDevice takes), or "" with last_error() set where it cannot
  // give one (opened for planning only, or a cuDNN older than 9.8).
  std::string DeviceJson();

  // Bytes of workspace one call over the shape's B sequences' first H of NH
  // query heads (all of them by default; a multiple of NH / NKV) needs,
  // building its graph if it is not built yet; -1 when cuDNN takes no graph
  // for the shape (why: last_error()). Backward's deterministic form keeps
  // its dp, a 16-bit T×T per head, there (cuDNN 9.19 asks about 6·B·H·T²
  // bytes), and with grouped heads each query head's dK and dV.
  int64_t WorkspaceBytes(bool backward, bool bf16, const AttentionShape& shape, int64_t H = 0);

  // The largest call Forward or Backward makes within `workspace_bytes`:
  // every head of as many sequences as fit, else the most query heads of one
  // sequence that divide NH and are whole groups of a key/value head; {0, 0}
  // when not even one group fits or cuDNN takes no graph (why: last_error()).
  struct Slice {
    int64_t sequences = 0, heads = 0;
  };
  Slice SliceFor(bool backward, bool bf16, const AttentionShape& shape, size_t workspace_bytes);

  // Queues the graph on `stream`, in calls small enough for
  // `workspace_bytes`: one where it all fits, else slices of the batch, else
  // groups of one sequence's heads. False, with nothing queued, where the
  // shape's graph is not supported, a tensor is not 16-byte aligned or not
  // even one head's workspace fits (why: last_error()): the caller then runs
  // its own kernels. `bf16` names the 16-bit format (else fp16).
  bool Forward(bool bf16, void* out, float* lse, const void* qkv, const AttentionShape& shape, cudaStream_t stream,
               void* workspace, size_t workspace_bytes);
  bool Backward(bool bf16, void* dqkv, const void* dout, const void* qkv, const void* out, const float* lse,
                const AttentionShape& shape, cudaStream_t stream, void* workspace, size_t workspace_bytes);

  // Why the last call that failed did, in one line ("" before any).
  const std::string& last_error() const { return last_error_; }

  struct Library;  // the loaded functions (cudnn_attention.cc)
  struct Plan;     // one shape's graph, engine and workspace need

 private:
  CudnnAttention() = default;
  // The plan of the shape's B sequences' H of NH query heads, built on
  // first use; null when cuDNN takes none.
  const Plan* PlanFor(bool backward, bool bf16, const AttentionShape& shape, int64_t H);

  using PlanKey = std::array<int64_t, 8>;  // backward, bf16, B, T, NH, NKV, hs, H
  std::unique_ptr<Library> library_;
  void* handle_ = nullptr;       // cudnnHandle_t; null when opened for planning only
  void* device_prop_ = nullptr;  // cudnnBackendDescriptor_t, when opened for a described device
  std::map<PlanKey, std::unique_ptr<Plan>> plans_;
  std::map<PlanKey, std::string> refusals_;  // why each shape that has no plan has none
  std::string last_error_;
};

}  // namespace pstar::kernels::cuda
