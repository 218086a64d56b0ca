#include "gateway/proxy.h"

#include <spdlog/spdlog.h>

#include <boost/asio.hpp>
#include <boost/beast/http.hpp>
#include <boost/container/small_vector.hpp>
#include <cstring>
#include <optional>
#include <random>
#include <sys/socket.h>

#include "common/json_line.h"
#include "gateway/access_log.h"
#include "gateway/answer.h"
#include "gateway/deadlines.h"
#include "gateway/digest.h"
#include "gateway/errors.h"
#include "gateway/redact.h"
#include "gateway/upstream_parser.h"
#include "server/http/asio.h"
#include "server/http/drained_read.h"
#include "server/http/plain_head.h"

namespace lmserve::gateway {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = beast::http;
using tcp = net::ip::tcp;
using server::http::Exchange;
using server::http::Response;
using server::http::names;

namespace {

using namespace std::string_view_literals;

constexpr std::size_t kReadChunk = 16 * 1024;

// The blocks upstream reads land in, kept per thread for the next call: an allocation of this
// size per request made glibc consolidate and trim its heap every time (5% of the gateway's CPU
// at one core, perf on the build VM).
class Block {
 public:
  Block() = default;
  Block(Block&&) = default;
  Block& operator=(Block&&) = default;
  ~Block() {
    if (data_ && free_list().size() < kKept) free_list().push_back(std::move(data_));
  }
  char* get() {
    if (!data_) {
      auto& fl = free_list();
      if (fl.empty()) {
        data_ = std::make_unique_for_overwrite<char[]>(kReadChunk);
      } else {
        data_ = std::move(fl.back());
        fl.pop_back();
      }
    }
    return data_.get();
  }

 private:
  static constexpr std::size_t kKept = 256;
  static std::vector<std::unique_ptr<char[]>>& free_list() {
    thread_local std::vector<std::unique_ptr<char[]>> blocks;
    return blocks;
  }
  std::unique_ptr<char[]> data_;  // not zeroed: written before read
};

// What the replica sent and the parser has not taken yet, in one Block: a head must fit in it
// (as nginx's proxy_buffer_size, though larger); body bytes pass through as they come.
class InBuffer {
 public:
  net::const_buffer data() const { return {block_data_ + begin_, end_ - begin_}; }
  std::size_t size() const { return end_ - begin_; }
  // Room for the next read; empty when the unparsed bytes fill the block.
  net::mutable_buffer prepare() {
    block_data_ = block_.get();
    if (begin_ > 0) {
      std::memmove(block_data_, block_data_ + begin_, end_ - begin_);
      end_ -= begin_;
      begin_ = 0;
    }
    return {block_data_ + end_, kReadChunk - end_};
  }
  void commit(std::size_t n) { end_ += n; }
  void consume(std::size_t n) {
    begin_ += std::min(n, size());
    if (begin_ == end_) begin_ = end_ = 0;
  }
  void clear() { begin_ = end_ = 0; }

 private:
  Block block_;
  char* block_data_ = nullptr;
  std::size_t begin_ = 0, end_ = 0;
};
constexpr std::size_t kMaxQueued = 1 << 20;       // client backlog before reading from the replica pauses
constexpr std::size_t kMaxWholeBody = 64 << 20;  // a non-streamed answer

// Calls are allocated from a free list per thread: a call is about a kilobyte, which glibc serves
// from its large bins, consolidating its fast bins first on every request (perf on the build VM:
// malloc_consolidate in the profile of every plain request).
template <class T>
struct RecyclingAllocator {
  using value_type = T;
  RecyclingAllocator() = default;
  template <class U>
  RecyclingAllocator(const RecyclingAllocator<U>&) {}
  T* allocate(std::size_t n) {
    auto& fl = free_list();
    if (n == 1 && !fl.empty()) {
      void* p = fl.back();
      fl.pop_back();
      return static_cast<T*>(p);
    }
    return static_cast<T*>(::operator new(n * sizeof(T)));
  }
  void deallocate(T* p, std::size_t n) {
    auto& fl = free_list();
    if (n == 1 && fl.size() < kKept) return fl.push_back(p);
    ::operator delete(p);
  }
  template <class U>
  bool operator==(const RecyclingAllocator<U>&) const {
    return true;
  }

