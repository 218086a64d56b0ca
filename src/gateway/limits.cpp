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

// The window's admissions in buckets of a millisecond: a bucket's time is its admissions' times
// rounded up, so an admission leaves the window at its exact time or up to a millisecond later,
// never earlier (no more admitted than the limits in any window). A key's state is then at most
// 60,000 buckets whatever the rate: a log of every admission held 2.4 million entries (~80 MB)
// for a key at 40,000 requests a second.
class LocalLimiter : public Limiter {
 public:
  Admission admit(const std::string& key_id, const KeyLimits& l, std::uint64_t, std::int64_t tokens, Clock::time_point now) override {
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
    if (l.rpm > 0 && s.window_requests >= l.rpm) {
      const auto frees = frees_at(s.buckets, &Bucket::requests, s.window_requests - l.rpm + 1, now);
      return refuse("rpm", seconds_until(frees, now), "rate limit reached: " + std::to_string(l.rpm) + " requests per minute for this key");
    }
    if (l.tpm > 0) {
      const std::string what = "rate limit reached: " + std::to_string(l.tpm) + " tokens per minute for this key";
      if (tokens > l.tpm) return refuse("tpm", 60, what + " (this request alone reserves " + std::to_string(tokens) + ")");
      if (s.window_tokens + tokens > l.tpm) {
        const auto frees = frees_at(s.buckets, &Bucket::tokens, s.window_tokens + tokens - l.tpm, now);
        return refuse("tpm", seconds_until(frees, now), what);
      }
    }
    if (l.daily_tokens > 0 && s.day_tokens + tokens > l.daily_tokens) {
      const auto midnight = Clock::time_point(std::chrono::seconds((day + 1) * 86400));
      return refuse("daily_tokens", seconds_until(midnight, now), "quota reached: " + std::to_string(l.daily_tokens) + " tokens per day for this key");
    }
    if (l.rpm > 0 || l.tpm > 0) {
      auto& b = bucket(s.buckets, bucket_of(now));
      if (l.rpm > 0) {
        ++b.requests;
        ++s.window_requests;
      }
      if (l.tpm > 0) {
        b.tokens += tokens;
        s.window_tokens += tokens;
      }
    }
    s.day_tokens += tokens;
    ++s.in_flight;
    return {.admitted = true};
  }

  void settle(const std::string& key_id, const KeyLimits& l, std::uint64_t, std::int64_t reserved, std::int64_t used,
              Clock::time_point admitted_at) override {
    std::lock_guard lock(mu_);
    auto& s = keys_[key_id];
    --s.in_flight;
    if (used < 0) return;
    const auto delta = used - reserved;
    // Still in the window: its bucket counts what was used.
    if (l.tpm > 0) {
      const auto at = bucket_of(admitted_at);
      const auto it = first_at_or_after(s.buckets, at);
      if (it != s.buckets.end() && it->at == at) {
        it->tokens += delta;
        s.window_tokens += delta;
      }
    }
    if (s.day == utc_day(admitted_at)) s.day_tokens = std::max<std::int64_t>(0, s.day_tokens + delta);
  }

 private:
  struct Bucket {
    Clock::time_point at;   // its admissions' times, rounded up to the millisecond
    std::int64_t requests;  // admitted (with an rpm)
    std::int64_t tokens;    // reserved or settled (with a tpm)
  };
  struct KeyState {
    std::deque<Bucket> buckets;        // within the window, in time order
    std::int64_t window_requests = 0;  // their sums
    std::int64_t window_tokens = 0;
    std::int64_t in_flight = 0;
    std::int64_t day = -1, day_tokens = 0;
  };

  // When `excess` of a count (requests or tokens) will have left the window: the oldest buckets
  // leave first.
  static Clock::time_point frees_at(const std::deque<Bucket>& d, std::int64_t Bucket::*count, std::int64_t excess, Clock::time_point now) {
    Clock::time_point frees = now;
    for (const auto& b : d) {
      excess -= b.*count;
      frees = b.at + kWindow;
      if (excess <= 0) break;
    }
    return frees;
  }

  static Clock::time_point bucket_of(Clock::time_point t) {
    return Clock::time_point(std::chrono::ceil<std::chrono::milliseconds>(t.time_since_epoch()));
  }

  // The first bucket at `t` or later. A request ends soon after it began, so its bucket is near
  // the back: steps of 1, 2, 4, ... back from the end bound it, and a binary search within them
  // finds it, touching the window's recent buckets rather than all of them.
  static std::deque<Bucket>::iterator first_at_or_after(std::deque<Bucket>& d, Clock::time_point t) {
    std::size_t hi = d.size(), step = 1;
    while (hi > 0) {
      const std::size_t probe = hi > step ? hi - step : 0;
      if (d[probe].at < t) return std::lower_bound(d.begin() + static_cast<std::ptrdiff_t>(probe) + 1, d.begin() + static_cast<std::ptrdiff_t>(hi), t, before);
      hi = probe;
      step *= 2;
    }
    return d.begin();
  }
  static bool before(const Bucket& b, Clock::time_point t) { return b.at < t; }

  // The bucket of time `at`, made where it belongs if there is none: at the back but for a thread
  // that comes in with an earlier `now` than another's (then a few places from it).
  static Bucket& bucket(std::deque<Bucket>& d, Clock::time_point at) {
    if (d.empty() || d.back().at < at) return d.emplace_back(Bucket{at, 0, 0});
    if (d.back().at == at) return d.back();
    auto it = first_at_or_after(d, at);
    if (it->at != at) it = d.insert(it, Bucket{at, 0, 0});
    return *it;
  }

  static void expire(KeyState& s, Clock::time_point now) {
    while (!s.buckets.empty() && s.buckets.front().at + kWindow <= now) {
      s.window_requests -= s.buckets.front().requests;
      s.window_tokens -= s.buckets.front().tokens;
      s.buckets.pop_front();
    }
  }

  std::mutex mu_;
  std::unordered_map<std::string, KeyState> keys_;
};

}  // namespace

std::unique_ptr<Limiter> make_local_limiter() { return std::make_unique<LocalLimiter>(); }

}  // namespace lmserve::gateway
