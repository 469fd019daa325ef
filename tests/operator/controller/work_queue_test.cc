#include "operator/controller/work_queue.h"

#include <atomic>
#include <thread>

#include <gtest/gtest.h>

namespace pstar::op {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

TEST(WorkQueue, DedupesAndKeepsOrder) {
  WorkQueue q;
  q.Add("a");
  q.Add("b");
  q.Add("a");
  q.Add("c");
  EXPECT_EQ(q.Len(), 3u);
  EXPECT_EQ(*q.Get(), "a");
  EXPECT_EQ(*q.Get(), "b");
  EXPECT_EQ(*q.Get(), "c");
  EXPECT_EQ(q.Len(), 0u);
}

TEST(WorkQueue, KeyBeingProcessedIsRequeuedAfterDone) {
  WorkQueue q;
  q.Add("a");
  ASSERT_EQ(*q.Get(), "a");
  q.Add("a");  // while processing: not handed to a second worker
  q.Add("a");
  EXPECT_EQ(q.Len(), 0u);
  q.Add("b");
  EXPECT_EQ(*q.Get(), "b");
  q.Done("b");
  q.Done("a");  // now it comes back, once
  EXPECT_EQ(q.Len(), 1u);
  EXPECT_EQ(*q.Get(), "a");
  q.Done("a");
  EXPECT_EQ(q.Len(), 0u);
}

TEST(WorkQueue, NoTwoWorkersGetTheSameKey) {
  WorkQueue q;
  std::atomic<int> in_flight{0}, max_in_flight{0}, processed{0};
  std::vector<std::thread> workers;
  for (int w = 0; w < 4; ++w) {
    workers.emplace_back([&] {
      while (auto key = q.Get()) {
        int now = ++in_flight;
        int prev = max_in_flight.load();
        while (now > prev && !max_in_flight.compare_exchange_weak(prev, now)) {
        }
        std::this_thread::sleep_for(milliseconds(2));
        --in_flight;
        ++processed;
        q.Done(*key);
      }
    });
  }
  for (int i = 0; i < 50; ++i) {
    q.Add("same");
    std::this_thread::sleep_for(milliseconds(1));
  }
  std::this_thread::sleep_for(milliseconds(50));
  q.ShutDown();
  for (auto& t : workers) t.join();
  EXPECT_EQ(max_in_flight.load(), 1);
  EXPECT_GE(processed.load(), 2);
  EXPECT_LE(processed.load(), 50);
}

TEST(WorkQueue, AddAfterWaits) {
  WorkQueue q;
  auto start = Clock::now();
  q.AddAfter("late", milliseconds(150));
  q.AddAfter("early", milliseconds(50));
  q.AddAfter("early", milliseconds(500));  // the earlier time wins
  EXPECT_EQ(q.Len(), 0u);
  EXPECT_EQ(*q.Get(), "early");
  auto t1 = Clock::now() - start;
  EXPECT_EQ(*q.Get(), "late");
  auto t2 = Clock::now() - start;
  EXPECT_GE(t1, milliseconds(45));
  EXPECT_LT(t1, milliseconds(1000));  // loose: a loaded machine may be late
  EXPECT_GE(t2, milliseconds(145));
  EXPECT_LT(t2, milliseconds(1000));
  q.Done("early");
  q.Done("late");
  // A delayed key that is also added now is handed out once, now.
  q.AddAfter("x", milliseconds(100));
  q.Add("x");
  EXPECT_EQ(*q.Get(), "x");
  q.Done("x");
  auto before = Clock::now();
  EXPECT_EQ(*q.Get(), "x");  // the delayed add still arrives (it is a later, separate request)
  EXPECT_GE(Clock::now() - before, milliseconds(50));
}

TEST(WorkQueue, RateLimitBackoffGrowsAndForgetResets) {
  WorkQueueOptions options;
  options.base_delay = milliseconds(5);
  options.max_delay = milliseconds(1000);
  options.qps = 0;  // per-key only
  WorkQueue q(options);
  EXPECT_EQ(q.NextDelay("k"), milliseconds(5));
  EXPECT_EQ(q.NextDelay("k"), milliseconds(10));
  EXPECT_EQ(q.NextDelay("k"), milliseconds(20));
  EXPECT_EQ(q.NumRequeues("k"), 3);
  EXPECT_EQ(q.NextDelay("other"), milliseconds(5));  // per key
  for (int i = 0; i < 20; ++i) q.NextDelay("k");
  EXPECT_EQ(q.NextDelay("k"), milliseconds(1000));  // capped
  q.Forget("k");
  EXPECT_EQ(q.NumRequeues("k"), 0);
  EXPECT_EQ(q.NextDelay("k"), milliseconds(5));
}

TEST(WorkQueue, OverallBucketLimitsBursts) {
  WorkQueueOptions options;
  options.base_delay = milliseconds(1);
  options.qps = 10;
  options.burst = 3;
  WorkQueue q(options);
  // Three distinct keys fit the burst; the fourth waits ~100 ms, the fifth ~200 ms.
  for (int i = 0; i < 3; ++i) EXPECT_LE(q.NextDelay("k" + std::to_string(i)), milliseconds(2));
  auto d4 = q.NextDelay("k3");
  auto d5 = q.NextDelay("k4");
  // The bucket refills while the test runs, so a slow machine sees less
  // delay; never more, and each key waits a token longer than the last.
  EXPECT_GE(d4, milliseconds(40));
  EXPECT_LE(d4, milliseconds(110));
  EXPECT_GE(d5, d4 + milliseconds(60));
  EXPECT_LE(d5, milliseconds(210));
}

TEST(WorkQueue, AddRateLimitedDelaysTheKey) {
  WorkQueueOptions options;
  options.base_delay = milliseconds(40);
  options.qps = 0;
  WorkQueue q(options);
  auto start = Clock::now();
  q.AddRateLimited("k");
  EXPECT_EQ(q.Len(), 0u);
  EXPECT_EQ(*q.Get(), "k");
  EXPECT_GE(Clock::now() - start, milliseconds(35));
}

TEST(WorkQueue, ShutDownUnblocksGet) {
  WorkQueue q;
  std::atomic<bool> returned{false};
  std::optional<std::string> got = "sentinel";
  std::thread t([&] {
    got = q.Get();
    returned = true;
  });
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_FALSE(returned.load());
  q.ShutDown();
  t.join();
  EXPECT_FALSE(got.has_value());
  EXPECT_TRUE(q.ShuttingDown());
  q.Add("ignored");
  EXPECT_EQ(q.Len(), 0u);
  EXPECT_FALSE(q.Get().has_value());
}

TEST(WorkQueue, GetWakesForAnEarlierDelayedKey) {
  WorkQueue q;
  q.AddAfter("slow", milliseconds(5000));
  std::optional<std::string> got;
  auto start = Clock::now();
  std::thread t([&] { got = q.Get(); });
  std::this_thread::sleep_for(milliseconds(20));
  q.AddAfter("fast", milliseconds(30));
  t.join();
  EXPECT_EQ(got, "fast");
  EXPECT_LT(Clock::now() - start, milliseconds(1000));
}

// Get sleeps until the earliest delayed key while other threads grow the heap
// (reallocating it): the deadline it waits on must not live in the heap
// (under AddressSanitizer a reference into it was a use after free).
TEST(WorkQueue, DelayedAddsWhileGetWaitsAreSafe) {
  WorkQueue q;
  q.AddAfter("first", milliseconds(200));
  std::optional<std::string> got;
  std::thread getter([&] { got = q.Get(); });
  std::this_thread::sleep_for(milliseconds(20));
  std::vector<std::thread> adders;
  for (int t = 0; t < 4; ++t) {
    adders.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) q.AddAfter("k" + std::to_string(t) + "-" + std::to_string(i), milliseconds(60000));
    });
  }
  for (auto& a : adders) a.join();
  getter.join();
  EXPECT_EQ(got, "first");
  q.ShutDown();
}

}  // namespace
}  // namespace pstar::op
