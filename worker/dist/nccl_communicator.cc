#include "worker/dist/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <string>
#include <thread>

namespace pstar {

namespace {

using Clock = std::chrono::steady_clock;

std::string CudaText(cudaError_t e) { return cudaGetErrorString(e); }

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(int rank, int world, std::chrono::milliseconds timeout)
      : rank_(rank), world_(world), timeout_(timeout) {}

  // A healthy communicator is finalized first (it flushes NCCL's outstanding
  // work with the peers, which ncclCommDestroy alone may wait on forever), with
  // the collectives' timeout; a broken one, or one whose finalize fails or
  // times out, is aborted.
  ~NcclCommunicator() override {
    if (comm_ != nullptr) {
      bool finalized = false;
      if (broken_.empty()) {
        const ncclResult_t r = ncclCommFinalize(comm_);
        finalized = (r == ncclSuccess || r == ncclInProgress) && WaitForComm("finalize").ok();
      }
      if (finalized) ncclCommDestroy(comm_);
      else ncclCommAbort(comm_);
    }
    if (scratch_ != nullptr) cudaFree(scratch_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  Status Init(Store& store, int device) {
    if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
      return Status::FailedPrecondition("cannot use CUDA device " + std::to_string(device) + ": " + CudaText(e));
    }
    if (cudaError_t e = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking); e != cudaSuccess) {
      return Status::Internal("cannot create the NCCL stream: " + CudaText(e));
    }
    if (cudaError_t e = cudaMalloc(&scratch_, kScratchBytes); e != cudaSuccess) {
      return Status::ResourceExhausted("cannot allocate the NCCL staging buffer: " + CudaText(e));
    }
    ncclUniqueId id;
    const std::string key = "nccl/unique_id";
    if (rank_ == 0) {
      if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) {
        return Status::Internal(std::string("ncclGetUniqueId failed: ") + ncclGetErrorString(r));
      }
      PSTAR_RETURN_IF_ERROR(store.Set(key, std::string(reinterpret_cast<const char*>(&id), sizeof id)));
    } else {
      PSTAR_ASSIGN_OR_RETURN(std::string bytes, store.Get(key));
      if (bytes.size() != sizeof id) return Status::DataLoss("the NCCL id in the store has the wrong size");
      std::memcpy(&id, bytes.data(), sizeof id);
    }
    // Non-blocking init, so joining is bounded by the timeout too.
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&comm_, world_, id, rank_, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      return Status::Internal(std::string("ncclCommInitRank failed: ") + ncclGetErrorString(r));
    }
    return WaitForComm("init");
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  bool device_buffers() const override { return true; }
  void KeepStore(std::unique_ptr<Store> store) { store_ = std::move(store); }

  Status AllGather(const float* shard, float* full, int64_t n) override {
    return Run(CollectiveOp::kAllGather, (world_ - 1) * n * 4, [&] {
      return ncclAllGather(shard, full, size_t(n), ncclFloat32, comm_, stream_);
    });
  }

  Status ReduceScatter(const float* full, float* shard, int64_t n) override {
    return Run(CollectiveOp::kReduceScatter, (world_ - 1) * n * 4, [&] {
      return ncclReduceScatter(full, shard, size_t(n), ncclFloat32, ncclSum, comm_, stream_);
    });
  }

  Status ReduceScatterHalf(const uint16_t* full, uint16_t* shard, int64_t n, HalfFormat format) override {
    // NCCL sums 16-bit values in its own order and precision: the bits are
    // NCCL's, the same on every run of one build and topology.
    const ncclDataType_t type = format == HalfFormat::kBf16 ? ncclBfloat16 : ncclFloat16;
    return Run(CollectiveOp::kReduceScatter, (world_ - 1) * n * 2, [&] {
      return ncclReduceScatter(full, shard, size_t(n), type, ncclSum, comm_, stream_);
    });
  }

  Status AllReduceSum(double* data, int64_t n) override {
    const size_t bytes = size_t(n) * sizeof(double);
    if (bytes > kScratchBytes) return Status::InvalidArgument("all_reduce of more than the staging buffer");
    PSTAR_RETURN_IF_ERROR(Copy(scratch_, data, bytes, cudaMemcpyHostToDevice));
    PSTAR_RETURN_IF_ERROR(Run(CollectiveOp::kAllReduce, 2 * (world_ - 1) * int64_t(bytes) / world_, [&] {
      return ncclAllReduce(scratch_, scratch_, size_t(n), ncclFloat64, ncclSum, comm_, stream_);
    }));
    return Copy(data, scratch_, bytes, cudaMemcpyDeviceToHost);
  }

