// AsyncUpdater: updates run in submission order on their own thread; Wait
// returns only once its chunk's update has run and its writes are visible;
// Drain and the destructor finish everything.
#include "worker/optim/async_updater.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace pstar {
namespace {

TEST(AsyncUpdater, RunsInSubmissionOrderAndWaitSeesTheChunksWrites) {
  AsyncUpdater updater(4);
  std::vector<int> ran;
  std::vector<int64_t> values(4, 0);
  std::atomic<bool> release{false};
  // The first update blocks until released: the others queue behind it.
  updater.Submit(2, 0, [&] {
    while (!release.load()) std::this_thread::yield();
    ran.push_back(2);
    values[2] = 20;
  });
  updater.Submit(0, 0, [&] {
    ran.push_back(0);
    values[0] = 10;
  });
  EXPECT_TRUE(updater.pending(2));
  EXPECT_TRUE(updater.pending(0));
  EXPECT_FALSE(updater.pending(1));
  updater.Wait(1);  // nothing pending: returns at once
  // Chunk 0's update cannot run before chunk 2's, held until the release:
  // this Wait blocks.
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    release = true;
  });
  updater.Wait(0);
  releaser.join();
  EXPECT_FALSE(updater.pending(0));
  EXPECT_FALSE(updater.pending(2)) << "2 was submitted first";
  EXPECT_EQ(values[0], 10);
  EXPECT_EQ(values[2], 20);
  EXPECT_EQ(ran, (std::vector<int>{2, 0}));
  const AsyncUpdater::Times times = updater.TakeTimes();
  EXPECT_EQ(times.updates, 2);
  EXPECT_GT(times.waited_s, 0.0);
  EXPECT_EQ(updater.TakeTimes().updates, 0) << "taken";
}

TEST(AsyncUpdater, ASecondUpdateOfAChunkWaitsForTheFirst) {
  AsyncUpdater updater(1);
  uint64_t value = 0;  // unsigned: the products wrap, defined
  for (int i = 0; i < 100; ++i) {
    updater.Submit(0, i, [&value] { value = value * 3 + 1; });
  }
  updater.Drain();
  uint64_t want = 0;
  for (int i = 0; i < 100; ++i) want = want * 3 + 1;
  EXPECT_EQ(value, want);
}

TEST(AsyncUpdater, LogsBeginEndAndWaits) {
  ChunkEventLog log;
  std::atomic<bool> release{false};
  {
    AsyncUpdater updater(2);
    updater.SetEventLog(&log);
    updater.Submit(1, 7, [&] {
      while (!release.load()) std::this_thread::yield();
    });
    std::thread releaser([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      release = true;
    });
    updater.Wait(1);
    releaser.join();
  }
  const std::vector<ChunkEvent> events = log.Events();
  ASSERT_EQ(events.size(), 3u);
  // The wait and the begin may be recorded in either order; the end is last.
  EXPECT_EQ(events[2].kind, ChunkEventKind::kUpdateEnd);
  for (const ChunkEvent& e : events) {
    EXPECT_EQ(e.chunk, 1);
    EXPECT_EQ(e.step, 7);
  }
}

TEST(AsyncUpdater, TheDestructorFinishesPendingUpdates) {
  std::atomic<int> done{0};
  {
    AsyncUpdater updater(8);
    for (int c = 0; c < 8; ++c) {
      updater.Submit(c, 0, [&done] {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        ++done;
      });
    }
  }
  EXPECT_EQ(done.load(), 8);
}

}  // namespace
}  // namespace pstar
