#include "backend/cpu/rank_group.h"

namespace lmserve::backend::cpu {

RankGroup::RankGroup(int ranks) : ranks_(ranks), data_(static_cast<std::size_t>(ranks)), barrier_(ranks) {
  for (int r = 1; r < ranks; ++r) threads_.push_back(std::make_unique<BackgroundTask>());
}

void RankGroup::run(const std::function<void(int)>& fn) {
  for (int r = 1; r < ranks_; ++r) threads_[static_cast<std::size_t>(r - 1)]->start([&fn, r] { fn(r); });
  fn(0);
  for (auto& t : threads_) t->wait();
}

void RankGroup::all_reduce(int rank, float* data, std::size_t n) {
  if (ranks_ == 1) return;
  data_[static_cast<std::size_t>(rank)] = data;
  barrier_.arrive_and_wait();  // every rank's data is published and final
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
