// A fixed pool of worker threads for fork-join loops on the compute path (the CPU backend's
// matrix products and attention). parallel_for blocks until every index ran; calls from
// several threads at once are serialised. Exceptions must not escape `fn`.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace lmserve {

class ThreadPool {
 public:
  // 0 threads: std::thread::hardware_concurrency().
  explicit ThreadPool(std::size_t threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  std::size_t size() const { return workers_.size() + 1; }
  // Runs fn(begin, end) over [0, n) split into contiguous chunks, one per thread (the caller
  // takes one).
  void parallel_for(std::size_t n, const std::function<void(std::size_t, std::size_t)>& fn);

 private:
  void worker(std::size_t index);

  std::vector<std::thread> workers_;
  std::mutex mu_, run_mu_;
  std::condition_variable start_cv_, done_cv_;
  const std::function<void(std::size_t, std::size_t)>* job_ = nullptr;
  std::size_t n_ = 0, generation_ = 0, pending_ = 0;
  bool stop_ = false;
};

}  // namespace lmserve
