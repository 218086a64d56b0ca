// The HTTP transport (server/http/transport.h) with a small application of its own, as the
// gateway will plug in: no engine, no OpenAI. A real Transport on port 0, driven through sockets.
#include "server/http/transport.h"

#include <gtest/gtest.h>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <condition_variable>
#include <future>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

namespace lmserve::server::http {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = beast::http;
using tcp = net::ip::tcp;

// Routes: /echo (method, path, a header, body, peer), /stream?n=N (N chunks), /later (answered
// from another thread), /hold (never answered until the client leaves; its context is tracked),
// /twice (answers, then tries again on the same handle).
class TestApp : public Application {
 public:
  void handle(Exchange ex) override {
    const Request& r = ex.request();
    ++handled;
    if (r.path == "/echo") {
      return ex.reply({.status = 200, .content_type = "text/plain",
                       .body = r.method + " " + r.path + " " + std::string(r.header("x-test")) + " " + r.body + " " + r.remote_address});
    }
    if (r.path == "/stream") {
      const int n = std::stoi(r.target.substr(r.target.find("n=") + 2));
      ex.start_stream({.status = 200, .content_type = "text/event-stream", .headers = {{"Cache-Control", "no-cache"}}});
      for (int i = 0; i < n; ++i) ex.send("data: " + std::to_string(i) + "\n\n");
      return ex.end_stream();
    }
    if (r.path == "/later") {
      std::thread([ex] {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        ex.post([ex]() mutable { ex.reply({.status = 202, .body = "later"}); });
      }).detach();
      return;
    }
    if (r.path == "/hold") {
      auto ctx = std::make_shared<int>(7);
      {
        std::lock_guard lock(mu);
        held = ctx;
        hold_ex.emplace(ex);
      }
      ex.set_context(ctx);
      ex.watch_disconnect([this, ex]() mutable {
        {
          std::lock_guard lock(mu);
          gone = true;
          active_when_gone = ex.active();
        }
        cv.notify_all();
        ex.reply({.status = 200, .body = "too late"});  // dropped: the client is gone
      });
      return;
    }
    if (r.path == "/throw") throw std::runtime_error("a handler's bug");
    if (r.path == "/throw-later") return ex.post([] { throw std::runtime_error("a posted handler's bug"); });
    if (r.path == "/throw-streaming") {
      ex.start_stream({.status = 200, .content_type = "text/event-stream"});
      ex.send("data: 0\n\n");
      throw std::out_of_range("a handler's bug, mid-stream");
    }
    if (r.path == "/abort") {  // two chunks, then the connection is cut
      ex.start_stream({.status = 200, .content_type = "text/event-stream"});
      ex.send("data: 0\n\n");
      ex.send("data: 1\n\n");
      return ex.post([ex]() mutable { ex.abort(); });
    }
    if (r.path == "/bulk") {  // 64 MiB, never more than 256 KiB queued ahead of the socket
      ex.start_stream({.status = 200, .content_type = "application/octet-stream"});
      return bulk(ex, 0);
    }
    if (r.path == "/watched-later") {  // watched while the answer is worked on elsewhere
      ex.watch_disconnect([] {});
      std::thread([ex] {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        ex.post([ex]() mutable { ex.reply({.status = 200, .body = "watched"}); });
      }).detach();
      return;
    }
    if (r.path == "/lines") {  // pre-formatted header lines, and headers the transport owns
      return ex.reply({.status = 201, .content_type = "text/plain", .body = "x",
                       .headers = {{"Server", "custom"}, {"Content-Length", "99"}, {"X-Bad", "a\r\nInjected: 1"}},
                       .head_lines = "X-A: 1\r\nX-B: two\r\n"});
    }
    if (r.path == "/thread") {
      std::ostringstream id;
      id << std::this_thread::get_id();
      return ex.reply({.status = 200, .content_type = "text/plain", .body = id.str()});
    }
    if (r.path == "/twice") {
      ex.reply({.status = 200, .body = "first"});
      ex.reply({.status = 500, .body = "second"});  // the exchange is over: ignored
      ex.send("stray");
      return;
    }
    ex.reply({.status = 404, .body = "no"});
  }
  void bulk(Exchange ex, int i) {
    for (; i < kBulkPieces; ++i) {
      if (ex.queued_bytes() > 256 * 1024) {
        max_queued = std::max<std::size_t>(max_queued, ex.queued_bytes());
        return ex.when_drained([this, ex, i] { bulk(ex, i); });
      }
      ex.send(std::string(kBulkPiece, 'x'));
      ++bulk_sent;
    }
    ex.end_stream();
  }
  static constexpr int kBulkPieces = 4096;
  static constexpr std::size_t kBulkPiece = 16 * 1024;
  std::atomic<int> bulk_sent{0};
  std::atomic<std::size_t> max_queued{0};

