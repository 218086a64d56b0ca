// The limits' counters in Redis (limits.h make_redis_limiter): two Lua scripts, each run
// atomically by the server, on its clock.
#include <hiredis/hiredis.h>
#include <spdlog/spdlog.h>

#include <array>
#include <atomic>
#include <mutex>
#include <span>
#include <random>
#include <vector>

#include "gateway/digest.h"
#include "gateway/limits.h"

namespace lmserve::gateway {

namespace {

// KEYS: 1 requests (zset id -> ms), 2 token entries (zset id -> ms), 3 their tokens (hash id ->
// n), 4 the window's token sum, 5 requests under way (zset id -> ms), 6 the day's tokens.
// ARGV: rpm, tpm, max_concurrency, daily_tokens, reserve, id, lease_ms.
// Returns {1, "", 0} or {0, limit, ms until there is room}.
constexpr const char* kAdmit = R"LUA(
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local rpm, tpm, conc, daily = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local reserve, id, lease = tonumber(ARGV[5]), ARGV[6], tonumber(ARGV[7])
local start = now - 60000
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', start)
local old = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', start)
for _, m in ipairs(old) do
  redis.call('DECRBY', KEYS[4], tonumber(redis.call('HGET', KEYS[3], m) or '0'))
  redis.call('HDEL', KEYS[3], m)
end
if #old > 0 then redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', start) end
redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now - lease)
if conc > 0 and redis.call('ZCARD', KEYS[5]) >= conc then return {0, 'max_concurrency', 1000} end
if rpm > 0 then
  local n = redis.call('ZCARD', KEYS[1])
  if n >= rpm then
    local e = redis.call('ZRANGE', KEYS[1], n - rpm, n - rpm, 'WITHSCORES')
    return {0, 'rpm', tonumber(e[2]) + 60000 - now}
  end
end
if tpm > 0 then
  if reserve > tpm then return {0, 'tpm', 60000} end
  local sum = tonumber(redis.call('GET', KEYS[4]) or '0')
  if sum + reserve > tpm then
    local es = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
    local left, frees = sum, now
    for i = 1, #es, 2 do
      left = left - tonumber(redis.call('HGET', KEYS[3], es[i]) or '0')
      frees = tonumber(es[i + 1]) + 60000
      if left + reserve <= tpm then break end
    end
    return {0, 'tpm', frees - now}
  end
end
if daily > 0 and tonumber(redis.call('GET', KEYS[6]) or '0') + reserve > daily then return {0, 'daily_tokens', 0} end
if rpm > 0 then redis.call('ZADD', KEYS[1], now, id) end
if tpm > 0 then
  redis.call('ZADD', KEYS[2], now, id)
  redis.call('HSET', KEYS[3], id, reserve)
  redis.call('INCRBY', KEYS[4], reserve)
end
redis.call('INCRBY', KEYS[6], reserve)
redis.call('EXPIRE', KEYS[6], 172800)
redis.call('ZADD', KEYS[5], now, id)
for i = 1, 5 do redis.call('PEXPIRE', KEYS[i], math.max(120000, 2 * lease)) end
return {1, '', 0}
)LUA";

// KEYS as above (6: the admission's day). ARGV: id, reserved, used (< 0: the reservation stands).
constexpr const char* kSettle = R"LUA(
redis.call('ZREM', KEYS[5], ARGV[1])
local used = tonumber(ARGV[3])
if used < 0 then return 0 end
local delta = used - tonumber(ARGV[2])
if redis.call('HEXISTS', KEYS[3], ARGV[1]) == 1 then
  redis.call('HINCRBY', KEYS[3], ARGV[1], delta)
  redis.call('INCRBY', KEYS[4], delta)
end
if redis.call('EXISTS', KEYS[6]) == 1 and redis.call('INCRBY', KEYS[6], delta) < 0 then redis.call('SET', KEYS[6], 0, 'KEEPTTL') end
return 1
)LUA";

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

std::int64_t utc_day(Limiter::Clock::time_point t) { return std::chrono::duration_cast<std::chrono::seconds>(t.time_since_epoch()).count() / 86400; }

class RedisLimiter : public Limiter {
 public:
  RedisLimiter(std::string host, int port, std::chrono::milliseconds lease) : host_(std::move(host)), port_(port), lease_(lease) {
    std::random_device rd;
    const std::uint64_t r = (static_cast<std::uint64_t>(rd()) << 32) | rd();
    instance_ = to_hex(reinterpret_cast<const unsigned char*>(&r), sizeof r);
  }
  ~RedisLimiter() override {
    for (auto* c : idle_) redisFree(c);
  }

  Status check() {
    auto* c = take();
    if (!c) return Status(StatusCode::kUnavailable, "redis " + host_ + ":" + std::to_string(port_) + ": cannot connect");
    const char* argv[] = {"PING"};
    Reply r(static_cast<redisReply*>(redisCommandArgv(c, 1, argv, nullptr)));
    const bool ok = r && r->type == REDIS_REPLY_STATUS;
    give(c, r != nullptr);
    if (!ok) return Status(StatusCode::kUnavailable, "redis " + host_ + ":" + std::to_string(port_) + ": no answer to PING");
    return Status::ok();
  }

