#include "server/http/transport.h"

#include "server/http/asio.h"

#include <sys/socket.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <optional>
#include <strings.h>
#include <thread>

namespace lmserve::server::http {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = beast::http;
using tcp = net::ip::tcp;

std::string Request::header(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (k.size() == name.size() && ::strncasecmp(k.data(), name.data(), k.size()) == 0) return v;
  }
  return "";
}

// The connection behind an Exchange. Every method runs on the connection's strand.
class SessionBase {
 public:
  virtual ~SessionBase() = default;
  virtual const Request& request() const = 0;
  virtual void reply(std::uint64_t seq, Response r) = 0;
  virtual void start_stream(std::uint64_t seq, Response head) = 0;
  virtual void send(std::uint64_t seq, std::string chunk) = 0;
  virtual void end_stream(std::uint64_t seq) = 0;
  virtual void abort(std::uint64_t seq) = 0;
  virtual void watch_disconnect(std::uint64_t seq, std::function<void()> on_gone) = 0;
  virtual void post(std::function<void()> fn) = 0;
  virtual void set_context(std::uint64_t seq, std::shared_ptr<void> context) = 0;
  virtual bool active(std::uint64_t seq) const = 0;
  virtual std::size_t queued_bytes(std::uint64_t seq) const = 0;
  virtual void when_drained(std::uint64_t seq, std::function<void()> fn) = 0;
  virtual net::any_io_executor executor() = 0;
};

Exchange::Exchange(std::shared_ptr<SessionBase> session, std::uint64_t seq) : session_(std::move(session)), seq_(seq) {}
const Request& Exchange::request() const { return session_->request(); }
void Exchange::reply(Response response) { session_->reply(seq_, std::move(response)); }
void Exchange::start_stream(Response head) { session_->start_stream(seq_, std::move(head)); }
void Exchange::send(std::string chunk) { session_->send(seq_, std::move(chunk)); }
void Exchange::end_stream() { session_->end_stream(seq_); }
void Exchange::abort() { session_->abort(seq_); }
void Exchange::watch_disconnect(std::function<void()> on_gone) { session_->watch_disconnect(seq_, std::move(on_gone)); }
void Exchange::post(std::function<void()> fn) const { session_->post(std::move(fn)); }
void Exchange::set_context(std::shared_ptr<void> context) { session_->set_context(seq_, std::move(context)); }
bool Exchange::active() const { return session_->active(seq_); }
std::size_t Exchange::queued_bytes() const { return session_->queued_bytes(seq_); }
void Exchange::when_drained(std::function<void()> fn) { session_->when_drained(seq_, std::move(fn)); }

struct Transport::Impl {
  TransportOptions opt;
  Application& app;
  // Before ioc: sessions still queued in it at destruction update these as they go.
  std::atomic<std::size_t> connections{0};
  std::atomic<std::size_t> open_exchanges{0};  // requests read and not yet completely answered
  std::atomic<bool> draining{false};
  std::atomic<int> bound_port{0};
  std::atomic<int> signals{0};
  std::optional<net::ssl::context> ssl;
  net::io_context ioc;
  tcp::acceptor acceptor{ioc};
  std::vector<std::thread> threads;
  std::thread drain_thread;
  // Keeps run() serving until shutdown ends, even with no connection open.
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;

  Impl(TransportOptions o, Application& a) : opt(std::move(o)), app(a) {}
  void accept();
  void refuse(tcp::socket socket);
  void begin_shutdown();
};

namespace {

bhttp::response<bhttp::string_body> to_beast(Response r, unsigned version, bool keep_alive, const std::string& server) {
  bhttp::response<bhttp::string_body> res(static_cast<bhttp::status>(r.status), version);
  res.set(bhttp::field::server, server);
  res.set(bhttp::field::content_type, r.content_type);
  for (const auto& [k, v] : r.headers) res.set(k, v);
  res.keep_alive(keep_alive && !r.close);
  res.body() = std::move(r.body);
  res.prepare_payload();
  return res;
}

// One connection. `Stream` is a plain TCP stream or a TLS stream over one.
template <class Stream>
class Session : public SessionBase, public std::enable_shared_from_this<Session<Stream>> {
 public:
  static constexpr bool kTls = !std::is_same_v<Stream, beast::tcp_stream>;

