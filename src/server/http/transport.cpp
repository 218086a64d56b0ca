#include "server/http/transport.h"

#include "common/sharded_counter.h"
#include "server/http/asio.h"
#include "server/http/drained_read.h"
#include "server/http/request_parser.h"

#include <sys/socket.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <charconv>
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

std::string_view Request::header(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (k.size() == name.size() && ::strncasecmp(k.data(), name.data(), k.size()) == 0) return v;
  }
  return {};
}

// The connection behind an Exchange. Every method runs on the connection's I/O thread.
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
  virtual net::io_context& context() = 0;
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

// A socket of one I/O thread's io_context: its handlers run on that thread, no strand needed.
using Socket = net::basic_stream_socket<tcp, net::io_context::executor_type>;

struct Transport::Impl {
  TransportOptions opt;
  Application& app;
  // Before the loops: sessions still queued in them at destruction update these as they go.
  std::atomic<std::size_t> connections{0};
  ShardedCounter open_exchanges;  // requests read and not yet completely answered
  std::atomic<bool> draining{false};
  std::atomic<int> bound_port{0};
  std::atomic<int> signals{0};
  std::optional<net::ssl::context> ssl;
  // One event loop per I/O thread, sharing nothing: a connection lives on one loop for its life
  // (accepted connections go round the loops). Loop 0 runs on run()'s thread and also carries the
  // acceptor, the signals and what applications do of their own (context_of).
  struct Loop {
    net::io_context ioc{1};
    std::optional<net::executor_work_guard<net::io_context::executor_type>> work;  // serves until shutdown ends
  };
  std::vector<std::unique_ptr<Loop>> loops;
  std::size_t next_loop = 0;
  tcp::acceptor acceptor;
  std::vector<std::thread> threads;
  std::thread drain_thread;

  Impl(TransportOptions o, Application& a) : opt(std::move(o)), app(a), loops(make_loops(opt.io_threads)), acceptor(loops[0]->ioc) {}
  static std::vector<std::unique_ptr<Loop>> make_loops(int n) {
    std::vector<std::unique_ptr<Loop>> v;
    for (int i = 0; i < std::max(1, n); ++i) v.push_back(std::make_unique<Loop>());
    return v;
  }
  net::io_context& main() { return loops[0]->ioc; }
  void accept();
  void refuse(Socket socket);
  void begin_shutdown();
  void stop_loops() {
    for (auto& l : loops) {
      l->work.reset();
      l->ioc.stop();
    }
  }
};

