// The queued communicator: started work runs in order on its own thread,
// direct calls wait for what came before them, failures reach every later
// ticket, and collectives on it give the inner communicator's results.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>
#include <vector>

#include "tests/worker/dist/thread_group_communicator.h"
#include "worker/dist/communicator.h"

namespace pstar {
namespace {

using namespace std::chrono_literals;

TEST(QueuedCommunicator, StartedWorkRunsInOrderOffTheCallersThread) {
  auto comm = MakeQueuedCommunicator(MakeSingleRankCommunicator());
  ASSERT_TRUE(comm->queued());
  std::vector<int> order;
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<bool> on_caller{false};
  const CollectiveTicket first = comm->Start([&](Communicator&) {
    released.wait();
    on_caller = std::this_thread::get_id() == caller;
    order.push_back(1);
    return Status();
  });
  const CollectiveTicket second = comm->Start([&](Communicator&) {
    order.push_back(2);
    return Status();
  });
  EXPECT_LT(first, second);
  // The first blocks the queue: neither is done, and Start returned anyway.
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(comm->Done(first));
  EXPECT_FALSE(comm->Done(second));
  const int64_t waited_before = comm->waited_nanoseconds();
  std::thread releaser([&] {
    std::this_thread::sleep_for(30ms);
    release.set_value();
  });
  EXPECT_TRUE(comm->Wait(second).ok());  // the second waits for the first
  releaser.join();
  EXPECT_TRUE(comm->Done(first));
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
  EXPECT_FALSE(on_caller.load());
  EXPECT_GE(comm->waited_nanoseconds() - waited_before, 20'000'000);  // the blocked wait counted
}

TEST(QueuedCommunicator, ADirectCallWaitsForTheWorkStartedBeforeIt) {
  auto comm = MakeQueuedCommunicator(MakeSingleRankCommunicator());
  std::atomic<bool> started_done{false};
  comm->Start([&](Communicator&) {
    std::this_thread::sleep_for(30ms);
    started_done = true;
    return Status();
  });
  double x = 1.0;
  ASSERT_TRUE(comm->AllReduceSum(&x, 1).ok());
  EXPECT_TRUE(started_done.load());
}

TEST(QueuedCommunicator, AFailureReachesItsTicketAndEveryLaterOneButNotEarlierOnes) {
  auto comm = MakeQueuedCommunicator(MakeSingleRankCommunicator());
  const CollectiveTicket ok = comm->Start([](Communicator&) { return Status(); });
  const CollectiveTicket bad = comm->Start([](Communicator&) { return Status::Internal("peer 1 lost"); });
  std::atomic<bool> later_ran{false};
  const CollectiveTicket later = comm->Start([&](Communicator&) {
    later_ran = true;
    return Status();
  });
  EXPECT_TRUE(comm->Wait(ok).ok());
  const Status b = comm->Wait(bad);
  EXPECT_FALSE(b.ok());
  EXPECT_EQ(b.message(), "peer 1 lost");
  EXPECT_EQ(comm->Wait(later).message(), "peer 1 lost");
  EXPECT_FALSE(later_ran.load()) << "work after a failure must not touch its buffers";
  double x = 0;
  EXPECT_FALSE(comm->AllReduceSum(&x, 1).ok());
}

TEST(QueuedCommunicator, DestructionWaitsForStartedWork) {
  std::atomic<int> ran{0};
  {
    auto comm = MakeQueuedCommunicator(MakeSingleRankCommunicator());
    for (int i = 0; i < 5; ++i) {
      comm->Start([&](Communicator&) {
        std::this_thread::sleep_for(2ms);
        ++ran;
        return Status();
      });
    }
  }
  EXPECT_EQ(ran.load(), 5);
}

TEST(QueuedCommunicator, TheBaseRunsStartedWorkAtOnce) {
  auto comm = MakeSingleRankCommunicator();
  EXPECT_FALSE(comm->queued());
  bool ran = false;
  const CollectiveTicket t = comm->Start([&](Communicator&) {
    ran = true;
    return Status();
  });
  EXPECT_TRUE(ran);
  EXPECT_TRUE(comm->Done(t));
  EXPECT_TRUE(comm->Wait(t).ok());
  const CollectiveTicket bad = comm->Start([](Communicator&) { return Status::Internal("no"); });
  EXPECT_TRUE(comm->Wait(t).ok());  // earlier than the failure
  EXPECT_FALSE(comm->Wait(bad).ok());
}

TEST(QueuedCommunicator, StartedAndDirectCollectivesOfThreeRanksGiveTheInnerResults) {
  constexpr int kWorld = 3;
  constexpr int64_t kShard = 1000;
  auto inner = test::MakeThreadGroupCommunicators(kWorld);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (auto& c : inner) comms.push_back(MakeQueuedCommunicator(std::move(c)));
  std::vector<std::string> errors(kWorld);
  auto rank_main = [&](int rank) {
    Communicator& comm = *comms[size_t(rank)];
    std::vector<float> shard(kShard), full(kShard * kWorld), grads(kShard * kWorld), sum(kShard);
    for (int64_t i = 0; i < kShard; ++i) shard[size_t(i)] = float(rank * 10000 + i);
    for (int64_t i = 0; i < kShard * kWorld; ++i) grads[size_t(i)] = float(rank + 1) * float(i % 7);
    // A gather and a reduce-scatter started, a direct all-reduce between.
    const CollectiveTicket gather = comm.Start([&](Communicator& c) { return c.AllGather(shard.data(), full.data(), kShard); });
    double x = rank + 1.0;
    if (Status s = comm.AllReduceSum(&x, 1); !s.ok()) errors[size_t(rank)] = s.message();
    const CollectiveTicket scatter =
        comm.Start([&](Communicator& c) { return c.ReduceScatter(grads.data(), sum.data(), kShard); });
    if (Status s = comm.Wait(scatter); !s.ok()) errors[size_t(rank)] = s.message();
    EXPECT_TRUE(comm.Done(gather));
    EXPECT_EQ(x, 6.0);
    for (int r = 0; r < kWorld; ++r) {
      for (int64_t i = 0; i < kShard; i += 97) ASSERT_EQ(full[size_t(r * kShard + i)], float(r * 10000 + i));
    }
    for (int64_t i = 0; i < kShard; i += 89) {
      const int64_t g = rank * kShard + i;
      ASSERT_EQ(sum[size_t(i)], 6.0f * float(g % 7)) << "rank " << rank << " element " << i;
    }
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) threads.emplace_back(rank_main, r);
  for (auto& t : threads) t.join();
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(errors[size_t(r)], "") << "rank " << r;
}

}  // namespace
}  // namespace pstar
