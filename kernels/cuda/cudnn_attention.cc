#include "kernels/cuda/cudnn_attention.h"

#include "kernels/cuda/attention.h"

#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <vector>

#ifdef PSTAR_WITH_CUDNN
#include <cudnn_graph.h>
#endif

namespace pstar::kernels::cuda {

#ifndef PSTAR_WITH_CUDNN

// Built without cuDNN's headers: Open refuses, and nothing else is reached.
struct CudnnAttention::Library {};
struct CudnnAttention::Plan {};
bool CudnnAttention::Built() { return false; }
int64_t CudnnAttention::BuildVersion() { return 0; }
std::unique_ptr<CudnnAttention> CudnnAttention::Open(std::string* why_not) {
  *why_not = "this build has no cuDNN route (cuDNN's headers were not found when it was configured)";
  return nullptr;
}
std::unique_ptr<CudnnAttention> CudnnAttention::OpenForDevice(const std::string&, std::string* why_not) {
  return Open(why_not);
}
CudnnAttention::~CudnnAttention() = default;
int64_t CudnnAttention::version() const { return 0; }
std::string CudnnAttention::DeviceJson() { return ""; }
int64_t CudnnAttention::WorkspaceBytes(bool, bool, const AttentionShape&, int64_t) { return -1; }
CudnnAttention::Slice CudnnAttention::SliceFor(bool, bool, const AttentionShape&, size_t) { return {}; }
bool CudnnAttention::Forward(bool, void*, float*, const void*, const AttentionShape&, cudaStream_t, void*, size_t) {
  return false;
}
bool CudnnAttention::Backward(bool, void*, const void*, const void*, const void*, const float*, const AttentionShape&,
                              cudaStream_t, void*, size_t) {
  return false;
}
const CudnnAttention::Plan* CudnnAttention::PlanFor(bool, bool, const AttentionShape&, int64_t) { return nullptr; }

#else  // PSTAR_WITH_CUDNN

// The functions of libcudnn.so.9 this route calls, resolved by dlsym; their
// types are the headers' own.
struct CudnnAttention::Library {
  void* so = nullptr;
  decltype(&cudnnGetVersion) GetVersion = nullptr;
  decltype(&cudnnGetErrorString) GetErrorString = nullptr;
  decltype(&cudnnGetLastErrorString) GetLastErrorString = nullptr;
  decltype(&cudnnCreate) Create = nullptr;
  decltype(&cudnnDestroy) Destroy = nullptr;
  decltype(&cudnnSetStream) SetStream = nullptr;
  decltype(&cudnnBackendCreateDescriptor) CreateDescriptor = nullptr;
  decltype(&cudnnBackendDestroyDescriptor) DestroyDescriptor = nullptr;
  decltype(&cudnnBackendSetAttribute) SetAttribute = nullptr;
  decltype(&cudnnBackendGetAttribute) GetAttribute = nullptr;
  decltype(&cudnnBackendFinalize) Finalize = nullptr;
  decltype(&cudnnBackendExecute) Execute = nullptr;

  ~Library() {
    if (so != nullptr) dlclose(so);
  }

  // "" when every function resolved, else the first that did not.
  std::string Resolve() {
    auto get = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)> >(dlsym(so, name));
      return fn != nullptr;
    };
    if (!get(GetVersion, "cudnnGetVersion")) return "cudnnGetVersion";
    if (!get(GetErrorString, "cudnnGetErrorString")) return "cudnnGetErrorString";
    if (!get(GetLastErrorString, "cudnnGetLastErrorString")) return "cudnnGetLastErrorString";
    if (!get(Create, "cudnnCreate")) return "cudnnCreate";
    if (!get(Destroy, "cudnnDestroy")) return "cudnnDestroy";
    if (!get(SetStream, "cudnnSetStream")) return "cudnnSetStream";
    if (!get(CreateDescriptor, "cudnnBackendCreateDescriptor")) return "cudnnBackendCreateDescriptor";
    if (!get(DestroyDescriptor, "cudnnBackendDestroyDescriptor")) return "cudnnBackendDestroyDescriptor";
    if (!get(SetAttribute, "cudnnBackendSetAttribute")) return "cudnnBackendSetAttribute";
    if (!get(GetAttribute, "cudnnBackendGetAttribute")) return "cudnnBackendGetAttribute";
    if (!get(Finalize, "cudnnBackendFinalize")) return "cudnnBackendFinalize";
    if (!get(Execute, "cudnnBackendExecute")) return "cudnnBackendExecute";
    return "";
  }

  // "what: STATUS (cuDNN's last message)", one line.
  std::string Describe(cudnnStatus_t status, const std::string& what) const {
    std::string line = what + ": " + GetErrorString(status);
    if (const std::string detail = LastMessage(); !detail.empty()) line += " (" + detail + ")";
    return line;
  }
  // cuDNN's message about its last failure, on one line ("" if none).
  std::string LastMessage() const {
    char message[512] = {0};
    GetLastErrorString(message, sizeof(message));
    std::string detail(message);
    for (char& c : detail) {
      if (c == '\n' || c == '\r') c = ' ';
    }
    return detail;
  }
};

namespace {

// One backend descriptor, destroyed with its owner.
class Descriptor {
 public:
  Descriptor() = default;
  Descriptor(const CudnnAttention::Library* lib, cudnnBackendDescriptor_t d) : lib_(lib), d_(d) {}
  Descriptor(Descriptor&& o) noexcept : lib_(o.lib_), d_(o.d_) { o.d_ = nullptr; }
  Descriptor& operator=(Descriptor&& o) noexcept {
    if (this != &o) {
      Reset();
      lib_ = o.lib_;
      d_ = o.d_;
      o.d_ = nullptr;
    }
    return *this;
  }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  ~Descriptor() { Reset(); }
  cudnnBackendDescriptor_t get() const { return d_; }

