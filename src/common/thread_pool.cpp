#include "common/thread_pool.h"

#include <algorithm>
#include <utility>

namespace lmserve {

ThreadPool::ThreadPool(std::size_t threads) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  for (std::size_t i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

namespace {
std::pair<std::size_t, std::size_t> chunk(std::size_t n, std::size_t parts, std::size_t i) {
  std::size_t base = n / parts, extra = n % parts;
  std::size_t b = i * base + std::min(i, extra);
  return {b, b + base + (i < extra ? 1 : 0)};
}
}  // namespace

void ThreadPool::worker(std::size_t index) {
  std::size_t seen = 0;
  while (true) {
    const std::function<void(std::size_t, std::size_t)>* job;
    std::size_t n;
    {
      std::unique_lock lock(mu_);
      start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
      n = n_;
    }
    auto [b, e] = chunk(n, size(), index);
    if (b < e) (*job)(b, e);
    {
      std::lock_guard lock(mu_);
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(std::size_t n, const std::function<void(std::size_t, std::size_t)>& fn) {
  if (n == 0) return;
  if (workers_.empty() || n == 1) {
    fn(0, n);
    return;
  }
  std::lock_guard run(run_mu_);
  {
    std::lock_guard lock(mu_);
    job_ = &fn;
    n_ = n;
    pending_ = workers_.size();
    ++generation_;
  }
  start_cv_.notify_all();
  auto [b, e] = chunk(n, size(), 0);
  if (b < e) fn(b, e);
  std::unique_lock lock(mu_);
  done_cv_.wait(lock, [&] { return pending_ == 0; });
}

BackgroundTask::BackgroundTask() : thread_([this] { loop(); }) {}

BackgroundTask::~BackgroundTask() {
  {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return !busy_; });
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void BackgroundTask::start(std::function<void()> job) {
  {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return !busy_; });  // the previous job's error, if any, waits for wait()
    job_ = std::move(job);
    busy_ = true;
  }
  cv_.notify_all();
}

void BackgroundTask::wait() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return !busy_; });
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void BackgroundTask::loop() {
  std::unique_lock lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || busy_; });
    if (busy_) {
      auto job = std::move(job_);
      lock.unlock();
      try {
        job();
      } catch (...) {
        lock.lock();
        error_ = std::current_exception();
        lock.unlock();
      }
      lock.lock();
      busy_ = false;
      cv_.notify_all();
      continue;
    }
    return;  // stop_, nothing in flight
  }
}

PeriodicTask::PeriodicTask(std::chrono::milliseconds period, std::function<void()> tick)
    : period_(period), tick_(std::move(tick)), thread_([this] {
        std::unique_lock lock(mu_);
        while (!cv_.wait_for(lock, period_, [this] { return stop_; })) {
          lock.unlock();
          tick_();
          lock.lock();
        }
      }) {}

PeriodicTask::~PeriodicTask() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

}  // namespace lmserve
