// gateway/limits: an API key's limits (keys.h KeyLimits), held exactly under concurrency.
//
//   rpm              requests admitted in any 60 s window
//   tpm              tokens in any 60 s window: a request counts prompt + max_tokens when it is
//                    admitted (a reservation), replaced by the prompt + completion tokens the
//                    replica reports when it ends
//   max_concurrency  requests of the key under way at once
//   daily_tokens     tokens per UTC day, reserved and settled likewise
//
// admit() is atomic over all four: a request refused by one takes nothing from the others. A
// grant's end (settle) gives its concurrency slot back and settles its tokens. The windows slide:
// a refusal's Retry-After is when enough of the window will have passed. Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "gateway/keys.h"

namespace lmserve::gateway {

struct Admission {
  bool admitted = false;
  std::string limit;    // refused: "rpm", "tpm", "max_concurrency" or "daily_tokens"
  std::int64_t retry_after_s = 0;
  std::string message;  // refused: names the limit, e.g. "rate limit reached: 60 requests per minute for this key"
  bool unavailable = false;  // refused because the shared counters could not be reached (limit "redis")
};

class Limiter {
 public:
  using Clock = std::chrono::system_clock;  // the day is a calendar (UTC) day
  virtual ~Limiter() = default;
  // Admits request `request_id` of key `key_id` reserving `tokens`, or names the limit that refuses it.
  virtual Admission admit(const std::string& key_id, const KeyLimits& limits, std::uint64_t request_id, std::int64_t tokens, Clock::time_point now) = 0;
  // The admitted request ended: `used` tokens instead of its reservation (< 0: the reservation stands).
  virtual void settle(const std::string& key_id, const KeyLimits& limits, std::uint64_t request_id, std::int64_t reserved, std::int64_t used,
                      Clock::time_point admitted_at) = 0;
};

// Counters in this process, in buckets of a millisecond (an admission leaves the window at its
// time or up to a millisecond later, never before), so that a key's state is bounded whatever
// its rate.
std::unique_ptr<Limiter> make_local_limiter();

// Counters in Redis (`host:port`), shared by every gateway that names the same server: each
// admission and settlement is one Lua script run atomically there, on Redis's clock; request ids
// are made unique per process. Keys: lmserve:{KEY_ID}:... (one hash slot per key), expiring when
// idle. A request under way counts against max_concurrency for at most `lease` (a gateway that
// died cannot hold slots for ever). When Redis cannot be reached, requests of limited keys are
// refused (unavailable): limits that are not shared would not hold. Checks the server at once.
Result<std::unique_ptr<Limiter>> make_redis_limiter(const std::string& host, int port, std::chrono::milliseconds lease);

// An admitted request's hold on its key's limits, settled once: by settle(), or on destruction
// with its reservation standing (a request that ended without a count). The limiter outlives it.
class Grant {
 public:
  Grant(Limiter& limiter, std::string key_id, KeyLimits limits, std::uint64_t request_id, std::int64_t reserved, Limiter::Clock::time_point at)
      : limiter_(limiter), key_id_(std::move(key_id)), limits_(limits), id_(request_id), reserved_(reserved), at_(at) {}
  ~Grant() { settle(-1); }
  Grant(const Grant&) = delete;
  Grant& operator=(const Grant&) = delete;
  void settle(std::int64_t used_tokens) {
    if (settled_) return;
    settled_ = true;
    limiter_.settle(key_id_, limits_, id_, reserved_, used_tokens, at_);
  }
  bool counts_tokens() const { return limits_.tpm > 0 || limits_.daily_tokens > 0; }

 private:
  Limiter& limiter_;
  const std::string key_id_;
  const KeyLimits limits_;
  const std::uint64_t id_;
  const std::int64_t reserved_;
  const Limiter::Clock::time_point at_;
  bool settled_ = false;
};

}  // namespace lmserve::gateway