namespace {

using namespace std::string_view_literals;

bool iequals(std::string_view a, std::string_view b) { return a.size() == b.size() && ::strncasecmp(a.data(), b.data(), a.size()) == 0; }

// The status line and headers of an answer, serialised once into one string. The transport owns
// the framing (Content-Length or chunked, Connection); an application's header named Server or
// Content-Type replaces the transport's, framing headers and any with CR or LF are dropped.
// `content_length`: the body's size, or nullopt for a streamed body (chunked when `chunked`).
std::string head_of(const Response& r, unsigned version, bool keep_alive, const std::string& server, std::optional<std::size_t> content_length,
                    bool chunked) {
  std::string_view server_v = server, type_v = r.content_type;
  std::size_t size = 96 + server.size() + r.content_type.size() + r.head_lines.size();
  for (const auto& [k, v] : r.headers) {
    size += k.size() + v.size() + 4;
    if (iequals(k, "server")) server_v = v;
    if (iequals(k, "content-type")) type_v = v;
  }
  std::string h;
  h.reserve(size);
  auto reason = bhttp::obsolete_reason(static_cast<bhttp::status>(r.status));
  if (reason.starts_with("<")) reason = "";  // not a status Beast knows
  h.append(version == 10 ? "HTTP/1.0 "sv : "HTTP/1.1 "sv).append(std::to_string(r.status)).append(" "sv).append(reason).append("\r\n"sv);
  if (!server_v.empty()) h.append("Server: "sv).append(server_v).append("\r\n"sv);
  if (!type_v.empty()) h.append("Content-Type: "sv).append(type_v).append("\r\n"sv);
  for (const auto& [k, v] : r.headers) {
    if (iequals(k, "server") || iequals(k, "content-type") || iequals(k, "content-length") || iequals(k, "transfer-encoding") ||
        iequals(k, "connection") || k.find_first_of("\r\n") != std::string::npos || v.find_first_of("\r\n") != std::string::npos) {
      continue;
    }
    h.append(k).append(": "sv).append(v).append("\r\n"sv);
  }
  h.append(r.head_lines);
  const bool bodiless = r.status < 200 || r.status == 204 || r.status == 304;
  if (content_length && !bodiless) h.append("Content-Length: "sv).append(std::to_string(*content_length)).append("\r\n"sv);
  if (chunked) h.append("Transfer-Encoding: chunked\r\n"sv);
  if (version == 10 && keep_alive) h.append("Connection: keep-alive\r\n"sv);
  if (version != 10 && !keep_alive) h.append("Connection: close\r\n"sv);
  h.append("\r\n"sv);
  return h;
}

// One connection. `Stream` is a Socket or a TLS stream over one.
//
// Reading: one read of the socket at a time (read_more), into buffer_, whose completion decides
// what the bytes are: a request's (parsed in place, no further I/O when it is all there), or,
// while the application works on an exchange, the client's end or pipelined bytes. So the
// disconnect watch is a read like any other: no readiness wait, whose re-arming costs a system
// call per request, and the read pending when the answer is complete is the next request's.
template <class Stream>
class Session : public SessionBase, public std::enable_shared_from_this<Session<Stream>> {
 public:
  static constexpr bool kTls = !std::is_same_v<Stream, Socket>;

  template <class... Args>
  Session(Transport::Impl& t, Args&&... args) : stream_(std::forward<Args>(args)...), timer_(socket().get_executor()), t_(t) {}
  ~Session() override {
    if (!closed_) --t_.connections;
    if (open_) --t_.open_exchanges;
  }

  void start() {
    beast::error_code ec;
    request_.remote_address = socket().remote_endpoint(ec).address().to_string();
    net::dispatch(socket().get_executor(), [self = this->shared_from_this()] {
      if constexpr (kTls) {
        self->set_deadline(std::chrono::steady_clock::now() + self->t_.opt.request_timeout);
        self->stream_.async_handshake(net::ssl::stream_base::server, [self](beast::error_code e) {
          self->deadline_ = kNoDeadline;
          if (e || self->timed_out_) return self->close();
          self->next_request();
        });
      } else {
        self->next_request();
      }
    });
  }

  // ---- SessionBase: what an Exchange does -----------------------------------------------------
  const Request& request() const override { return request_; }

  void reply(std::uint64_t seq, Response r) override {
    if (!current(seq) || streaming_) return;
    if (gone_) return finish_and_close();
    ending_ = true;
    keep_alive_ = request_.keep_alive && !r.close;
    head_out_ = head_of(r, version_, keep_alive_, t_.opt.server_header, r.body.size(), false);
    body_out_ = request_.method == "HEAD" ? std::string() : std::move(r.body);
    set_deadline(std::chrono::steady_clock::now() + t_.opt.write_timeout);
    writing_ = true;
    net::async_write(stream_, std::array<net::const_buffer, 2>{net::buffer(head_out_), net::buffer(body_out_)},
                     [self = this->shared_from_this()](beast::error_code ec, std::size_t) {
                       self->writing_ = false;
                       self->deadline_ = kNoDeadline;
                       self->finish(/*from_io=*/true);
                       if (ec || !self->keep_alive_) return self->close();
                       self->next_request();
                     });
  }

  void start_stream(std::uint64_t seq, Response head) override {
    if (!current(seq) || streaming_) return;
    streaming_ = true;
    if (gone_) return;
    keep_alive_ = request_.keep_alive && !head.close && version_ != 10;  // HTTP/1.0 has no chunks: the end is the close
    chunked_ = version_ != 10;
    head_out_ = head_of(head, version_, keep_alive_, t_.opt.server_header, std::nullopt, chunked_);
    head_pending_ = true;
    schedule_flush();  // with whatever the application sends in this same call
  }

