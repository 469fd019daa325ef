#include "worker/dist/gloo_communicator.h"
#include "worker/runtime/half_format.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "tests/test_util.h"
#include "worker/dist/dist_env.h"
#include "worker/dist/store.h"

namespace pstar {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

uint64_t Seed() {
  static const uint64_t seed = test::RunSeed();
  return seed;
}
std::string SeedNote() { return "seed " + std::to_string(Seed()) + " (rerun with PSTAR_TEST_SEED)"; }

// The data rank `rank` contributes, reproducible by every thread.
template <typename T>
std::vector<T> RankData(int rank, int64_t n, int salt) {
  std::mt19937_64 rng(Seed() ^ (uint64_t(rank) * 0x9e3779b97f4a7c15ull) ^ uint64_t(salt));
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  std::vector<T> v(static_cast<size_t>(n));
  for (T& x : v) x = T(dist(rng));
  return v;
}

StoreOptions Options(int port, int rank, int world, milliseconds timeout) {
  StoreOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.rdzv_id = "gloo-test";
  o.rank = rank;
  o.world_size = world;
  o.timeout = timeout;
  return o;
}

// Runs `body` on `world` threads, each a rank with its own Store client and
// Gloo communicator (rank 0's Store hosts the server).
void RunRanks(int world, const std::function<void(Communicator&)>& body) {
  const int port = test::FreePort();
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      auto store = Store::Connect(Options(port, r, world, milliseconds(20000)));
      ASSERT_TRUE(store.ok()) << store.status().message();
      auto comm = MakeGlooCommunicator(**store, r, world, milliseconds(20000));
      ASSERT_TRUE(comm.ok()) << comm.status().message();
      ASSERT_EQ((*comm)->rank(), r);
      ASSERT_EQ((*comm)->world_size(), world);
      body(**comm);
    });
  }
  for (auto& t : threads) t.join();
}

int64_t Bytes(const Communicator& c, CollectiveOp op) { return c.counters().bytes[size_t(op)].load(); }
int64_t Calls(const Communicator& c, CollectiveOp op) { return c.counters().calls[size_t(op)].load(); }

class GlooWorld : public ::testing::TestWithParam<int> {};

TEST_P(GlooWorld, CollectivesMatchAReference) {
  const int world = GetParam();
  SCOPED_TRACE(SeedNote());
  constexpr int64_t kShard = 1000;
  std::vector<std::vector<double>> all_reduced(static_cast<size_t>(world));
  std::atomic<int> arrived{0};

  RunRanks(world, [&](Communicator& comm) {
    const int r = comm.rank();
    // all_gather: rank r's shard lands at r * kShard everywhere, also in place.
    std::vector<float> shard = RankData<float>(r, kShard, 1);
    std::vector<float> full(static_cast<size_t>(world * kShard), -7.0f);
    ASSERT_TRUE(comm.AllGather(shard.data(), full.data(), kShard).ok());
    std::vector<float> in_place(static_cast<size_t>(world * kShard), -7.0f);
    std::copy(shard.begin(), shard.end(), in_place.begin() + r * kShard);
    ASSERT_TRUE(comm.AllGather(in_place.data() + r * kShard, in_place.data(), kShard).ok());
    for (int p = 0; p < world; ++p) {
      const std::vector<float> expect = RankData<float>(p, kShard, 1);
      EXPECT_TRUE(std::equal(expect.begin(), expect.end(), full.begin() + p * kShard)) << "from rank " << p;
      EXPECT_TRUE(std::equal(expect.begin(), expect.end(), in_place.begin() + p * kShard)) << "from rank " << p;
    }
    EXPECT_EQ(Calls(comm, CollectiveOp::kAllGather), 2);
    EXPECT_EQ(Bytes(comm, CollectiveOp::kAllGather), 2 * (world - 1) * kShard * 4);

    // reduce_scatter: this rank's block summed over ranks, the same bits twice.
    const std::vector<float> contribution = RankData<float>(r, world * kShard, 2);
    std::vector<float> out1(static_cast<size_t>(kShard)), out2(static_cast<size_t>(kShard));
    ASSERT_TRUE(comm.ReduceScatter(contribution.data(), out1.data(), kShard).ok());
    ASSERT_TRUE(comm.ReduceScatter(contribution.data(), out2.data(), kShard).ok());
    std::vector<double> expect(static_cast<size_t>(kShard), 0.0);
    for (int p = 0; p < world; ++p) {
      const std::vector<float> x = RankData<float>(p, world * kShard, 2);
      for (int64_t i = 0; i < kShard; ++i) expect[size_t(i)] += x[size_t(r * kShard + i)];
    }
    for (int64_t i = 0; i < kShard; ++i) {
      ASSERT_NEAR(out1[size_t(i)], expect[size_t(i)], 1e-5) << "element " << i;
    }
    EXPECT_EQ(std::memcmp(out1.data(), out2.data(), out1.size() * sizeof(float)), 0);
    EXPECT_EQ(Bytes(comm, CollectiveOp::kReduceScatter), 2 * (world - 1) * kShard * 4);

    // all_reduce: a ring over sizes that split unevenly; a small one (fewer
    // elements than ranks) in one exchange, summed in rank order.
    for (int64_t n : {int64_t(1001), int64_t(3)}) {
      const int64_t bytes_before = Bytes(comm, CollectiveOp::kAllReduce);
      std::vector<double> data = RankData<double>(r, n, 3);
      ASSERT_TRUE(comm.AllReduceSum(data.data(), n).ok());
      for (int64_t i = 0; i < n; ++i) {
        double sum = 0;
        for (int p = 0; p < world; ++p) sum += RankData<double>(p, n, 3)[size_t(i)];
        if (n == 3) {
          ASSERT_EQ(data[size_t(i)], sum) << "element " << i;
        } else {
          ASSERT_NEAR(data[size_t(i)], sum, 1e-12) << "n " << n << " element " << i;
        }
      }
      if (n == 3) {
        EXPECT_EQ(Bytes(comm, CollectiveOp::kAllReduce) - bytes_before, (world - 1) * 3 * 8);
      }
      if (n == 1001) all_reduced[size_t(r)] = data;
    }

    // broadcast from the last rank.
    const int root = world - 1;
    std::vector<double> b = r == root ? RankData<double>(root, 333, 4) : std::vector<double>(333, 0.0);
    ASSERT_TRUE(comm.Broadcast(b.data(), int64_t(b.size() * sizeof(double)), root).ok());
    EXPECT_EQ(b, RankData<double>(root, 333, 4));
    EXPECT_EQ(Bytes(comm, CollectiveOp::kBroadcast), r == root ? (world - 1) * 333 * 8 : 0);
    EXPECT_FALSE(comm.Broadcast(b.data(), 8, world).ok());

    // barrier: nobody leaves before everybody has arrived.
    arrived.fetch_add(1);
    ASSERT_TRUE(comm.Barrier().ok());
    EXPECT_EQ(arrived.load(), world);
    EXPECT_EQ(Bytes(comm, CollectiveOp::kBarrier), world - 1);
    ASSERT_TRUE(comm.Barrier().ok());  // keeps every rank here until all have checked
  });

  // Every rank holds the same all-reduce bits.
  for (int r = 1; r < world; ++r) {
    ASSERT_EQ(all_reduced[size_t(r)].size(), all_reduced[0].size());
    EXPECT_EQ(std::memcmp(all_reduced[size_t(r)].data(), all_reduced[0].data(), all_reduced[0].size() * 8), 0)
        << "rank " << r;
  }
}

