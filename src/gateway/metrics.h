// gateway/metrics: the gateway's own Prometheus metrics, under "lmserve:gateway_". Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "common/prometheus.h"
#include "gateway/replicas.h"

namespace lmserve::gateway {

class GatewayMetrics {
 public:
  // One finished request. `backend`/`version` empty when no replica answered; ttft_s < 0 when
  // no byte of an answer came.
  void request(const std::string& model, const std::string& backend, const std::string& version, int status, double ttft_s,
               double total_s);
  void retry(const std::string& model, const std::string& backend, const std::string& reason);
  void ejection(const std::string& backend, const std::string& reason);
  void upstream_error(const std::string& backend, const std::string& kind);
  // Per tenant (an API key's): requests answered (proxied or refused), the tokens replicas
  // reported, refusals by a limit, and blocks by the guard.
  void tenant_request(const std::string& tenant, const std::string& model, int status);
  void tenant_tokens(const std::string& tenant, const std::string& model, std::int64_t prompt, std::int64_t completion);
  void tenant_limited(const std::string& tenant, const std::string& limit);
  void tenant_blocked(const std::string& tenant, const std::string& rule);

  struct ReplicaRow {
    std::string model, backend, version;
    bool healthy = false, available = false;
    std::int64_t outstanding = 0;
  };
  std::string render(const std::vector<ReplicaRow>& replicas) const;

 private:
  // The series every request touches are kept per thread, a shard each, and summed when rendered:
  // the I/O threads then share no lock on every request. Keys are the labels joined by '\0', so
  // that a series already there is found without building a key.
  struct Shard {
    std::mutex mu;  // its own thread's, and render()'s
    std::map<std::string, std::uint64_t, std::less<>> requests;       // model, backend, version, status
    std::map<std::string, prometheus::Histogram, std::less<>> ttft, total;  // model, version
    std::map<std::string, std::uint64_t, std::less<>> tenant_requests, tenant_tokens;  // tenant, model, status/kind
  };
  Shard& shard();
  const std::uint64_t id_ = next_id();  // tells this instance's shards from another's in a thread's cache
  static std::uint64_t next_id();

  mutable std::mutex mu_;
  std::map<std::thread::id, std::unique_ptr<Shard>> shards_;
  std::map<std::tuple<std::string, std::string, std::string>, std::uint64_t> retries_;
  std::map<std::pair<std::string, std::string>, std::uint64_t> ejections_, upstream_errors_;
  std::map<std::pair<std::string, std::string>, std::uint64_t> tenant_limited_, tenant_blocked_;                 // tenant, limit/rule
};

}  // namespace lmserve::gateway
