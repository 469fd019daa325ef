// The warp emulation itself (tests/kernels/cuda/warp_emulation.h): its
// barriers order every thread's shared-memory writes before the reads after
// them, each emulated thread keeps its own indices and cp.async groups, and
// a barrier that not every thread reaches ends the run naming it rather than
// hanging.
#include "tests/kernels/cuda/warp_emulation.h"

#include <gtest/gtest.h>

#include <vector>

namespace pstar {
namespace {

namespace emulation = test::emulation;

TEST(WarpEmulated, SyncthreadsOrdersSharedMemoryAndEachThreadKeepsItsIndices) {
  constexpr unsigned kThreads = 96;  // three warps
  const emulation::Dim3 grid{3, 2, 1};
  std::vector<long> sums(size_t(grid.x * grid.y * kThreads), -1);
  emulation::RunBlocks(grid, kThreads, kThreads * sizeof(int), [&] {
    int* slots = reinterpret_cast<int*>(emulation::TensorCoreSharedMemory());
    const unsigned block = blockIdx.y * gridDim.x + blockIdx.x;
    slots[threadIdx.x] = int(1000 * block + threadIdx.x);
    __syncthreads();
    long sum = 0;
    for (unsigned t = 0; t < blockDim.x; ++t) sum += slots[t];  // every thread's write, none of the garbage
    __syncthreads();
    slots[(threadIdx.x + 1) % blockDim.x] = -1;  // overwritten only after every read above
    sums[block * kThreads + threadIdx.x] = sum + threadIdx.x;
  });
  for (unsigned block = 0; block < grid.x * grid.y; ++block) {
    const long expected = long(kThreads) * 1000 * block + long(kThreads) * (kThreads - 1) / 2;
    for (unsigned t = 0; t < kThreads; ++t) {
      ASSERT_EQ(sums[block * kThreads + t], expected + t) << "block " << block << " thread " << t;
    }
  }
}

TEST(WarpEmulated, WarpShufflesExchangeTheLanesOfTheirOwnWarp) {
  std::vector<float> got(64);
  emulation::RunBlocks({1, 1, 1}, 64, 0, [&] {
    got[threadIdx.x] = emulation::ShflXor(float(threadIdx.x), 1) + emulation::WarpSum(1.0f);
  });
  for (unsigned t = 0; t < 64; ++t) EXPECT_EQ(got[t], float(t ^ 1u) + 32.0f) << "thread " << t;
}

TEST(WarpEmulated, CpAsyncCopiesLandOnlyAtTheirWait) {
  std::vector<unsigned char> source(32 * 16, 7);
  std::vector<int> before(32), after(32);
  emulation::RunBlocks({1, 1, 1}, 32, 32 * 16, [&] {
    unsigned char* tile = emulation::TensorCoreSharedMemory() + 16 * threadIdx.x;
    emulation::CpAsync16(tile, source.data() + 16 * threadIdx.x, true);
    emulation::CpAsyncCommit();
    before[threadIdx.x] = tile[0];
    emulation::CpAsyncWait<0>();
    after[threadIdx.x] = tile[0];
  });
  for (unsigned t = 0; t < 32; ++t) {
    EXPECT_EQ(before[t], 0xCD) << "thread " << t << " saw its copy before the wait";
    EXPECT_EQ(after[t], 7) << "thread " << t;
  }
}

TEST(WarpEmulatedDeathTest, ABarrierNotEveryThreadReachesEndsTheRunNamingIt) {
  // Lane 0 waits at __syncwarp; the warp's other lanes never come.
  EXPECT_DEATH(emulation::RunBlocks({1, 1, 1}, 64, 0,
                                    [] {
                                      if (threadIdx.x == 0) __syncwarp();
                                    }),
               "block 0,0 cannot go on: at __syncwarp 1 of 32 threads \\(thread 0 first\\)");
}

}  // namespace
}  // namespace pstar
