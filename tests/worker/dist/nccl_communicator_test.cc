// The NCCL communicator on real GPUs: two ranks (threads, one GPU each)
// rendezvous through the Store and run every collective against a host
// reference. Skips where fewer than two CUDA devices are present.
#include "worker/dist/nccl_communicator.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace pstar