  void send(std::uint64_t seq, std::string chunk) override {
    if (!current(seq) || !streaming_ || gone_ || chunk.empty()) return;  // an empty chunk would end the body
    queued_ += chunk.size();
    out_.push_back(std::move(chunk));
    schedule_flush();
  }

  void end_stream(std::uint64_t seq) override {
    if (!current(seq) || !streaming_) return;
    ending_ = true;
    if (gone_) return finish_and_close();
    schedule_flush();
  }

  void abort(std::uint64_t seq) override {
    if (!current(seq)) return;
    aborting_ = ending_ = true;
    if (gone_ || !streaming_) return finish_and_close();
    schedule_flush();  // what was sent goes out; then the connection closes instead of the last chunk
  }

  void watch_disconnect(std::uint64_t seq, std::function<void()> on_gone) override {
    if (!current(seq)) return;
    on_gone_ = std::move(on_gone);
    watching_ = true;
    read_more();
  }

  void post(std::function<void()> fn) override {
    net::post(socket().get_executor(), [self = this->shared_from_this(), fn = std::move(fn)] { fn(); });
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

  net::io_context& context() override { return static_cast<net::io_context&>(socket().get_executor().context()); }

 private:
  static constexpr auto kNoDeadline = std::chrono::steady_clock::time_point::max();
  static constexpr std::size_t kReadSize = 4096;

  Socket& socket() { return beast::get_lowest_layer(stream_); }
  bool current(std::uint64_t seq) const { return open_ && seq == seq_ && !ending_; }

  // ---- reading ------------------------------------------------------------------------------------
  // Ready for the next request on this connection: idle until its first byte, then
  // request_timeout for the whole of it.
  void next_request() {
    context_.reset();  // the last exchange's (finish() kept it for this moment)
    if (peer_done_) return close();
    parser_.emplace(request_, t_.opt.max_header_bytes, t_.opt.max_body_bytes);
    timed_out_ = false;
    if (buffer_.size() > 0) {  // pipelined, or read while the last answer was under way
      awaiting_first_byte_ = false;
      set_deadline(std::chrono::steady_clock::now() + t_.opt.request_timeout);
      return parse();
    }
    awaiting_first_byte_ = true;
    set_deadline(std::chrono::steady_clock::now() + t_.opt.idle_timeout);
    read_more();  // if the disconnect watch's read is still under way, it goes on as this one
  }

  // Reads land in read_buf_ and are then appended to buffer_: the parser may consume from buffer_
  // while a read is under way (a pipelined request found there when the last answer ended).
  void read_more() {
    if (reading_) return;  // its completion goes on from here
    reading_ = true;
    async_read_some_drained(stream_, net::buffer(read_buf_), [self = this->shared_from_this()](beast::error_code ec, std::size_t n) {
      self->reading_ = false;
      self->buffer_.commit(net::buffer_copy(self->buffer_.prepare(n), net::buffer(self->read_buf_.data(), n)));
      self->on_bytes(ec, n);
    });
  }

  void on_bytes(beast::error_code ec, std::size_t n) {
    if (closed_) return;
    if (open_) {  // the application has the request: this read watches for the client's end
      if (ec == net::error::operation_aborted) return;  // a deadline cancelled the answer's write too
      if (ec || n == 0) {
        peer_done_ = true;  // a half-closed client still gets an answer under way, then the close
        if (!ending_) client_gone();
        return;
      }
      // Pipelined bytes of the next request: kept for the parser (bounded).
      if (buffer_.size() > t_.opt.max_body_bytes + t_.opt.max_header_bytes) return client_gone();
      if (!ending_ && watching_) read_more();
      return;
    }
    if (timed_out_) {
      if (parser_->got_some() || buffer_.size() > 0) return refuse(TransportError::kRequestTimeout);
      return close();  // an idle keep-alive connection
    }
    if (ec) {
      if (ec == net::error::eof && (parser_->got_some() || buffer_.size() > 0)) return refuse(TransportError::kMalformed);  // cut short
      return close();
    }
    if (awaiting_first_byte_ && n > 0) {
      awaiting_first_byte_ = false;
      set_deadline(std::chrono::steady_clock::now() + t_.opt.request_timeout);
    }
    parse();
  }

  // Feeds what is buffered to the parser; reads more only when the request is not all there.
  void parse() {
    if (buffer_.size() > 0) {
      const auto step = parser_->feed({static_cast<const char*>(buffer_.data().data()), buffer_.size()});
      buffer_.consume(step.used);
      if (step.state == RequestParser::State::kError) return refuse(step.error);
    }
    if (parser_->is_done()) return on_request();
    if (buffer_.size() > t_.opt.max_header_bytes + t_.opt.max_body_bytes) return refuse(TransportError::kHeadersTooLarge);
    read_more();
  }

  void on_request() {
    deadline_ = kNoDeadline;  // not reading any more
    version_ = parser_->version;
    request_.keep_alive = parser_->keep_alive();
    ++seq_;
    open_ = true;
    ++t_.open_exchanges;
    streaming_ = ending_ = gone_ = watching_ = aborting_ = head_pending_ = false;
    on_gone_ = nullptr;
    Exchange ex(this->shared_from_this(), seq_);
    try {
      t_.app.handle(ex);
    } catch (const std::exception& e) {
      // A handler's bug costs its request, not the process and every other request on it: the
      // application's 500 (or, a stream begun, the connection cut), and the bug in the log.
      spdlog::error("http: the handler of {} {} threw: {:.160}", request_.method, request_.path, e.what());
      ex.reply(t_.app.error_response(TransportError::kInternal));
      ex.abort();
    }
  }

  // A request the transport answers itself (no exchange is open): the answer, then close.
  void refuse(TransportError e) {
    deadline_ = kNoDeadline;
    auto r = t_.app.error_response(e);
    head_out_ = head_of(r, version_, false, t_.opt.server_header, r.body.size(), false);
    body_out_ = std::move(r.body);
    set_deadline(std::chrono::steady_clock::now() + t_.opt.write_timeout);
    net::async_write(stream_, std::array<net::const_buffer, 2>{net::buffer(head_out_), net::buffer(body_out_)},
                     [self = this->shared_from_this()](beast::error_code, std::size_t) { self->close(); });
  }

  // ---- deadlines ----------------------------------------------------------------------------------
  // One timer, set lazily: moving the deadline later (as every request on a keep-alive connection
  // does) is an assignment, and the timer, firing early, looks again; cancelling and re-arming it
  // per request cost two completions each time. On expiry the socket's operations are cancelled
  // and their handlers see timed_out_.
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
    if (closed_ || deadline_ == kNoDeadline) return;  // nothing timed now
    if (std::chrono::steady_clock::now() < deadline_) return set_deadline(deadline_);
    timed_out_ = true;
    beast::error_code ignored;
    socket().cancel(ignored);
  }

