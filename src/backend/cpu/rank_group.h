// The CPU backend's tensor-parallel group: one thread per rank and an in-memory all-reduce, the
// host's stand-in for a GPU per rank and NCCL (model/shard.h says what each rank holds).
#pragma once

#include <atomic>
#include <barrier>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <vector>

#include "common/thread_pool.h"

namespace lmserve::backend::cpu {

class RankGroup {
 public:
  explicit RankGroup(int ranks);
  int size() const { return ranks_; }

  // Runs fn(rank) for every rank at once, rank 0 on the calling thread, and returns when all
  // have returned. fn must make the same sequence of all_reduce calls on every rank. When a rank
  // throws, the others' all_reduce calls throw instead of waiting for it, run() rethrows what that
  // rank threw, and the group is broken: every later run() throws at once.
  void run(const std::function<void(int)>& fn);

  // Called by every rank with its own n floats (the same n): returns with each rank's data the
  // element-wise sum over the ranks, added in rank order, so every rank holds the same bits.
  // Rank r adds up the r-th slice of every rank's data and writes it into all of them.
  void all_reduce(int rank, float* data, std::size_t n);

 private:
  int ranks_;
  std::vector<float*> data_;
  std::barrier<> barrier_;
  std::atomic<bool> broken_{false};
  std::exception_ptr cause_;  // what the first rank to fail threw (run() rethrows it)
  std::vector<std::unique_ptr<BackgroundTask>> threads_;  // ranks 1..
};

}  // namespace lmserve::backend::cpu
