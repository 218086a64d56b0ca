#include "gateway/upstream_parser.h"

#include <boost/asio/error.hpp>
#include <cstring>
#include <iterator>

#include "server/http/plain_head.h"

namespace lmserve::gateway {

namespace bhttp = boost::beast::http;
using server::http::names;
using server::http::PlainField;
using server::http::read_plain_length;
using namespace std::string_view_literals;

UpstreamParser::UpstreamParser(std::function<bool(std::string_view)> on_body, Reading reading)
    : on_body_(std::move(on_body)), reading_(reading) {
  body_limit(boost::none);
}

std::size_t UpstreamParser::put(boost::asio::const_buffer bytes, error_code& ec) {
  ec = {};
  const std::string_view in(static_cast<const char*>(bytes.data()), bytes.size());
  if (plain_ && !chunks_) {  // the body, counted off by its length
    const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(left_, in.size()));
    if (n == 0) return 0;
    left_ -= n;
    deliver(in.substr(0, n), ec);
    given_up_ = given_up_ || static_cast<bool>(ec);  // as Beast: never complete after that
    return n;
  }
  // Past the head, Beast takes all it can in one put (eager): the head stops a put, so that the
  // caller acts on it before any of the body arrives.
  if (Beast::is_header_done() && !Beast::eager()) Beast::eager(true);
  if (chunks_) return Beast::put(bytes, ec);
  // The plain pass only where Beast has seen nothing: a head that came in pieces is Beast's (and
  // its parser must start from the start to be put in the chunks' state).
  std::size_t used = 0;
  if (reading_ == Reading::kPlainWherePossible && !Beast::got_some() && read_plain(in, used)) return used;
  return Beast::put(bytes, ec);
}

void UpstreamParser::put_eof(error_code& ec) {
  if (!plain_ || chunks_) return Beast::put_eof(ec);
  ec = plain_body_done() ? error_code{} : error_code(bhttp::error::partial_message);
}

bool UpstreamParser::read_plain(std::string_view bytes, std::size_t& used) {
  // The status line: HTTP/1.x SP 3DIGIT SP reason CRLF, for a status with a body.
  const char* p = bytes.data();
  const char* const end = p + bytes.size();
  if (end - p < 13 || std::memcmp(p, "HTTP/1.", 7) != 0 || (p[7] != '0' && p[7] != '1') || p[8] != ' ') return false;
  int code = 0;
  for (int i = 9; i < 12; ++i) {
    if (p[i] < '0' || p[i] > '9') return false;
    code = code * 10 + (p[i] - '0');
  }
  if (p[12] != ' ' || code < 200 || code == 204 || code == 304) return false;
  const bool http11 = p[7] == '1';
  p = server::http::skip_text(p + 13, end, true);
  if (end - p < 2 || p[0] != '\r' || p[1] != '\n') return false;
  p += 2;
  // The fields: Beast's own (Connection, Content-Length, ...) only where plain; a Content-Length
  // needed. Nothing is kept until the head has proved plain.
  PlainField fields[32];  // left uninitialised: only the first n are read
  std::size_t n = 0;
  bool close = false, keep_alive = false, has_length = false, chunked = false;
  std::uint64_t length = 0;
  p = server::http::read_plain_fields(p, end, [&](std::string_view name, std::string_view value) {
    if (n == std::size(fields) || names(name, "upgrade") || names(name, "proxy-connection")) return false;
    if (names(name, "transfer-encoding")) {  // just "chunked", once, in HTTP/1.1
      if (chunked || !http11 || !names(value, "chunked")) return false;
      chunked = true;
    } else if (names(name, "connection")) {
      close = close || names(value, "close");
      keep_alive = keep_alive || names(value, "keep-alive");
      if (!names(value, "close") && !names(value, "keep-alive")) return false;
    } else if (names(name, "content-length")) {
      if (has_length || !read_plain_length(value, length)) return false;
      has_length = true;
    }
    fields[n++] = {name.data(), value.data(), name.size(), value.size()};
    return true;
  });
  if (p == nullptr || has_length == chunked) return false;  // a length or chunks, not both
  for (std::size_t i = 0; i < n; ++i) take_field(fields[i].name_v(), fields[i].value_v());
  status = code;
  plain_ = true;
  plain_keep_alive_ = http11 ? !close : keep_alive;
  length_ = left_ = length;
  used = static_cast<std::size_t>(p - bytes.data());
  if (chunked) {
    // The chunks are Beast's: its parser is put in their state by the head that says only that
    // (its fields and status are not taken: priming_).
    static constexpr std::string_view kChunkedHead = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
    priming_ = true;
    error_code ec;  // none: the head is Beast's to take whole (upstream_parser_test reads chunks through it)
    Beast::put(boost::asio::buffer(kChunkedHead.data(), kChunkedHead.size()), ec);
    priming_ = false;
    chunks_ = true;
  }
  return true;
}

bool hop_by_hop(std::string_view name) {
  switch (name.size()) {  // by length first: most names are none of these
    case 2:
      return names(name, "te");
    case 4:
      return names(name, "host") || names(name, "date");
    case 6:
      return names(name, "server");
    case 7:
      return names(name, "trailer") || names(name, "upgrade");
    case 10:
      return names(name, "connection") || names(name, "keep-alive");
    case 12:
      return names(name, "content-type");
    case 14:
      return names(name, "content-length");
    case 16:
      return names(name, "proxy-connection");
    case 17:
      return names(name, "transfer-encoding");
    case 18:
      return names(name, "proxy-authenticate");
    case 19:
      return names(name, "proxy-authorization");
    default:
      return false;
  }
}

void UpstreamParser::take_field(std::string_view name, std::string_view value) {
  if (names(name, "content-type")) {
    content_type.assign(value);
    return;
  }
  if (names(name, "retry-after")) retry_after.assign(value);
  if (hop_by_hop(name)) return;
  pass_lines.append(name).append(": "sv).append(value).append("\r\n"sv);
}

void UpstreamParser::on_request_impl(bhttp::verb, boost::beast::string_view, boost::beast::string_view, int, error_code& ec) {
  ec = bhttp::error::bad_method;
}

void UpstreamParser::on_field_impl(bhttp::field, boost::beast::string_view name, boost::beast::string_view value, error_code&) {
  if (!priming_) take_field({name.data(), name.size()}, {value.data(), value.size()});
}

std::size_t UpstreamParser::deliver(std::string_view body, error_code& ec) {
  if (!on_body_(body)) ec = boost::asio::error::operation_aborted;  // the call gave up on this attempt
  return body.size();
}

}  // namespace lmserve::gateway