 private:
  void Reset() {
    if (d_ != nullptr) lib_->DestroyDescriptor(d_);
    d_ = nullptr;
  }
  const CudnnAttention::Library* lib_ = nullptr;
  cudnnBackendDescriptor_t d_ = nullptr;
};

// The tensors a graph reads and writes, by unique id; the virtual tensors
// between its operations take ids from kFirstVirtual up.
enum Uid : int64_t {
  kQ = 1,
  kK = 2,
  kV = 3,
  kO = 4,
  kStats = 5,
  kScale = 6,
  kMaskFill = 7,
  kDO = 8,
  kDQ = 9,
  kDK = 10,
  kDV = 11,
  kSoftmaxSum = 12,
  kFirstVirtual = 100,
};

using Dims = std::array<int64_t, 4>;

// Builds one operation graph. Every call records the first failure in
// error() and does nothing after it, so a graph is written as a straight
// sequence and checked once at its end.
class GraphBuilder {
 public:
  GraphBuilder(const CudnnAttention::Library& lib, cudnnHandle_t handle) : lib_(lib), handle_(handle) {}

  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }

  // A tensor of the graph: `uid` one of Uid's, or 0 for a new virtual one.
  cudnnBackendDescriptor_t Tensor(int64_t uid, cudnnDataType_t type, Dims dims, Dims strides, bool by_value = false) {
    const bool is_virtual = uid == 0;
    if (is_virtual) uid = next_virtual_++;
    Descriptor t = Create(CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor");
    const int64_t alignment = 16;
    Set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type, "tensor data type");
    Set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data(), "tensor dimensions");
    Set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data(), "tensor strides");
    Set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "tensor id");
    Set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment, "tensor alignment");
    if (is_virtual) Set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual, "tensor virtual");
    if (by_value) Set(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value, "tensor by value");
    return Keep(std::move(t), "tensor " + std::to_string(uid));
  }
  // A virtual tensor of `dims`, packed: the intermediates between the
  // operations, fp32 unless a product needs them in the 16-bit type.
  cudnnBackendDescriptor_t Virtual(Dims dims, cudnnDataType_t type = CUDNN_DATA_FLOAT) {
    const Dims strides = {dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1};
    return Tensor(0, type, dims, strides);
  }

  // c = a · b over the last two dimensions, batched over the first two.
  void Matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c) {
    Descriptor desc = Create(CUDNN_BACKEND_MATMUL_DESCRIPTOR, "matmul");
    const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    Set(desc, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute, "matmul compute type");
    auto d = Keep(std::move(desc), "matmul");
    Descriptor op = Create(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "matmul operation");
    Set(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a, "matmul a");
    Set(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b, "matmul b");
    Set(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c, "matmul c");
    Set(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &d, "matmul descriptor");
    AddOperation(std::move(op), "matmul operation");
  }

  // y = mode(x[, b[, t]]) elementwise, broadcasting size-1 dimensions; for
  // CUDNN_POINTWISE_GEN_INDEX, y holds each element's index along `axis` of
  // x's shape.
  void Pointwise(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                 cudnnBackendDescriptor_t y, cudnnBackendDescriptor_t t = nullptr, int64_t axis = -1,
                 cudnnDataType_t precision = CUDNN_DATA_FLOAT) {
    Descriptor desc = Create(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "pointwise");
    Set(desc, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "pointwise mode");
    Set(desc, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &precision, "pointwise precision");
    if (axis >= 0) Set(desc, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, "pointwise axis");
    auto d = Keep(std::move(desc), "pointwise");
    Descriptor op = Create(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, "pointwise operation");
    Set(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &d, "pointwise desc");
    Set(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, "pointwise x");
    if (b != nullptr) Set(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b, "pw b");
    Set(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, "pointwise y");
    if (t != nullptr) Set(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t, "pw t");
    AddOperation(std::move(op), "pointwise operation");
  }

  // y = the `mode` reduction of x over the dimensions where y has size 1.
  void Reduction(cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    Descriptor desc = Create(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, "reduction");
    const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    Set(desc, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode, "reduction operator");
    Set(desc, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute, "reduction compute type");
    auto d = Keep(std::move(desc), "reduction");
    Descriptor op = Create(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, "reduction operation");
    Set(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, "reduction x");
    Set(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, "reduction y");
    Set(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &d, "reduction descriptor");
    AddOperation(std::move(op), "reduction operation");
  }

  // y = x with y's own dimensions and strides (a transpose where they swap).
  void Reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    Descriptor op = Create(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, "reshape operation");
    Set(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, "reshape x");
    Set(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, "reshape y");
    AddOperation(std::move(op), "reshape operation");
  }

  // The operation graph of every operation added, finalized.
  Descriptor Finish() {
    Descriptor graph = Create(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
    std::vector<cudnnBackendDescriptor_t> ops;
    for (const auto& op : ops_) ops.push_back(op.get());
    if (handle_ != nullptr)
      Set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_, "graph handle");
    Set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, int64_t(ops.size()), ops.data(),
        "graph operations");
    if (ok()) Check(lib_.Finalize(graph.get()), "finalize the operation graph");
    return graph;
  }

 private:
  Descriptor Create(cudnnBackendDescriptorType_t type, const char* what) {
    cudnnBackendDescriptor_t d = nullptr;
    if (ok()) Check(lib_.CreateDescriptor(type, &d), std::string("create a ") + what + " descriptor");
    return Descriptor(&lib_, d);
  }
  void Set(const Descriptor& d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count,
           const void* values, const char* what) {
    if (ok()) Check(lib_.SetAttribute(d.get(), name, type, count, values), std::string("set the ") + what);
  }
  cudnnBackendDescriptor_t Keep(Descriptor d, const std::string& what) {
    if (ok()) Check(lib_.Finalize(d.get()), "finalize the " + what);
    kept_.push_back(std::move(d));
    return kept_.back().get();
  }
  void AddOperation(Descriptor op, const char* what) {
    if (ok()) Check(lib_.Finalize(op.get()), std::string("finalize the ") + what);
    ops_.push_back(std::move(op));
  }
  void Check(cudnnStatus_t status, const std::string& what) {
    if (status != CUDNN_STATUS_SUCCESS && ok()) error_ = lib_.Describe(status, what);
  }

  const CudnnAttention::Library& lib_;
  cudnnHandle_t handle_;
  std::vector<Descriptor> kept_;  // tensors and op descriptors, alive until the graph is
  std::vector<Descriptor> ops_;
  int64_t next_virtual_ = kFirstVirtual;
  std::string error_;
};

}  // namespace

