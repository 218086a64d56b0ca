#include "common/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>

namespace lmserve {
namespace {

// Jobs run one at a time on one thread other than the caller's, in the order started; wait()
// returns once the job has run, and rethrows (once) what it threw.
TEST(BackgroundTask, RunsEachJobOnItsThreadAndWaitSeesItDone) {
  BackgroundTask task;
  const auto caller = std::this_thread::get_id();
  std::thread::id first_thread, thread;
  int sum = 0;
  for (int i = 1; i <= 100; ++i) {
    task.start([&, i] {
      thread = std::this_thread::get_id();
      std::this_thread::yield();
      sum += i;
    });
    task.wait();
    EXPECT_EQ(sum, i * (i + 1) / 2);  // the job has run, and its writes are seen
    if (i == 1) first_thread = thread;
    EXPECT_EQ(thread, first_thread);  // one thread for every job
    EXPECT_NE(thread, caller);
  }
  task.wait();  // idle: returns at once
}

TEST(BackgroundTask, WaitRethrowsTheJobsErrorOnce) {
  BackgroundTask task;
  task.start([] { throw std::runtime_error("boom"); });
  EXPECT_THROW(task.wait(), std::runtime_error);
  EXPECT_NO_THROW(task.wait());
  std::atomic<bool> ran{false};
  task.start([&] { ran = true; });  // still usable
  task.wait();
  EXPECT_TRUE(ran);
}

// Destroying the task waits for the job in flight.
TEST(BackgroundTask, DestructionWaitsForTheJobInFlight) {
  std::atomic<bool> done{false};
  {
    BackgroundTask task;
    task.start([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      done = true;
    });
  }
  EXPECT_TRUE(done);
}

// Ticks come on another thread, one period apart at the earliest; none after destruction,
// which waits for the tick in flight.
TEST(PeriodicTask, TicksUntilDestroyedAndNotAfter) {
  std::atomic<int> ticks{0};
  std::atomic<bool> in_tick{false}, other_thread{true};
  const auto caller = std::this_thread::get_id();
  {
    PeriodicTask t(std::chrono::milliseconds(1), [&] {
      in_tick = true;
      if (std::this_thread::get_id() == caller) other_thread = false;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      ++ticks;
      in_tick = false;
    });
    for (int i = 0; i < 2000 && ticks < 3; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_FALSE(in_tick);
  EXPECT_TRUE(other_thread);
  const int seen = ticks;
  EXPECT_GE(seen, 3);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(ticks, seen);
}

// A long period: destruction does not wait for it.
TEST(PeriodicTask, DestructionDoesNotWaitForTheNextTick) {
  std::atomic<int> ticks{0};
  const auto t0 = std::chrono::steady_clock::now();
  { PeriodicTask t(std::chrono::hours(1), [&] { ++ticks; }); }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::minutes(1));
  EXPECT_EQ(ticks, 0);
}

}  // namespace
}  // namespace lmserve