 private:
  static constexpr std::size_t kKept = 1024;
  struct List {
    std::vector<void*> blocks;
    ~List() {
      for (void* p : blocks) ::operator delete(p);
    }
  };
  static std::vector<void*>& free_list() {
    thread_local List list;
    return list.blocks;
  }
};

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Sends what the socket takes of `bufs` now, without waiting: the bytes sent (0 where it takes
// none or fails; the asynchronous write of the rest then waits or reports the error).
std::size_t send_now(UpstreamSocket& sock, const std::array<net::const_buffer, 2>& bufs) {
  iovec iov[2];
  for (std::size_t i = 0; i < 2; ++i) iov[i] = {const_cast<void*>(bufs[i].data()), bufs[i].size()};
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = 2;
  for (;;) {
    const ssize_t n = ::sendmsg(sock.native_handle(), &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n >= 0) return static_cast<std::size_t>(n);
    if (errno != EINTR) return 0;
  }
}

thread_local std::mt19937_64 tl_rng{std::random_device{}()};

class ProxyCall : public Watched, public std::enable_shared_from_this<ProxyCall> {
 public:
  ProxyCall(State& state, std::shared_ptr<Snapshot> snap, const ModelConfig& model, Exchange ex, RouteInfo info)
      : state_(state), snap_(std::move(snap)), model_(model), cfg_(snap_->config), ex_(std::move(ex)), info_(std::move(info)),
        io_(server::http::io_context_of(ex_)), id_(info_.id ? info_.id : state.next_id()) {
    const bool counts = (info_.grant && info_.grant->counts_tokens()) || !info_.tenant.empty();  // limits, tenant metrics
    if (state_.audit || counts) answer_.emplace(info_.audit_text, state_.audit != nullptr);
  }

  void on_deadline() override { on_timer(); }

  void start() {
    ++state_.in_flight;
    ex_.watch_disconnect([self = shared_from_this()] { self->on_client_gone(); });
    total_deadline_ = arrived_ + cfg_.timeouts.total;
    state_.deadlines.add(shared_from_this(), io_);
    update_deadline();
    attempt();
  }

 private:
  // ---- choosing a replica -----------------------------------------------------------------------
  void attempt() {
    thread_local std::vector<Candidate> cs;  // reused: no allocation per request
    thread_local std::vector<const std::shared_ptr<Replica>*> replicas;
    candidates(state_, cfg_, model_, info_.lane, tried_, cs, replicas);
    Router::Input in{info_.header_version, info_.sticky_key, info_.session_key, info_.prompt,
                     std::uniform_real_distribution<double>(0, 1)(tl_rng)};
    auto pick = snap_->routers.at(model_.name)->pick(cs, in);
    if (!pick) return give_up();
    replica_ = *replicas[*pick];  // counted on this thread's block (ReplicaRegistry::view_of)
    version_ = cs[*pick].version;
    tried_.push_back(replica_.get());
    ++replica_->outstanding;
    counted_ = true;
    ++gen_;
    // Nothing of a failed attempt carries over (nothing of it reached the client).
    head_lines_.clear();
    head_lines_.reserve(256);
    whole_.clear();
    pending_.clear();
    tail_.clear();
    content_type_.clear();
    streamed_ = event_stream_ = keep_alive_ = false;
    status_ = 0;
    if (auto s = replica_->take_idle(io_)) {
      sock_.emplace(std::move(*s));
      reused_ = true;
      return send_request();
    }
    connect();
  }

  void connect() {
    reused_ = false;
    sock_.emplace(io_);
    arm(cfg_.timeouts.connect, "connect_timeout");
    sock_->async_connect(replica_->endpoint(), [self = shared_from_this(), g = gen_](beast::error_code ec) {
      if (g != self->gen_ || self->done_) return;
      if (ec) return self->attempt_failed(self->timeout_kind_ ? self->timeout_kind_ : "connect", true);
      beast::error_code ignored;
      self->sock_->set_option(tcp::no_delay(true), ignored);
      server::http::enable_drained_reads(*self->sock_);
      self->send_request();
    });
  }

  void send_request() {
    const auto& req = ex_.request();
    std::size_t size = 256 + req.target.size();
    for (const auto& [k, v] : req.headers) size += k.size() + v.size() + 4;
    out_.clear();
    out_.reserve(size);
    out_.append(req.method).append(" "sv).append(req.target).append(" HTTP/1.1\r\nHost: "sv).append(replica_->host_port()).append("\r\n"sv);
    std::optional<std::string_view> ct, xff;  // the first of each, as Request::header reads them
    for (const auto& [k, v] : req.headers) {
      if (hop_by_hop(k)) {
        if (!ct && names(k, "content-type")) ct = v;
        continue;
      }
      if (names(k, "x-forwarded-for")) {
        if (!xff) xff = v;
        continue;
      }
      if (names(k, "x-lmserve-lane") || (info_.drop_authorization && names(k, "authorization"))) continue;
      out_.append(k).append(": "sv).append(v).append("\r\n"sv);
    }
    if (!info_.lane.empty()) out_.append("x-lmserve-lane: "sv).append(info_.lane).append("\r\n"sv);
    if (ct && !ct->empty()) out_.append("Content-Type: "sv).append(*ct).append("\r\n"sv);
    out_.append("X-Forwarded-For: "sv);
    if (xff && !xff->empty()) out_.append(*xff).append(", "sv);
    out_.append(req.remote_address).append("\r\nContent-Length: "sv).append(std::to_string(req.body.size())).append("\r\n\r\n"sv);
    arm(cfg_.timeouts.first_token, "first_token_timeout");
    std::array<net::const_buffer, 2> bufs{net::buffer(out_), net::buffer(req.body)};
    // A request is a few hundred bytes, which the socket takes at once: the answer's read starts
    // here, without the turn of the event loop an asynchronous write takes to report that it is
    // done. What the socket does not take goes asynchronously.
    const std::size_t sent = send_now(*sock_, bufs);
    if (sent == out_.size() + req.body.size()) return read_head();
    if (sent < out_.size()) bufs[0] += sent;
    else bufs = {net::buffer(req.body) + (sent - out_.size()), net::const_buffer()};
    net::async_write(*sock_, bufs, [self = shared_from_this(), g = gen_](beast::error_code ec, std::size_t) {
      if (g != self->gen_ || self->done_) return;
      if (ec) return self->stale_or_failed();
      self->read_head();
    });
  }

  // The replica's answer: one read of the socket at a time into rbuf_, and everything it brought
  // parsed at once, without further I/O (a read's worth of a stream's events then goes to the
  // client in one write; a write per upstream chunk had been most of a stream's system calls).
  void read_head() {
    rbuf_.clear();
    parser_.emplace([this, g = gen_](std::string_view body) { return g == gen_ && !done_ && on_body(body); });
    read_upstream();
  }

  void read_upstream() {
    if (done_) return;
    const auto room = rbuf_.prepare();
    if (room.size() == 0) return attempt_failed("too_large", false);  // a head of over kReadChunk bytes
    server::http::async_read_some_drained(*sock_, room, [self = shared_from_this(), g = gen_](beast::error_code ec, std::size_t n) {
      if (g != self->gen_ || self->done_) return;
      self->rbuf_.commit(n);
      self->on_upstream(ec);
    });
  }

  void on_upstream(beast::error_code ec) {
    const auto g = gen_;
    if (streamed_) pending_.reserve(pending_.size() + rbuf_.size());  // what this read brought, at most
    const bool had_head = parser_->is_header_done();
    beast::error_code pec = parse_upstream();
    if (g != gen_ || done_) return;  // the head failed this attempt (5xx, 429), or on_bytes gave up on it
    // A body that ends with the connection (neither a length nor chunks). Before the head, the end
    // is a failure (and Beast's put_eof must not see a parser that got nothing).
    if (!pec && ec == net::error::eof && parser_->is_header_done() && !parser_->is_done()) parser_->put_eof(pec);
    if (!pec && ec && !parser_->is_done()) pec = ec;
    if (parser_->is_header_done() && !pec) send_pending();
    if (pec) {
      const char* kind = timeout_kind_ ? timeout_kind_ : "reset";
      if (!had_head && !parser_->is_header_done()) return stale_or_failed();
      if (sent_) return stream_failed(kind);
      return attempt_failed(kind, true);
    }
    if (parser_->is_done()) return on_complete();
    if (sent_ && ex_.queued_bytes() > kMaxQueued) {
      // Waiting on the client, not on the replica: no idle deadline meanwhile.
      phase_kind_ = nullptr;
      return ex_.when_drained([self = shared_from_this(), g] {
        if (g != self->gen_ || self->done_) return;
        self->arm(self->cfg_.timeouts.idle, "idle_timeout");
        self->read_upstream();
      });
    }
    read_upstream();
  }

  // Feeds rbuf_ to the parser: the head (then on_head), then the body (to on_body, from inside
  // the parser). need_more is no error: the rest needs bytes from the socket.
  beast::error_code parse_upstream() {
    const auto g = gen_;
    while (rbuf_.size() > 0 && !parser_->is_done()) {
      beast::error_code ec;
      const bool had_head = parser_->is_header_done();
      const std::size_t used = parser_->put(rbuf_.data(), ec);
      rbuf_.consume(used);
      if (g != gen_ || done_) return {};  // on_body gave up on this attempt
      if (ec == bhttp::error::need_more) return {};
      if (ec) return ec;
      if (!had_head && parser_->is_header_done()) {
        on_head();
        if (g != gen_ || done_) return {};
      }
      if (used == 0) return {};
    }
    return {};
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
    auto& p = *parser_;
    status_ = p.status;
    if (status_ == 429) {
      int secs = 1;
      try {
        secs = std::max(1, std::stoi(p.retry_after));
      } catch (...) {
      }
      retry_after_ = retry_after_ ? std::min(*retry_after_, secs) : secs;
      replica_->on_retry_after(Clock::now() + std::chrono::seconds(secs));
      return attempt_failed("status_429", false);
    }
    if (status_ >= 500) return attempt_failed("status_" + std::to_string(status_), true);
    replica_->on_success();
    // A stream flows to the client only after its admission's record; one that a request asking
    // for a whole answer gets (recorded only at its end) is passed on whole.
    event_stream_ = p.content_type.starts_with("text/event-stream");
    streamed_ = event_stream_ && (!state_.audit || info_.admission_audited);
    content_type_ = std::move(p.content_type);
    if (!streamed_ && p.content_length()) whole_.reserve(static_cast<std::size_t>(std::min<std::uint64_t>(*p.content_length(), kMaxWholeBody)));
    if (streamed_) pending_.reserve(rbuf_.size());  // the events that came with the head, at most
    head_lines_ = std::move(p.pass_lines);
    keep_alive_ = p.keep_alive();
    if (!streamed_) arm(cfg_.timeouts.idle, "idle_timeout");
  }

  // Body bytes as parsed: a whole answer collects them; a stream gathers them for send_pending().
  // False when the attempt is given up (too large).
  bool on_body(std::string_view bytes) {
    if (streamed_) {
      pending_.append(bytes);
      return true;
    }
    if (whole_.size() + bytes.size() > kMaxWholeBody) {
      attempt_failed("too_large", false);
      return false;
    }
    whole_.append(bytes);
    return true;
  }

  // A stream's gathered bytes to the client (its head first, the first time).
  void send_pending() {
    if (!streamed_ || pending_.empty()) return;
    if (!sent_) {
      sent_ = true;
      ttft_ = seconds_since(arrived_);
      head_lines_.append("X-Accel-Buffering: no\r\n"sv);
      add_identity();
      ex_.start_stream({.status = status_, .content_type = content_type_, .head_lines = std::move(head_lines_)});
    }
    phase_kind_ = "idle_timeout";
    phase_deadline_ = Clock::now() + cfg_.timeouts.idle;
    update_deadline();  // an atomic store
    if (answer_) answer_->take(pending_, true);
    tail_.append(pending_.size() > 2 ? pending_.substr(pending_.size() - 2) : pending_);
    if (tail_.size() > 2) tail_.erase(0, tail_.size() - 2);
    ex_.send(std::move(pending_));
    pending_.clear();
  }

  void on_complete() {
    phase_kind_ = nullptr;
    if (streamed_) {
      if (!sent_) {  // an empty streamed body
        add_identity();
        ex_.start_stream({.status = status_, .content_type = content_type_, .head_lines = std::move(head_lines_)});
        sent_ = true;
      }
      ex_.end_stream();
    }
    if (keep_alive_ && rbuf_.size() == 0 && sock_) {
      replica_->put_idle(std::move(*sock_));
      sock_.reset();
    }
    if (streamed_) return finish(status_);
    ttft_ = seconds_since(arrived_);
    if (answer_) answer_->take(whole_, event_stream_);
    if (!state_.audit) return reply_whole();
    // The outcome's record before the answer: an answer is not served unaudited. The thread
    // serves other requests while it is written (a deadline or the client's going may end this
    // call meanwhile: then the answer is dropped).
    audit_completed(status_, [self = shared_from_this()](bool ok) {
      if (self->done_) return;
      if (ok) return self->reply_whole();
      auto r = error_response(503, "the audit trail cannot be written", "audit_unavailable");
      r.headers.emplace_back("Retry-After", "1");
      self->ex_.reply(std::move(r));
      self->finish(503);
    });
  }

  void reply_whole() {
    add_identity();
    ex_.reply({.status = status_, .content_type = content_type_, .body = std::move(whole_), .head_lines = std::move(head_lines_)});
    finish(status_);
  }

  void add_identity() {
    head_lines_.append("x-lmserve-backend: "sv).append(replica_->url()).append("\r\nx-lmserve-version: "sv).append(version_).append("\r\n"sv);
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
    if (state_.audit && !answer_->written) audit_completed(status, {});  // a stream's, or a failure's (a stream already flowed)
    if (info_.grant) {
      // The tokens the replica reported; none when nothing was answered; else the reservation.
      const Usage u = answer_ ? answer_->reader.usage() : Usage{};
      info_.grant->settle(u.known() ? u.prompt_tokens + u.completion_tokens : !sent_ && status != 200 ? 0 : -1);
      info_.grant.reset();
    }
    const double total = seconds_since(arrived_);
    static const std::string kNone;
    const std::string& backend = replica_ && status != 503 ? replica_->url() : kNone;
    state_.metrics.request(model_.name, backend, backend.empty() ? "" : version_, status, ttft_, total);
    if (!info_.tenant.empty()) {
      state_.metrics.tenant_request(info_.tenant, model_.name, status);
      const auto& u = answer_->reader.usage();
      state_.metrics.tenant_tokens(info_.tenant, model_.name, u.prompt_tokens, u.completion_tokens);
    }
    if (cfg_.access_log) {
      const auto& req = ex_.request();
      write_access_log({.id = id_, .model = model_.name, .backend = backend, .version = version_, .path = req.path, .client = req.remote_address,
                        .error = !failed_mid_stream_.empty() ? failed_mid_stream_ : status >= 500 ? last_failure_ : "",
                        .key_id = info_.key_id, .tenant = info_.tenant, .status = status, .stream = streamed_, .retries = retries_,
                        .ttft_s = ttft_, .total_s = total});
    }
  }

  // The outcome's audit record: status, replica, tokens as the replica reported them, times, and
  // the SHA-256 of the answer's body as the replica sent it. `then(ok)` (when given) runs on this
  // call's thread once it is written, ok false when it could not be and the trail is fail-closed.
  void audit_completed(int status, std::function<void(bool)> then) {
    auto& a = *answer_;
    a.written = true;
    const auto& req = ex_.request();
    JsonLine rec;
    rec.str("event", "completed").num("id", static_cast<std::int64_t>(id_)).str("time", utc_now()).str("tenant", info_.tenant).str("key_id", info_.key_id);
    rec.str("model", model_.name).str("path", req.path);
    if (!info_.admission_audited) {  // the request's only record
      rec.str("prompt_sha256", sha256_hex(req.body));
      if (info_.audit_text) rec.str("prompt", info_.audit_prompt);
    }
    rec.str("lane", info_.lane).num("status", status).boolean("stream", streamed_);
    rec.num("retries", retries_).millis("latency_ms", seconds_since(arrived_)).str("completion_sha256", a.hash->hex());
    rec.str("replica", replica_ ? replica_->url() : "").str("version", replica_ ? version_ : "");  // the last one tried
    if (ttft_ < 0) rec.null("ttft_ms");
    else rec.millis("ttft_ms", ttft_);
    const auto& u = a.reader.usage();
    for (const auto& [name, n] : {std::pair{"prompt_tokens", u.prompt_tokens}, std::pair{"completion_tokens", u.completion_tokens}}) {
      if (n >= 0) rec.num(name, n);
      else rec.null(name);
    }
    const std::string& failure = !failed_mid_stream_.empty() ? failed_mid_stream_ : status >= 500 ? last_failure_ : "";
    if (!failure.empty()) rec.str("error", failure);
    if (info_.audit_text) rec.str("completion", redact(a.reader.text()));
    state_.audit_then(io_, std::move(rec).done(), std::move(then));
  }

  // What the audit and the token limits take from the answer as it passes.
  struct AnswerTap {
    AnswerTap(bool text, bool hashed) : reader(text) {
      if (hashed) hash.emplace();
    }
    void take(std::string_view body, bool streamed) {
      if (hash) hash->update(body);
      if (streamed) reader.feed_stream(body);
      else reader.read_whole(body);
    }
    AnswerReader reader;
    std::optional<Sha256> hash;  // with the audit
    bool written = false;        // the audit's outcome record
  };

  State& state_;
  std::shared_ptr<Snapshot> snap_;
  const ModelConfig& model_;
  const GatewayConfig& cfg_;
  Exchange ex_;
  RouteInfo info_;
  net::io_context& io_;  // the client connection's I/O thread, where the upstream socket lives too
  Clock::time_point phase_deadline_{}, total_deadline_{};
  const char* phase_kind_ = nullptr;  // the phase whose deadline counts (nullptr: none)
  const std::uint64_t id_;
  const Clock::time_point arrived_ = Clock::now();

  boost::container::small_vector<const Replica*, 4> tried_;
  std::shared_ptr<Replica> replica_;
  std::string version_;
  std::optional<UpstreamSocket> sock_;
  std::string out_;
  InBuffer rbuf_;
  std::optional<UpstreamParser> parser_;
  std::string whole_, pending_, tail_, content_type_;
  std::string head_lines_;  // the replica's headers that pass to the client, formatted
  std::uint64_t gen_ = 0;  // the current attempt; handlers of earlier ones do nothing
  const char* timeout_kind_ = nullptr;
  bool counted_ = false, reused_ = false, streamed_ = false, sent_ = false, keep_alive_ = false, done_ = false;
  bool event_stream_ = false;  // the answer is an event stream (passed on whole when not streamed_)
  int status_ = 0, retries_ = 0;
  double ttft_ = -1;
  std::optional<int> retry_after_;
  std::string last_failure_, failed_mid_stream_;
  std::optional<AnswerTap> answer_;  // with the audit trail, token limits or a tenant (its metrics)
};

}  // namespace

void start_proxy(State& state, std::shared_ptr<Snapshot> snapshot, const ModelConfig& model, Exchange exchange, RouteInfo info) {
  auto call = std::allocate_shared<ProxyCall>(RecyclingAllocator<ProxyCall>(), state, std::move(snapshot), model, exchange, std::move(info));
  exchange.set_context(call);
  call->start();
}

}  // namespace lmserve::gateway