  template <class... Args>
  Session(Transport::Impl& t, Args&&... args) : stream_(std::forward<Args>(args)...), timer_(stream_.get_executor()), t_(t) {}
  ~Session() override {
    if (!closed_) --t_.connections;
    if (open_) --t_.open_exchanges;
  }

  void start() {
    beast::error_code ec;
    request_.remote_address = beast::get_lowest_layer(stream_).socket().remote_endpoint(ec).address().to_string();
    net::dispatch(stream_.get_executor(), [self = this->shared_from_this()] {
      if constexpr (kTls) {
        beast::get_lowest_layer(self->stream_).expires_after(self->t_.opt.request_timeout);
        self->stream_.async_handshake(net::ssl::stream_base::server, [self](beast::error_code e) {
          if (e) return self->close();
          self->read();
        });
      } else {
        self->read();
      }
    });
  }

  // ---- SessionBase: what an Exchange does -----------------------------------------------------
  const Request& request() const override { return request_; }

  void reply(std::uint64_t seq, Response r) override {
    if (!current(seq) || streaming_) return;
    stop_watching();
    if (gone_) return finish_and_close();
    auto res = std::make_shared<bhttp::response<bhttp::string_body>>(to_beast(std::move(r), version_, request_.keep_alive, t_.opt.server_header));
    beast::get_lowest_layer(stream_).expires_after(t_.opt.write_timeout);
    ending_ = true;
    bhttp::async_write(stream_, *res, [self = this->shared_from_this(), res](beast::error_code ec, std::size_t) {
      self->finish();
      if (ec || !res->keep_alive()) return self->close();
      self->read();
    });
  }

  void start_stream(std::uint64_t seq, Response head) override {
    if (!current(seq) || streaming_) return;
    streaming_ = true;
    if (gone_) return;
    auto res = std::make_shared<bhttp::response<bhttp::empty_body>>(static_cast<bhttp::status>(head.status), version_);
    res->set(bhttp::field::server, t_.opt.server_header);
    res->set(bhttp::field::content_type, head.content_type);
    for (const auto& [k, v] : head.headers) res->set(k, v);
    res->keep_alive(request_.keep_alive && !head.close);
    res->chunked(true);
    keep_alive_ = res->keep_alive();
    beast::get_lowest_layer(stream_).expires_never();
    auto sr = std::make_shared<bhttp::response_serializer<bhttp::empty_body>>(*res);
    writing_ = true;
    bhttp::async_write_header(stream_, *sr, [self = this->shared_from_this(), res, sr](beast::error_code ec, std::size_t) {
      self->writing_ = false;
      if (ec) return self->client_gone();
      self->flush();
    });
  }

  void send(std::uint64_t seq, std::string chunk) override {
    if (!current(seq) || !streaming_ || gone_ || chunk.empty()) return;  // an empty chunk would end the body
    queued_ += chunk.size();
    out_.push_back(std::move(chunk));
    flush();
  }

  void end_stream(std::uint64_t seq) override {
    if (!current(seq) || !streaming_) return;
    ending_ = true;
    if (gone_) return finish_and_close();
    flush();
  }

  void abort(std::uint64_t seq) override {
    if (!current(seq)) return;
    stop_watching();
    aborting_ = ending_ = true;
    if (gone_ || !streaming_) return finish_and_close();
    flush();  // what was sent goes out; then the connection closes instead of the last chunk
  }

  void watch_disconnect(std::uint64_t seq, std::function<void()> on_gone) override {
    if (!current(seq)) return;
    on_gone_ = std::move(on_gone);
    if (!watching_) watch(seq);
  }

  void post(std::function<void()> fn) override {
    net::post(stream_.get_executor(), [self = this->shared_from_this(), fn = std::move(fn)] { fn(); });
  }

  void set_context(std::uint64_t seq, std::shared_ptr<void> context) override {
    if (current(seq)) context_ = std::move(context);
  }