TEST_P(GlooWorld, SixteenBitReduceScatterRoundsEachRingStepAndSendsHalfTheBytes) {
  const int world = GetParam();
  SCOPED_TRACE(SeedNote());
  constexpr int64_t kShard = 1000;
  for (HalfFormat format : {HalfFormat::kBf16, HalfFormat::kFp16}) {
    // Every rank's 16-bit contribution, reproducible by every thread.
    auto contribution = [&](int rank) {
      const std::vector<float> x = RankData<float>(rank, world * kShard, 5);
      std::vector<uint16_t> h(x.size());
      NarrowToHalf(h.data(), x.data(), int64_t(x.size()), format);
      return h;
    };
    RunRanks(world, [&](Communicator& comm) {
      const int r = comm.rank();
      const std::vector<uint16_t> mine = contribution(r);
      std::vector<uint16_t> out(static_cast<size_t>(kShard)), again(static_cast<size_t>(kShard));
      ASSERT_TRUE(comm.ReduceScatterHalf(mine.data(), out.data(), kShard, format).ok());
      ASSERT_TRUE(comm.ReduceScatterHalf(mine.data(), again.data(), kShard, format).ok());
      EXPECT_EQ(out, again);
      // The ring's order: block r summed from rank r+1 on, each partial sum
      // rounded to the format before the next rank adds its part.
      std::vector<float> acc(static_cast<size_t>(kShard)), x(static_cast<size_t>(kShard));
      const std::vector<uint16_t> first = contribution((r + 1) % world);
      std::vector<uint16_t> rounded(first.begin() + r * kShard, first.begin() + (r + 1) * kShard);
      for (int k = 2; k <= world; ++k) {
        const std::vector<uint16_t> part = contribution((r + k) % world);
        WidenFromHalf(acc.data(), rounded.data(), kShard, format);
        WidenFromHalf(x.data(), part.data() + r * kShard, kShard, format);
        for (int64_t i = 0; i < kShard; ++i) acc[size_t(i)] += x[size_t(i)];
        NarrowToHalf(rounded.data(), acc.data(), kShard, format);
      }
      EXPECT_EQ(out, rounded);
      EXPECT_EQ(Bytes(comm, CollectiveOp::kReduceScatter), 2 * (world - 1) * kShard * 2);
    });
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, GlooWorld, ::testing::Values(2, 4),
                         [](const auto& info) { return "World" + std::to_string(info.param); });

TEST(GlooCommunicator, ConnectCommunicatorFromTheEnvironment) {
  DistEnv single;
  auto one = ConnectCommunicator(single, milliseconds(1000));
  ASSERT_TRUE(one.ok());
  EXPECT_EQ((*one)->world_size(), 1);

  const int port = test::FreePort();
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      DistEnv env;
      env.rank = r;
      env.world_size = 2;
      env.master_port = port;
      env.rdzv_id = "connect-test";
      auto comm = ConnectCommunicator(env, milliseconds(20000));
      ASSERT_TRUE(comm.ok()) << comm.status().message();
      double x = r + 1;
      ASSERT_TRUE((*comm)->AllReduceSum(&x, 1).ok());
      EXPECT_EQ(x, 3.0);
    });
  }
  for (auto& t : threads) t.join();
}