// One shape's graph: its finalized execution plan, what the plan's
// workspace needs, and the host values its by-value tensors point at.
struct CudnnAttention::Plan {
  // Declared in the order they are made, so the plan goes first.
  std::unique_ptr<GraphBuilder> builder;  // the graph's tensors and operations
  Descriptor graph;
  Descriptor config;  // the engine configuration the plan runs
  Descriptor plan;
  int64_t workspace_bytes = 0;
  float scale = 0;      // 1/sqrt(head size)
  float mask_fill = 0;  // what a masked score becomes
};

namespace {

// One call's view of the shape: B sequences, H query heads (whole groups)
// and their H / group key/value heads, of the q|k|v rows' `row` elements and
// the out rows' C.
struct CallShape {
  int64_t B, T, H, Hk, hs, row, C;
};

CallShape CallOf(const AttentionShape& s, int64_t H) {
  const int64_t group = s.NH / s.NKV;
  return {s.B, s.T, H, H / group, s.hs, s.RowElements(), s.NH * s.hs};
}

// The graph's inputs as strided views of the packed tensors: q (B, H, T, hs)
// and kᵀ (B, Hk, hs, T) of the q|k|v rows, each head at its own columns; the
// scale and the mask's fill by value. With Hk < H cuDNN's matmuls broadcast
// each key/value head to its group's query heads.
struct Inputs {
  cudnnBackendDescriptor_t q, kt, scale, fill;
};

Inputs MakeInputs(GraphBuilder& g, cudnnDataType_t type, const CallShape& c) {
  const int64_t B = c.B, T = c.T, hs = c.hs, row = c.row;
  Inputs in;
  in.q = g.Tensor(kQ, type, {B, c.H, T, hs}, {T * row, hs, row, 1});
  in.kt = g.Tensor(kK, type, {B, c.Hk, hs, T}, {T * row, hs, 1, row});
  in.scale = g.Tensor(kScale, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, /*by_value=*/true);
  in.fill = g.Tensor(kMaskFill, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, /*by_value=*/true);
  return in;
}

// s = scale · q kᵀ, fp32 and virtual.
cudnnBackendDescriptor_t ScaledScores(GraphBuilder& g, const Inputs& in, int64_t B, int64_t T, int64_t H) {
  const Dims scores = {B, H, T, T};
  const auto s = g.Virtual(scores);
  g.Matmul(in.q, in.kt, s);
  const auto scaled = g.Virtual(scores);
  g.Pointwise(CUDNN_POINTWISE_MUL, s, in.scale, scaled);
  return scaled;
}

// x with the keys after each query's position replaced by the fill (key j
// is seen by query i where i >= j).
cudnnBackendDescriptor_t CausalMask(GraphBuilder& g, const Inputs& in, cudnnBackendDescriptor_t x, int64_t B, int64_t T,
                                    int64_t H) {
  const Dims scores = {B, H, T, T};
  const auto rows = g.Virtual(scores, CUDNN_DATA_INT32);
  g.Pointwise(CUDNN_POINTWISE_GEN_INDEX, x, nullptr, rows, nullptr, /*axis=*/2);
  const auto cols = g.Virtual(scores, CUDNN_DATA_INT32);
  g.Pointwise(CUDNN_POINTWISE_GEN_INDEX, x, nullptr, cols, nullptr, /*axis=*/3);
  const auto seen = g.Virtual(scores, CUDNN_DATA_BOOLEAN);
  g.Pointwise(CUDNN_POINTWISE_CMP_GE, rows, cols, seen, nullptr, -1, CUDNN_DATA_BOOLEAN);
  const auto masked = g.Virtual(scores);
  g.Pointwise(CUDNN_POINTWISE_BINARY_SELECT, x, in.fill, masked, seen);
  return masked;
}

// Forward: the masked scores' row max m and sum z of exp(s - m); lse = m +
// log z (kStats); o = (exp(s - m) / z) · v, p rounded to the 16-bit type
// for that product.
void ForwardGraph(GraphBuilder& g, cudnnDataType_t type, const CallShape& c, int64_t NH) {
  const int64_t B = c.B, T = c.T, H = c.H, hs = c.hs, row = c.row, C = c.C;
  const Inputs in = MakeInputs(g, type, c);
  const auto s = CausalMask(g, in, ScaledScores(g, in, B, T, H), B, T, H);
  const Dims scores = {B, H, T, T}, rows = {B, H, T, 1};
  const auto m = g.Virtual(rows);
  g.Reduction(CUDNN_REDUCE_TENSOR_MAX, s, m);
  const auto shifted = g.Virtual(scores);
  g.Pointwise(CUDNN_POINTWISE_SUB, s, m, shifted);
  const auto e = g.Virtual(scores);
  g.Pointwise(CUDNN_POINTWISE_EXP, shifted, nullptr, e);
  const auto z = g.Virtual(rows);
  g.Reduction(CUDNN_REDUCE_TENSOR_ADD, e, z);
  const auto log_z = g.Virtual(rows);
  g.Pointwise(CUDNN_POINTWISE_LOG, z, nullptr, log_z);
  const auto lse = g.Tensor(kStats, CUDNN_DATA_FLOAT, rows, {NH * T, T, 1, 1});
  g.Pointwise(CUDNN_POINTWISE_ADD, m, log_z, lse);
  const auto p = g.Virtual(scores, type);
  g.Pointwise(CUDNN_POINTWISE_DIV, e, z, p);
  const auto v = g.Tensor(kV, type, {B, c.Hk, T, hs}, {T * row, hs, row, 1});
  const auto o = g.Tensor(kO, type, {B, H, T, hs}, {T * C, hs, C, 1});
  g.Matmul(p, v, o);
}

// Backward, from the forward's lse: dsum = rowsum(do ∘ o) (kSoftmaxSum, in
// the workspace); p = exp(s - lse) under the mask; dv = pᵀ · do;
// dp = do · vᵀ; ds = scale · p ∘ (dp - dsum); dk = dsᵀ · q; dq = ds · k,
// written straight to dq (no fp32 dq sum: cuDNN's deterministic form, which
// keeps dp in its workspace instead). With grouped heads dk and dv are each
// query head's (B, H, T, hs), fp32 and packed in the workspace, for the group
// sums (cuDNN refuses a matmul output with fewer heads than its inputs).
void BackwardGraph(GraphBuilder& g, cudnnDataType_t type, const CallShape& c, int64_t NH) {
  const int64_t B = c.B, T = c.T, H = c.H, hs = c.hs, row = c.row, C = c.C;
  const Dims scores = {B, H, T, T}, rows = {B, H, T, 1}, heads = {B, H, T, hs}, kv_heads = {B, c.Hk, T, hs};
  const Dims in_qkv = {T * row, hs, row, 1}, in_out = {T * C, hs, C, 1}, packed = {H * T * hs, T * hs, hs, 1};
  const Dims& grad_kv = c.Hk < H ? packed : in_qkv;
  const Dims transposed = {H * T * T, T * T, 1, T};
  const Inputs in = MakeInputs(g, type, c);
  const auto dout = g.Tensor(kDO, type, heads, in_out);
  const auto o = g.Tensor(kO, type, heads, in_out);
  const auto dout_o = g.Virtual(heads);
  g.Pointwise(CUDNN_POINTWISE_MUL, dout, o, dout_o);
  const auto dsum = g.Tensor(kSoftmaxSum, CUDNN_DATA_FLOAT, rows, {H * T, T, 1, 1});
  g.Reduction(CUDNN_REDUCE_TENSOR_ADD, dout_o, dsum);
  const auto s = ScaledScores(g, in, B, T, H);
  const auto lse = g.Tensor(kStats, CUDNN_DATA_FLOAT, rows, {NH * T, T, 1, 1});
  const auto shifted = g.Virtual(scores);
  g.Pointwise(CUDNN_POINTWISE_SUB, s, lse, shifted);
  const auto masked = CausalMask(g, in, shifted, B, T, H);
  const auto p = g.Virtual(scores);
  g.Pointwise(CUDNN_POINTWISE_EXP, masked, nullptr, p);
  // dv = pᵀ · do.
  const auto pt = g.Tensor(0, type, scores, transposed);
  g.Reshape(p, pt);
  const auto dv = g.Tensor(kDV, c.Hk < H ? CUDNN_DATA_FLOAT : type, heads, grad_kv);
  g.Matmul(pt, dout, dv);
  // dp = do · vᵀ.
  const auto vt = g.Tensor(kV, type, {B, c.Hk, hs, T}, {T * row, hs, 1, row});
  const auto dp = g.Virtual(scores);
  g.Matmul(dout, vt, dp);
  const auto centred = g.Virtual(scores);
  g.Pointwise(CUDNN_POINTWISE_SUB, dp, dsum, centred);
  const auto ds_unscaled = g.Virtual(scores);
  g.Pointwise(CUDNN_POINTWISE_MUL, centred, p, ds_unscaled);
  const auto ds = g.Virtual(scores);
  g.Pointwise(CUDNN_POINTWISE_MUL, ds_unscaled, in.scale, ds);
  // dk = dsᵀ · q.
  const auto dst = g.Tensor(0, type, scores, transposed);
  g.Reshape(ds, dst);
  const auto dk = g.Tensor(kDK, c.Hk < H ? CUDNN_DATA_FLOAT : type, heads, grad_kv);
  g.Matmul(dst, in.q, dk);
  // dq = ds · k, k the transpose of kᵀ.
  const auto k = g.Tensor(0, type, kv_heads, in_qkv);
  g.Reshape(in.kt, k);
  const auto dq = g.Tensor(kDQ, type, heads, in_qkv);
  g.Matmul(ds, k, dq);
}

// The engine configurations cuDNN's heuristic offers for `graph` in
// `mode`, best first; none (and `first_failure` set, if empty) where it
// offers none.
std::vector<Descriptor> Heuristic(const CudnnAttention::Library& lib, cudnnBackendDescriptor_t graph,
                                  cudnnBackendDescriptor_t device_prop, cudnnBackendHeurMode_t mode,
                                  std::string* first_failure) {
  std::vector<Descriptor> configs;
  auto failed = [&](cudnnStatus_t status, const char* what) {
    if (first_failure->empty()) *first_failure = lib.Describe(status, what);
    return std::vector<Descriptor>();
  };
  cudnnBackendDescriptor_t heur_d = nullptr;
  cudnnStatus_t s = lib.CreateDescriptor(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur_d);
  if (s != CUDNN_STATUS_SUCCESS) return failed(s, "create the heuristic");
  Descriptor heur(&lib, heur_d);
  s = lib.SetAttribute(heur_d, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph);
  if (s == CUDNN_STATUS_SUCCESS)
    s = lib.SetAttribute(heur_d, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  if (s == CUDNN_STATUS_SUCCESS && device_prop != nullptr) {
    s = lib.SetAttribute(heur_d, CUDNN_ATTR_ENGINEHEUR_DEVICEPROP, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &device_prop);
  }
  if (s == CUDNN_STATUS_SUCCESS) s = lib.Finalize(heur_d);
  if (s != CUDNN_STATUS_SUCCESS) return failed(s, "the engine heuristic");
  int64_t count = 0;
  s = lib.GetAttribute(heur_d, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr);
  if (s != CUDNN_STATUS_SUCCESS) return failed(s, "count the heuristic's results");
  std::vector<cudnnBackendDescriptor_t> ds;
  for (int64_t i = 0; i < count; ++i) {
    cudnnBackendDescriptor_t d = nullptr;
    s = lib.CreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &d);
    if (s != CUDNN_STATUS_SUCCESS) return failed(s, "create an engine configuration");
    configs.emplace_back(&lib, d);
    ds.push_back(d);
  }
  if (count == 0) return configs;
  int64_t got = 0;
  s = lib.GetAttribute(heur_d, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, ds.data());
  if (s != CUDNN_STATUS_SUCCESS) return failed(s, "read the heuristic's results");
  configs.resize(size_t(std::clamp<int64_t>(got, 0, count)));
  if (configs.empty() && first_failure->empty()) {
    // The heuristic's support checks refused every configuration it ranked.
    const std::string detail = lib.LastMessage();
    *first_failure = "cuDNN's heuristic offers no engine that supports the graph" +
                     (detail.empty() ? std::string() : " (" + detail + ")");
  }
  return configs;
}

// Whether the configuration's engine carries no non-deterministic numerical
// note (false where its notes cannot be read).
bool Deterministic(const CudnnAttention::Library& lib, cudnnBackendDescriptor_t config) {
  cudnnBackendDescriptor_t engine_d = nullptr;
  if (lib.CreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &engine_d) != CUDNN_STATUS_SUCCESS) return false;
  Descriptor engine(&lib, engine_d);
  int64_t got = 0;
  if (lib.GetAttribute(config, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &got, &engine_d) !=
      CUDNN_STATUS_SUCCESS) {
    return false;
  }
  std::array<cudnnBackendNumericalNote_t, CUDNN_NUMERICAL_NOTE_TYPE_COUNT> notes{};
  int64_t n = 0;
  if (lib.GetAttribute(engine_d, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE, int64_t(notes.size()), &n,
                       notes.data()) != CUDNN_STATUS_SUCCESS) {
    return false;
  }
  for (int64_t j = 0; j < n && j < int64_t(notes.size()); ++j) {
    if (notes[size_t(j)] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) return false;
  }
  return true;
}

