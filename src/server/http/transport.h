// server/http: the HTTP/1.1 transport that `lmserve serve` and `lmserve gateway` share. It owns
// the listener, the connections (plain TCP or TLS), their limits and timeouts, keep-alive,
// streamed (chunked, SSE) responses, client-disconnect detection and the drain at shutdown. It
// knows nothing of OpenAI, engines or replicas: each request goes to an Application.
//
// How an application plugs in (the OpenAI server in server/server.cpp is one):
//
//   class MyApp : public http::Application {
//     void handle(http::Exchange ex) override {          // on the connection's thread
//       if (ex.request().path == "/hello") return ex.reply({.status = 200, .body = "hi"});
//       ex.start_stream({.status = 200, .content_type = "text/event-stream"});
//       ex.send("data: 1\n\n");                          // any number of chunks, in order
//       ex.end_stream();                                  // then the next request is read
//     }
//     http::Response error_response(http::TransportError e) override { ... }  // 408/413/431/400/503/500
//     void drain(std::chrono::milliseconds grace) override { ... }            // at shutdown
//   };
//   MyApp app;  http::Transport t(options, app);  t.start();  t.run();
//
// Each request gets exactly one answer: reply(), or start_stream() + send()... + end_stream().
// A handle() that throws is a bug, and costs only its request: the transport logs it and answers
// error_response(kInternal) (a 500), or cuts the connection if a stream had begun. One thrown
// from a posted function is logged and its loop goes on (that exchange waits for its timeouts).
// Work that completes later (an engine's tokens, a replica's reply) keeps the Exchange (a cheap
// handle) and calls it back on the connection's thread through Exchange::post().
//
// Threading: each of the `io_threads` threads runs an event loop (an Asio io_context) of its own,
// and accepted connections go round them; a connection's handlers all run on its loop's thread,
// so Application::handle and everything it posts for that exchange run one at a time, and the
// threads share nothing but the counters. No thread is dedicated to a connection, and handlers
// must never block. Exchange methods must be called on the exchange's thread (from handle(), or
// from a function given to post()); post() itself may be called from any thread.
//
// Writes of a streamed answer wait for the end of the handler that queued them, so a head, the
// chunks sent in one go and the end leave in one system call.
//
// Lifetime: an Exchange handle refers to one request. Once its answer is complete (or the
// connection closed), its methods do nothing, even if the connection goes on to serve another
// request. Exchange::set_context() hangs the application's per-request state on the connection:
// it lives until the answer is complete or the connection closes, whichever comes first.
//
// Shutdown: the first SIGTERM/SIGINT (or shutdown()) sets draining(), calls Application::drain
// on a thread of its own, then stops accepting, gives the answers still being written up to a
// second, and returns from run(). A second signal exits the process at once.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace lmserve::server::http {

struct TransportOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0: any free port (see Transport::port())
  int io_threads = 2;
  std::size_t max_connections = 10000;
  std::size_t max_header_bytes = 16 * 1024;
  std::size_t max_body_bytes = 8 * 1024 * 1024;
  std::chrono::seconds request_timeout{30};  // to receive one whole request (headers + body)
  std::chrono::seconds idle_timeout{60};     // keep-alive connection with no request
  std::chrono::seconds write_timeout{60};    // to write one whole (non-streamed) response
  std::chrono::seconds shutdown_timeout{30}; // the grace given to Application::drain
  std::string ssl_certfile, ssl_keyfile;     // both set: HTTPS
  std::string server_header = "lmserve";
};

using Headers = std::vector<std::pair<std::string, std::string>>;

struct Request {
  std::string method;  // "GET", "POST", ... as sent
  std::string target;  // as sent, with the query
  std::string path;    // target without the query
  Headers headers;     // in the order sent
  std::string body;
  bool keep_alive = true;
  std::string remote_address;  // the peer's IP address
  // The first header of that name (case-insensitive); "" when there is none. A view into
  // `headers`.
  std::string_view header(std::string_view name) const;
};

