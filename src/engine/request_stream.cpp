// RequestStream (engine.h): one request's events, pushed by the engine thread and read by the
// request's consumer.
#include "engine/engine.h"

namespace lmserve::engine {

bool RequestStream::next(StreamEvent* out, std::chrono::milliseconds timeout, bool* timed_out) {
  std::unique_lock lock(mu_);
  auto ready = [&] { return !events_.empty() || open_choices_ == 0; };
  if (timed_out) *timed_out = false;
  if (timeout == std::chrono::milliseconds::max()) {
    cv_.wait(lock, ready);
  } else if (!cv_.wait_for(lock, timeout, ready)) {
    if (timed_out) *timed_out = true;
    return false;
  }
  if (events_.empty()) return false;
  *out = std::move(events_.front());
  events_.pop_front();
  return true;
}

void RequestStream::set_notify(std::function<void()> fn) {
  std::lock_guard lock(mu_);
  notify_ = std::move(fn);
}

void RequestStream::push(StreamEvent e, bool last_of_choice) {
  std::function<void()> notify;
  {
    std::lock_guard lock(mu_);
    events_.push_back(std::move(e));
    if (last_of_choice && open_choices_ > 0) --open_choices_;
    notify = notify_;
  }
  cv_.notify_all();
  if (notify) notify();
}

RequestStream::Times RequestStream::times() const {
  std::lock_guard lock(mu_);
  return times_;
}

void RequestStream::set_times(const Times& t) {
  std::lock_guard lock(mu_);
  times_ = t;
}

}  // namespace lmserve::engine
