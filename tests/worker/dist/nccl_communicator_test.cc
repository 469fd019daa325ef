// The NCCL communicator on real GPUs: two ranks (threads, one GPU each)
// rendezvous through the Store and run every collective against a host
// reference (skipped with fewer than two CUDA devices); and a world of one
// on one GPU, every collective in place and not, called directly and
// queued on the communicator's own thread, so that every GPU host
// exercises the NCCL path it can reach.
#include "worker/dist/nccl_communicator.h"
#include "worker/runtime/half_format.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <thread>

#include "tests/test_util.h"

namespace pstar {
namespace {

TEST(NcclCommunicator, CollectivesMatchAHostReference) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
  PSTAR_REQUIRE_GPUS_FOUND(2, devices);
  const int port = test::FreePort();
  const int64_t n = 1000;
  std::vector<std::string> errors(2);
  std::vector<std::vector<float>> gathered(2), scattered(2);
  std::vector<double> sums(2);
  auto rank = [&](int r) {
    StoreOptions o;
    o.port = port;
    o.rdzv_id = "nccl-test";
    o.rank = r;
    o.world_size = 2;
    o.timeout = std::chrono::seconds(30);
    auto store = Store::Connect(o);
    if (!store.ok()) return void(errors[size_t(r)] = store.status().message());
    auto comm = MakeNcclCommunicator(**store, r, 2, r, std::chrono::seconds(30));
    if (!comm.ok()) return void(errors[size_t(r)] = comm.status().message());
    std::vector<float> host(size_t(2 * n));
    for (int64_t i = 0; i < 2 * n; ++i) host[size_t(i)] = float(r * 10000 + i);
    float *full = nullptr, *shard = nullptr;
    cudaMalloc(&full, size_t(2 * n) * 4);
    cudaMalloc(&shard, size_t(n) * 4);
    cudaMemcpy(shard, host.data() + r * n, size_t(n) * 4, cudaMemcpyHostToDevice);
    Status s = (*comm)->AllGather(shard, full, n);
    gathered[size_t(r)].resize(size_t(2 * n));
    cudaMemcpy(gathered[size_t(r)].data(), full, size_t(2 * n) * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(full, host.data(), size_t(2 * n) * 4, cudaMemcpyHostToDevice);
    if (s.ok()) s = (*comm)->ReduceScatter(full, shard, n);
    scattered[size_t(r)].resize(size_t(n));
    cudaMemcpy(scattered[size_t(r)].data(), shard, size_t(n) * 4, cudaMemcpyDeviceToHost);
    double x = r + 1.5;
    if (s.ok()) s = (*comm)->AllReduceSum(&x, 1);
    sums[size_t(r)] = x;
    if (s.ok()) s = (*comm)->Barrier();
    if (!s.ok()) errors[size_t(r)] = s.message();
    cudaFree(full);
    cudaFree(shard);
  };
  std::thread a(rank, 0), b(rank, 1);
  a.join();
  b.join();
  ASSERT_EQ(errors[0], "");
  ASSERT_EQ(errors[1], "");
  for (int r = 0; r < 2; ++r) {
    for (int64_t i = 0; i < 2 * n; ++i) {
      // Rank q's shard is its own values at [q*n, (q+1)*n).
      const int64_t q = i / n;
      ASSERT_EQ(gathered[size_t(r)][size_t(i)], float(q * 10000 + i));
    }
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(scattered[size_t(r)][size_t(i)], float(0 * 10000 + r * n + i) + float(10000 + r * n + i));
    }
    EXPECT_EQ(sums[size_t(r)], 1.5 + 2.5);
  }
}

// Runs `work` on `comm` directly, or (queued) through Start and Wait on the
// communicator's own thread, as the training step does.
Status Call(Communicator& comm, bool queued, const std::function<Status(Communicator&)>& work) {
  if (!queued) return work(comm);
  return comm.Wait(comm.Start(work));
}

TEST(NcclCommunicator, AWorldOfOneRunsEveryCollectiveInPlaceAndNot) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
  PSTAR_REQUIRE_GPUS_FOUND(1, devices);
  StoreOptions o;
  o.port = test::FreePort();
  o.rdzv_id = "nccl-one";
  o.rank = 0;
  o.world_size = 1;
  o.timeout = std::chrono::seconds(30);
  auto store = Store::Connect(o);
  ASSERT_TRUE(store.ok()) << store.status().message();
  auto made = MakeNcclCommunicator(**store, 0, 1, 0, std::chrono::seconds(30));
  ASSERT_TRUE(made.ok()) << made.status().message();
  ASSERT_TRUE((*made)->device_buffers());
  ASSERT_EQ((*made)->world_size(), 1);
  const int64_t n = 4099;  // not a multiple of any vector width
  std::vector<float> host(static_cast<size_t>(n)), back(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) host[size_t(i)] = 0.5f * float(i) - 7.0f;
  float *full = nullptr, *shard = nullptr;
  ASSERT_EQ(cudaMalloc(&full, size_t(n) * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&shard, size_t(n) * 4), cudaSuccess);
  auto expect_host = [&](const float* device, const char* what) {
    ASSERT_EQ(cudaMemcpy(back.data(), device, size_t(n) * 4, cudaMemcpyDeviceToHost), cudaSuccess) << what;
    ASSERT_EQ(back, host) << what;
  };
  // Every collective, first called directly, then queued (the communicator
  // the trainer makes: its own thread, Start and Wait).
  auto exercise = [&](Communicator& comm, bool queued) {
    SCOPED_TRACE(queued ? "queued" : "direct");
    // Out of place: a world of one gathers and reduce-scatters its own values.
    cudaMemcpy(shard, host.data(), size_t(n) * 4, cudaMemcpyHostToDevice);
    cudaMemset(full, 0, size_t(n) * 4);
    ASSERT_TRUE(Call(comm, queued, [&](Communicator& c) { return c.AllGather(shard, full, n); }).ok());
    expect_host(full, "all_gather");
    cudaMemset(shard, 0, size_t(n) * 4);
    ASSERT_TRUE(Call(comm, queued, [&](Communicator& c) { return c.ReduceScatter(full, shard, n); }).ok());
    expect_host(shard, "reduce_scatter");
    // In place: the shard is its own place in the buffer.
    ASSERT_TRUE(Call(comm, queued, [&](Communicator& c) { return c.AllGather(full, full, n); }).ok());
    expect_host(full, "all_gather in place");
    ASSERT_TRUE(Call(comm, queued, [&](Communicator& c) { return c.ReduceScatter(full, full, n); }).ok());
    expect_host(full, "reduce_scatter in place");
    // 16-bit reduce-scatter: the values pass through as they are, in place
    // too, half the bytes (none cross with one rank).
    for (HalfFormat format : {HalfFormat::kBf16, HalfFormat::kFp16}) {
      std::vector<uint16_t> half(static_cast<size_t>(n)), half_back(static_cast<size_t>(n));
      NarrowToHalf(half.data(), host.data(), n, format);
      uint16_t* h_full = reinterpret_cast<uint16_t*>(full);
      uint16_t* h_shard = reinterpret_cast<uint16_t*>(shard);
      cudaMemcpy(h_full, half.data(), size_t(n) * 2, cudaMemcpyHostToDevice);
      cudaMemset(h_shard, 0, size_t(n) * 2);
      ASSERT_TRUE(
          Call(comm, queued, [&](Communicator& c) { return c.ReduceScatterHalf(h_full, h_shard, n, format); }).ok());
      ASSERT_EQ(cudaMemcpy(half_back.data(), h_shard, size_t(n) * 2, cudaMemcpyDeviceToHost), cudaSuccess);
      EXPECT_EQ(half_back, half) << "reduce_scatter_half";
      ASSERT_TRUE(
          Call(comm, queued, [&](Communicator& c) { return c.ReduceScatterHalf(h_full, h_full, n, format); }).ok());
      ASSERT_EQ(cudaMemcpy(half_back.data(), h_full, size_t(n) * 2, cudaMemcpyDeviceToHost), cudaSuccess);
      EXPECT_EQ(half_back, half) << "reduce_scatter_half in place";
    }
    double sums[3] = {1.5, -2.25, 1e300};
    ASSERT_TRUE(Call(comm, queued, [&](Communicator& c) { return c.AllReduceSum(sums, 3); }).ok());
    EXPECT_EQ(sums[0], 1.5);
    EXPECT_EQ(sums[1], -2.25);
    EXPECT_EQ(sums[2], 1e300);
    int32_t token = 42;
    ASSERT_TRUE(Call(comm, queued, [&](Communicator& c) { return c.Broadcast(&token, sizeof(token), 0); }).ok());
    EXPECT_EQ(token, 42);
    ASSERT_TRUE(Call(comm, queued, [&](Communicator& c) { return c.Barrier(); }).ok());
  };
  auto expect_counts = [](const CollectiveCounters& c, int passes) {
    // Per pass: two all-gathers; two fp32 reduce-scatters and two per 16-bit
    // format; the sum and the barrier (an all-reduce of one value); one
    // broadcast.
    EXPECT_EQ(c.calls[int(CollectiveOp::kAllGather)].load(), 2 * passes);
    EXPECT_EQ(c.calls[int(CollectiveOp::kReduceScatter)].load(), 6 * passes);
    EXPECT_EQ(c.calls[int(CollectiveOp::kAllReduce)].load(), 2 * passes);
    EXPECT_EQ(c.calls[int(CollectiveOp::kBroadcast)].load(), passes);
    EXPECT_EQ(c.bytes[int(CollectiveOp::kAllGather)].load(), 0) << "a world of one sends nothing";
    EXPECT_EQ(c.bytes[int(CollectiveOp::kReduceScatter)].load(), 0);
  };
  exercise(**made, false);
  expect_counts((*made)->counters(), 1);
  std::unique_ptr<Communicator> queued = MakeQueuedCommunicator(std::move(*made));
  ASSERT_TRUE(queued->queued());
  exercise(*queued, true);
  expect_counts(queued->counters(), 2);
  queued.reset();  // its thread drains before the buffers go
  cudaFree(full);
  cudaFree(shard);
}

}  // namespace
}  // namespace pstar