  bool active(std::uint64_t seq) const override { return current(seq) && !gone_; }

  std::size_t queued_bytes(std::uint64_t seq) const override { return current(seq) ? queued_ : 0; }

  void when_drained(std::uint64_t seq, std::function<void()> fn) override {
    if (!current(seq) || gone_) return;
    if (queued_ == 0) return post(std::move(fn));
    drained_ = std::move(fn);
  }

  net::any_io_executor executor() override { return stream_.get_executor(); }

 private:
  bool current(std::uint64_t seq) const { return open_ && seq == seq_ && !ending_; }

  // ---- reading requests -----------------------------------------------------------------------
  void read() {
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(t_.opt.max_header_bytes));
    parser_->body_limit(t_.opt.max_body_bytes);
    // Our own timer rather than the stream's expiry: on timeout the stream would close the
    // socket, and a slow client should still get its 408.
    beast::get_lowest_layer(stream_).expires_never();
    timed_out_ = false;
    // Idle until the request's first byte, then request_timeout for the whole request.
    const bool idle = buffer_.size() == 0;
    set_deadline(std::chrono::steady_clock::now() + (idle ? t_.opt.idle_timeout : t_.opt.request_timeout));
    if (idle) {
      stream_.async_read_some(buffer_.prepare(4096), [self = this->shared_from_this()](beast::error_code ec, std::size_t n) {
        self->buffer_.commit(n);
        if (self->timed_out_ || ec || n == 0) return self->close();  // idle, or gone
        self->read();
      });
      return;
    }
    bhttp::async_read(stream_, buffer_, *parser_, [self = this->shared_from_this()](beast::error_code ec, std::size_t) { self->on_read(ec); });
  }

  // The read deadline. One timer, set lazily: moving the deadline later (as every request on a
  // keep-alive connection does) is an assignment, and the timer, firing early, looks again;
  // cancelling and re-arming it per request cost two completions each time.
  void set_deadline(std::chrono::steady_clock::time_point when) {
    deadline_ = when;
    if (timer_pending_ && timer_at_ <= when) return;
    timer_pending_ = true;
    timer_at_ = when;
    timer_.expires_at(when);
    timer_.async_wait([self = this->shared_from_this(), when](beast::error_code ec) {
      if (ec || when != self->timer_at_) return;  // replaced by a sooner one
      self->timer_pending_ = false;
      self->on_deadline();
    });
  }

  void on_deadline() {
    if (closed_ || deadline_ == std::chrono::steady_clock::time_point::max()) return;  // not reading
    if (std::chrono::steady_clock::now() < deadline_) return set_deadline(deadline_);
    timed_out_ = true;
    beast::error_code ignored;
    beast::get_lowest_layer(stream_).socket().cancel(ignored);
  }

  void on_read(beast::error_code ec) {
    deadline_ = std::chrono::steady_clock::time_point::max();  // not reading any more
    if (timed_out_) {
      if (parser_->got_some() || buffer_.size() > 0) return refuse(TransportError::kRequestTimeout);
      return close();  // an idle keep-alive connection
    }
    if (ec == bhttp::error::end_of_stream || ec == net::error::eof || ec == net::error::connection_reset ||
        ec == net::ssl::error::stream_truncated) {
      return close();
    }
    if (ec == bhttp::error::header_limit) return refuse(TransportError::kHeadersTooLarge);
    if (ec == bhttp::error::body_limit) return refuse(TransportError::kBodyTooLarge);
    if (ec) return refuse(TransportError::kMalformed);
    auto req = parser_->release();
    version_ = req.version();
    request_.method = std::string(req.method_string());
    request_.target = std::string(req.target());
    request_.path = request_.target.substr(0, request_.target.find('?'));
    request_.headers.clear();
    for (const auto& f : req) request_.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
    request_.keep_alive = req.keep_alive();
    request_.body = std::move(req.body());
    ++seq_;
    open_ = true;
    ++t_.open_exchanges;
    streaming_ = ending_ = gone_ = watching_ = aborting_ = false;
    on_gone_ = nullptr;
    t_.app.handle(Exchange(this->shared_from_this(), seq_));
  }

