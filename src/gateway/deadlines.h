// gateway/deadlines: the deadlines of calls under way, checked by one periodic timer (every
// `tick`) rather than an Asio timer per call. Setting, moving or clearing a deadline is an
// atomic store, so a stream's idle deadline moves at every piece for free; with a timer per call,
// every request armed and re-armed a timer whose earliest change cost a system call and a
// completion (measured: 16 us of CPU per request at one connection, docs/perf.md). Deadlines fire
// up to one tick late, never early.
#pragma once

#include <atomic>
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>

namespace lmserve::gateway {

// What the scanner watches: a deadline (steady-clock nanoseconds; kNever for none) and what to
// run, on the watched object's executor, once it has passed.
class Watched {
 public:
  static constexpr std::int64_t kNever = INT64_MAX;
  virtual ~Watched() = default;
  // Called on executor() once the deadline has passed (it may have moved later meanwhile: check).
  virtual void on_deadline() = 0;
  virtual boost::asio::any_io_executor executor() const = 0;

  void set_deadline(std::chrono::steady_clock::time_point t) { deadline_ns_.store(t.time_since_epoch().count(), std::memory_order_relaxed); }
  void clear_deadline() { deadline_ns_.store(kNever, std::memory_order_relaxed); }

 private:
  friend class Deadlines;
  std::atomic<std::int64_t> deadline_ns_{kNever};
  std::list<std::weak_ptr<Watched>>::iterator where_;
};

class Deadlines {
 public:
  Deadlines(boost::asio::io_context& io, std::chrono::milliseconds tick);
  void start();
  void stop();  // thread-safe
  void add(const std::shared_ptr<Watched>& w);
  void remove(Watched& w);  // before it goes; once removed, never called again

 private:
  void arm();
  void scan();
  boost::asio::io_context& io_;
  const std::chrono::milliseconds tick_;
  boost::asio::steady_timer timer_;
  std::atomic<bool> stopped_{false};
  std::mutex mu_;
  std::list<std::weak_ptr<Watched>> watched_;
};

}  // namespace lmserve::gateway
