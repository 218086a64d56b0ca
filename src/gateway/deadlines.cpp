#include "gateway/deadlines.h"

#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <vector>

namespace lmserve::gateway {

Deadlines::Deadlines(boost::asio::io_context& io, std::chrono::milliseconds tick) : io_(io), tick_(tick), timer_(boost::asio::make_strand(io)) {}

void Deadlines::start() { boost::asio::post(timer_.get_executor(), [this] { arm(); }); }

void Deadlines::stop() {
  stopped_ = true;
  boost::asio::post(timer_.get_executor(), [this] { timer_.cancel(); });
}

void Deadlines::add(const std::shared_ptr<Watched>& w) {
  std::lock_guard lock(mu_);
  watched_.push_front(w);
  w->where_ = watched_.begin();
}

void Deadlines::remove(Watched& w) {
  std::lock_guard lock(mu_);
  watched_.erase(w.where_);
}

void Deadlines::arm() {
  if (stopped_) return;
  timer_.expires_after(tick_);
  timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec || stopped_) return;
    scan();
    arm();
  });
}

void Deadlines::scan() {
  const std::int64_t now = std::chrono::steady_clock::now().time_since_epoch().count();
  std::vector<std::shared_ptr<Watched>> due;
  {
    std::lock_guard lock(mu_);
    for (auto it = watched_.begin(); it != watched_.end();) {
      auto w = it->lock();
      if (!w) {  // gone without being removed (its io_context shut down under it)
        it = watched_.erase(it);
        continue;
      }
      ++it;
      std::int64_t d = w->deadline_ns_.load(std::memory_order_relaxed);
      // Taken (set to never) so that it fires once; the object sets it again if it moved.
      if (d <= now && w->deadline_ns_.compare_exchange_strong(d, Watched::kNever, std::memory_order_relaxed)) due.push_back(std::move(w));
    }
  }
  for (auto& w : due) {
    auto ex = w->executor();
    boost::asio::post(ex, [w = std::move(w)] { w->on_deadline(); });
  }
}

}  // namespace lmserve::gateway