  // ---- streamed responses -----------------------------------------------------------------------
  // Writes wait for the end of the current handler, so that a head, the pieces an application
  // sends in one go and the last chunk leave in one write.
  void schedule_flush() {
    if (writing_ || flush_scheduled_) return;
    flush_scheduled_ = true;
    net::post(socket().get_executor(), [self = this->shared_from_this()] {
      self->flush_scheduled_ = false;
      self->flush();
    });
  }

  void flush() {
    if (writing_ || gone_ || closed_) return;
    const bool ends = ending_;  // end_stream() or abort(): nothing more comes after what is queued
    const bool last_chunk = ends && chunked_ && !aborting_;
    if (out_.empty() && !head_pending_ && !last_chunk) {
      if (ends) return stream_done();
      if (auto fn = std::move(drained_)) fn();
      return;
    }
    // Everything queued goes out in one gathered write (one system call, no copy, however many
    // pieces the application sent since the last write finished): the head if it has not gone
    // yet, the pieces as one chunk, and the last chunk once the stream has ended.
    std::size_t n = 0;
    for (const auto& d : out_) n += d.size();
    pieces_.assign(std::make_move_iterator(out_.begin()), std::make_move_iterator(out_.end()));
    out_.clear();
    buffers_.clear();
    if (head_pending_) buffers_.push_back(net::buffer(head_out_));
    head_pending_ = false;
    static constexpr char kCrlf[] = "\r\n";
    static constexpr char kLastChunk[] = "0\r\n\r\n";
    if (n > 0) {
      if (chunked_) {
        auto [end, ec] = std::to_chars(size_line_, size_line_ + sizeof size_line_ - 2, n, 16);
        *end++ = '\r';
        *end++ = '\n';
        buffers_.push_back(net::buffer(size_line_, static_cast<std::size_t>(end - size_line_)));
      }
      for (const auto& p : pieces_) buffers_.push_back(net::buffer(p));
      if (chunked_) buffers_.push_back(net::buffer(kCrlf, 2));
    }
    if (last_chunk) buffers_.push_back(net::buffer(kLastChunk, 5));
    writing_ = true;
    net::async_write(stream_, buffers_, [self = this->shared_from_this(), n, ends](beast::error_code ec, std::size_t) {
      self->queued_ -= std::min(self->queued_, n);
      self->writing_ = false;
      self->pieces_.clear();
      if (ec) return self->client_gone();
      if (ends) return self->stream_done();
      self->flush();
    });
  }