// The finalized execution plan of one engine configuration, for the
// handle's device or else the device properties; empty, with `why` set,
// where cuDNN does not finalize it.
Descriptor ExecutionPlan(const CudnnAttention::Library& lib, cudnnHandle_t handle, cudnnBackendDescriptor_t device_prop,
                         cudnnBackendDescriptor_t config, std::string* why) {
  cudnnBackendDescriptor_t plan_d = nullptr;
  cudnnStatus_t s = lib.CreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan_d);
  if (s != CUDNN_STATUS_SUCCESS) {
    *why = lib.Describe(s, "create an execution plan");
    return Descriptor();
  }
  Descriptor plan(&lib, plan_d);
  s = handle != nullptr ? lib.SetAttribute(plan_d, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle)
                        : lib.SetAttribute(plan_d, CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                           1, &device_prop);
  if (s == CUDNN_STATUS_SUCCESS) {
    s = lib.SetAttribute(plan_d, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &config);
  }
  if (s == CUDNN_STATUS_SUCCESS) s = lib.Finalize(plan_d);
  if (s != CUDNN_STATUS_SUCCESS) {
    *why = lib.Describe(s, "finalize the execution plan");
    return Descriptor();
  }
  return plan;
}

}  // namespace

bool CudnnAttention::Built() { return true; }
int64_t CudnnAttention::BuildVersion() { return CUDNN_VERSION; }

