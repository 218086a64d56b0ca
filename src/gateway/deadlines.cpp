#include "gateway/deadlines.h"

#include <boost/asio/post.hpp>

namespace lmserve::gateway {

// One I/O thread's calls and the timer that scans them. Used on that thread only (stop() posts).
struct Deadlines::Shard {
  explicit Shard(boost::asio::io_context& context) : io(context), timer(context) {}
  boost::asio::io_context& io;
  boost::asio::steady_timer timer;
  bool armed = false;
  int idle_ticks = 0;  // ticks in a row that found nothing to watch
  std::list<std::weak_ptr<Watched>> watched;
};

std::uint64_t Deadlines::next_instance() {
  static std::atomic<std::uint64_t> n{1};
  return n++;
}

Deadlines::Deadlines(std::chrono::milliseconds tick) : tick_(tick) {}

Deadlines::~Deadlines() = default;

void Deadlines::stop() {
  stopped_ = true;
  std::lock_guard lock(mu_);
  for (auto& s : shards_) boost::asio::post(s->io, [sh = s.get()] { sh->timer.cancel(); });
}

Deadlines::Shard& Deadlines::shard(boost::asio::io_context& io) {
  thread_local std::uint64_t cached_instance = 0;
  thread_local Shard* cached = nullptr;
  if (cached_instance == instance_ && &cached->io == &io) return *cached;
  std::lock_guard lock(mu_);
  Shard* found = nullptr;
  for (auto& s : shards_) {
    if (&s->io == &io) found = s.get();
  }
  if (!found) found = shards_.emplace_back(std::make_unique<Shard>(io)).get();
  cached_instance = instance_;
  cached = found;
  return *found;
}

void Deadlines::add(const std::shared_ptr<Watched>& w, boost::asio::io_context& io) {
  auto& s = shard(io);
  s.watched.push_front(w);
  w->where_ = s.watched.begin();
  w->shard_ = &s;
  s.idle_ticks = 0;
  if (!s.armed) arm(s);
}

void Deadlines::remove(Watched& w) {
  auto* s = static_cast<Shard*>(w.shard_);
  if (!s) return;
  s->watched.erase(w.where_);
  w.shard_ = nullptr;
}

// The timer runs while the shard watches anything and for a second after (so that an idle
// gateway does not wake every tick, and a lone client's requests, each alone in the list, do not
// re-arm it each time: a system call per request).
void Deadlines::arm(Shard& s) {
  if (stopped_) return;
  s.armed = true;
  s.timer.expires_after(tick_);
  s.timer.async_wait([this, sh = &s](const boost::system::error_code& ec) {
    sh->armed = false;
    if (ec || stopped_) return;
    scan(*sh);
    sh->idle_ticks = sh->watched.empty() ? sh->idle_ticks + 1 : 0;
    if (sh->idle_ticks * tick_ < std::chrono::seconds(1)) arm(*sh);
  });
}

void Deadlines::scan(Shard& s) {
  const std::int64_t now = std::chrono::steady_clock::now().time_since_epoch().count();
  std::vector<std::shared_ptr<Watched>> due;
  for (auto it = s.watched.begin(); it != s.watched.end();) {
    auto w = it->lock();
    if (!w) {  // gone without being removed
      it = s.watched.erase(it);
      continue;
    }
    ++it;
    std::int64_t d = w->deadline_ns_.load(std::memory_order_relaxed);
    // Taken (set to never) so that it fires once; the object sets it again if it moved.
    if (d <= now && w->deadline_ns_.compare_exchange_strong(d, Watched::kNever, std::memory_order_relaxed)) due.push_back(std::move(w));
  }
  // After the walk: a call that ends in on_deadline() removes itself from the list.
  for (auto& w : due) w->on_deadline();
}

}  // namespace lmserve::gateway