  // A request the transport answers itself (no exchange is open): the answer, then close.
  void refuse(TransportError e) {
    auto res = std::make_shared<bhttp::response<bhttp::string_body>>(to_beast(t_.app.error_response(e), version_, false, t_.opt.server_header));
    beast::get_lowest_layer(stream_).expires_after(t_.opt.write_timeout);
    bhttp::async_write(stream_, *res, [self = this->shared_from_this(), res](beast::error_code, std::size_t) { self->close(); });
  }

  // ---- streamed responses -----------------------------------------------------------------------
  void flush() {
    if (writing_ || gone_) return;
    if (out_.empty()) {
      if (aborting_) return finish_and_close();
      if (ending_) return write_last_chunk();
      if (auto fn = std::move(drained_)) fn();
      return;
    }
    // Everything queued goes out as one chunk in one gathered write (one system call, no copy,
    // however many pieces the application sent since the last write finished).
    std::size_t n = 0;
    for (const auto& d : out_) n += d.size();
    auto pieces = std::make_shared<std::vector<std::string>>(std::make_move_iterator(out_.begin()), std::make_move_iterator(out_.end()));
    out_.clear();
    char size_line[24];
    const int len = std::snprintf(size_line, sizeof size_line, "%zx\r\n", n);
    pieces->emplace_back(size_line, static_cast<std::size_t>(len));  // last, so the buffers above stay put
    std::vector<net::const_buffer> buffers;
    buffers.reserve(pieces->size() + 1);
    buffers.push_back(net::buffer(pieces->back()));
    for (std::size_t i = 0; i + 1 < pieces->size(); ++i) buffers.push_back(net::buffer((*pieces)[i]));
    static constexpr char kCrlf[] = "\r\n";
    buffers.push_back(net::buffer(kCrlf, 2));
    writing_ = true;
    net::async_write(stream_, buffers, [self = this->shared_from_this(), pieces, n](beast::error_code ec, std::size_t) {
      self->queued_ -= std::min(self->queued_, n);
      self->writing_ = false;
      if (ec) return self->client_gone();
      self->flush();
    });
  }

  void write_last_chunk() {
    writing_ = true;
    net::async_write(stream_, bhttp::make_chunk_last(), [self = this->shared_from_this()](beast::error_code ec, std::size_t) {
      self->writing_ = false;
      self->finish();
      if (ec || !self->keep_alive_) return self->close();
      self->read();
    });
  }

