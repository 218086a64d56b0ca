// A fixed pool of worker threads for fork-join loops on the compute path (the CPU backend's
// matrix products and attention). parallel_for blocks until every index ran; calls from
// several threads at once are serialised. Exceptions must not escape `fn`.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <exception>
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

// One long-lived thread that runs one job at a time beside its owner: start() hands a job over
// (the previous one must be waited for), wait() blocks until it has run and rethrows what it
// threw. A thread made once, not one per job (std::async), so that starting a job costs a
// wake-up and cannot fail for want of threads.
class BackgroundTask {
 public:
  BackgroundTask();
  ~BackgroundTask();  // waits for the job in flight, then joins
  BackgroundTask(const BackgroundTask&) = delete;
  BackgroundTask& operator=(const BackgroundTask&) = delete;

  void start(std::function<void()> job);
  void wait();

 private:
  void loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> job_;
  bool busy_ = false, stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;  // last: started once the members above exist
};

// A thread that calls `tick` every `period` (the first call one period after construction)
// until it is destroyed; destruction returns once the call in flight has ended. Exceptions must
// not escape `tick`. For samplers (device memory, clocks and power).
class PeriodicTask {
 public:
  PeriodicTask(std::chrono::milliseconds period, std::function<void()> tick);
  ~PeriodicTask();
  PeriodicTask(const PeriodicTask&) = delete;
  PeriodicTask& operator=(const PeriodicTask&) = delete;

 private:
  std::chrono::milliseconds period_;
  std::function<void()> tick_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;  // last: started once the members above exist
};

}  // namespace lmserve
