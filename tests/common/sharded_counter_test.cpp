#include "common/sharded_counter.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace lmserve {
namespace {

TEST(ShardedCounter, ChangesOnManyThreadsSumExactly) {
  ShardedCounter c;
  constexpr int kThreads = 24;  // more than kShards: some threads share a shard
  static_assert(kThreads > static_cast<int>(ShardedCounter::kShards));
  constexpr int kEach = 20000;
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&c, t] {
      for (int i = 0; i < kEach; ++i) {
        ++c;
        if (t % 2 == 0) --c;  // half the threads take back what they add
      }
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(c.sum(), std::int64_t{kThreads / 2} * kEach);
}

TEST(ShardedCounter, AnIncrementOnOneThreadAndItsDecrementOnAnotherCancel) {
  ShardedCounter c;
  std::thread([&c] { c.add(7); }).join();
  EXPECT_EQ(c.sum(), 7);
  std::thread([&c] { c.add(-7); }).join();
  EXPECT_EQ(c.sum(), 0);
}

TEST(ShardedCounter, AThreadsSequenceGoesOnFromItsOwnPosition) {
  ShardedCounter c;
  for (std::int64_t i = 0; i < 5; ++i) EXPECT_EQ(c.next_of_thread(), i);
  EXPECT_EQ(c.sum(), 5);
}

}  // namespace
}  // namespace lmserve
