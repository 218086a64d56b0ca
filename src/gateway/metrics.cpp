#include "gateway/metrics.h"

namespace lmserve::gateway {

using prometheus::escape;
using prometheus::header;
using prometheus::num;

void GatewayMetrics::request(const std::string& model, const std::string& backend, const std::string& version, int status,
                             double ttft_s, double total_s) {
  std::lock_guard lock(mu_);
  ++requests_[{model, backend, version, status}];
  auto key = std::make_pair(model, version);
  // Found first: the buckets are built only for a new series.
  auto series = [&key](auto& map) -> prometheus::Histogram& {
    auto it = map.find(key);
    if (it == map.end()) it = map.emplace(key, prometheus::Histogram(prometheus::latency_buckets())).first;
    return it->second;
  };
  if (ttft_s >= 0) series(ttft_).observe(ttft_s);
  series(total_).observe(total_s);
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

std::string GatewayMetrics::render(const std::vector<ReplicaRow>& replicas) const {
  std::lock_guard lock(mu_);
  std::string out;
  auto lbl = [](const char* k, const std::string& v) { return std::string(k) + "=\"" + escape(v) + "\""; };
  header(out, "lmserve:gateway_requests_total", "counter", "Requests answered, by model, replica, version and HTTP status.");
  for (const auto& [k, n] : requests_) {
    const auto& [model, backend, version, status] = k;
    out += "lmserve:gateway_requests_total{" + lbl("model", model) + "," + lbl("backend", backend) + "," + lbl("version", version) + "," +
           lbl("status", std::to_string(status)) + "} " + std::to_string(n) + "\n";
  }
  header(out, "lmserve:gateway_time_to_first_token_seconds", "histogram",
         "Time from the request's arrival to the first byte of its answer's body (streamed: the first token).");
  for (const auto& [k, h] : ttft_) h.render(out, "lmserve:gateway_time_to_first_token_seconds", lbl("model", k.first) + "," + lbl("version", k.second));
  header(out, "lmserve:gateway_request_duration_seconds", "histogram", "Time from the request's arrival to the end of its answer.");
  for (const auto& [k, h] : total_) h.render(out, "lmserve:gateway_request_duration_seconds", lbl("model", k.first) + "," + lbl("version", k.second));
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
