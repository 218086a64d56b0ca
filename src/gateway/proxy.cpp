#include "gateway/proxy.h"

#include <spdlog/spdlog.h>

#include <boost/asio.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>
#include <random>
#include <strings.h>

#include "gateway/access_log.h"
#include "gateway/deadlines.h"
#include "gateway/errors.h"
#include "server/http/asio.h"

namespace lmserve::gateway {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = beast::http;
using tcp = net::ip::tcp;
using server::http::Exchange;
using server::http::Response;

namespace {

constexpr std::size_t kReadChunk = 16 * 1024;
constexpr std::size_t kMaxQueued = 1 << 20;       // client backlog before reading from the replica pauses
constexpr std::size_t kMaxWholeBody = 64 << 20;  // a non-streamed answer

bool iequals(std::string_view a, std::string_view b) { return a.size() == b.size() && ::strncasecmp(a.data(), b.data(), a.size()) == 0; }

// Hop-by-hop and framing headers: the gateway sets its own on each side.
bool hop_by_hop(std::string_view name) {
  for (const char* h : {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection",
                        "proxy-authorization", "proxy-authenticate", "host", "content-length", "content-type", "server", "date"}) {
    if (iequals(name, h)) return true;
  }
  return false;
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

thread_local std::mt19937_64 tl_rng{std::random_device{}()};

class ProxyCall : public Watched, public std::enable_shared_from_this<ProxyCall> {
 public:
  ProxyCall(State& state, std::shared_ptr<Snapshot> snap, const ModelConfig& model, Exchange ex, RouteInfo info)
      : state_(state), snap_(std::move(snap)), model_(model), cfg_(snap_->config), ex_(std::move(ex)), info_(std::move(info)),
        strand_(server::http::executor_of(ex_)), id_(state.next_id++) {}

  net::any_io_executor executor() const override { return strand_; }
  void on_deadline() override { on_timer(); }

  void start() {
    ++state_.in_flight;
    ex_.watch_disconnect([self = shared_from_this()] { self->on_client_gone(); });
    total_deadline_ = arrived_ + cfg_.timeouts.total;
    state_.deadlines.add(shared_from_this());
    update_deadline();
    attempt();
  }

 private:
  // ---- choosing a replica -----------------------------------------------------------------------
  void attempt() {
    std::vector<std::shared_ptr<Replica>> replicas;
    auto cs = candidates(state_, cfg_, model_, info_.lane, tried_, replicas);
    Router::Input in{info_.header_version, info_.sticky_key, info_.session_key, info_.prompt,
                     std::uniform_real_distribution<double>(0, 1)(tl_rng)};
    auto pick = snap_->routers.at(model_.name)->pick(cs, in);
    if (!pick) return give_up();
    replica_ = replicas[*pick];
    version_ = cs[*pick].version;
    tried_.push_back(replica_.get());
    ++replica_->outstanding;
    counted_ = true;
    ++gen_;
    // Nothing of a failed attempt carries over (nothing of it reached the client).
    head_.clear();
    whole_.clear();
    pending_.clear();
    tail_.clear();
    content_type_.clear();
    streamed_ = keep_alive_ = false;
    status_ = 0;
    if (auto s = replica_->take_idle()) {
      sock_.emplace(std::move(*s));
      reused_ = true;
      return send_request();
    }
    connect();
  }

  void connect() {
    reused_ = false;
    sock_.emplace(state_.ioc);
    arm(cfg_.timeouts.connect, "connect_timeout");
    sock_->async_connect(replica_->endpoint(), net::bind_executor(strand_, [self = shared_from_this(), g = gen_](beast::error_code ec) {
      if (g != self->gen_ || self->done_) return;
      if (ec) return self->attempt_failed(self->timeout_kind_ ? self->timeout_kind_ : "connect", true);
      beast::error_code ignored;
      self->sock_->set_option(tcp::no_delay(true), ignored);
      self->send_request();
    }));
  }

  void send_request() {
    const auto& req = ex_.request();
    std::size_t size = 256 + req.target.size();
    for (const auto& [k, v] : req.headers) size += k.size() + v.size() + 4;
    out_.clear();
    out_.reserve(size);
    out_.append(req.method).append(" ").append(req.target).append(" HTTP/1.1\r\nHost: ").append(replica_->host_port()).append("\r\n");
    for (const auto& [k, v] : req.headers) {
      if (hop_by_hop(k) || iequals(k, "x-forwarded-for")) continue;
      out_.append(k).append(": ").append(v).append("\r\n");
    }
    const auto ct = req.header("content-type");
    if (!ct.empty()) out_.append("Content-Type: ").append(ct).append("\r\n");
    const auto xff = req.header("x-forwarded-for");
    out_.append("X-Forwarded-For: ");
    if (!xff.empty()) out_.append(xff).append(", ");
    out_.append(req.remote_address).append("\r\nContent-Length: ").append(std::to_string(req.body.size())).append("\r\n\r\n");
    arm(cfg_.timeouts.first_token, "first_token_timeout");
    std::array<net::const_buffer, 2> bufs{net::buffer(out_), net::buffer(req.body)};
    net::async_write(*sock_, bufs, net::bind_executor(strand_, [self = shared_from_this(), g = gen_](beast::error_code ec, std::size_t) {
      if (g != self->gen_ || self->done_) return;
      if (ec) return self->stale_or_failed();
      self->read_head();
    }));
  }

  void read_head() {
    rbuf_.clear();
    parser_.emplace();
    parser_->body_limit(boost::none);
    bhttp::async_read_header(*sock_, rbuf_, *parser_, net::bind_executor(strand_, [self = shared_from_this(), g = gen_](beast::error_code ec, std::size_t) {
      if (g != self->gen_ || self->done_) return;
      if (ec) return self->stale_or_failed();
      self->on_head();
    }));
  }

  // A reused keep-alive connection may have been closed by the replica just as we sent: once,
  // that is worth a fresh connection to the same replica rather than a failure.
  void stale_or_failed() {
    if (reused_ && !timeout_kind_) {
      ++gen_;
      close_upstream();
      return connect();
    }
    attempt_failed(timeout_kind_ ? timeout_kind_ : "reset", true);
  }

  void on_head() {
    reused_ = false;
    auto& res = parser_->get();
    status_ = static_cast<int>(res.result_int());
    if (status_ == 429) {
      const auto ra = std::string(res[bhttp::field::retry_after]);
      int secs = 1;
      try {
        secs = std::max(1, std::stoi(ra));
      } catch (...) {
      }
      retry_after_ = retry_after_ ? std::min(*retry_after_, secs) : secs;
      replica_->on_retry_after(Clock::now() + std::chrono::seconds(secs));
      return attempt_failed("status_429", false);
    }
    if (status_ >= 500) return attempt_failed("status_" + std::to_string(status_), true);
    replica_->on_success();
    streamed_ = res[bhttp::field::content_type].starts_with("text/event-stream");
    for (const auto& f : res) {
      if (!hop_by_hop(f.name_string())) head_.emplace_back(std::string(f.name_string()), std::string(f.value()));
    }
    content_type_ = std::string(res[bhttp::field::content_type]);
    keep_alive_ = res.keep_alive();
    if (!streamed_) arm(cfg_.timeouts.idle, "idle_timeout");
    if (parser_->is_done()) return on_complete();
    read_body();
  }

  void read_body() {
    if (done_) return;
    if (!piece_) piece_ = std::make_unique_for_overwrite<char[]>(kReadChunk);
    parser_->get().body().data = piece_.get();
    parser_->get().body().size = kReadChunk;
    bhttp::async_read_some(*sock_, rbuf_, *parser_, net::bind_executor(strand_, [self = shared_from_this(), g = gen_](beast::error_code ec, std::size_t) {
      if (g != self->gen_ || self->done_) return;
      if (ec == bhttp::error::need_buffer) ec = {};
      const std::size_t n = kReadChunk - self->parser_->get().body().size;
      if (n > 0) self->on_bytes(n);
      // What that read brought beyond the first chunk is parsed now, without I/O, so that a
      // read's worth of events goes to the client in one write (a write per upstream chunk was
      // most of a stream's system calls).
      while (!ec && g == self->gen_ && !self->done_ && !self->parser_->is_done() && self->rbuf_.size() > 0) {
        auto& body = self->parser_->get().body();
        body.data = self->piece_.get();
        body.size = kReadChunk;
        beast::error_code pec;
        const std::size_t used = self->parser_->put(self->rbuf_.data(), pec);
        self->rbuf_.consume(used);
        const bool more = pec == bhttp::error::need_more;  // the rest needs bytes from the socket
        if (pec == bhttp::error::need_buffer || more) pec = {};
        const std::size_t got = kReadChunk - body.size;
        if (got > 0) self->on_bytes(got);
        ec = pec;
        if (more || (used == 0 && got == 0)) break;
      }
      if (g != self->gen_ || self->done_) return;  // on_bytes gave up on this attempt
      self->send_pending();
      if (ec) {
        const char* kind = self->timeout_kind_ ? self->timeout_kind_ : "reset";
        if (self->sent_) return self->stream_failed(kind);
        return self->attempt_failed(kind, true);
      }
      if (self->parser_->is_done()) return self->on_complete();
      if (self->sent_ && self->ex_.queued_bytes() > kMaxQueued) {
        // Waiting on the client, not on the replica: no idle deadline meanwhile.
        self->phase_kind_ = nullptr;
        return self->ex_.when_drained([self, g] {
          if (g != self->gen_ || self->done_) return;
          self->arm(self->cfg_.timeouts.idle, "idle_timeout");
          self->read_body();
        });
      }
      self->read_body();
    }));
  }

  // Body bytes in piece_: a whole answer collects them; a stream gathers them for send_pending().
  void on_bytes(std::size_t n) {
    if (!streamed_) {
      if (whole_.size() + n > kMaxWholeBody) return attempt_failed("too_large", false);
      whole_.append(piece_.get(), n);
      return;
    }
    pending_.append(piece_.get(), n);
  }

  // A stream's gathered bytes to the client (its head first, the first time).
  void send_pending() {
    if (!streamed_ || pending_.empty()) return;
    if (!sent_) {
      sent_ = true;
      ttft_ = seconds_since(arrived_);
      head_.emplace_back("X-Accel-Buffering", "no");
      add_identity(head_);
      ex_.start_stream({.status = status_, .content_type = content_type_, .headers = std::move(head_)});
    }
    phase_kind_ = "idle_timeout";
    phase_deadline_ = Clock::now() + cfg_.timeouts.idle;
    update_deadline();  // an atomic store
    tail_.append(pending_.size() > 2 ? pending_.substr(pending_.size() - 2) : pending_);
    if (tail_.size() > 2) tail_.erase(0, tail_.size() - 2);
    ex_.send(std::move(pending_));
    pending_.clear();
  }

  void on_complete() {
    phase_kind_ = nullptr;
    if (streamed_) {
      if (!sent_) {  // an empty streamed body
        add_identity(head_);
        ex_.start_stream({.status = status_, .content_type = content_type_, .headers = std::move(head_)});
        sent_ = true;
      }
      ex_.end_stream();
    } else {
      add_identity(head_);
      ttft_ = seconds_since(arrived_);
      ex_.reply({.status = status_, .content_type = content_type_, .body = std::move(whole_), .headers = std::move(head_)});
    }
    if (keep_alive_ && rbuf_.size() == 0 && sock_) {
      replica_->put_idle(std::move(*sock_));
      sock_.reset();
    }
    finish(status_);
  }

  void add_identity(server::http::Headers& h) const {
    h.emplace_back("x-lmserve-backend", replica_->url());
    h.emplace_back("x-lmserve-version", version_);
  }

  // ---- failures -----------------------------------------------------------------------------
  // The attempt failed before anything reached the client: mark the replica, try another.
  void attempt_failed(const std::string& kind, bool eject) {
    const auto url = replica_->url();
    state_.metrics.upstream_error(url, kind);
    if (eject && replica_->on_failure(Clock::now(), cfg_.eject)) {
      state_.metrics.ejection(url, "passive");
      spdlog::warn("gateway: replica {} ejected after {} (request {})", url, kind, id_);
    }
    last_failure_ = kind;
    release_attempt();
    if (static_cast<int>(tried_.size()) >= cfg_.max_attempts) return give_up();
    state_.metrics.retry(model_.name, url, kind);
    ++retries_;
    attempt();
  }

  // No (further) replica: 503 when none could take it, else the last failure as 502/504.
  void give_up() {
    phase_kind_ = nullptr;
    const bool timeout = last_failure_.find("timeout") != std::string::npos;
    Response r;
    if (last_failure_.empty() || last_failure_ == "status_429") {
      r = error_response(503, "no replica of the model can take the request now; retry later", "service_unavailable");
      r.headers.emplace_back("Retry-After", std::to_string(retry_after_.value_or(1)));
    } else if (timeout) {
      r = error_response(504, "the model's replicas did not answer in time", "upstream_timeout");
    } else {
      r = error_response(502, "the model's replicas failed to answer", "upstream_failed");
    }
    if (!info_.header_version.empty() && last_failure_.empty()) {
      r.body = error_json("no replica of the requested version is available", "service_unavailable");
    }
    const int status = r.status;
    ex_.reply(std::move(r));
    finish(status);
  }

  // After the first byte: the stream ends with an error event the client can read.
  void stream_failed(const std::string& kind) {
    state_.metrics.upstream_error(replica_->url(), kind);
    if (replica_->on_failure(Clock::now(), cfg_.eject)) state_.metrics.ejection(replica_->url(), "passive");
    std::string out = tail_.ends_with("\n\n") ? "" : "\n\n";
    out += "data: " + error_json(kind.find("timeout") != std::string::npos ? "the replica stopped answering in time" : "the replica failed mid-answer",
                                 "upstream_failed") +
           "\n\ndata: [DONE]\n\n";
    ex_.send(std::move(out));
    ex_.end_stream();
    failed_mid_stream_ = kind;
    finish(status_);
  }

  void on_total_timeout() {
    if (done_) return;
    timeout_kind_ = "total_timeout";
    if (sent_) {
      close_upstream();
      return stream_failed("total_timeout");
    }
    last_failure_ = "total_timeout";
    if (replica_ && counted_) state_.metrics.upstream_error(replica_->url(), "total_timeout");
    give_up();
  }

  void on_client_gone() {
    if (done_) return;
    // The exchange still needs its end (the transport then drops it); nothing reaches the client.
    if (sent_) ex_.end_stream();
    else ex_.reply(error_response(499, "the client closed the request", "client_closed"));
    finish(499);  // nginx's "client closed request"
  }

  // Deadlines (deadlines.h): the soonest of the phase's and the total one is what the scanner
  // watches. On a phase's expiry the upstream socket closes, so the pending operation fails and
  // its handler reads timeout_kind_.
  void arm(std::chrono::milliseconds after, const char* kind) {
    timeout_kind_ = nullptr;
    phase_kind_ = kind;
    phase_deadline_ = Clock::now() + after;
    update_deadline();
  }

  void update_deadline() { set_deadline(phase_kind_ ? std::min(phase_deadline_, total_deadline_) : total_deadline_); }

  void on_timer() {
    if (done_) return;
    const auto now = Clock::now();
    if (now >= total_deadline_) return on_total_timeout();
    if (phase_kind_ && now >= phase_deadline_) {
      timeout_kind_ = phase_kind_;
      phase_kind_ = nullptr;
      beast::error_code ignored;
      if (sock_) sock_->close(ignored);
    }
    update_deadline();  // it had moved later, or the next one
  }

  void close_upstream() {
    if (!sock_) return;
    beast::error_code ignored;
    sock_->shutdown(tcp::socket::shutdown_both, ignored);
    sock_->close(ignored);
    sock_.reset();
  }

  void release_attempt() {
    ++gen_;
    phase_kind_ = nullptr;
    close_upstream();
    if (counted_) --replica_->outstanding;
    counted_ = false;
  }

  void finish(int status) {
    if (done_) return;
    done_ = true;
    clear_deadline();
    state_.deadlines.remove(*this);
    close_upstream();
    if (counted_) --replica_->outstanding;
    counted_ = false;
    --state_.in_flight;
    const double total = seconds_since(arrived_);
    const std::string backend = replica_ && status != 503 ? replica_->url() : "";
    state_.metrics.request(model_.name, backend, backend.empty() ? "" : version_, status, ttft_, total);
    if (cfg_.access_log) {
      const auto& req = ex_.request();
      write_access_log({.id = id_, .model = model_.name, .backend = backend, .version = version_, .path = req.path, .client = req.remote_address,
                        .error = !failed_mid_stream_.empty() ? failed_mid_stream_ : status >= 500 ? last_failure_ : "",
                        .status = status, .stream = streamed_, .retries = retries_, .ttft_s = ttft_, .total_s = total});
    }
  }

  State& state_;
  std::shared_ptr<Snapshot> snap_;
  const ModelConfig& model_;
  const GatewayConfig& cfg_;
  Exchange ex_;
  RouteInfo info_;
  net::any_io_executor strand_;
  Clock::time_point phase_deadline_{}, total_deadline_{};
  const char* phase_kind_ = nullptr;  // the phase whose deadline counts (nullptr: none)
  const std::uint64_t id_;
  const Clock::time_point arrived_ = Clock::now();

  std::vector<const Replica*> tried_;
  std::shared_ptr<Replica> replica_;
  std::string version_;
  std::optional<tcp::socket> sock_;
  std::string out_;
  beast::flat_buffer rbuf_;
  std::optional<bhttp::response_parser<bhttp::buffer_body>> parser_;
  std::unique_ptr<char[]> piece_;  // what one read of the body lands in (not zeroed: written before read)
  std::string whole_, pending_, tail_, content_type_;
  server::http::Headers head_;
  std::uint64_t gen_ = 0;  // the current attempt; handlers of earlier ones do nothing
  const char* timeout_kind_ = nullptr;
  bool counted_ = false, reused_ = false, streamed_ = false, sent_ = false, keep_alive_ = false, done_ = false;
  int status_ = 0, retries_ = 0;
  double ttft_ = -1;
  std::optional<int> retry_after_;
  std::string last_failure_, failed_mid_stream_;
};

}  // namespace

void start_proxy(State& state, std::shared_ptr<Snapshot> snapshot, const ModelConfig& model, Exchange exchange, RouteInfo info) {
  auto call = std::make_shared<ProxyCall>(state, std::move(snapshot), model, exchange, std::move(info));
  exchange.set_context(call);
  call->start();
}

}  // namespace lmserve::gateway
