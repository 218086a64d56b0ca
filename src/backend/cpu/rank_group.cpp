#include "backend/cpu/rank_group.h"

#include <stdexcept>

namespace lmserve::backend::cpu {

RankGroup::RankGroup(int ranks) : ranks_(ranks), data_(static_cast<std::size_t>(ranks)), barrier_(ranks) {
  for (int r = 1; r < ranks; ++r) threads_.push_back(std::make_unique<BackgroundTask>());
}

void RankGroup::run(const std::function<void(int)>& fn) {
  if (broken_.load()) throw std::runtime_error("tensor-parallel group: a rank failed in an earlier step");
  // A rank that throws leaves the barrier for good (arrive_and_drop), after marking the group
  // broken, so that the others' next all_reduce throws instead of waiting for it forever.
  auto guarded = [this, &fn](int r) {
    try {
      fn(r);
    } catch (...) {
      bool was = false;
      if (broken_.compare_exchange_strong(was, true)) cause_ = std::current_exception();  // the first failure, not its echoes
      barrier_.arrive_and_drop();
      throw;
    }
  };
  for (int r = 1; r < ranks_; ++r) threads_[static_cast<std::size_t>(r - 1)]->start([&guarded, r] { guarded(r); });
  std::exception_ptr first;
  try {
    guarded(0);
  } catch (...) {
    first = std::current_exception();
  }
  for (auto& t : threads_) {
    try {
      t->wait();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (cause_) std::rethrow_exception(cause_);
  if (first) std::rethrow_exception(first);
}

void RankGroup::all_reduce(int rank, float* data, std::size_t n) {
  if (ranks_ == 1) return;
  auto check = [this] {
    if (broken_.load()) throw std::runtime_error("tensor-parallel group: another rank failed");
  };
  check();
  data_[static_cast<std::size_t>(rank)] = data;
  barrier_.arrive_and_wait();  // every rank's data is published and final
  check();  // a rank that failed instead of arriving published nothing
  const std::size_t begin = n * static_cast<std::size_t>(rank) / static_cast<std::size_t>(ranks_);
  const std::size_t end = n * static_cast<std::size_t>(rank + 1) / static_cast<std::size_t>(ranks_);
  for (std::size_t i = begin; i < end; ++i) {
    float sum = data_[0][i];
    for (int r = 1; r < ranks_; ++r) sum += data_[static_cast<std::size_t>(r)][i];
    for (int r = 0; r < ranks_; ++r) data_[static_cast<std::size_t>(r)][i] = sum;
  }
  barrier_.arrive_and_wait();  // every slice is written everywhere
}

}  // namespace lmserve::backend::cpu
