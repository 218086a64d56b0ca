#include "gateway/monitor.h"

#include <spdlog/spdlog.h>

#include <boost/asio.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <charconv>
#include <set>

namespace lmserve::gateway {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = beast::http;
using tcp = net::ip::tcp;

ReplicaLoad parse_load(const std::string& text) {
  ReplicaLoad load;
  load.scraped = true;
  load.at = Clock::now();
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + pos, end - pos);
    pos = end + 1;
    if (line.empty() || line[0] == '#') continue;
    const auto sp = line.rfind(' ');
    if (sp == std::string_view::npos) continue;
    double v = 0;
    auto [p, ec] = std::from_chars(line.data() + sp + 1, line.data() + line.size(), v);
    if (ec != std::errc()) continue;
    auto name_end = line.find_first_of("{ ");
    const auto name = line.substr(0, name_end);
    if (name == "vllm:kv_cache_usage_perc") {
      load.kv_usage = std::max(load.kv_usage, v);
    } else if (name == "vllm:num_requests_waiting") {
      load.waiting += v;
    } else if (name == "lmserve:num_requests_waiting_lane") {
      const auto l = line.find("lane=\"");
      if (l == std::string_view::npos) continue;
      const auto q = line.find('"', l + 6);
      if (q == std::string_view::npos) continue;
      load.waiting_by_lane[std::string(line.substr(l + 6, q - l - 6))] += v;
    }
  }
  return load;
}

namespace {

// One GET with a deadline on a connection of its own (kept for the next probe of the replica).
class Probe : public std::enable_shared_from_this<Probe> {
 public:
  using Done = std::function<void(int status, std::string body)>;
  Probe(net::any_io_executor strand, std::shared_ptr<Replica> r, std::optional<tcp::socket>& conn, std::string target,
        std::chrono::milliseconds timeout, Done done)
      : strand_(std::move(strand)), replica_(std::move(r)), conn_(conn), target_(std::move(target)), timer_(strand_), done_(std::move(done)) {
    timer_.expires_after(timeout);
  }

  void start() {
    timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (ec) return;
      self->timed_out_ = true;
      beast::error_code ignored;
      if (self->conn_) self->conn_->close(ignored);
    });
    if (conn_ && conn_->is_open()) return write();
    conn_.emplace(strand_);
    conn_->async_connect(replica_->endpoint(), [self = shared_from_this()](beast::error_code ec) {
      if (ec) return self->end(-1, {});
      self->write();
    });
  }

 private:
  void write() {
    req_ = "GET " + target_ + " HTTP/1.1\r\nHost: " + replica_->endpoint().address().to_string() + "\r\nUser-Agent: lmserve-gateway\r\n\r\n";
    net::async_write(*conn_, net::buffer(req_), [self = shared_from_this()](beast::error_code ec, std::size_t) {
      if (ec) return self->end(-1, {});
      self->res_.emplace();
      self->res_->body_limit(8 << 20);
      bhttp::async_read(*self->conn_, self->buf_, *self->res_, [self](beast::error_code ec2, std::size_t) {
        if (ec2) return self->end(-1, {});
        const bool keep = self->res_->get().keep_alive();
        const int status = static_cast<int>(self->res_->get().result_int());
        std::string body = std::move(self->res_->get().body());
        if (!keep) {
          beast::error_code ignored;
          self->conn_->close(ignored);
        }
        self->end(status, std::move(body));
      });
    });
  }

  void end(int status, std::string body) {
    timer_.cancel();
    if (status < 0 && conn_) {
      beast::error_code ignored;
      conn_->close(ignored);
    }
    if (auto d = std::move(done_)) d(timed_out_ ? -1 : status, std::move(body));
  }

  net::any_io_executor strand_;
  std::shared_ptr<Replica> replica_;
  std::optional<tcp::socket>& conn_;  // owned by the monitor's per-replica record
  std::string target_, req_;
  net::steady_timer timer_;
  Done done_;
  bool timed_out_ = false;
  beast::flat_buffer buf_;
  std::optional<bhttp::response_parser<bhttp::string_body>> res_;
};

bool is_ip(const std::string& host) {
  beast::error_code ec;
  net::ip::make_address(host, ec);
  return !ec;
}

}  // namespace

struct Monitor::Impl : std::enable_shared_from_this<Monitor::Impl> {
  explicit Impl(State& s) : state(s), strand(net::make_strand(s.ioc)), tick(strand), resolver(strand) {}

  // Per replica: when its next probes are due, whether one is under way, and its connections.
  struct Record {
    std::weak_ptr<Replica> replica;
    Clock::time_point next_health{}, next_scrape{};
    bool health_busy = false, scrape_busy = false;
    std::optional<tcp::socket> health_conn, scrape_conn;
  };

  State& state;
  net::any_io_executor strand;
  net::steady_timer tick;
  tcp::resolver resolver;
  std::map<std::string, std::unique_ptr<Record>> records;  // by replica url
  Clock::time_point next_dns{};
  bool resolving = false;
  std::atomic<bool> stopped{false};