struct Response {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;        // ignored by start_stream()
  Headers headers;         // added as given (Retry-After, Cache-Control, ...)
  // Header lines already formatted ("Name: value\r\n" each), written after `headers` as they are:
  // for a proxy passing a replica's headers on without a string per header. Not checked: the
  // caller guarantees well-formed lines and no framing header (Content-Length, Transfer-Encoding,
  // Connection).
  std::string head_lines;
  bool close = false;      // close the connection after this answer, whatever the request asked
};

// Failures the transport answers by itself, before a request reaches Application::handle.
enum class TransportError {
  kRequestTimeout,      // the request was not received within request_timeout (408)
  kHeadersTooLarge,     // over max_header_bytes (431)
  kBodyTooLarge,        // over max_body_bytes (413)
  kMalformed,           // not HTTP/1.x (400)
  kTooManyConnections,  // over max_connections: answered without reading the request (503)
  kInternal,            // the application's handle() threw on this request: a bug (500)
};

class SessionBase;

// One request on one connection, and the way to answer it. Copyable handle; see the file
// comment for its threading and lifetime rules.
class Exchange {
 public:
  Exchange(std::shared_ptr<SessionBase> session, std::uint64_t seq);

  const Request& request() const;
  // A whole response. The connection then reads the next request (or closes).
  void reply(Response response);
  // A streamed response: the head now (chunked transfer encoding), then send() chunks in order,
  // then end_stream(). Writes are queued, so send() never waits.
  void start_stream(Response head);
  void send(std::string chunk);
  void end_stream();
  // Gives up on the answer: the connection closes at once, so the client sees it cut short (a
  // streamed body without its last chunk). For an application that cannot finish what it began.
  void abort();
  // Watches the socket while the application works on the request: when the client closes it
  // (or a write fails), `on_gone` runs once on the exchange's thread and later answers are dropped.
  void watch_disconnect(std::function<void()> on_gone);
  // Runs `fn` on this exchange's thread; callable from any thread. fn runs even when the
  // exchange is over (check active()).
  void post(std::function<void()> fn) const;
  // Keeps the application's state for this request alive until the answer is complete or the
  // connection closes.
  void set_context(std::shared_ptr<void> context);
  // Still waiting for its answer, and the client still there.
  bool active() const;
  // Backpressure for streamed answers: bytes given to send() and not yet written to the socket,
  // and a way to wait for them. `fn` runs once on the exchange's thread when everything queued is written
  // (at once, posted, when nothing is queued); it does not run if the client goes (watch that
  // with watch_disconnect) or the answer ends first.
  std::size_t queued_bytes() const;
  void when_drained(std::function<void()> fn);

 private:
  friend struct AsioAccess;  // server/http/asio.h
  std::shared_ptr<SessionBase> session_;
  std::uint64_t seq_;
};

class Application {
 public:
  virtual ~Application() = default;
  // A complete request. Must answer it exactly once (now or later, see Exchange).
  virtual void handle(Exchange exchange) = 0;
  // The answer to a failure the transport detected (the application's error format).
  virtual Response error_response(TransportError error) = 0;
  // Shutdown started: finish or end in-flight work within `grace`, then return. Runs on a
  // thread of its own; the transport keeps serving meanwhile (draining() is true).
  virtual void drain(std::chrono::milliseconds grace) = 0;
};

class Transport {
 public:
  Transport(TransportOptions options, Application& app);
  ~Transport();
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  // Loads the TLS certificate (if any), binds and listens. InvalidArgument for bad options,
  // Unavailable when the address cannot be bound. The port bound is port() afterwards.
  Status start();
  int port() const;
  // Serves until shutdown completes. Installs SIGINT/SIGTERM handling when `handle_signals`.
  void run(bool handle_signals = true);
  // Starts the graceful shutdown, as the first signal does. Thread-safe.
  void shutdown();
  bool draining() const;
  std::size_t connections() const;

  struct Impl;

 private:
  friend struct AsioAccess;  // server/http/asio.h
  std::unique_ptr<Impl> impl_;
};

}  // namespace lmserve::server::http
