// common/sharded_counter: a count that many threads change often and few read, kept in one cache
// line per thread (a shard) and summed when read. A single atomic that every I/O thread
// increments and decrements on every request is a cache line the cores pass among themselves on
// each change (measured: the gateway's user time a request rose from 4.6 to 6.0 us going from
// one I/O thread to four, nginx's from 4.9 to 5.2; docs/perf.md). A thread always changes the
// same shard (threads past kShards share one, still exactly: the changes are atomic additions), so
// an increment on one thread and its decrement on another still sum to nothing.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

namespace lmserve {

class ShardedCounter {
 public:
  void add(std::int64_t n) { shards_[thread_shard()].value.fetch_add(n, std::memory_order_relaxed); }
  ShardedCounter& operator++() {
    add(1);
    return *this;
  }
  ShardedCounter& operator--() {
    add(-1);
    return *this;
  }
  // This thread's shard's value before adding one: a sequence of the thread's own (threads past
  // kShards share theirs), for what needs only to go round, as a round-robin does.
  std::int64_t next_of_thread() { return shards_[thread_shard()].value.fetch_add(1, std::memory_order_relaxed); }
  // The sum of every shard: exact when no thread changes it meanwhile, else a value it passed
  // through or will (each change is counted once).
  std::int64_t sum() const {
    std::int64_t s = 0;
    for (const auto& shard : shards_) s += shard.value.load(std::memory_order_relaxed);
    return s;
  }

  static constexpr std::size_t kShards = 16;

 private:
  // The calling thread's shard: threads are numbered as they first count anything.
  static std::size_t thread_shard() {
    static std::atomic<std::size_t> next{0};
    thread_local const std::size_t mine = next.fetch_add(1, std::memory_order_relaxed) % kShards;
    return mine;
  }
  struct alignas(64) Shard {
    std::atomic<std::int64_t> value{0};
  };
  std::array<Shard, kShards> shards_{};
};

}  // namespace lmserve
