#include "gateway/limits.h"

#include <algorithm>
#include <deque>
#include <mutex>
#include <unordered_map>

namespace lmserve::gateway {

namespace {

constexpr auto kWindow = std::chrono::seconds(60);

std::int64_t seconds_until(Limiter::Clock::time_point t, Limiter::Clock::time_point now) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t - now).count();
  return std::max<std::int64_t>(1, (ms + 999) / 1000);
}

std::int64_t utc_day(Limiter::Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::seconds>(t.time_since_epoch()).count() / 86400;
}

Admission refuse(const char* limit, std::int64_t retry_after_s, std::string message) {
  return {.admitted = false, .limit = limit, .retry_after_s = retry_after_s, .message = std::move(message)};
}

class LocalLimiter : public Limiter {
 public:
  Admission admit(const std::string& key_id, const KeyLimits& l, std::uint64_t request_id, std::int64_t tokens, Clock::time_point now) override {
    std::lock_guard lock(mu_);
    auto& s = keys_[key_id];
    expire(s, now);
    const auto day = utc_day(now);
    if (s.day != day) {
      s.day = day;
      s.day_tokens = 0;
    }
    if (l.max_concurrency > 0 && s.in_flight >= l.max_concurrency) {
      return refuse("max_concurrency", 1, "rate limit reached: " + std::to_string(l.max_concurrency) + " concurrent requests for this key");
    }
    if (l.rpm > 0 && static_cast<std::int64_t>(s.requests.size()) >= l.rpm) {
      const auto frees = s.requests[s.requests.size() - static_cast<std::size_t>(l.rpm)] + kWindow;
      return refuse("rpm", seconds_until(frees, now), "rate limit reached: " + std::to_string(l.rpm) + " requests per minute for this key");
    }
    if (l.tpm > 0) {
      const std::string what = "rate limit reached: " + std::to_string(l.tpm) + " tokens per minute for this key";
      if (tokens > l.tpm) return refuse("tpm", 60, what + " (this request alone reserves " + std::to_string(tokens) + ")");
      if (s.window_tokens + tokens > l.tpm) {
        std::int64_t left = s.window_tokens;
        Clock::time_point frees = now;
        for (const auto& e : s.tokens) {  // the oldest leave first
          left -= e.tokens;
          frees = e.at + kWindow;
          if (left + tokens <= l.tpm) break;
        }
        return refuse("tpm", seconds_until(frees, now), what);
      }
    }
    if (l.daily_tokens > 0 && s.day_tokens + tokens > l.daily_tokens) {
      const auto midnight = Clock::time_point(std::chrono::seconds((day + 1) * 86400));
      return refuse("daily_tokens", seconds_until(midnight, now), "quota reached: " + std::to_string(l.daily_tokens) + " tokens per day for this key");
    }
    if (l.rpm > 0) s.requests.push_back(now);
    if (l.tpm > 0) {
      // Kept in time order (a thread may come in with an earlier `now` than the last one's).
      s.tokens.push_back({s.tokens.empty() ? now : std::max(now, s.tokens.back().at), request_id, tokens});
      s.window_tokens += tokens;
    }
    s.day_tokens += tokens;
    ++s.in_flight;
    return {.admitted = true};
  }

  void settle(const std::string& key_id, const KeyLimits&, std::uint64_t request_id, std::int64_t reserved, std::int64_t used,
              Clock::time_point admitted_at) override {
    std::lock_guard lock(mu_);
    auto& s = keys_[key_id];
    --s.in_flight;
    if (used < 0) return;
    const auto delta = used - reserved;
    // Still in the window: it counts what was used. The entries are in admission order, so its
    // time finds it (a scan would be linear in the window's requests, on every request).
    auto it = first_at_or_after(s.tokens, admitted_at);
    for (; it != s.tokens.end() && it->at - admitted_at < std::chrono::seconds(1); ++it) {
      if (it->id != request_id) continue;
      it->tokens += delta;
      s.window_tokens += delta;
      break;
    }
    if (s.day == utc_day(admitted_at)) s.day_tokens = std::max<std::int64_t>(0, s.day_tokens + delta);
  }

 private:
  struct Entry {
    Clock::time_point at;
    std::uint64_t id;
    std::int64_t tokens;
  };
  struct KeyState {
    std::deque<Clock::time_point> requests;  // admitted within the window
    std::deque<Entry> tokens;                // reserved or settled within the window
    std::int64_t window_tokens = 0;          // their sum
    std::int64_t in_flight = 0;
    std::int64_t day = -1, day_tokens = 0;
  };

  // The first entry at `t` or later. A request ends soon after it began, so its entry is near the
  // back: steps of 1, 2, 4, ... back from the end bound it, and a binary search within them finds
  // it, touching the window's recent entries rather than the whole of it (a million at 17k
  // requests a second).
  static std::deque<Entry>::iterator first_at_or_after(std::deque<Entry>& d, Clock::time_point t) {
    std::size_t hi = d.size(), step = 1;
    while (hi > 0) {
      const std::size_t probe = hi > step ? hi - step : 0;
      if (d[probe].at < t) return std::lower_bound(d.begin() + static_cast<std::ptrdiff_t>(probe) + 1, d.begin() + static_cast<std::ptrdiff_t>(hi), t, before);
      hi = probe;
      step *= 2;
    }
    return d.begin();
  }
  static bool before(const Entry& e, Clock::time_point t) { return e.at < t; }

  static void expire(KeyState& s, Clock::time_point now) {
    while (!s.requests.empty() && s.requests.front() + kWindow <= now) s.requests.pop_front();
    while (!s.tokens.empty() && s.tokens.front().at + kWindow <= now) {
      s.window_tokens -= s.tokens.front().tokens;
      s.tokens.pop_front();
    }
  }

  std::mutex mu_;
  std::unordered_map<std::string, KeyState> keys_;
};

}  // namespace

std::unique_ptr<Limiter> make_local_limiter() { return std::make_unique<LocalLimiter>(); }

}  // namespace lmserve::gateway