  void schedule() {
    if (stopped) return;
    tick.expires_after(std::chrono::milliseconds(10));
    tick.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (ec || self->stopped) return;
      self->run_once();
      self->schedule();
    });
  }

  static constexpr std::chrono::milliseconds kDashboardScrape{1000};

  void run_once() {
    auto snap = state.current();
    const auto& cfg = snap->config;
    const auto now = Clock::now();
    // Replicas of kv_aware models are scraped.
    std::set<std::string> scraped;
    for (const auto& m : cfg.models) {
      if (m.policy != Policy::kKvAware) continue;
      for (const auto& b : m.backends) {
        for (const auto& r : state.replicas.of(b)) scraped.insert(r->url());
      }
    }
    std::set<std::string> live;
    for (const auto& r : state.replicas.all()) {
      live.insert(r->url());
      auto& rec = records[r->url()];
      if (!rec) {
        rec = std::make_unique<Record>();
        rec->replica = r;
      }
      if (!rec->health_busy && now >= rec->next_health) {
        rec->health_busy = true;
        rec->next_health = now + cfg.health.interval;
        const auto timeout = cfg.health.timeout.count() > 0 ? cfg.health.timeout : cfg.health.interval;
        auto* record = rec.get();
        std::make_shared<Probe>(strand, r, rec->health_conn, "/health", timeout,
                                [self = shared_from_this(), r, record, health = cfg.health](int status, std::string) {
                                  record->health_busy = false;
                                  const int change = r->on_check(status == 200, health);
                                  if (change < 0) {
                                    self->state.metrics.ejection(r->url(), "health");
                                    spdlog::warn("gateway: replica {} is unhealthy ({} failed health checks)", r->url(), health.fail_after);
                                  } else if (change > 0) {
                                    spdlog::info("gateway: replica {} is healthy again", r->url());
                                  }
                                })
            ->start();
      }
      // Every replica's /metrics once a second for the dashboard; kv_aware models' replicas at
      // scrape_interval for the router.
      if (!rec->scrape_busy && now >= rec->next_scrape) {
        const bool for_router = scraped.contains(r->url());
        rec->scrape_busy = true;
        rec->next_scrape = now + (for_router ? cfg.scrape_interval : std::max(cfg.scrape_interval, kDashboardScrape));
        auto* record = rec.get();
        std::make_shared<Probe>(strand, r, rec->scrape_conn, "/metrics", std::max(cfg.scrape_interval * 5, std::chrono::milliseconds(500)),
                                [self = shared_from_this(), r, record, for_router](int status, std::string body) {
                                  record->scrape_busy = false;
                                  if (status != 200) return;
                                  if (for_router) r->set_load(parse_load(body));
                                  r->set_metrics_text(std::move(body));
                                })
            ->start();
      }
    }
    // Replicas gone from the configuration or from DNS: their records go once no probe is out.
    for (auto it = records.begin(); it != records.end();) {
      if (!live.contains(it->first) && !it->second->health_busy && !it->second->scrape_busy) {
        it = records.erase(it);
      } else {
        ++it;
      }
    }
    if (!resolving && now >= next_dns) {
      next_dns = now + cfg.dns_refresh;
      resolve_names(snap);
    }
  }

  // Names resolved one after another (one resolver); IP addresses need no lookup.
  void resolve_names(std::shared_ptr<Snapshot> snap) {
    auto names = std::make_shared<std::vector<std::pair<std::string, std::uint16_t>>>();
    std::set<std::pair<std::string, std::uint16_t>> seen;
    for (const auto& m : snap->config.models) {
      for (const auto& b : m.backends) {
        if (!is_ip(b.host) && seen.insert({b.host, b.port}).second) names->emplace_back(b.host, b.port);
      }
    }
    resolving = true;
    resolve_next(names, 0);
  }

  void resolve_next(std::shared_ptr<std::vector<std::pair<std::string, std::uint16_t>>> names, std::size_t i) {
    if (i >= names->size() || stopped) {
      resolving = false;
      return;
    }
    // Plain variables, not a structured binding: clang 14 (the fuzz build) cannot capture one.
    const std::string host = (*names)[i].first;
    const std::uint16_t port = (*names)[i].second;
    resolver.async_resolve(host, std::to_string(port), [self = shared_from_this(), names, i, host, port](beast::error_code ec, tcp::resolver::results_type rs) {
      if (!ec) {
        std::vector<net::ip::address> addrs;
        for (const auto& e : rs) addrs.push_back(e.endpoint().address());
        self->state.replicas.set_addresses(host, port, addrs);
      } else {
        spdlog::warn("gateway: cannot resolve {}: {} (keeping its previous addresses)", host, ec.message());
      }
      self->resolve_next(names, i + 1);
    });
  }
};

Monitor::Monitor(State& state) : impl_(std::make_shared<Impl>(state)) {}
Monitor::~Monitor() { stop(); }

void Monitor::start() {
  net::post(impl_->strand, [impl = impl_] { impl->schedule(); });
}

void Monitor::stop() {
  impl_->stopped = true;
  net::post(impl_->strand, [impl = impl_] {
    impl->tick.cancel();
    impl->resolver.cancel();
    for (auto& [url, rec] : impl->records) {
      beast::error_code ignored;
      if (rec->health_conn) rec->health_conn->close(ignored);
      if (rec->scrape_conn) rec->scrape_conn->close(ignored);
    }
  });
}

void Monitor::resolve_now(State& state, const GatewayConfig& config) {
  std::vector<std::pair<std::string, std::uint16_t>> backends;
  net::io_context io;
  tcp::resolver resolver(io);
  for (const auto& m : config.models) {
    for (const auto& b : m.backends) {
      backends.emplace_back(b.host, b.port);
      beast::error_code ec;
      if (auto a = net::ip::make_address(b.host, ec); !ec) {
        state.replicas.set_addresses(b.host, b.port, {a});
        continue;
      }
      auto rs = resolver.resolve(b.host, std::to_string(b.port), ec);
      if (ec) {
        spdlog::warn("gateway: cannot resolve {}: {}", b.host, ec.message());
        continue;
      }
      std::vector<net::ip::address> addrs;
      for (const auto& e : rs) addrs.push_back(e.endpoint().address());
      state.replicas.set_addresses(b.host, b.port, addrs);
    }
  }
  state.replicas.retain(backends);
}

}  // namespace lmserve::gateway
