#include "gateway/access_log.h"

#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>
#include <nlohmann/json.hpp>

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
  nlohmann::json j = {{"time", utc_now()},    {"event", "request"}, {"id", r.id},           {"model", r.model},
                      {"backend", r.backend}, {"version", r.version}, {"status", r.status}, {"stream", r.stream},
                      {"retries", r.retries}, {"total_ms", r.total_s * 1e3}, {"client", r.client}, {"path", r.path}};
  j["ttft_ms"] = r.ttft_s < 0 ? nlohmann::json(nullptr) : nlohmann::json(r.ttft_s * 1e3);
  if (!r.error.empty()) j["error"] = r.error;
  if (!r.key_id.empty()) j["key_id"] = r.key_id;
  if (!r.tenant.empty()) j["tenant"] = r.tenant;
  const auto line = j.dump() + "\n";
  static std::mutex mu;
  std::lock_guard lock(mu);
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fflush(stdout);
}

}  // namespace lmserve::gateway
