#include "gateway/access_log.h"

#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>

#include "common/json_line.h"

namespace lmserve::gateway {

std::string utc_now() {
  // The date and time to the second are formatted once a second per thread (gmtime_r and strftime
  // cost ~1 us, twice per audited request); the milliseconds every call.
  struct Second {
    std::time_t t = -1;
    char text[24] = {};
    std::size_t n = 0;
  };
  thread_local Second last;
  const auto now = std::chrono::system_clock::now();
  const auto t = std::chrono::system_clock::to_time_t(now);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  if (t != last.t) {
    std::tm tm{};
    gmtime_r(&t, &tm);
    last.n = std::strftime(last.text, sizeof last.text, "%Y-%m-%dT%H:%M:%S", &tm);
    last.t = t;
  }
  std::string out(last.text, last.n);
  const char tail[] = {'.', static_cast<char>('0' + ms / 100), static_cast<char>('0' + ms / 10 % 10), static_cast<char>('0' + ms % 10), 'Z'};
  out.append(tail, sizeof tail);
  return out;
}

void write_access_log(const AccessRecord& r) {
  JsonLine j;
  j.str("time", utc_now()).str("event", "request").num("id", static_cast<std::int64_t>(r.id)).str("model", r.model).str("backend", r.backend);
  j.str("version", r.version).num("status", r.status).boolean("stream", r.stream).num("retries", r.retries).millis("total_ms", r.total_s);
  j.str("client", r.client).str("path", r.path);
  if (r.ttft_s < 0) j.null("ttft_ms");
  else j.millis("ttft_ms", r.ttft_s);
  if (!r.error.empty()) j.str("error", r.error);
  if (!r.key_id.empty()) j.str("key_id", r.key_id);
  if (!r.tenant.empty()) j.str("tenant", r.tenant);
  const auto line = std::move(j).done() + "\n";
  static std::mutex mu;
  std::lock_guard lock(mu);
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fflush(stdout);
}

}  // namespace lmserve::gateway
