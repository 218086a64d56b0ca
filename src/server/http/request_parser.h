// server/http: one HTTP/1.x request read from its bytes as they arrive, straight into a Request
// (no field container between). The transport (transport.cpp) feeds it what a connection
// reads; the HTTP fuzz target (tests/fuzz/http_request_fuzz.cpp) feeds it anything.
//
// Beast's parser does the syntax (RFC 9112) and refuses Content-Length beside chunked and
// conflicting lengths; this one adds what Beast lets through and a server must refuse: a
// Transfer-Encoding whose last coding is not chunked (its length cannot be known, and reading it
// as empty would make its body the next request: smuggling), and an HTTP/1.1 request without
// exactly one Host. A chunked body's trailer fields are dropped: a client could otherwise add
// headers (an Authorization, a lane) after the ones a proxy checked.
//
// A request that is all there and plain (an origin-form target of printable ASCII, HTTP/1.0 or
// 1.1, fields of printable ASCII without folding, at most one Content-Length of digits, no
// Transfer-Encoding, Upgrade or Proxy-Connection, a Connection of just "close" or "keep-alive",
// within the limits, the Host rule kept) is read by a plain pass instead, at about half Beast's
// instructions; anything else goes to Beast as it arrived. So the plain pass only ever takes a
// request Beast takes, and reads it as Beast does (`Reading::kBeastOnly` reads every request with
// Beast: the fuzz target and the tests compare the two).
#pragma once

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cstddef>
#include <string_view>

#include "server/http/transport.h"

namespace lmserve::server::http {

class RequestParser : private boost::beast::http::basic_parser<true> {
  using Beast = boost::beast::http::basic_parser<true>;

 public:
  enum class Reading { kPlainWherePossible, kBeastOnly };
  // Fills `r`, whose headers are this request's once its head is read (until then they may be
  // the last request's: their strings' room is reused); refuses more than `max_header` bytes of
  // request line and headers and more than `max_body` bytes of body.
  RequestParser(Request& r, std::size_t max_header, std::size_t max_body, Reading reading = Reading::kPlainWherePossible);

  enum class State { kNeedMore, kDone, kError };
  struct Step {
    std::size_t used;  // bytes of the input taken: the caller drops them and keeps the rest
    State state;
    TransportError error;  // with kError: kHeadersTooLarge, kBodyTooLarge or kMalformed
  };
  // Parses what it can of `bytes`. kNeedMore: give the rest (what was not used) again with more
  // bytes after it. kDone: the request is complete; bytes after `used` are the next request's.
  Step feed(std::string_view bytes);

  unsigned version = 11;  // 10 or 11, once the request line is read
  bool is_done() const { return plain_done_ || Beast::is_done(); }
  bool got_some() const { return plain_done_ || Beast::got_some(); }
  // Whether the connection stays open after this request (once it is done).
  bool keep_alive() const { return plain_done_ ? plain_keep_alive_ : Beast::keep_alive(); }
  // Whether the request was read by the plain pass.
  bool read_plainly() const { return plain_done_; }

 private:
  // Reads `bytes` as one whole plain request (above); false, and `r_` as it was, for anything else.
  bool read_plain(std::string_view bytes, std::size_t& used);
  void add_field(std::string_view name, std::string_view value);  // the next of r_.headers

  using string_view = boost::beast::string_view;
  using error_code = boost::beast::error_code;
  void on_request_impl(boost::beast::http::verb, string_view method, string_view target, int v, error_code&) override;
  void on_response_impl(int, string_view, int, error_code& ec) override;
  void on_field_impl(boost::beast::http::field f, string_view name, string_view value, error_code&) override;
  void on_header_impl(error_code& ec) override;
  void on_body_init_impl(const boost::optional<std::uint64_t>& length, error_code&) override;
  std::size_t on_body_impl(string_view body, error_code&) override;
  void on_chunk_header_impl(std::uint64_t, string_view, error_code&) override {}
  std::size_t on_chunk_body_impl(std::uint64_t, string_view body, error_code&) override;
  void on_finish_impl(error_code&) override {}

  Request& r_;
  std::size_t max_header_, max_body_, taken_ = 0;  // taken_: bytes put() has taken so far
  std::size_t fields_ = 0;                         // r_.headers of this request so far
  bool header_sized_ = false;
  int hosts_ = 0;
  bool transfer_encoding_ = false, header_done_ = false;
  Reading reading_;
  bool plain_done_ = false, plain_keep_alive_ = false;
};

}  // namespace lmserve::server::http