namespace {

// libcudnn.so.9 (or the file PSTAR_CUDNN_LIBRARY names) loaded, every
// function resolved and its version no older than the build's; null with
// `why_not` set where not.
std::unique_ptr<CudnnAttention::Library> LoadLibrary(std::string* why_not) {
  const char* named = std::getenv("PSTAR_CUDNN_LIBRARY");
  const std::string path = named != nullptr && named[0] != '\0' ? named : "libcudnn.so.9";
  auto lib = std::make_unique<CudnnAttention::Library>();
  lib->so = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);  // never unloaded: cuDNN keeps state
  if (lib->so == nullptr) {
    const char* err = dlerror();
    *why_not = "cannot load " + path + ": " + (err != nullptr ? err : "unknown error");
    return nullptr;
  }
  if (const std::string missing = lib->Resolve(); !missing.empty()) {
    *why_not = path + " lacks " + missing + " (not cuDNN 9)";
    return nullptr;
  }
  const int64_t version = int64_t(lib->GetVersion());
  if (version < CUDNN_VERSION) {
    *why_not = path + " is cuDNN " + std::to_string(version) + ", older than the " + std::to_string(CUDNN_VERSION) +
               " this build compiled against";
    return nullptr;
  }
  return lib;
}

}  // namespace

std::unique_ptr<CudnnAttention> CudnnAttention::Open(std::string* why_not) {
  auto lib = LoadLibrary(why_not);
  if (lib == nullptr) return nullptr;
  cudnnHandle_t handle = nullptr;
  if (const cudnnStatus_t status = lib->Create(&handle); status != CUDNN_STATUS_SUCCESS) {
    *why_not = lib->Describe(status, "cudnnCreate");
    return nullptr;
  }
  std::unique_ptr<CudnnAttention> route(new CudnnAttention());
  route->library_ = std::move(lib);
  route->handle_ = handle;
  return route;
}

std::unique_ptr<CudnnAttention> CudnnAttention::OpenForDevice(const std::string& device_json, std::string* why_not) {
  auto lib = LoadLibrary(why_not);
  if (lib == nullptr) return nullptr;
  cudnnBackendDescriptor_t prop = nullptr;
  cudnnStatus_t s = lib->CreateDescriptor(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, &prop);
  if (s != CUDNN_STATUS_SUCCESS) {
    *why_not = lib->Describe(s, "create the device properties");
    return nullptr;
  }
  std::unique_ptr<CudnnAttention> route(new CudnnAttention());
  route->device_prop_ = prop;
  s = lib->SetAttribute(prop, CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, int64_t(device_json.size()),
                        device_json.data());
  if (s == CUDNN_STATUS_SUCCESS) s = lib->Finalize(prop);
  route->library_ = std::move(lib);
  if (s != CUDNN_STATUS_SUCCESS) {
    *why_not = route->library_->Describe(s, "read the device properties");
    return nullptr;
  }
  return route;
}

