// gateway/deadlines: the deadlines of calls under way, checked by a periodic timer (every
// `tick`) rather than an Asio timer per call. Setting, moving or clearing a deadline is an
// atomic store, so a stream's idle deadline moves at every piece for free; with a timer per call,
// every request armed and re-armed a timer whose earliest change cost a system call and a
// completion (measured: 16 us of CPU per request at one connection, docs/perf.md). Each I/O
// thread has its own list and timer (a shard), so adding and removing a call takes no lock
// another thread contends for. Deadlines fire up to one tick late, never early.
#pragma once

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <vector>

namespace lmserve::gateway {

// What the scanner watches: a deadline (steady-clock nanoseconds; kNever for none) and what to
// run once it has passed, on the thread that added it.
class Watched {
 public:
  static constexpr std::int64_t kNever = INT64_MAX;
  virtual ~Watched() = default;
  // Called on the thread that added it once the deadline has passed (it may have moved later
  // meanwhile: check).
  virtual void on_deadline() = 0;

  void set_deadline(std::chrono::steady_clock::time_point t) { deadline_ns_.store(t.time_since_epoch().count(), std::memory_order_relaxed); }
  void clear_deadline() { deadline_ns_.store(kNever, std::memory_order_relaxed); }

 private:
  friend class Deadlines;
  std::atomic<std::int64_t> deadline_ns_{kNever};
  void* shard_ = nullptr;
  std::list<std::weak_ptr<Watched>>::iterator where_;
};

class Deadlines {
 public:
  explicit Deadlines(std::chrono::milliseconds tick);
  ~Deadlines();
  void stop();  // thread-safe; nothing fires afterwards
  // Watches `w` from the calling thread, which must be the one running `io` (an I/O thread).
  void add(const std::shared_ptr<Watched>& w, boost::asio::io_context& io);
  void remove(Watched& w);  // on the thread that added it; once removed, never called again

 private:
  struct Shard;
  Shard& shard(boost::asio::io_context& io);
  void arm(Shard& s);
  void scan(Shard& s);
  static std::uint64_t next_instance();
  const std::uint64_t instance_ = next_instance();
  const std::chrono::milliseconds tick_;
  std::atomic<bool> stopped_{false};
  std::mutex mu_;  // shards_
  std::vector<std::unique_ptr<Shard>> shards_;
};

}  // namespace lmserve::gateway