  Response error_response(TransportError e) override {
    ++errors;
    return {.status = e == TransportError::kTooManyConnections ? 503 : e == TransportError::kInternal ? 500 : 400, .content_type = "text/plain",
            .body = "transport error " + std::to_string(static_cast<int>(e)), .headers = {{"Retry-After", "1"}}};
  }
  void drain(std::chrono::milliseconds grace) override {
    drained_with = grace;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }

  std::atomic<int> handled{0}, errors{0};
  std::chrono::milliseconds drained_with{-1};
  std::mutex mu;
  std::condition_variable cv;
  std::weak_ptr<int> held;
  std::optional<Exchange> hold_ex;
  bool gone = false, active_when_gone = true;
};

class TransportTest : public ::testing::Test {
 protected:
  void start(TransportOptions o = {}) {
    o.port = 0;
    o.request_timeout = std::chrono::seconds(1);
    o.shutdown_timeout = std::chrono::seconds(3);
    transport_ = std::make_unique<Transport>(o, app_);
    ASSERT_TRUE(transport_->start().is_ok());
    port_ = transport_->port();
    ASSERT_GT(port_, 0);
    thread_ = std::thread([this] { transport_->run(false); });
  }
  void TearDown() override {
    if (transport_) {
      transport_->shutdown();
      thread_.join();
      {
        std::lock_guard lock(app_.mu);
        app_.hold_ex.reset();
      }
      transport_.reset();
    }
  }
  tcp::endpoint endpoint() const { return {net::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port_)}; }

  // Sends `bytes`, then reads `count` responses from the same connection.
  std::vector<bhttp::response<bhttp::string_body>> exchange(const std::string& bytes, int count = 1) {
    net::io_context ioc;
    beast::tcp_stream s(ioc);
    s.connect(endpoint());
    s.expires_after(std::chrono::seconds(10));
    net::write(s, net::buffer(bytes));
    beast::flat_buffer buf;
    std::vector<bhttp::response<bhttp::string_body>> out;
    for (int i = 0; i < count; ++i) {
      bhttp::response<bhttp::string_body> res;
      beast::error_code ec;
      bhttp::read(s, buf, res, ec);
      if (ec) break;
      out.push_back(std::move(res));
    }
    return out;
  }

  // Sends `bytes` on a new connection and reads everything until the server ends it: the raw
  // text, and how the reading ended.
  std::pair<std::string, beast::error_code> read_until_closed(const std::string& bytes) {
    net::io_context ioc;
    tcp::socket s(ioc);
    s.connect(endpoint());
    net::write(s, net::buffer(bytes));
    std::string got;
    beast::error_code ec;
    char buf[4096];
    for (;;) {
      const std::size_t n = s.read_some(net::buffer(buf), ec);
      got.append(buf, n);
      if (ec) break;
    }
    return {got, ec};
  }

  TestApp app_;
  std::unique_ptr<Transport> transport_;
  std::thread thread_;
  int port_ = 0;
};

TEST_F(TransportTest, RequestsReachTheApplicationAndKeepAliveServesTheNext) {
  start();
  auto r = exchange("POST /echo?x=1 HTTP/1.1\r\nHost: h\r\nX-Test: yes\r\nContent-Length: 4\r\n\r\nbody"
                    "GET /twice HTTP/1.1\r\nHost: h\r\n\r\n"
                    "GET /later HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
                    3);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].result_int(), 200u);
  EXPECT_EQ(r[0].body(), "POST /echo yes body 127.0.0.1");
  EXPECT_EQ(r[0][bhttp::field::server], "lmserve");
  EXPECT_EQ(r[1].result_int(), 200u);  // the second reply on a finished exchange was dropped
  EXPECT_EQ(r[1].body(), "first");
  EXPECT_EQ(r[2].result_int(), 202u);  // answered from another thread through post()
  EXPECT_EQ(r[2].body(), "later");
  EXPECT_FALSE(r[2].keep_alive());
  EXPECT_EQ(app_.handled, 3);
}