CudnnAttention::~CudnnAttention() {
  plans_.clear();  // before the handle, the device properties and the library they use
  if (library_ == nullptr) return;
  if (handle_ != nullptr) library_->Destroy(static_cast<cudnnHandle_t>(handle_));
  if (device_prop_ != nullptr) library_->DestroyDescriptor(static_cast<cudnnBackendDescriptor_t>(device_prop_));
}

int64_t CudnnAttention::version() const { return int64_t(library_->GetVersion()); }

std::string CudnnAttention::DeviceJson() {
  if (handle_ == nullptr) {
    last_error_ = "cuDNN attention opened for planning only (no device)";
    return "";
  }
  const Library& lib = *library_;
  cudnnBackendDescriptor_t prop_d = nullptr;
  cudnnStatus_t s = lib.CreateDescriptor(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, &prop_d);
  if (s != CUDNN_STATUS_SUCCESS) {
    last_error_ = lib.Describe(s, "create the device properties");
    return "";
  }
  Descriptor prop(&lib, prop_d);
  const auto handle = static_cast<cudnnHandle_t>(handle_);
  s = lib.SetAttribute(prop_d, CUDNN_ATTR_DEVICEPROP_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
  if (s == CUDNN_STATUS_SUCCESS) s = lib.Finalize(prop_d);
  int64_t size = 0;
  if (s == CUDNN_STATUS_SUCCESS) {
    s = lib.GetAttribute(prop_d, CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, 0, &size, nullptr);
  }
  std::string json(size_t(std::max<int64_t>(size, 0)), '\0');
  if (s == CUDNN_STATUS_SUCCESS && size > 0) {
    s = lib.GetAttribute(prop_d, CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, size, &size, json.data());
  }
  if (s != CUDNN_STATUS_SUCCESS) {
    last_error_ = lib.Describe(s, "describe the device");
    return "";
  }
  json.resize(std::min(json.size(), size_t(std::max<int64_t>(size, 0))));
  while (!json.empty() && json.back() == '\0') json.pop_back();
  return json;
}

const CudnnAttention::Plan* CudnnAttention::PlanFor(bool backward, bool bf16, const AttentionShape& shape,
                                                    int64_t H) {
  const int64_t B = shape.B, T = shape.T, NH = shape.NH, NKV = shape.NKV, hs = shape.hs;
  const PlanKey key = {backward, bf16, B, T, NH, NKV, hs, H};
  if (auto it = plans_.find(key); it != plans_.end()) {
    if (it->second == nullptr) last_error_ = refusals_[key];
    return it->second.get();
  }
  auto& slot = plans_[key];  // null until the plan is built: a shape that fails stays failed
  const char* direction = backward ? "backward" : "forward";
  auto fail = [&](const std::string& why) -> const Plan* {
    last_error_ = std::string("cuDNN attention ") + direction + " (B " + std::to_string(B) + ", T " +
                  std::to_string(T) + ", C " + std::to_string(NH * hs) + ", NH " + std::to_string(NH) +
                  (NKV != NH ? ", NKV " + std::to_string(NKV) : std::string()) +
                  (H != NH ? ", " + std::to_string(H) + " heads a call" : std::string()) + "): " + why;
    refusals_[key] = last_error_;
    return nullptr;
  };
  if (NH <= 0 || NKV <= 0 || NH % NKV != 0 || hs <= 0 || B <= 0 || T <= 0 || H <= 0 || H > NH ||
      H % (NH / NKV) != 0) {
    return fail("not an attention shape");
  }
  if (hs % 8 != 0 || hs > 256) return fail("head size " + std::to_string(hs) + " is not a multiple of 8 up to 256");
  const Library& lib = *library_;
  const auto handle = static_cast<cudnnHandle_t>(handle_);
  const auto device_prop = static_cast<cudnnBackendDescriptor_t>(device_prop_);
  const cudnnDataType_t type = bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;

  auto built = std::make_unique<Plan>();
  built->builder = std::make_unique<GraphBuilder>(lib, handle);
  GraphBuilder& g = *built->builder;
  if (backward) {
    BackwardGraph(g, type, CallOf(shape, H), NH);
  } else {
    ForwardGraph(g, type, CallOf(shape, H), NH);
  }
  built->graph = g.Finish();
  if (!g.ok()) return fail(g.error());
  built->scale = 1.0f / std::sqrt(float(hs));
  built->mask_fill = -INFINITY;

  // cuDNN's heuristic ranks the engine configurations (mode A, then its
  // fallback list); the first whose plan finalizes runs: in backward, the
  // first that cuDNN does not mark non-deterministic.
  std::string first_failure;
  bool skipped_nondeterministic = false;
  for (const cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    std::vector<Descriptor> configs = Heuristic(lib, built->graph.get(), device_prop, mode, &first_failure);
    for (size_t i = 0; i < configs.size(); ++i) {
      if (backward && !Deterministic(lib, configs[i].get())) {
        skipped_nondeterministic = true;
        continue;
      }
      if (handle == nullptr) {
        // Planning only: the configuration cuDNN's support checks passed,
        // its workspace; no kernel is compiled (that needs the device).
        int64_t workspace = 0, got = 0;
        if (auto ws = lib.GetAttribute(configs[i].get(), CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &got,
                                       &workspace);
            ws != CUDNN_STATUS_SUCCESS) {
          return fail(lib.Describe(ws, "read the configuration's workspace size"));
        }
        built->config = std::move(configs[i]);
        built->workspace_bytes = workspace;
        slot = std::move(built);
        return slot.get();
      }
      std::string why;
      Descriptor plan = ExecutionPlan(lib, handle, device_prop, configs[i].get(), &why);
      if (plan.get() == nullptr) {
        if (first_failure.empty()) first_failure = why;
        continue;
      }
      int64_t workspace = 0, got = 0;
      if (auto ws = lib.GetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &got,
                                     &workspace);
          ws != CUDNN_STATUS_SUCCESS) {
        return fail(lib.Describe(ws, "read the plan's workspace size"));
      }
      built->config = std::move(configs[i]);
      built->plan = std::move(plan);
      built->workspace_bytes = workspace;
      slot = std::move(built);
      return slot.get();
    }
  }
  if (!first_failure.empty()) return fail(first_failure);
  return fail(skipped_nondeterministic ? "every engine cuDNN offers is marked non-deterministic"
                                       : "cuDNN's heuristic offers no engine that supports the graph");
}