  Status Broadcast(void* data, int64_t bytes, int root) override {
    if (size_t(bytes) > kScratchBytes) return Status::InvalidArgument("broadcast of more than the staging buffer");
    if (rank_ == root) PSTAR_RETURN_IF_ERROR(Copy(scratch_, data, size_t(bytes), cudaMemcpyHostToDevice));
    PSTAR_RETURN_IF_ERROR(Run(CollectiveOp::kBroadcast, rank_ == root ? (world_ - 1) * bytes : 0, [&] {
      return ncclBroadcast(scratch_, scratch_, size_t(bytes), ncclUint8, root, comm_, stream_);
    }));
    return Copy(data, scratch_, size_t(bytes), cudaMemcpyDeviceToHost);
  }

  Status Barrier() override {
    double zero = 0;
    return AllReduceSum(&zero, 1);
  }

 private:
  static constexpr size_t kScratchBytes = 1 << 20;

  Status Copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
    if (cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, stream_); e != cudaSuccess) {
      return Status::Internal("staging copy failed: " + CudaText(e));
    }
    return WaitForStream("staging copy");
  }

  template <typename Enqueue>
  Status Run(CollectiveOp op, int64_t bytes, Enqueue enqueue) {
    if (!broken_.empty()) return Status::Internal(broken_);
    const auto start = Clock::now();
    ncclResult_t r = enqueue();
    if (r != ncclSuccess && r != ncclInProgress) return Fail(op, ncclGetErrorString(r));
    // A non-blocking communicator may return before the collective is on the
    // stream (the first call sets up connections): an empty stream would
    // look finished. Wait until NCCL has enqueued it.
    if (r == ncclInProgress) PSTAR_RETURN_IF_ERROR(WaitForComm(CollectiveOpName(op)));
    PSTAR_RETURN_IF_ERROR(WaitForStream(CollectiveOpName(op)));
    const size_t i = size_t(op);
    ++counters_.calls[i];
    counters_.bytes[i] += bytes;
    counters_.nanoseconds[i] += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
    return Status();
  }

  // Waits for the stream, watching NCCL's asynchronous errors and the timeout.
  Status WaitForStream(const char* what) {
    const auto deadline = Clock::now() + timeout_;
    while (true) {
      cudaError_t e = cudaStreamQuery(stream_);
      if (e == cudaSuccess) return Status();
      if (e != cudaErrorNotReady) return Broken(std::string(what) + " failed: " + CudaText(e));
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        return Broken(std::string(what) + " failed: " + ncclGetErrorString(async));
      }
      if (Clock::now() > deadline) {
        return Broken(std::string(what) + " did not finish within " +
                      std::to_string(timeout_.count() / 1000.0) + " s (a peer may be lost)");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  Status WaitForComm(const char* what) {
    const auto deadline = Clock::now() + timeout_;
    while (true) {
      ncclResult_t state = ncclSuccess;
      ncclCommGetAsyncError(comm_, &state);
      if (state == ncclSuccess) return Status();
      if (state != ncclInProgress) return Broken(std::string("NCCL ") + what + " failed: " + ncclGetErrorString(state));
      if (Clock::now() > deadline) return Broken(std::string("NCCL ") + what + " did not finish within the timeout");
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  Status Fail(CollectiveOp op, const char* why) {
    return Broken(std::string(CollectiveOpName(op)) + " failed: " + why);
  }

  Status Broken(std::string message) {
    broken_ = std::move(message);
    return Status::Internal(broken_);
  }

  int rank_, world_;
  std::chrono::milliseconds timeout_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  void* scratch_ = nullptr;
  std::string broken_;
  std::unique_ptr<Store> store_;  // destroyed after the NCCL communicator
};

}  // namespace

Result<std::unique_ptr<Communicator>> MakeNcclCommunicator(Store& store, int rank, int world_size, int device,
                                                           std::chrono::milliseconds timeout) {
  auto comm = std::make_unique<NcclCommunicator>(rank, world_size, timeout);
  PSTAR_RETURN_IF_ERROR(comm->Init(store, device));
  return std::unique_ptr<Communicator>(std::move(comm));
}

Result<std::unique_ptr<Communicator>> MakeNcclCommunicator(std::unique_ptr<Store> store, int rank, int world_size,
                                                           int device, std::chrono::milliseconds timeout) {
  auto comm = std::make_unique<NcclCommunicator>(rank, world_size, timeout);
  PSTAR_RETURN_IF_ERROR(comm->Init(*store, device));
  comm->KeepStore(std::move(store));
  return std::unique_ptr<Communicator>(std::move(comm));
}

}  // namespace pstar
