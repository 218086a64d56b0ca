// gateway/state: what the gateway's parts share: the configuration in force (an immutable
// snapshot, swapped whole on reload, so a request keeps the one it started with), the replicas,
// the metrics. Internal to src/gateway/.
#pragma once

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <map>
#include <memory>
#include <string>

#include "gateway/config.h"
#include "gateway/deadlines.h"
#include "gateway/metrics.h"
#include "gateway/replicas.h"
#include "gateway/router.h"

namespace lmserve::gateway {

struct Snapshot {
  explicit Snapshot(GatewayConfig c);
  GatewayConfig config;
  std::map<std::string, std::unique_ptr<Router>> routers;  // by model name; thread-safe
};

struct State {
  explicit State(boost::asio::io_context& io) : ioc(io), deadlines(io, std::chrono::milliseconds(5)) {}
  boost::asio::io_context& ioc;
  Deadlines deadlines;  // the timeouts of calls under way
  std::atomic<std::shared_ptr<Snapshot>> snapshot;
  ReplicaRegistry replicas;
  GatewayMetrics metrics;
  std::atomic<std::int64_t> in_flight{0};
  std::atomic<std::uint64_t> next_id{1};
};

// The replicas of `model` as the router sees them now; `replicas` gets the same order.
// `exclude`: replicas already tried for this request.
std::vector<Candidate> candidates(const State& state, const GatewayConfig& config, const ModelConfig& model, const std::string& lane,
                                  const std::vector<const Replica*>& exclude, std::vector<std::shared_ptr<Replica>>& replicas);

}  // namespace lmserve::gateway