  // ---- the client going away --------------------------------------------------------------------
  // While the application works: a readable socket with nothing to read means the client left.
  void watch(std::uint64_t seq) {
    watching_ = true;
    beast::get_lowest_layer(stream_).socket().async_wait(tcp::socket::wait_read, [self = this->shared_from_this(), seq](beast::error_code ec) {
      if (seq != self->seq_ || !self->open_ || self->ending_ || ec == net::error::operation_aborted) return;
      auto& socket = beast::get_lowest_layer(self->stream_).socket();
      beast::error_code ec2;
      std::size_t avail = socket.available(ec2);
      if (!ec && !ec2 && avail == 0) {
        // Readiness can be stale (the bytes that raised it were already taken by a read, e.g.
        // the TLS layer's): only a peek that returns 0 is the client's end of stream.
        char byte;
        ssize_t n = ::recv(socket.native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return self->watch(seq);
        if (n > 0) avail = static_cast<std::size_t>(n);
      }
      if (ec || ec2 || avail == 0) return self->client_gone();
      // TLS records cannot be taken off the socket here: stop watching (a write will notice).
      if constexpr (kTls) return;
      // Pipelined bytes of the next request: keep them for the parser (bounded).
      if (self->buffer_.size() + avail > self->t_.opt.max_body_bytes + self->t_.opt.max_header_bytes) return self->client_gone();
      auto buf = self->buffer_.prepare(avail);
      std::size_t n = socket.read_some(buf, ec2);
      self->buffer_.commit(n);
      if (ec2) return self->client_gone();
      self->watch(seq);
    });
  }

  void stop_watching() {
    if (!watching_) return;
    watching_ = false;
    beast::error_code ec;
    beast::get_lowest_layer(stream_).socket().cancel(ec);
  }

  void client_gone() {
    if (gone_) return;
    gone_ = true;
    out_.clear();
    drained_ = nullptr;
    if (auto fn = std::move(on_gone_)) fn();
    if (ending_ && !writing_) finish_and_close();
  }

  // ---- ends -------------------------------------------------------------------------------------
  // The exchange is answered (or given up): its handle goes inert, its context goes.
  void finish() {
    if (!open_) return;
    open_ = false;
    --t_.open_exchanges;
    on_gone_ = nullptr;
    drained_ = nullptr;
    queued_ = 0;
    // Not destroyed here: the application may be inside a call that ends in this one.
    if (context_) net::post(stream_.get_executor(), [c = std::move(context_)] {});
  }

  void finish_and_close() {
    finish();
    close();
  }

  // The connection counts as open until its socket closes, not until the session object goes (an
  // application may keep an Exchange handle a while longer).
  void close() {
    if (!closed_) --t_.connections;
    closed_ = true;
    timer_.cancel();  // its handler holds the session
    beast::error_code ec;
    beast::get_lowest_layer(stream_).socket().shutdown(tcp::socket::shutdown_both, ec);
    beast::get_lowest_layer(stream_).socket().close(ec);
  }

  Stream stream_;
  net::steady_timer timer_;
  bool timed_out_ = false, timer_pending_ = false;
  std::chrono::steady_clock::time_point deadline_ = std::chrono::steady_clock::time_point::max(), timer_at_{};
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  unsigned version_ = 11;
  Request request_;
  Transport::Impl& t_;
  // The exchange in progress: its number, whether it awaits its answer (open_), the answer's
  // progress, and the client's.
  std::uint64_t seq_ = 0;
  bool open_ = false, streaming_ = false, ending_ = false, writing_ = false, gone_ = false, watching_ = false;
  bool keep_alive_ = true, closed_ = false, aborting_ = false;
  std::deque<std::string> out_;
  std::size_t queued_ = 0;  // bytes in out_ and in the write under way
  std::function<void()> on_gone_, drained_;
  std::shared_ptr<void> context_;
};

}  // namespace

void Transport::Impl::refuse(tcp::socket socket) {
  // Too many connections: the application's answer and close, without reading the request.
  auto res = to_beast(app.error_response(TransportError::kTooManyConnections), 11, false, opt.server_header);
  beast::error_code ec;
  bhttp::write(socket, res, ec);
  socket.close(ec);
}

void Transport::Impl::accept() {
  // With one I/O thread every handler already runs one at a time: a strand per connection would
  // only add its dispatch to every completion.
  auto executor = opt.io_threads <= 1 ? net::any_io_executor(ioc.get_executor()) : net::any_io_executor(net::make_strand(ioc));
  acceptor.async_accept(executor, [this](beast::error_code ec, tcp::socket socket) {
    if (ec) {
      if (ec == net::error::operation_aborted) return;
      return accept();
    }
    // Streamed answers are many small writes: without TCP_NODELAY, Nagle's algorithm holds each
    // one back until the client's (delayed, up to 40 ms) ACK of the previous one.
    beast::error_code nd;
    socket.set_option(tcp::no_delay(true), nd);
    if (++connections > opt.max_connections) {
      --connections;
      refuse(std::move(socket));
      return accept();
    }
    if (ssl) {
      std::make_shared<Session<beast::ssl_stream<beast::tcp_stream>>>(*this, std::move(socket), *ssl)->start();
    } else {
      std::make_shared<Session<beast::tcp_stream>>(*this, std::move(socket))->start();
    }
    accept();
  });
}

