// gateway/monitor: the background work on the replicas: active health checks (GET /health every
// health.interval; fail_after failures in a row take a replica out, pass_after passes bring it
// back), load scrapes of kv_aware models' replicas (GET /metrics every scrape_interval: KV usage
// and waiting requests, per lane too), and DNS names resolved again every dns_refresh. Runs on
// its own strand of the transport's io_context; each probe has its own connection and deadline.
#pragma once

#include <memory>

#include "gateway/state.h"

namespace lmserve::gateway {

class Monitor {
 public:
  explicit Monitor(State& state);
  ~Monitor();
  void start();
  void stop();  // thread-safe; probes under way end on their own

  // Resolves the snapshot's backends now, blocking (at start and on reload, so that a new
  // backend has replicas before the first request). Names that do not resolve keep their
  // previous addresses and are tried again by the monitor.
  static void resolve_now(State& state, const GatewayConfig& config);

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

// The load figures of a replica's Prometheus text (vllm:kv_cache_usage_perc, the largest of its
// series; vllm:num_requests_waiting, summed; lmserve:num_requests_waiting_lane by lane).
ReplicaLoad parse_load(const std::string& metrics_text);

}  // namespace lmserve::gateway
