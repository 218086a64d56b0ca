// A blocking HTTP/1.1 client for the gateway's tests: one keep-alive connection, reopened after
// a failure; and a helper that runs many requests over several such clients at once.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace lmserve::testing {

struct Reply {
  int status = 0;  // 0: no answer (connection failed)
  std::string body;
  std::map<std::string, std::string> headers;  // names in lower case
  std::string header(const std::string& name) const {
    auto it = headers.find(name);
    return it == headers.end() ? "" : it->second;
  }
};

struct Call {
  std::string method = "POST", path = "/v1/completions", body;
  std::vector<std::pair<std::string, std::string>> headers;
};

class Client {
 public:
  explicit Client(int port) : port_(port) {}

  Reply send(const Call& c) {
    namespace http = boost::beast::http;
    for (int attempt = 0; attempt < 2; ++attempt) {
      try {
        if (!stream_) {
          stream_.emplace(io_);
          stream_->connect(boost::asio::ip::tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port_)));
        }
        http::request<http::string_body> req(http::string_to_verb(c.method), c.path, 11);
        req.set(http::field::host, "gw");
        if (!c.body.empty()) req.set(http::field::content_type, "application/json");
        for (const auto& [k, v] : c.headers) req.set(k, v);
        req.body() = c.body;
        req.prepare_payload();
        http::write(*stream_, req);
        http::response_parser<http::string_body> p;
        p.body_limit(64 << 20);
        http::read(*stream_, buf_, p);
        Reply r;
        r.status = static_cast<int>(p.get().result_int());
        r.body = std::move(p.get().body());
        for (const auto& f : p.get()) {
          std::string k(f.name_string());
          for (auto& ch : k) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
          r.headers[k] = std::string(f.value());
        }
        if (!p.get().keep_alive()) reset();
        return r;
      } catch (const std::exception&) {
        reset();
      }
    }
    return {};
  }

  void reset() {
    stream_.reset();
    buf_.clear();
  }

 private:
  int port_;
  boost::asio::io_context io_;
  std::optional<boost::beast::tcp_stream> stream_;
  boost::beast::flat_buffer buf_;
};

// Sends `bytes` on a new connection to the loopback `port` and reads until the server closes it
// (or 10 s pass): everything it wrote.
inline std::string raw_until_closed(int port, const std::string& bytes) {
  namespace net = boost::asio;
  net::io_context io;
  boost::beast::tcp_stream s(io);
  s.connect(net::ip::tcp::endpoint(net::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)));
  s.expires_after(std::chrono::seconds(10));
  net::write(s.socket(), net::buffer(bytes));
  std::string got;
  char buf[4096];
  for (;;) {
    boost::beast::error_code ec;
    const std::size_t n = s.read_some(net::buffer(buf), ec);
    got.append(buf, n);
    if (ec) break;
  }
  return got;
}

// A loopback port nothing listens on (bound and released at once).
inline int unused_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// Sends calls 0..n-1 (made by make(i)) over `clients` connections at once; replies in order.
inline std::vector<Reply> run_calls(int port, int n, int clients, const std::function<Call(int)>& make) {
  std::vector<Reply> out(static_cast<std::size_t>(n));
  std::atomic<int> next{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < clients; ++t) {
    ts.emplace_back([&] {
      Client c(port);
      for (int i = next++; i < n; i = next++) out[static_cast<std::size_t>(i)] = c.send(make(i));
    });
  }
  for (auto& t : ts) t.join();
  return out;
}

inline std::string completion(bool stream = false, const std::string& user = "", const std::string& model = "m") {
  std::string body = R"({"model":")" + model + R"(","prompt":"hello","max_tokens":2)";
  if (stream) body += R"(,"stream":true)";
  if (!user.empty()) body += R"(,"user":")" + user + "\"";
  return body + "}";
}

}  // namespace lmserve::testing