void Transport::Impl::begin_shutdown() {
  if (draining.exchange(true)) return;
  spdlog::info("shutdown: not ready; finishing in-flight requests for up to {} s", opt.shutdown_timeout.count());
  drain_thread = std::thread([this] {
    app.drain(std::chrono::duration_cast<std::chrono::milliseconds>(opt.shutdown_timeout));
    net::post(ioc, [this] {
      beast::error_code ec;
      acceptor.close(ec);
    });
    // The answers the drain completed may still be on their way out: up to a second for them.
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    while (open_exchanges.load() > 0 && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    work.reset();
    ioc.stop();
  });
}

Transport::Transport(TransportOptions options, Application& app) : impl_(std::make_unique<Impl>(std::move(options), app)) {}

Transport::~Transport() {
  if (impl_->drain_thread.joinable()) impl_->drain_thread.join();
  impl_->work.reset();
  impl_->ioc.stop();
  for (auto& t : impl_->threads) {
    if (t.joinable()) t.join();
  }
}

Status Transport::start() {
  beast::error_code ec;
  const auto& o = impl_->opt;
  if (!o.ssl_certfile.empty() || !o.ssl_keyfile.empty()) {
    if (o.ssl_certfile.empty() || o.ssl_keyfile.empty()) {
      return Status(StatusCode::kInvalidArgument, "TLS needs both --ssl-certfile and --ssl-keyfile");
    }
    auto& ctx = impl_->ssl.emplace(net::ssl::context::tls_server);
    ctx.set_options(net::ssl::context::default_workarounds | net::ssl::context::no_sslv2 | net::ssl::context::no_sslv3 |
                    net::ssl::context::no_tlsv1 | net::ssl::context::no_tlsv1_1);
    ctx.use_certificate_chain_file(o.ssl_certfile, ec);
    if (ec) return Status(StatusCode::kInvalidArgument, "--ssl-certfile: cannot use " + o.ssl_certfile + ": " + ec.message());
    ctx.use_private_key_file(o.ssl_keyfile, net::ssl::context::pem, ec);
    if (ec) return Status(StatusCode::kInvalidArgument, "--ssl-keyfile: cannot use " + o.ssl_keyfile + ": " + ec.message());
  }
  auto addr = net::ip::make_address(o.host, ec);
  if (ec) return Status(StatusCode::kInvalidArgument, "--host '" + o.host + "' is not an IP address");
  tcp::endpoint ep(addr, static_cast<unsigned short>(o.port));
  auto& a = impl_->acceptor;
  a.open(ep.protocol(), ec);
  if (!ec) a.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) a.bind(ep, ec);
  if (!ec) a.listen(net::socket_base::max_listen_connections, ec);
  if (ec) return Status(StatusCode::kUnavailable, "cannot listen on " + o.host + ":" + std::to_string(o.port) + ": " + ec.message());
  impl_->bound_port = a.local_endpoint().port();
  impl_->work.emplace(net::make_work_guard(impl_->ioc));
  impl_->accept();
  return Status::ok();
}

int Transport::port() const { return impl_->bound_port; }
bool Transport::draining() const { return impl_->draining; }
std::size_t Transport::connections() const { return impl_->connections; }

void Transport::shutdown() {
  net::post(impl_->ioc, [impl = impl_.get()] { impl->begin_shutdown(); });
}

void Transport::run(bool handle_signals) {
  // Both live until run() returns: the handler re-arms itself through them.
  std::optional<net::signal_set> signals;
  std::function<void(beast::error_code, int)> on_signal = [this, &signals, &on_signal](beast::error_code ec, int) {
    if (ec) return;
    if (++impl_->signals > 1) std::_Exit(1);  // a second signal: exit at once
    impl_->begin_shutdown();
    signals->async_wait(on_signal);
  };
  if (handle_signals) {
    signals.emplace(impl_->ioc, SIGINT, SIGTERM);
    signals->async_wait(on_signal);
  }
  const int n = std::max(1, impl_->opt.io_threads);
  for (int i = 1; i < n; ++i) impl_->threads.emplace_back([this] { impl_->ioc.run(); });
  impl_->ioc.run();
  for (auto& t : impl_->threads) t.join();
  impl_->threads.clear();
}

}  // namespace lmserve::server::http

namespace lmserve::server::http {

net::any_io_executor AsioAccess::executor_of(const Exchange& exchange) { return exchange.session_->executor(); }
net::io_context& AsioAccess::context_of(Transport& transport) { return transport.impl_->ioc; }

}  // namespace lmserve::server::http
