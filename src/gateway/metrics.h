// gateway/metrics: the gateway's own Prometheus metrics, under "lmserve:gateway_". Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
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

  struct ReplicaRow {
    std::string model, backend, version;
    bool healthy = false, available = false;
    std::int64_t outstanding = 0;
  };
  std::string render(const std::vector<ReplicaRow>& replicas) const;

 private:
  mutable std::mutex mu_;
  std::map<std::tuple<std::string, std::string, std::string, int>, std::uint64_t> requests_;
  std::map<std::pair<std::string, std::string>, prometheus::Histogram> ttft_, total_;  // by model, version
  std::map<std::tuple<std::string, std::string, std::string>, std::uint64_t> retries_;
  std::map<std::pair<std::string, std::string>, std::uint64_t> ejections_, upstream_errors_;
};

}  // namespace lmserve::gateway