  // The stream's last byte is written (or, aborting or HTTP/1.0, the close ends it).
  void stream_done() {
    finish(/*from_io=*/true);
    if (aborting_ || !keep_alive_) return close();
    next_request();
  }

  // ---- the client going away --------------------------------------------------------------------
  void client_gone() {
    if (gone_) return;
    gone_ = true;
    out_.clear();
    drained_ = nullptr;
    if (auto fn = std::move(on_gone_)) fn();
    if (ending_ && !writing_) finish_and_close();
  }

  // ---- ends -------------------------------------------------------------------------------------
  // The exchange is answered (or given up): its handle goes inert, its context goes. Within an
  // application's call the context is not destroyed (the application may be inside a call that
  // ends in this one): it goes with the next request, or in a handler of its own when the
  // connection closes.
  void finish(bool from_io = false) {
    if (!open_) return;
    open_ = false;
    --t_.open_exchanges;
    on_gone_ = nullptr;
    drained_ = nullptr;
    queued_ = 0;
    if (from_io) context_.reset();
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
    // The context may hold an Exchange, and so this session: released in a handler of its own.
    if (context_) net::post(socket().get_executor(), [c = std::move(context_)] {});
    beast::error_code ec;
    socket().shutdown(tcp::socket::shutdown_both, ec);
    socket().close(ec);
  }

  Stream stream_;
  net::basic_waitable_timer<std::chrono::steady_clock, net::wait_traits<std::chrono::steady_clock>, net::io_context::executor_type> timer_;
  bool timed_out_ = false, timer_pending_ = false;
  std::chrono::steady_clock::time_point deadline_ = kNoDeadline, timer_at_{};
  beast::flat_buffer buffer_;
  std::optional<RequestParser> parser_;  // fills request_
  unsigned version_ = 11;
  Request request_;
  Transport::Impl& t_;
  // The exchange in progress: its number, whether it awaits its answer (open_), the answer's
  // progress, and the client's.
  std::uint64_t seq_ = 0;
  bool open_ = false, streaming_ = false, ending_ = false, writing_ = false, gone_ = false, watching_ = false;
  bool keep_alive_ = true, closed_ = false, aborting_ = false, chunked_ = true, head_pending_ = false, flush_scheduled_ = false;
  bool reading_ = false, awaiting_first_byte_ = false, peer_done_ = false;
  std::string head_out_, body_out_;       // the answer being written
  std::vector<std::string> pieces_;       // the stream's pieces in the write under way
  std::vector<net::const_buffer> buffers_;
  char size_line_[24];
  std::array<char, kReadSize> read_buf_;  // not zeroed: written by each read before it is used
  std::deque<std::string> out_;
  std::size_t queued_ = 0;  // bytes in out_ and in the write under way
  std::function<void()> on_gone_, drained_;
  std::shared_ptr<void> context_;
};

}  // namespace