// A handler that throws costs its own request only: a 500 from the application (the connection
// goes on), or, with a stream under way, the connection cut; the server serves the next ones.
TEST_F(TransportTest, AHandlerThatThrowsGetsItsRequestA500AndTheServerGoesOn) {
  start();
  auto r = exchange("GET /throw HTTP/1.1\r\nHost: h\r\n\r\nPOST /echo HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok", 2);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].result_int(), 500u);
  EXPECT_EQ(r[0].body(), "transport error 5");
  EXPECT_EQ(r[1].result_int(), 200u);
  const auto [got, ec] = read_until_closed("GET /throw-streaming HTTP/1.1\r\nHost: h\r\n\r\n");
  EXPECT_EQ(ec, net::error::eof);
  EXPECT_NE(got.find("data: 0\n\n"), std::string::npos) << got;
  EXPECT_EQ(got.find("\r\n0\r\n\r\n"), std::string::npos) << "the stream was ended as if complete: " << got;
  auto after = exchange("GET /echo HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n", 1);
  ASSERT_EQ(after.size(), 1u);
  EXPECT_EQ(after[0].result_int(), 200u);
  // Thrown from a posted function, outside handle(): that exchange is left to its timeouts, but
  // the loop, and every other connection on it, goes on.
  net::io_context ioc;
  tcp::socket left(ioc);
  left.connect(endpoint());
  net::write(left, net::buffer(std::string("GET /throw-later HTTP/1.1\r\nHost: h\r\n\r\n")));
  for (int i = 0; i < 3; ++i) {
    auto next = exchange("GET /echo HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n", 1);
    ASSERT_EQ(next.size(), 1u);
    EXPECT_EQ(next[0].result_int(), 200u);
  }
}

TEST_F(TransportTest, StreamedAnswersArriveInOrderAndTheConnectionGoesOn) {
  start();
  auto r = exchange("GET /stream?n=50 HTTP/1.1\r\nHost: h\r\n\r\nGET /echo HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n", 2);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0][bhttp::field::content_type], "text/event-stream");
  EXPECT_EQ(r[0][bhttp::field::cache_control], "no-cache");
  EXPECT_TRUE(r[0].chunked());
  std::string want;
  for (int i = 0; i < 50; ++i) want += "data: " + std::to_string(i) + "\n\n";
  EXPECT_EQ(r[0].body(), want);
  EXPECT_EQ(r[1].body().substr(0, 9), "GET /echo");
}

