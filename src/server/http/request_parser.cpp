#include "server/http/request_parser.h"

#include <algorithm>

namespace lmserve::server::http {

namespace bhttp = boost::beast::http;

RequestParser::RequestParser(Request& r, std::size_t max_header, std::size_t max_body) : r_(r), max_header_(max_header) {
  header_limit(static_cast<std::uint32_t>(std::min<std::size_t>(max_header, UINT32_MAX)));
  body_limit(max_body);
  eager(false);  // put() stops at the header's end: its size is then what was taken
  r_.headers.clear();
  r_.body.clear();
}

RequestParser::Step RequestParser::feed(std::string_view bytes) {
  std::size_t used = 0;
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
  r_.headers.emplace_back(std::string(name.data(), name.size()), std::string(value.data(), value.size()));
}

void RequestParser::on_header_impl(error_code& ec) {
  header_done_ = true;
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