void Transport::Impl::refuse(Socket socket) {
  // Too many connections: the application's answer and close, without reading the request.
  auto r = app.error_response(TransportError::kTooManyConnections);
  const auto head = head_of(r, 11, false, opt.server_header, r.body.size(), false);
  beast::error_code ec;
  net::write(socket, std::array<net::const_buffer, 2>{net::buffer(head), net::buffer(r.body)}, ec);
  socket.close(ec);
}

void Transport::Impl::accept() {
  auto& loop = loops[next_loop++ % loops.size()]->ioc;
  acceptor.async_accept(loop, [this](beast::error_code ec, Socket socket) {
    if (ec) {
      if (ec == net::error::operation_aborted) return;
      return accept();
    }
    // Streamed answers are many small writes: without TCP_NODELAY, Nagle's algorithm holds each
    // one back until the client's (delayed, up to 40 ms) ACK of the previous one.
    beast::error_code nd;
    socket.set_option(tcp::no_delay(true), nd);
    enable_drained_reads(socket);  // drained_read.h: no read that finds nothing
    if (++connections > opt.max_connections) {
      --connections;
      refuse(std::move(socket));
      return accept();
    }
    if (ssl) {
      std::make_shared<Session<beast::ssl_stream<Socket>>>(*this, std::move(socket), *ssl)->start();
    } else {
      std::make_shared<Session<Socket>>(*this, std::move(socket))->start();
    }
    accept();
  });
}

void Transport::Impl::begin_shutdown() {
  if (draining.exchange(true)) return;
  spdlog::info("shutdown: not ready; finishing in-flight requests for up to {} s", opt.shutdown_timeout.count());
  drain_thread = std::thread([this] {
    app.drain(std::chrono::duration_cast<std::chrono::milliseconds>(opt.shutdown_timeout));
    net::post(main(), [this] {
      beast::error_code ec;
      acceptor.close(ec);
    });
    // The answers the drain completed may still be on their way out: up to a second for them.
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    while (open_exchanges.sum() > 0 && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    stop_loops();
  });
}

Transport::Transport(TransportOptions options, Application& app) : impl_(std::make_unique<Impl>(std::move(options), app)) {}

Transport::~Transport() {
  if (impl_->drain_thread.joinable()) impl_->drain_thread.join();
  impl_->stop_loops();
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
  for (auto& l : impl_->loops) l->work.emplace(net::make_work_guard(l->ioc));
  impl_->accept();
  return Status::ok();
}

int Transport::port() const { return impl_->bound_port; }
bool Transport::draining() const { return impl_->draining; }
std::size_t Transport::connections() const { return impl_->connections; }

void Transport::shutdown() {
  net::post(impl_->main(), [impl = impl_.get()] { impl->begin_shutdown(); });
}

// Runs a loop until it has nothing left to do. A handler that throws outside handle() (one an
// exchange posted, a timer's) is a bug whose exchange may be left unanswered until its timeouts;
// the loop logs it and goes on serving every other connection rather than ending the process.
static void run_loop(net::io_context& ioc) {
  for (;;) {
    try {
      ioc.run();
      return;
    } catch (const std::exception& e) {
      spdlog::error("http: a handler threw: {:.160}; this thread's loop goes on", e.what());
    }
  }
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
    signals.emplace(impl_->main(), SIGINT, SIGTERM);
    signals->async_wait(on_signal);
  }
  for (std::size_t i = 1; i < impl_->loops.size(); ++i) impl_->threads.emplace_back([loop = impl_->loops[i].get()] { run_loop(loop->ioc); });
  run_loop(impl_->main());
  for (auto& t : impl_->threads) t.join();
  impl_->threads.clear();
}

}  // namespace lmserve::server::http

namespace lmserve::server::http {

net::any_io_executor AsioAccess::executor_of(const Exchange& exchange) { return exchange.session_->context().get_executor(); }
net::io_context& AsioAccess::io_context_of(const Exchange& exchange) { return exchange.session_->context(); }
net::io_context& AsioAccess::context_of(Transport& transport) { return transport.impl_->main(); }

}  // namespace lmserve::server::http
