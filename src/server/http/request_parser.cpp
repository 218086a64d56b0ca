#include "server/http/request_parser.h"

#include <algorithm>
#include <cstring>
#include <iterator>

#include "server/http/plain_head.h"

namespace lmserve::server::http {

namespace bhttp = boost::beast::http;

RequestParser::RequestParser(Request& r, std::size_t max_header, std::size_t max_body, Reading reading)
    : r_(r), max_header_(max_header), max_body_(max_body), reading_(reading) {
  header_limit(static_cast<std::uint32_t>(std::min<std::size_t>(max_header, UINT32_MAX)));
  body_limit(max_body);
  eager(false);  // put() stops at the header's end: its size is then what was taken
  r_.body.clear();  // the headers' strings are kept for this request's (add_field)
}

RequestParser::Step RequestParser::feed(std::string_view bytes) {
  std::size_t used = 0;
  if (reading_ == Reading::kPlainWherePossible && taken_ == 0 && !is_done() && read_plain(bytes, used)) {
    return {used, State::kDone, TransportError::kMalformed};
  }
  while (used < bytes.size() && !is_done()) {
    error_code ec;
    const std::size_t n = put(boost::asio::const_buffer(bytes.data() + used, bytes.size() - used), ec);
    used += n;
    taken_ += n;
    if (ec == bhttp::error::need_more) break;
    // Beast limits the request line and the fields each to header_limit, so a whole header
    // could pass at up to twice it when it arrived in one read (and not when in several).
    if (!header_sized_ && !ec && is_header_done()) {
      header_sized_ = true;
      if (taken_ > max_header_) return {used, State::kError, TransportError::kHeadersTooLarge};
    }
    if (ec == bhttp::error::header_limit) return {used, State::kError, TransportError::kHeadersTooLarge};
    if (ec == bhttp::error::body_limit) return {used, State::kError, TransportError::kBodyTooLarge};
    if (ec) return {used, State::kError, TransportError::kMalformed};
    if (n == 0) break;  // no progress without more bytes
  }
  return {used, is_done() ? State::kDone : State::kNeedMore, TransportError::kMalformed};
}

bool RequestParser::read_plain(std::string_view bytes, std::size_t& used) {
  const char* p = bytes.data();
  const char* const end = p + bytes.size();
  // The request line: method SP origin-form SP HTTP/1.x CRLF.
  const char* const method = p;
  while (p < end && kTokenChar[static_cast<unsigned char>(*p)]) ++p;
  if (p == method || p == end || *p != ' ') return false;
  const std::string_view method_v(method, p - method);
  const char* const target = ++p;
  if (p == end || *p != '/') return false;
  p = skip_text(p, end, false);
  const std::string_view target_v(target, p - target);
  if (end - p < 11 || std::memcmp(p, " HTTP/1.", 8) != 0 || (p[8] != '0' && p[8] != '1') || p[9] != '\r' || p[10] != '\n') return false;
  const unsigned v = p[8] == '1' ? 11 : 10;
  p += 11;
  // The fields: Beast's own (Connection, Content-Length, ...) only where plain, and Host counted.
  PlainField fields[32];  // left uninitialised: only the first n are read
  std::size_t n = 0;
  int hosts = 0;
  bool close = false, keep_alive = false, has_length = false;
  std::uint64_t length = 0;
  p = read_plain_fields(p, end, [&](std::string_view name, std::string_view value) {
    if (n == std::size(fields)) return false;
    switch (name.size()) {
      case 4:
        hosts += names(name, "host");
        break;
      case 7:
        if (names(name, "upgrade")) return false;
        break;
      case 10:
        if (names(name, "connection")) {
          if (names(value, "close")) {
            close = true;
          } else if (names(value, "keep-alive")) {
            keep_alive = true;
          } else {
            return false;
          }
        }
        break;
      case 14:
        if (names(name, "content-length")) {
          if (has_length || !read_plain_length(value, length)) return false;
          has_length = true;
        }
        break;
      case 16:
        if (names(name, "proxy-connection")) return false;
        break;
      case 17:
        if (names(name, "transfer-encoding")) return false;
        break;
      default:
        break;
    }
    fields[n++] = {name.data(), value.data(), name.size(), value.size()};
    return true;
  });
  if (p == nullptr) return false;
  const std::size_t header = static_cast<std::size_t>(p - bytes.data());
  if (header > max_header_ || length > max_body_ || static_cast<std::uint64_t>(end - p) < length) return false;
  if (v == 11 ? hosts != 1 : hosts > 1) return false;
  r_.method.assign(method_v);
  r_.target.assign(target_v);
  r_.path.assign(target_v.substr(0, target_v.find('?')));
  for (std::size_t i = 0; i < n; ++i) add_field(fields[i].name_v(), fields[i].value_v());
  r_.headers.resize(n);
  r_.body.assign(p, static_cast<std::size_t>(length));
  version = v;
  plain_keep_alive_ = v == 11 ? !close : keep_alive;
  plain_done_ = true;
  used = header + static_cast<std::size_t>(length);
  return true;
}

void RequestParser::on_request_impl(bhttp::verb, string_view method, string_view target, int v, error_code&) {
  r_.method.assign(method.data(), method.size());
  r_.target.assign(target.data(), target.size());
  r_.path.assign(target.data(), std::min(target.size(), target.find('?')));
  version = static_cast<unsigned>(v);
}

void RequestParser::on_response_impl(int, string_view, int, error_code& ec) { ec = bhttp::error::bad_version; }

void RequestParser::on_field_impl(bhttp::field f, string_view name, string_view value, error_code&) {
  if (header_done_) return;  // a chunked body's trailer: never taken as a header (RFC 9110 6.5.1)
  hosts_ += f == bhttp::field::host;
  transfer_encoding_ = transfer_encoding_ || f == bhttp::field::transfer_encoding;
  add_field({name.data(), name.size()}, {value.data(), value.size()});
}

void RequestParser::add_field(std::string_view name, std::string_view value) {
  if (fields_ < r_.headers.size()) {  // the last request's strings, their room reused
    r_.headers[fields_].first.assign(name);
    r_.headers[fields_].second.assign(value);
  } else {
    r_.headers.emplace_back(name, value);
  }
  ++fields_;
}

void RequestParser::on_header_impl(error_code& ec) {
  header_done_ = true;
  r_.headers.resize(fields_);  // the last request's beyond this one's
  if (transfer_encoding_ && !chunked()) ec = bhttp::error::bad_transfer_encoding;
  if (version == 11 ? hosts_ != 1 : hosts_ > 1) ec = bhttp::error::bad_field;
}

void RequestParser::on_body_init_impl(const boost::optional<std::uint64_t>& length, error_code&) {
  if (length) r_.body.reserve(static_cast<std::size_t>(*length));  // within body_limit: the parser checked
}

std::size_t RequestParser::on_body_impl(string_view body, error_code&) {
  r_.body.append(body.data(), body.size());
  return body.size();
}

std::size_t RequestParser::on_chunk_body_impl(std::uint64_t, string_view body, error_code&) {
  r_.body.append(body.data(), body.size());
  return body.size();
}

}  // namespace lmserve::server::http
