#include "gateway/metrics.h"

#include <atomic>
#include <charconv>

namespace lmserve::gateway {

using prometheus::escape;
using prometheus::header;
using prometheus::num;

std::uint64_t GatewayMetrics::next_id() {
  static std::atomic<std::uint64_t> n{1};
  return n++;
}

GatewayMetrics::Shard& GatewayMetrics::shard() {
  thread_local std::uint64_t cached_id = 0;
  thread_local Shard* cached = nullptr;
  if (cached_id == id_) return *cached;
  std::lock_guard lock(mu_);
  auto& s = shards_[std::this_thread::get_id()];
  if (!s) s = std::make_unique<Shard>();
  cached_id = id_;
  cached = s.get();
  return *s;
}

namespace {

// Labels joined by '\0' into a thread's reused buffer (no allocation once it has grown).
template <class... Parts>
const std::string& joined(const Parts&... parts) {
  thread_local std::string key;
  key.clear();
  ((key.append(parts).push_back('\0')), ...);
  key.pop_back();
  return key;
}

std::vector<std::string> split(const std::string& key) {
  std::vector<std::string> out;
  std::size_t at = 0;
  for (;;) {
    const auto end = key.find('\0', at);
    out.push_back(key.substr(at, end == std::string::npos ? std::string::npos : end - at));
    if (end == std::string::npos) return out;
    at = end + 1;
  }
}

// The series of `key`, made by `fresh()` the first time only.
template <class Map, class Make>
auto& series(Map& map, const std::string& key, Make fresh) {
  auto it = map.find(key);
  if (it == map.end()) it = map.emplace(key, fresh()).first;
  return it->second;
}

prometheus::Histogram latency_histogram() { return prometheus::Histogram(prometheus::latency_buckets()); }
std::uint64_t zero() { return 0; }

}  // namespace

void GatewayMetrics::request(const std::string& model, const std::string& backend, const std::string& version, int status,
                             double ttft_s, double total_s) {
  auto& s = shard();
  char code[16];
  const auto n = std::to_chars(code, code + sizeof code, status).ptr - code;
  std::lock_guard lock(s.mu);
  ++series(s.requests, joined(model, backend, version, std::string_view(code, static_cast<std::size_t>(n))), zero);
  const auto& key = joined(model, version);
  if (ttft_s >= 0) series(s.ttft, key, latency_histogram).observe(ttft_s);
  series(s.total, key, latency_histogram).observe(total_s);
}

void GatewayMetrics::retry(const std::string& model, const std::string& backend, const std::string& reason) {
  std::lock_guard lock(mu_);
  ++retries_[{model, backend, reason}];
}

void GatewayMetrics::ejection(const std::string& backend, const std::string& reason) {
  std::lock_guard lock(mu_);
  ++ejections_[{backend, reason}];
}

void GatewayMetrics::upstream_error(const std::string& backend, const std::string& kind) {
  std::lock_guard lock(mu_);
  ++upstream_errors_[{backend, kind}];
}

void GatewayMetrics::tenant_request(const std::string& tenant, const std::string& model, int status) {
  auto& s = shard();
  char code[16];
  const auto n = std::to_chars(code, code + sizeof code, status).ptr - code;
  std::lock_guard lock(s.mu);
  ++series(s.tenant_requests, joined(tenant, model, std::string_view(code, static_cast<std::size_t>(n))), zero);
}

void GatewayMetrics::tenant_tokens(const std::string& tenant, const std::string& model, std::int64_t prompt, std::int64_t completion) {
  auto& s = shard();
  std::lock_guard lock(s.mu);
  if (prompt > 0) series(s.tenant_tokens, joined(tenant, model, std::string_view("prompt")), zero) += static_cast<std::uint64_t>(prompt);
  if (completion > 0) series(s.tenant_tokens, joined(tenant, model, std::string_view("completion")), zero) += static_cast<std::uint64_t>(completion);
}

void GatewayMetrics::tenant_limited(const std::string& tenant, const std::string& limit) {
  std::lock_guard lock(mu_);
  ++tenant_limited_[{tenant, limit}];
}

void GatewayMetrics::tenant_blocked(const std::string& tenant, const std::string& rule) {
  std::lock_guard lock(mu_);
  ++tenant_blocked_[{tenant, rule}];
}

std::string GatewayMetrics::render(const std::vector<ReplicaRow>& replicas) const {
  std::lock_guard lock(mu_);
  std::map<std::string, std::uint64_t> requests;
  std::map<std::string, prometheus::Histogram> ttft, total;
  std::map<std::string, std::uint64_t> tenant_requests, tenant_tokens;
  for (const auto& [thread, s] : shards_) {
    std::lock_guard shard_lock(s->mu);
    for (const auto& [k, n] : s->requests) requests[k] += n;
    for (const auto& [k, n] : s->tenant_requests) tenant_requests[k] += n;
    for (const auto& [k, n] : s->tenant_tokens) tenant_tokens[k] += n;
    for (const auto& [k, h] : s->ttft) series(ttft, k, latency_histogram).merge(h);
    for (const auto& [k, h] : s->total) series(total, k, latency_histogram).merge(h);
  }
  std::string out;
  auto lbl = [](const char* k, const std::string& v) { return std::string(k) + "=\"" + escape(v) + "\""; };
  header(out, "lmserve:gateway_requests_total", "counter", "Requests answered, by model, replica, version and HTTP status.");
  for (const auto& [k, n] : requests) {
    const auto l = split(k);  // model, backend, version, status
    out += "lmserve:gateway_requests_total{" + lbl("model", l[0]) + "," + lbl("backend", l[1]) + "," + lbl("version", l[2]) + "," +
           lbl("status", l[3]) + "} " + std::to_string(n) + "\n";
  }
  header(out, "lmserve:gateway_time_to_first_token_seconds", "histogram",
         "Time from the request's arrival to the first byte of its answer's body (streamed: the first token).");
  for (const auto& [k, h] : ttft) {
    const auto l = split(k);  // model, version
    h.render(out, "lmserve:gateway_time_to_first_token_seconds", lbl("model", l[0]) + "," + lbl("version", l[1]));
  }
  header(out, "lmserve:gateway_request_duration_seconds", "histogram", "Time from the request's arrival to the end of its answer.");
  for (const auto& [k, h] : total) {
    const auto l = split(k);
    h.render(out, "lmserve:gateway_request_duration_seconds", lbl("model", l[0]) + "," + lbl("version", l[1]));
  }
  header(out, "lmserve:gateway_retries_total", "counter", "Requests sent to another replica after one failed before answering, by the replica that failed and why.");
  for (const auto& [k, n] : retries_) {
    const auto& [model, backend, reason] = k;
    out += "lmserve:gateway_retries_total{" + lbl("model", model) + "," + lbl("backend", backend) + "," + lbl("reason", reason) + "} " +
           std::to_string(n) + "\n";
  }
  header(out, "lmserve:gateway_ejections_total", "counter", "Replicas taken out of rotation: by failed health checks (health) or failed requests (passive).");
  for (const auto& [k, n] : ejections_) out += "lmserve:gateway_ejections_total{" + lbl("backend", k.first) + "," + lbl("reason", k.second) + "} " + std::to_string(n) + "\n";
  header(out, "lmserve:gateway_upstream_errors_total", "counter", "Failed exchanges with replicas, by replica and kind.");
  for (const auto& [k, n] : upstream_errors_) {
    out += "lmserve:gateway_upstream_errors_total{" + lbl("backend", k.first) + "," + lbl("kind", k.second) + "} " + std::to_string(n) + "\n";
  }
  header(out, "lmserve:gateway_tenant_requests_total", "counter", "Requests of API keys answered (proxied or refused by the gateway), by tenant, model and HTTP status.");
  for (const auto& [k, n] : tenant_requests) {
    const auto l = split(k);  // tenant, model, status
    out += "lmserve:gateway_tenant_requests_total{" + lbl("tenant", l[0]) + "," + lbl("model", l[1]) + "," + lbl("status", l[2]) + "} " + std::to_string(n) + "\n";
  }
  header(out, "lmserve:gateway_tenant_tokens_total", "counter", "Tokens the replicas reported for a tenant's requests, by kind (prompt, completion).");
  for (const auto& [k, n] : tenant_tokens) {
    const auto l = split(k);  // tenant, model, kind
    out += "lmserve:gateway_tenant_tokens_total{" + lbl("tenant", l[0]) + "," + lbl("model", l[1]) + "," + lbl("kind", l[2]) + "} " + std::to_string(n) + "\n";
  }
  header(out, "lmserve:gateway_tenant_limited_total", "counter", "A tenant's requests refused by a key's limit (rpm, tpm, max_concurrency, daily_tokens, max_input_tokens).");
  for (const auto& [k, n] : tenant_limited_) out += "lmserve:gateway_tenant_limited_total{" + lbl("tenant", k.first) + "," + lbl("limit", k.second) + "} " + std::to_string(n) + "\n";
  header(out, "lmserve:gateway_tenant_blocked_total", "counter", "A tenant's requests blocked by the guard, by rule.");
  for (const auto& [k, n] : tenant_blocked_) out += "lmserve:gateway_tenant_blocked_total{" + lbl("tenant", k.first) + "," + lbl("rule", k.second) + "} " + std::to_string(n) + "\n";
  header(out, "lmserve:gateway_backend_healthy", "gauge", "1 when the replica passes its health checks.");
  for (const auto& r : replicas) {
    out += "lmserve:gateway_backend_healthy{" + lbl("model", r.model) + "," + lbl("backend", r.backend) + "," + lbl("version", r.version) + "} " +
           (r.healthy ? "1" : "0") + "\n";
  }
  header(out, "lmserve:gateway_backend_available", "gauge", "1 when the replica takes requests (healthy, not ejected, not backing off after a 429).");
  for (const auto& r : replicas) {
    out += "lmserve:gateway_backend_available{" + lbl("model", r.model) + "," + lbl("backend", r.backend) + "," + lbl("version", r.version) +
           "} " + (r.available ? "1" : "0") + "\n";
  }
  header(out, "lmserve:gateway_backend_outstanding_requests", "gauge", "Requests this gateway has in flight on the replica.");
  for (const auto& r : replicas) {
    out += "lmserve:gateway_backend_outstanding_requests{" + lbl("model", r.model) + "," + lbl("backend", r.backend) + "," +
           lbl("version", r.version) + "} " + num(static_cast<double>(r.outstanding)) + "\n";
  }
  return out;
}

}  // namespace lmserve::gateway
