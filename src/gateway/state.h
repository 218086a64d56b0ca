// gateway/state: what the gateway's parts share: the configuration in force (an immutable
// snapshot, swapped whole on reload, so a request keeps the one it started with), the replicas,
// the metrics. Internal to src/gateway/.
#pragma once

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>

#include "common/sharded_counter.h"
#include "gateway/audit.h"
#include "gateway/config.h"
#include "gateway/deadlines.h"
#include "gateway/guards.h"
#include "gateway/limits.h"
#include "gateway/metrics.h"
#include "gateway/replicas.h"
#include "gateway/router.h"
#include "gateway/tokens.h"

namespace lmserve::gateway {

struct Snapshot {
  explicit Snapshot(GatewayConfig c);
  GatewayConfig config;
  std::map<std::string, std::unique_ptr<Router>> routers;  // by model name; thread-safe
  std::map<std::string, std::shared_ptr<const PromptCounter>> counters;  // by model name: those with a tokenizer
  Guards guards;  // per tenant with rules of its own, and for everyone else
  // Whether a request's body is read as a document in the routing pass (for a tokenizer's count,
  // prefix_aware's prompt or a redacted audit of it); else the scanner reads what the policies
  // need (route_fields.h).
  bool needs_document = false;
  const Guard* guard_for(std::string_view tenant) const { return guards.for_tenant(tenant); }
};

struct State {
  explicit State(boost::asio::io_context& io) : ioc(io), deadlines(std::chrono::milliseconds(5)) {}
  boost::asio::io_context& ioc;
  Deadlines deadlines;  // the timeouts of calls under way
  ReplicaRegistry replicas;
  GatewayMetrics metrics;
  ShardedCounter in_flight;  // calls under way
  // The audit trail (config audit.dir; null without): a request's outcome is recorded before its
  // answer is served, and a stream's admission before it goes to a replica (gateway.cpp).
  std::unique_ptr<AuditLog> audit;
  bool audit_fail_closed = true;
  // The trail's last group of records could not be written: until one is again, every request's
  // admission is recorded before it goes to a replica, so that a failing trail turns requests
  // away before a replica spends anything on them.
  std::atomic<bool> audit_failing{false};
  std::unique_ptr<Limiter> limiter = make_local_limiter();  // the keys' limits

  // The configuration in force. current() is what a request takes: a pointer whose reference
  // count is this thread's own (one shared count, touched by every request on every I/O thread,
  // was a cache line they fought over), refreshed when set() has replaced the configuration.
  void set(std::shared_ptr<Snapshot> snapshot);
  std::shared_ptr<Snapshot> current();
  // A request's number, unique in this process (taken in blocks per thread).
  std::uint64_t next_id();
  // Queues `record` (a JSON object, serialised) on the audit trail and returns at once; `then(ok)`
  // (when given) runs on `io`'s thread once the record is written, ok false when it could not be
  // and the trail is fail-closed. The records an I/O thread queues in one turn of its event loop
  // (the requests of one wait for events) go to the trail as one group (one write, one lock), and
  // their callbacks come back as one handler. `io` is the calling thread's own.
  void audit_then(boost::asio::io_context& io, std::string record, std::function<void(bool ok)> then);

 private:
  const std::uint64_t instance_ = next_instance();  // tells this State's thread caches from another's
  static std::uint64_t next_instance();
  std::atomic<std::shared_ptr<Snapshot>> snapshot_;
  std::atomic<std::uint64_t> generation_{0};
  std::atomic<std::uint64_t> ids_{1};
};

// The replicas of `model` as the router sees them now, into `cs`, and `replicas` in the same order
// (valid until this thread's next call: from ReplicaRegistry::view_of, whose pointers count on this
// thread's own blocks). `exclude`: replicas already tried for this request.
void candidates(const State& state, const GatewayConfig& config, const ModelConfig& model, const std::string& lane,
                std::span<const Replica* const> exclude, std::vector<Candidate>& cs,
                std::vector<const std::shared_ptr<Replica>*>& replicas);

}  // namespace lmserve::gateway