namespace {

int64_t AlignUp(int64_t bytes) { return (bytes + 255) / 256 * 256; }

// Backward's rowsums of do ∘ o (kSoftmaxSum) open its workspace; with
// grouped heads each query head's dk and dv (fp32) follow; then the plan's
// own workspace.
int64_t SoftmaxSumBytes(bool backward, int64_t B, int64_t T, int64_t H) {
  return backward ? AlignUp(B * H * T * int64_t(sizeof(float))) : 0;
}
int64_t GroupedGradBytes(bool backward, const AttentionShape& s, int64_t B, int64_t H) {
  return backward && s.NKV < s.NH ? AlignUp(B * H * s.T * s.hs * int64_t(sizeof(float))) : 0;
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

int64_t CudnnAttention::WorkspaceBytes(bool backward, bool bf16, const AttentionShape& shape, int64_t H) {
  if (H == 0) H = shape.NH;
  const Plan* plan = PlanFor(backward, bf16, shape, H);
  return plan != nullptr ? SoftmaxSumBytes(backward, shape.B, shape.T, H) +
                               2 * GroupedGradBytes(backward, shape, shape.B, H) + AlignUp(plan->workspace_bytes)
                         : -1;
}

CudnnAttention::Slice CudnnAttention::SliceFor(bool backward, bool bf16, const AttentionShape& shape,
                                               size_t workspace_bytes) {
  const int64_t avail = int64_t(workspace_bytes), B = shape.B, NH = shape.NH, group = NH / std::max<int64_t>(shape.NKV, 1);
  AttentionShape sequences = shape;
  // Every head, as many sequences as fit: the workspace grows with the
  // batch, so aim at what fits, then below.
  int64_t b = B;
  for (int tries = 0; tries < 8 && b >= 1; ++tries) {
    sequences.B = b;
    const int64_t need = WorkspaceBytes(backward, bf16, sequences, NH);
    if (need < 0) return {};
    if (need <= avail) return {b, NH};
    const int64_t aimed = int64_t(double(b) * double(avail) / double(need));
    b = std::min(b - 1, std::max<int64_t>(aimed, 1));
  }
  // Not every head of one sequence at once: one sequence, the most query
  // heads a call that divide its heads, are whole groups, and fit.
  sequences.B = 1;
  for (int64_t h = NH - group; h >= group; h -= group) {
    if (NH % h != 0) continue;
    const int64_t need = WorkspaceBytes(backward, bf16, sequences, h);
    if (need >= 0 && need <= avail) return {1, h};
  }
  last_error_ = std::string("cuDNN attention ") + (backward ? "backward" : "forward") + " needs more than the " +
                std::to_string(workspace_bytes) + " bytes of workspace given, even one " +
                (group > 1 ? "group of heads" : "head") + " of one sequence a call";
  return {};
}

// Runs `plan` on `stream` with the tensors by uid.
static bool Run(const CudnnAttention::Library& lib, cudnnHandle_t handle, const CudnnAttention::Plan& plan,
                cudaStream_t stream, const std::vector<int64_t>& uids, const std::vector<void*>& pointers,
                void* workspace, std::string* error) {
  cudnnStatus_t s = lib.SetStream(handle, stream);
  if (s != CUDNN_STATUS_SUCCESS) {
    *error = lib.Describe(s, "cudnnSetStream");
    return false;
  }
  cudnnBackendDescriptor_t pack_d = nullptr;
  s = lib.CreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack_d);
  if (s != CUDNN_STATUS_SUCCESS) {
    *error = lib.Describe(s, "create the variant pack");
    return false;
  }
  Descriptor pack(&lib, pack_d);
  s = lib.SetAttribute(pack_d, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, int64_t(uids.size()), uids.data());
  if (s == CUDNN_STATUS_SUCCESS) {
    s = lib.SetAttribute(pack_d, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, int64_t(pointers.size()),
                         pointers.data());
  }
  if (s == CUDNN_STATUS_SUCCESS) {
    s = lib.SetAttribute(pack_d, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
  }
  if (s == CUDNN_STATUS_SUCCESS) s = lib.Finalize(pack_d);
  if (s == CUDNN_STATUS_SUCCESS) s = lib.Execute(handle, plan.plan.get(), pack_d);
  if (s != CUDNN_STATUS_SUCCESS) {
    *error = lib.Describe(s, "run the attention graph");
    return false;
  }
  return true;
}

bool CudnnAttention::Forward(bool bf16, void* out, float* lse, const void* qkv, const AttentionShape& shape,
                             cudaStream_t stream, void* workspace, size_t workspace_bytes) {
  if (handle_ == nullptr) {
    last_error_ = "cuDNN attention opened for planning only (no device)";
    return false;
  }
  const int64_t B = shape.B, T = shape.T, NH = shape.NH, NKV = shape.NKV, hs = shape.hs;
  if (!Aligned16(out) || !Aligned16(lse) || !Aligned16(qkv) || !Aligned16(workspace) || hs % 8 != 0) {
    last_error_ = "cuDNN attention forward: a tensor is not 16-byte aligned";
    return false;
  }
  const Slice slice = SliceFor(false, bf16, shape, workspace_bytes);
  if (slice.sequences == 0) return false;
  // Bytes of a q|k|v row and of an out row; a query head's and its group's.
  const int64_t row = shape.RowElements() * 2, width = NH * hs * 2, group = NH / NKV;
  for (int64_t b0 = 0; b0 < B; b0 += slice.sequences) {
    AttentionShape call = shape;
    call.B = std::min(slice.sequences, B - b0);
    const Plan* plan = PlanFor(false, bf16, call, slice.heads);
    if (plan == nullptr) return false;  // a smaller last slice cuDNN takes no graph for
    for (int64_t h0 = 0; h0 < NH; h0 += slice.heads) {
      // The call's first element of each tensor: sequence b0, query head h0
      // and its key/value head.
      auto* in = static_cast<char*>(const_cast<void*>(qkv)) + b0 * T * row;
      const int64_t kv = h0 / group;
      const std::vector<int64_t> uids = {kQ, kK, kV, kO, kStats, kScale, kMaskFill};
      const std::vector<void*> pointers = {in + h0 * hs * 2,
                                           in + (NH + kv) * hs * 2,
                                           in + (NH + NKV + kv) * hs * 2,
                                           static_cast<char*>(out) + b0 * T * width + h0 * hs * 2,
                                           lse + (b0 * NH + h0) * T,
                                           const_cast<float*>(&plan->scale),
                                           const_cast<float*>(&plan->mask_fill)};
      if (!Run(*library_, static_cast<cudnnHandle_t>(handle_), *plan, stream, uids, pointers, workspace,
               &last_error_)) {
        return false;
      }
    }
  }
  return true;
}

bool CudnnAttention::Backward(bool bf16, void* dqkv, const void* dout, const void* qkv, const void* out,
                              const float* lse, const AttentionShape& shape, cudaStream_t stream, void* workspace,
                              size_t workspace_bytes) {
  if (handle_ == nullptr) {
    last_error_ = "cuDNN attention opened for planning only (no device)";
    return false;
  }
  const int64_t B = shape.B, T = shape.T, NH = shape.NH, NKV = shape.NKV, hs = shape.hs;
  if (!Aligned16(dqkv) || !Aligned16(dout) || !Aligned16(qkv) || !Aligned16(out) || !Aligned16(lse) ||
      !Aligned16(workspace) || hs % 8 != 0) {
    last_error_ = "cuDNN attention backward: a tensor is not 16-byte aligned";
    return false;
  }
  const Slice slice = SliceFor(true, bf16, shape, workspace_bytes);
  if (slice.sequences == 0) return false;
  const int64_t row = shape.RowElements() * 2, width = NH * hs * 2, group = NH / NKV;
  const bool grouped = NKV < NH;
  auto* sums = static_cast<char*>(workspace);
  for (int64_t b0 = 0; b0 < B; b0 += slice.sequences) {
    AttentionShape call = shape;
    call.B = std::min(slice.sequences, B - b0);
    const Plan* plan = PlanFor(true, bf16, call, slice.heads);
    if (plan == nullptr) return false;
    // With grouped heads, each query head's dk and dv after the sums.
    const int64_t grouped_bytes = GroupedGradBytes(true, shape, call.B, slice.heads);
    char* dk_heads = sums + SoftmaxSumBytes(true, call.B, T, slice.heads);
    char* dv_heads = dk_heads + grouped_bytes;
    char* plan_workspace = dv_heads + grouped_bytes;
    for (int64_t h0 = 0; h0 < NH; h0 += slice.heads) {
      auto* in = static_cast<char*>(const_cast<void*>(qkv)) + b0 * T * row;
      auto* grad = static_cast<char*>(dqkv) + b0 * T * row;
      const int64_t out_offset = b0 * T * width + h0 * hs * 2, kv = h0 / group;
      char* dk = grad + (NH + kv) * hs * 2;
      char* dv = grad + (NH + NKV + kv) * hs * 2;
      const std::vector<int64_t> uids = {kQ, kK, kV, kO, kStats, kScale, kMaskFill, kDO, kDQ, kDK, kDV, kSoftmaxSum};
      const std::vector<void*> pointers = {in + h0 * hs * 2,
                                           in + (NH + kv) * hs * 2,
                                           in + (NH + NKV + kv) * hs * 2,
                                           static_cast<char*>(const_cast<void*>(out)) + out_offset,
                                           const_cast<float*>(lse) + (b0 * NH + h0) * T,
                                           const_cast<float*>(&plan->scale),
                                           const_cast<float*>(&plan->mask_fill),
                                           static_cast<char*>(const_cast<void*>(dout)) + out_offset,
                                           grad + h0 * hs * 2,
                                           grouped ? dk_heads : dk,
                                           grouped ? dv_heads : dv,
                                           sums};
      if (!Run(*library_, static_cast<cudnnHandle_t>(handle_), *plan, stream, uids, pointers, plan_workspace,
               &last_error_)) {
        return false;
      }
      if (grouped) {
        // Each key/value head's dK and dV: its group's query heads' summed.
        const int64_t row_elements = shape.RowElements();
        if (bf16) {
          AddGroupedHeads(reinterpret_cast<__nv_bfloat16*>(dk), row_elements, reinterpret_cast<const float*>(dk_heads), call.B,
                          slice.heads, T, hs, group, stream);
          AddGroupedHeads(reinterpret_cast<__nv_bfloat16*>(dv), row_elements, reinterpret_cast<const float*>(dv_heads), call.B,
                          slice.heads, T, hs, group, stream);
        } else {
          AddGroupedHeads(reinterpret_cast<__half*>(dk), row_elements, reinterpret_cast<const float*>(dk_heads), call.B,
                          slice.heads, T, hs, group, stream);
          AddGroupedHeads(reinterpret_cast<__half*>(dv), row_elements, reinterpret_cast<const float*>(dv_heads), call.B,
                          slice.heads, T, hs, group, stream);
        }
      }
    }
  }
  return true;
}

#endif  // PSTAR_WITH_CUDNN

}  // namespace pstar::kernels::cuda
