#include "gateway/access_log.h"

#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>

#include "common/json_line.h"

namespace lmserve::gateway {

std::string utc_now() {
  const auto now = std::chrono::system_clock::now();
  const auto t = std::chrono::system_clock::to_time_t(now);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[40];
  const auto n = std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  std::snprintf(buf + n, sizeof buf - n, ".%03dZ", static_cast<int>(ms));
  return buf;
}

void write_access_log(const AccessRecord& r) {
  JsonLine j;
  j.str("time", utc_now()).str("event", "request").num("id", static_cast<std::int64_t>(r.id)).str("model", r.model).str("backend", r.backend);
  j.str("version", r.version).num("status", r.status).boolean("stream", r.stream).num("retries", r.retries).real("total_ms", r.total_s * 1e3);
  j.str("client", r.client).str("path", r.path);
  if (r.ttft_s < 0) j.null("ttft_ms");
  else j.real("ttft_ms", r.ttft_s * 1e3);
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