  Admission admit(const std::string& key_id, const KeyLimits& l, std::uint64_t request_id, std::int64_t tokens, Clock::time_point now) override {
    const auto keys = keys_of(key_id, utc_day(now));
    const std::string args[] = {std::to_string(l.rpm), std::to_string(l.tpm), std::to_string(l.max_concurrency), std::to_string(l.daily_tokens),
                                std::to_string(tokens), member(request_id), std::to_string(lease_.count())};
    auto r = run(kAdmit, sha_admit_, keys, args);
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 3 || r->element[0]->type != REDIS_REPLY_INTEGER) {
      return {.admitted = false, .limit = "redis", .retry_after_s = 1, .message = "the limits' shared counters cannot be reached", .unavailable = true};
    }
    if (r->element[0]->integer == 1) return {.admitted = true};
    const std::string limit(r->element[1]->str, r->element[1]->len);
    const auto ms = r->element[2]->integer;
    const std::int64_t retry = std::max<std::int64_t>(1, (ms + 999) / 1000);
    if (limit == "max_concurrency") return {false, limit, 1, "rate limit reached: " + std::to_string(l.max_concurrency) + " concurrent requests for this key"};
    if (limit == "rpm") return {false, limit, retry, "rate limit reached: " + std::to_string(l.rpm) + " requests per minute for this key"};
    if (limit == "tpm") {
      std::string m = "rate limit reached: " + std::to_string(l.tpm) + " tokens per minute for this key";
      if (tokens > l.tpm) m += " (this request alone reserves " + std::to_string(tokens) + ")";
      return {false, limit, retry, m};
    }
    const auto midnight = Clock::time_point(std::chrono::seconds((utc_day(now) + 1) * 86400));
    const auto to_midnight = std::chrono::duration_cast<std::chrono::seconds>(midnight - now).count();
    return {false, "daily_tokens", std::max<std::int64_t>(1, to_midnight), "quota reached: " + std::to_string(l.daily_tokens) + " tokens per day for this key"};
  }

  void settle(const std::string& key_id, const KeyLimits&, std::uint64_t request_id, std::int64_t reserved, std::int64_t used,
              Clock::time_point admitted_at) override {
    const auto keys = keys_of(key_id, utc_day(admitted_at));
    const std::string args[] = {member(request_id), std::to_string(reserved), std::to_string(used)};
    auto r = run(kSettle, sha_settle_, keys, args);
    if (!r || r->type == REDIS_REPLY_ERROR) note_error("a request's limits were not settled (key " + key_id + ")");
  }

 private:
  std::array<std::string, 6> keys_of(const std::string& key_id, std::int64_t day) const {
    const std::string p = "lmserve:{" + key_id + "}:";
    return {p + "req", p + "tok", p + "tokn", p + "toksum", p + "busy", p + "day:" + std::to_string(day)};
  }
  std::string member(std::uint64_t request_id) const { return instance_ + ":" + std::to_string(request_id); }

  // Runs a script by its digest (loading it the first time the server does not know it).
  Reply run(const char* script, const std::string& sha, const std::array<std::string, 6>& keys, std::span<const std::string> args) {
    auto* c = take();
    if (!c) return nullptr;
    std::vector<const char*> argv;
    std::vector<std::size_t> lens;
    auto push = [&](const std::string& s) {
      argv.push_back(s.data());
      lens.push_back(s.size());
    };
    const std::string evalsha = "EVALSHA", eval = "EVAL", nkeys = std::to_string(keys.size()), text = script;
    push(evalsha);
    push(sha);
    push(nkeys);
    for (const auto& k : keys) push(k);
    for (const auto& a : args) push(a);
    Reply r(static_cast<redisReply*>(redisCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lens.data())));
    if (r && r->type == REDIS_REPLY_ERROR && std::string_view(r->str, r->len).starts_with("NOSCRIPT")) {
      argv[0] = eval.data();
      lens[0] = eval.size();
      argv[1] = text.data();
      lens[1] = text.size();
      r.reset(static_cast<redisReply*>(redisCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lens.data())));
    }
    if (!r) note_error(c->errstr);
    else if (r->type == REDIS_REPLY_ERROR) note_error("script error: " + std::string(r->str, r->len));
    give(c, r != nullptr);
    return r;
  }

  redisContext* take() {
    {
      std::lock_guard lock(mu_);
      if (!idle_.empty()) {
        auto* c = idle_.back();
        idle_.pop_back();
        return c;
      }
    }
    const timeval tv{0, 500'000};
    auto* c = redisConnectWithTimeout(host_.c_str(), port_, tv);
    if (!c || c->err) {
      note_error(c ? c->errstr : "cannot connect");
      if (c) redisFree(c);
      return nullptr;
    }
    redisSetTimeout(c, tv);
    return c;
  }

  // Logged at most once a second (an unreachable server would otherwise log every request).
  void note_error(const std::string& what) {
    const auto now = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
    auto last = last_note_.load();
    if (now == last || !last_note_.compare_exchange_strong(last, now)) return;
    spdlog::error("gateway: redis {}:{}: {}", host_, port_, what);
  }

  void give(redisContext* c, bool healthy) {
    if (!healthy || c->err) return redisFree(c);
    std::lock_guard lock(mu_);
    idle_.push_back(c);
  }

  const std::string host_;
  const int port_;
  const std::chrono::milliseconds lease_;
  std::string instance_;
  const std::string sha_admit_ = sha1_hex(kAdmit), sha_settle_ = sha1_hex(kSettle);
  std::mutex mu_;
  std::vector<redisContext*> idle_;
  std::atomic<std::int64_t> last_note_{0};
};

}  // namespace

Result<std::unique_ptr<Limiter>> make_redis_limiter(const std::string& host, int port, std::chrono::milliseconds lease) {
  auto l = std::make_unique<RedisLimiter>(host, port, lease);
  if (auto st = l->check(); !st.is_ok()) return error(st);
  return std::unique_ptr<Limiter>(std::move(l));
}

}  // namespace lmserve::gateway