// Rank 1 runs in a forked child that joins the group and then exits (or
// stalls) before the next collective; rank 0, in this process, must fail that
// collective with a message naming the op and the peer, within the timeout.
enum class Peer { kExits, kStalls };

void RunWithLostPeer(Peer mode, milliseconds timeout, const std::function<void(Communicator&)>& survivor) {
  const int port = test::FreePort();
  std::fflush(nullptr);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Only async-safe exits from here: never return into the test runner.
    auto store = Store::Connect(Options(port, 1, 2, timeout));
    if (!store.ok()) ::_exit(3);
    auto comm = MakeGlooCommunicator(**store, 1, 2, timeout);
    if (!comm.ok()) ::_exit(4);
    if (mode == Peer::kStalls) ::sleep(30);
    ::_exit(0);  // the kernel closes every socket, as when a rank crashes
  }
  // The child is gone before this rank's Store stops serving, so that stop
  // does not wait for it.
  struct Reap {
    pid_t pid;
    ~Reap() {
      int status = 0;
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
    }
  };
  auto store = Store::Connect(Options(port, 0, 2, timeout));
  Reap reap{child};
  ASSERT_TRUE(store.ok()) << store.status().message();
  auto comm = MakeGlooCommunicator(**store, 0, 2, timeout);
  ASSERT_TRUE(comm.ok()) << comm.status().message();
  survivor(**comm);
}

TEST(GlooCommunicator, APeerThatExitedFailsTheNextCollectiveNamingIt) {
  const milliseconds timeout(3000);
  RunWithLostPeer(Peer::kExits, timeout, [&](Communicator& comm) {
    std::this_thread::sleep_for(milliseconds(200));  // let the child exit
    std::vector<float> full(20), shard(10, 1.0f);
    const auto start = Clock::now();
    Status s = comm.AllGather(shard.data(), full.data(), 10);
    EXPECT_LE(Clock::now() - start, timeout + milliseconds(1000));
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.message().rfind("all_gather failed: ", 0), 0u) << s.message();
    EXPECT_NE(s.message().find("rank 1"), std::string::npos) << s.message();
    EXPECT_EQ(s.message().find('\n'), std::string::npos) << s.message();
    // Broken for good: later calls fail at once, repeating the cause.
    Status again = comm.Barrier();
    ASSERT_FALSE(again.ok());
    EXPECT_NE(again.message().find("barrier: the communicator failed earlier: all_gather failed"),
              std::string::npos)
        << again.message();
    EXPECT_EQ(comm.counters().calls[size_t(CollectiveOp::kAllGather)].load(), 1);
  });
}

TEST(GlooCommunicator, AStalledPeerTimesOutNamingIt) {
  const milliseconds timeout(1000);
  RunWithLostPeer(Peer::kStalls, timeout, [&](Communicator& comm) {
    std::vector<float> full(20), shard(10, 1.0f);
    const auto start = Clock::now();
    Status s = comm.ReduceScatter(full.data(), shard.data(), 10);
    const auto took = Clock::now() - start;
    ASSERT_FALSE(s.ok());
    EXPECT_GE(took, timeout - milliseconds(100));
    EXPECT_LE(took, timeout + milliseconds(1500));
    EXPECT_EQ(s.message(), "reduce_scatter failed: rank 1 sent nothing within 1 s (is it alive?)");
  });
}

TEST(GlooCommunicator, ARankThatNeverComesFailsTheRendezvous) {
  const int port = test::FreePort();
  auto store = Store::Connect(Options(port, 0, 2, milliseconds(500)));
  ASSERT_TRUE(store.ok()) << store.status().message();
  const auto start = Clock::now();
  auto comm = MakeGlooCommunicator(**store, 0, 2, milliseconds(500));
  EXPECT_LT(Clock::now() - start, milliseconds(3000));
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().message(), "gloo rendezvous: rank 1 did not join within 500 ms (store at 127.0.0.1:" +
                                         std::to_string(port) + ")");
}

}  // namespace
}  // namespace pstar
