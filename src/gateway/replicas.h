// gateway/replicas: what the gateway knows of each replica (one address:port), shared by every
// request and by the monitor. A configured backend is a URL; its host may be a DNS name that
// resolves to several addresses (a Kubernetes headless Service), each a replica of its own.
// Replicas outlive configuration reloads: a URL still configured keeps its health, its
// outstanding count and its idle connections. All methods are thread-safe.
#pragma once

#include <array>
#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/sharded_counter.h"
#include "gateway/config.h"

namespace lmserve::gateway {

using Clock = std::chrono::steady_clock;
// A connection to a replica, on one I/O thread's io_context (that of the client connection it
// serves: its handlers run on that thread).
using UpstreamSocket = boost::asio::basic_stream_socket<boost::asio::ip::tcp, boost::asio::io_context::executor_type>;

struct ReplicaLoad {
  bool scraped = false;
  Clock::time_point at{};
  double kv_usage = 0, waiting = 0;
  std::map<std::string, double> waiting_by_lane;
};

class Replica : public std::enable_shared_from_this<Replica> {
 public:
  Replica(boost::asio::ip::address address, std::uint16_t port);
  const std::string& url() const { return url_; }  // http://ADDRESS:PORT
  const std::string& host_port() const { return host_port_; }  // ADDRESS:PORT, for the Host header
  const boost::asio::ip::tcp::endpoint& endpoint() const { return endpoint_; }

  // Healthy by the active checks, not ejected and not backing off after a 429.
  bool available(Clock::time_point now) const;
  bool healthy() const;
  // Healthy and not backing off after a 429, ejected or not: what takes requests when every
  // replica of a model is ejected (a short failure everywhere then costs no 503s).
  bool usable_in_panic(Clock::time_point now) const;

  // Passive health. A failure ejects the replica for the current backoff (which then doubles up
  // to eject.max); returns true when this failure started an ejection. A success resets it.
  bool on_failure(Clock::time_point now, const EjectConfig& eject);
  void on_success();
  void on_retry_after(Clock::time_point until);
  // Active health: a check's result. Returns -1 when this made the replica unhealthy, +1 when it
  // made it healthy again, 0 otherwise. A replica starts healthy (the first check runs at once).
  int on_check(bool passed, const HealthConfig& health);

  // Requests sent to it and not yet ended: changed by every request, summed when read.
  ShardedCounter outstanding;

  void set_load(ReplicaLoad load);
  // The replica's last /metrics text (the monitor scrapes every replica for the dashboard).
  void set_metrics_text(std::string text);
  std::string metrics_text() const;
  // The figures the router needs (waiting: of `lane` when the replica reports it), without copying
  // the per-lane table.
  struct LoadFigures {
    bool scraped = false;
    Clock::time_point at{};
    double kv_usage = 0, waiting = 0;
  };
  LoadFigures load_for(const std::string& lane) const;

  // Idle keep-alive connections to this replica, each on the io_context it was opened on:
  // take_idle gives one of `io`'s only. Kept per calling thread (one pool per I/O thread, at most
  // kMaxIdle each, as nginx's keepalive is per worker), so the threads share no lock for them.
  std::optional<UpstreamSocket> take_idle(boost::asio::io_context& io);
  void put_idle(UpstreamSocket socket);
  void close_idle();
  static constexpr std::size_t kMaxIdle = 256;

 private:
  const boost::asio::ip::tcp::endpoint endpoint_;
  const std::string url_, host_port_;
  // A time that every request reads and few write: an atomic, so reading takes no lock.
  struct AtomicTime {
    std::atomic<Clock::rep> ticks{Clock::time_point{}.time_since_epoch().count()};
    Clock::time_point get() const { return Clock::time_point(Clock::duration(ticks.load(std::memory_order_relaxed))); }
    void set(Clock::time_point t) { ticks.store(t.time_since_epoch().count(), std::memory_order_relaxed); }
  };
  mutable std::mutex mu_;  // for the writers; the state requests read is atomic
  std::atomic<bool> healthy_{true}, backing_off_{false};
  int passes_ = 0, fails_ = 0;
  AtomicTime ejected_until_, retry_after_until_;
  std::chrono::milliseconds backoff_{0};
  ReplicaLoad load_;
  std::string metrics_text_;
  struct alignas(64) IdlePool {
    std::mutex mu;  // its thread's, and close_idle()'s
    std::vector<UpstreamSocket> sockets;
  };
  static constexpr std::size_t kPools = 16;  // threads beyond share (the io_context is checked)
  IdlePool& my_pool();
  std::array<IdlePool, kPools> idle_;
};

// Every replica of every configured backend, by backend (host:port) and by address.
class ReplicaRegistry {
 public:
  ReplicaRegistry() = default;
  // Closes every replica's idle connections: threads' views may keep a replica past the registry,
  // and its pooled sockets must not outlive the io_contexts they belong to.
  ~ReplicaRegistry();
  ReplicaRegistry(const ReplicaRegistry&) = delete;
  ReplicaRegistry& operator=(const ReplicaRegistry&) = delete;
  // The replicas a backend currently resolves to (empty until its name resolved).
  std::vector<std::shared_ptr<Replica>> of(const BackendConfig& backend) const;
  // The same from this thread's copy of the registry, refreshed when the registry changed: no lock
  // and no count shared with other threads, for the per-request path (the pointers' reference
  // counts are this thread's own; keep copies on this thread). The reference is valid until this
  // thread's next call.
  const std::vector<std::shared_ptr<Replica>>& view_of(const BackendConfig& backend) const;
  // Sets a backend's addresses (as resolved); replicas already known keep their state.
  void set_addresses(const std::string& host, std::uint16_t port, const std::vector<boost::asio::ip::address>& addresses);
  // Drops backends no longer configured (their replicas' idle connections close).
  void retain(const std::vector<std::pair<std::string, std::uint16_t>>& backends);
  std::vector<std::shared_ptr<Replica>> all() const;

 private:
  static std::string key(const std::string& host, std::uint16_t port) { return host + "|" + std::to_string(port); }
  static std::uint64_t next_instance();
  const std::uint64_t instance_ = next_instance();  // tells this registry's thread views from another's
  std::atomic<std::uint64_t> generation_{1};  // changes with by_backend_
  mutable std::mutex mu_;
  std::map<std::string, std::vector<std::shared_ptr<Replica>>> by_backend_;
};

}  // namespace lmserve::gateway