TEST_F(TransportTest, AnAbortedStreamCutsTheConnectionWithoutItsLastChunk) {
  start();
  const auto [got, ec] = read_until_closed("GET /abort HTTP/1.1\r\nHost: h\r\n\r\n");
  EXPECT_EQ(ec, net::error::eof);
  EXPECT_NE(got.find("data: 1\n\n"), std::string::npos) << got;
  EXPECT_EQ(got.find("\r\n0\r\n\r\n"), std::string::npos) << "the last chunk was sent: " << got;
  for (int i = 0; i < 200 && transport_->connections() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(transport_->connections(), 0u);
}

// A client that stops reading holds the application back (queued_bytes/when_drained) instead of
// letting the answer pile up in memory; once it reads again, everything arrives in order.
TEST_F(TransportTest, BackpressureHoldsAStreamWhileTheClientDoesNotRead) {
  start();
  net::io_context ioc;
  tcp::socket s(ioc);
  s.open(tcp::v4());
  s.set_option(net::socket_base::receive_buffer_size(64 * 1024));
  s.connect(endpoint());
  net::write(s, net::buffer(std::string("GET /bulk HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // not reading
  const std::size_t total = TestApp::kBulkPieces * TestApp::kBulkPiece;
  const std::size_t sent_while_stalled = static_cast<std::size_t>(app_.bulk_sent.load()) * TestApp::kBulkPiece;
  EXPECT_LT(sent_while_stalled, total / 4) << "the application was not held back";
  EXPECT_LE(app_.max_queued.load(), 256 * 1024 + TestApp::kBulkPiece);
  std::size_t body = 0;
  beast::error_code ec;
  std::vector<char> buf(1 << 16);
  for (;;) {
    body += s.read_some(net::buffer(buf), ec);
    if (ec) break;
  }
  EXPECT_GT(body, total);  // all of it, with the chunk framing
  EXPECT_EQ(app_.bulk_sent.load(), TestApp::kBulkPieces);
}

TEST_F(TransportTest, AClientThatLeavesIsReportedAndItsStateReleased) {
  start();
  {
    net::io_context ioc;
    tcp::socket s(ioc);
    s.connect(endpoint());
    net::write(s, net::buffer(std::string("GET /hold HTTP/1.1\r\nHost: h\r\n\r\n")));
    for (int i = 0; i < 200 && app_.held.expired(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    ASSERT_FALSE(app_.held.expired());
  }  // closed
  std::unique_lock lock(app_.mu);
  ASSERT_TRUE(app_.cv.wait_for(lock, std::chrono::seconds(5), [&] { return app_.gone; }));
  EXPECT_FALSE(app_.active_when_gone);
  lock.unlock();
  // The answer ended the exchange: its context goes, though the app still holds the handle.
  bool released = false;
  for (int i = 0; i < 200 && !released; ++i) {
    released = app_.held.expired();
    if (!released) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(released);
  EXPECT_EQ(transport_->connections(), 0u);
}

TEST_F(TransportTest, FailuresTheTransportDetectsAreAnsweredByTheApplication) {
  TransportOptions o;
  o.max_header_bytes = 1024;
  o.max_body_bytes = 100;
  start(o);
  auto big_header = exchange("GET /echo HTTP/1.1\r\nHost: h\r\nX-Big: " + std::string(2000, 'a') + "\r\n\r\n");
  ASSERT_EQ(big_header.size(), 1u);
  EXPECT_EQ(big_header[0].body(), "transport error " + std::to_string(static_cast<int>(TransportError::kHeadersTooLarge)));
  EXPECT_FALSE(big_header[0].keep_alive());
  // A request line and fields each under the limit, together over it, in one write (Beast
  // limits each part alone).
  auto split_header = exchange("GET /echo?" + std::string(700, 'q') + " HTTP/1.1\r\nHost: h\r\nX-Mid: " + std::string(700, 'm') + "\r\n\r\n");
  ASSERT_EQ(split_header.size(), 1u);
  EXPECT_EQ(split_header[0].body(), "transport error " + std::to_string(static_cast<int>(TransportError::kHeadersTooLarge)));
  auto big_body = exchange("POST /echo HTTP/1.1\r\nHost: h\r\nContent-Length: 1000\r\n\r\n" + std::string(1000, 'b'));
  ASSERT_EQ(big_body.size(), 1u);
  EXPECT_EQ(big_body[0].body(), "transport error " + std::to_string(static_cast<int>(TransportError::kBodyTooLarge)));
  auto garbage = exchange("NOT HTTP AT ALL\r\n\r\n");
  ASSERT_EQ(garbage.size(), 1u);
  EXPECT_EQ(garbage[0].body(), "transport error " + std::to_string(static_cast<int>(TransportError::kMalformed)));
  auto slow = exchange("POST /echo HTTP/1.1\r\nHost: h\r\nContent-Length: 50\r\n\r\nhalf");
  ASSERT_EQ(slow.size(), 1u);
  EXPECT_EQ(slow[0].body(), "transport error " + std::to_string(static_cast<int>(TransportError::kRequestTimeout)));
  EXPECT_EQ(app_.handled, 0);
  EXPECT_EQ(app_.errors, 5);
}

// Request smuggling and framing abuse (RFC 9112 sections 6.1-6.3, 7.1): a request whose length
// is ambiguous or whose framing is malformed gets one 400 and the connection closes, so bytes
// after it are never read as a request of their own; nothing reaches the application.
TEST_F(TransportTest, AmbiguousOrMalformedFramingGetsOneBadRequestAndTheClose) {
  start();
  const std::string head = "POST /echo HTTP/1.1\r\nHost: h\r\n";
  const std::string smuggled = "GET /echo HTTP/1.1\r\nHost: h\r\nX-Test: smuggled\r\n\r\n";
  struct Case {
    const char* name;
    std::string bytes;
  };
  const std::vector<Case> cases = {
      {"content-length then chunked", head + "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + smuggled},
      {"chunked then content-length", head + "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n" + smuggled},
      {"two different lengths", head + "Content-Length: 0\r\nContent-Length: 44\r\n\r\n" + smuggled},
      {"a list of lengths", head + "Content-Length: 0, 44\r\n\r\n" + smuggled},
      {"a signed length", head + "Content-Length: +0\r\n\r\n" + smuggled},
      {"a negative length", head + "Content-Length: -1\r\n\r\n" + smuggled},
      {"a hexadecimal length", head + "Content-Length: 0x0\r\n\r\n" + smuggled},
      {"a length past 64 bits", head + "Content-Length: 99999999999999999999999\r\n\r\n" + smuggled},
      {"an empty length", head + "Content-Length: \r\n\r\n" + smuggled},
      {"chunked not last", head + "Transfer-Encoding: chunked, gzip\r\n\r\n0\r\n\r\n" + smuggled},
      {"only gzip", head + "Transfer-Encoding: gzip\r\n\r\n" + smuggled},
      {"an unknown coding", head + "Transfer-Encoding: xchunked\r\n\r\n0\r\n\r\n" + smuggled},
      {"chunked twice", head + "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + smuggled},
      {"space before the colon", head + "Transfer-Encoding : chunked\r\nContent-Length: 0\r\n\r\n0\r\n\r\n" + smuggled},
      {"a folded coding", head + "Content-Length: 0\r\nTransfer-Encoding:\r\n chunked\r\n\r\n0\r\n\r\n" + smuggled},
      {"a chunk size past 64 bits", head + "Transfer-Encoding: chunked\r\n\r\nfffffffffffffffffff\r\nx\r\n0\r\n\r\n" + smuggled},
      {"a chunk size not hex", head + "Transfer-Encoding: chunked\r\n\r\nzz\r\nx\r\n0\r\n\r\n" + smuggled},
      {"a chunk longer than its size", head + "Transfer-Encoding: chunked\r\n\r\n1\r\nxyz\r\n0\r\n\r\n" + smuggled},
      {"a NUL in a header", head + "X-Test: a" + std::string(1, '\0') + "b\r\nContent-Length: 0\r\n\r\n" + smuggled},
      {"a space in a header name", head + "X Test: a\r\nContent-Length: 0\r\n\r\n" + smuggled},
      {"no Host in HTTP/1.1", "POST /echo HTTP/1.1\r\nContent-Length: 0\r\n\r\n" + smuggled},
      {"two Hosts", head + "Host: other\r\nContent-Length: 0\r\n\r\n" + smuggled},
      {"HTTP/2.0 in a request line", "GET /echo HTTP/2.0\r\nHost: h\r\n\r\n" + smuggled},
      {"HTTP/0.9 style", "GET /echo\r\n\r\n" + smuggled},
  };
  for (const auto& c : cases) {
    const int handled = app_.handled;
    auto [got, ec] = read_until_closed(c.bytes);
    EXPECT_TRUE(got.starts_with("HTTP/1.1 400 ")) << c.name << ": " << got.substr(0, 80);
    EXPECT_EQ(got.find("HTTP/1.", 5), std::string::npos) << c.name << ": a second answer";
    EXPECT_EQ(app_.handled, handled) << c.name << ": reached the application";
    EXPECT_TRUE(ec == net::error::eof || ec == net::error::connection_reset) << c.name << ": " << ec.message();
  }
}

// A chunked body's trailer is read and dropped: a field there never becomes a header the
// application sees (it could add one after a proxy checked them).
TEST_F(TransportTest, TrailerFieldsAreNotHeaders) {
  start();
  auto r = exchange("POST /echo HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nbody\r\n0\r\nX-Test: from-trailer\r\nHost: h2\r\n\r\n"
                    "POST /echo HTTP/1.1\r\nHost: h\r\nX-Test: header\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nX-Test: trailer\r\n\r\n",
                    2);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].body(), "POST /echo  body 127.0.0.1");
  EXPECT_EQ(r[1].body(), "POST /echo header ok 127.0.0.1");
}

TEST_F(TransportTest, ConnectionsBeyondTheLimitGetTheApplicationsAnswer) {
  TransportOptions o;
  o.max_connections = 1;
  start(o);
  net::io_context ioc;
  tcp::socket first(ioc);
  first.connect(endpoint());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  auto r = exchange("GET /echo HTTP/1.1\r\nHost: h\r\n\r\n");
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].result_int(), 503u);
  EXPECT_EQ(r[0][bhttp::field::retry_after], "1");
  first.close();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  auto ok = exchange("GET /echo HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n");
  ASSERT_EQ(ok.size(), 1u);
  EXPECT_EQ(ok[0].result_int(), 200u);
}

TEST_F(TransportTest, ShutdownDrainsTheApplicationThenReturnsFromRun) {
  start();
  EXPECT_FALSE(transport_->draining());
  auto inflight = std::async(std::launch::async, [this] { return exchange("GET /later HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"); });
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  transport_->shutdown();
  auto r = inflight.get();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].body(), "later");  // in flight when the drain began: answered
  thread_.join();                   // run() returned
  EXPECT_TRUE(transport_->draining());
  EXPECT_EQ(app_.drained_with, std::chrono::milliseconds(3000));
  transport_.reset();
}

TEST_F(TransportTest, HeadGetsTheLengthButNoBody) {
  start();
  const auto [got, ec] = read_until_closed("HEAD /echo HTTP/1.1\r\nHost: h\r\n\r\nGET /echo HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n");
  // The HEAD answer's head says how long the body would be; the next answer follows it at once.
  const auto second = got.find("HTTP/1.1 200", 1);
  ASSERT_NE(second, std::string::npos) << got;
  const std::string head = got.substr(0, second);
  EXPECT_NE(head.find("Content-Length: 22\r\n"), std::string::npos) << head;  // "HEAD /echo   127.0.0.1"
  EXPECT_TRUE(head.ends_with("\r\n\r\n")) << head;
  EXPECT_NE(got.find("GET /echo"), std::string::npos) << got;
}

TEST_F(TransportTest, AnHttp10StreamIsTheBodyUntilTheClose) {
  start();
  const auto [got, ec] = read_until_closed("GET /stream?n=3 HTTP/1.0\r\n\r\n");
  EXPECT_EQ(ec, net::error::eof);
  EXPECT_TRUE(got.starts_with("HTTP/1.0 200 OK\r\n")) << got;
  EXPECT_EQ(got.find("Transfer-Encoding"), std::string::npos) << got;  // HTTP/1.0 has no chunks
  EXPECT_TRUE(got.ends_with("\r\n\r\ndata: 0\n\ndata: 1\n\ndata: 2\n\n")) << got;
}

// The request that arrives while the application still works on a watched one is read by the
// disconnect watch, kept, and answered after it, in order.
TEST_F(TransportTest, ARequestReadByTheDisconnectWatchIsAnsweredNext) {
  start();
  net::io_context ioc;
  beast::tcp_stream s(ioc);
  s.connect(endpoint());
  s.expires_after(std::chrono::seconds(10));
  net::write(s, net::buffer(std::string("GET /watched-later HTTP/1.1\r\nHost: h\r\n\r\n")));
  std::this_thread::sleep_for(std::chrono::milliseconds(30));  // the application has it, and watches
  net::write(s, net::buffer(std::string("POST /echo HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\nConnection: close\r\n\r\nnext")));
  beast::flat_buffer buf;
  bhttp::response<bhttp::string_body> first, second;
  bhttp::read(s, buf, first);
  bhttp::read(s, buf, second);
  EXPECT_EQ(first.body(), "watched");
  EXPECT_EQ(second.body(), "POST /echo  next 127.0.0.1");
  EXPECT_EQ(app_.handled, 2);
}

TEST_F(TransportTest, HeaderLinesPassAsGivenAndTheFramingIsTheTransports) {
  start();
  auto r = exchange("GET /lines HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n");
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].result_int(), 201u);
  EXPECT_EQ(r[0]["X-A"], "1");
  EXPECT_EQ(r[0]["X-B"], "two");
  EXPECT_EQ(r[0][bhttp::field::server], "custom");     // the application's replaces the transport's
  EXPECT_EQ(r[0][bhttp::field::content_length], "1");  // the transport's, not the application's 99
  EXPECT_EQ(r[0]["X-Bad"], "");                          // a value with CR/LF is dropped
  EXPECT_EQ(r[0]["Injected"], "");
  EXPECT_EQ(r[0].body(), "x");
}

TEST_F(TransportTest, ConnectionsGoRoundTheIoThreads) {
  TransportOptions o;
  o.io_threads = 4;
  start(o);
  std::set<std::string> threads;
  for (int i = 0; i < 8; ++i) {  // one connection each, in turn
    auto r = exchange("GET /thread HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n");
    ASSERT_EQ(r.size(), 1u);
    threads.insert(r[0].body());
  }
  EXPECT_EQ(threads.size(), 4u);
}

TEST(Transport, BadOptionsFailStart) {
  TestApp app;
  TransportOptions o;
  o.host = "not-an-ip";
  EXPECT_EQ(Transport(o, app).start().code(), StatusCode::kInvalidArgument);
  o.host = "127.0.0.1";
  o.ssl_certfile = "/nonexistent/cert.pem";
  EXPECT_EQ(Transport(o, app).start().code(), StatusCode::kInvalidArgument);
  o.ssl_keyfile = "/nonexistent/key.pem";
  EXPECT_EQ(Transport(o, app).start().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace lmserve::server::http
