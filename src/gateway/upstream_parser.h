// gateway: a replica's answer as the proxy reads it (proxy.cpp), kept lean: the status and the
// headers the gateway acts on are kept, the others are formatted once into the lines that pass to
// the client, and the body goes to `on_body` as it is parsed (no field container, no body buffer).
//
// Beast's parser reads the answer, except for a plain head that arrived whole with a
// Content-Length or (HTTP/1.1) a Transfer-Encoding of just "chunked" (a status with a body, fields
// as server/http/plain_head.h reads them, no Upgrade or Proxy-Connection, a Connection of just
// "close" or "keep-alive"): that one a plain pass reads, at a fraction of Beast's instructions
// (its field-name lookup). A body of that length is counted off by it; chunks stay Beast's, its
// parser put in their state by a head that says only that they follow.
// `Reading::kBeastOnly` reads every answer with Beast (the tests compare the two).
#pragma once

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/optional.hpp>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace lmserve::gateway {

// Hop-by-hop and framing headers (and Host, Server, Date, Content-Type): the gateway sets its own
// on each side.
bool hop_by_hop(std::string_view name);

class UpstreamParser : private boost::beast::http::basic_parser<false> {
  using Beast = boost::beast::http::basic_parser<false>;
  using error_code = boost::beast::error_code;

 public:
  enum class Reading { kPlainWherePossible, kBeastOnly };
  // `on_body` gets the body's bytes as they are parsed; false gives the answer up (put() then
  // fails with operation_aborted).
  explicit UpstreamParser(std::function<bool(std::string_view)> on_body, Reading reading = Reading::kPlainWherePossible);

  int status = 0;
  std::string content_type, retry_after;
  std::string pass_lines;  // "Name: value\r\n" for each header the client gets as the replica sent it

  // As Beast's: put() takes the head (and stops there) or body bytes (as many as it can), and says
  // how many it used; need_more when the head is not all there. put_eof() where the connection
  // ended.
  std::size_t put(boost::asio::const_buffer bytes, error_code& ec);
  void put_eof(error_code& ec);
  bool is_header_done() const { return plain_ || Beast::is_header_done(); }
  bool is_done() const { return plain_ && !chunks_ ? plain_body_done() : Beast::is_done(); }
  bool keep_alive() const { return plain_ ? plain_keep_alive_ : Beast::keep_alive(); }
  boost::optional<std::uint64_t> content_length() const {
    if (chunks_) return boost::none;
    return plain_ ? boost::optional<std::uint64_t>(length_) : Beast::content_length();
  }
  // Whether the head was read by the plain pass.
  bool read_plainly() const { return plain_; }

 private:
  bool plain_body_done() const { return left_ == 0 && !given_up_; }
  // Reads a whole plain head from `bytes` (above); false, and nothing kept, for anything else.
  bool read_plain(std::string_view bytes, std::size_t& used);
  // A header field as the client gets it (or not), by its name.
  void take_field(std::string_view name, std::string_view value);

  void on_request_impl(boost::beast::http::verb, boost::beast::string_view, boost::beast::string_view, int, error_code& ec) override;
  void on_response_impl(int code, boost::beast::string_view, int, error_code&) override {
    if (!priming_) status = code;
  }
  void on_field_impl(boost::beast::http::field, boost::beast::string_view name, boost::beast::string_view value, error_code&) override;
  void on_header_impl(error_code&) override {}
  void on_body_init_impl(const boost::optional<std::uint64_t>&, error_code&) override {}
  std::size_t on_body_impl(boost::beast::string_view body, error_code& ec) override { return deliver({body.data(), body.size()}, ec); }
  void on_chunk_header_impl(std::uint64_t, boost::beast::string_view, error_code&) override {}
  std::size_t on_chunk_body_impl(std::uint64_t, boost::beast::string_view body, error_code& ec) override {
    return deliver({body.data(), body.size()}, ec);
  }
  void on_finish_impl(error_code&) override {}
  std::size_t deliver(std::string_view body, error_code& ec);

  std::function<bool(std::string_view)> on_body_;
  Reading reading_;
  bool plain_ = false, plain_keep_alive_ = false;
  bool given_up_ = false;  // on_body gave the plain answer up
  bool chunks_ = false;   // a plain head's chunked body, which Beast reads (primed by a head of just that)
  bool priming_ = false;  // Beast reading that head: its status and fields are not the answer's
  std::uint64_t length_ = 0, left_ = 0;  // the plain answer's body: its length, the bytes still to come
};

}  // namespace lmserve::gateway
