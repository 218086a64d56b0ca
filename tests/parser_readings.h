// What the HTTP parsers read from a byte string, for their tests and fuzz targets alike: a
// client's requests (server/http/request_parser.h) and a replica's answer
// (gateway/upstream_parser.h), delivered whole or `cut` bytes at a time as the transport and the
// proxy deliver them, so that the plain passes' readings can be compared with Beast's alone. No
// gtest here: the fuzz targets include it too; a broken parser contract aborts.
#pragma once

#include <algorithm>
#include <boost/asio/buffer.hpp>
#include <boost/beast/http/error.hpp>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gateway/upstream_parser.h"
#include "server/http/request_parser.h"

namespace lmserve::testing {

struct RequestReading {
  std::vector<server::http::Request> requests;
  std::vector<bool> keep_alive, plain;  // per request: kept alive, read by the plain pass
  std::vector<unsigned> versions;
  int end = -1;  // -1: the bytes ran out (mid-request or between requests); else the refusal's TransportError
};

// The same requests (method, target, path, headers, body) kept alive alike; versions, plain
// flags and ends are for the caller to compare where it means to.
inline bool same_requests(const RequestReading& a, const RequestReading& b) {
  if (a.requests.size() != b.requests.size() || a.keep_alive != b.keep_alive) return false;
  for (std::size_t i = 0; i < a.requests.size(); ++i) {
    const auto &x = a.requests[i], &y = b.requests[i];
    if (x.method != y.method || x.target != y.target || x.path != y.path || x.headers != y.headers || x.body != y.body) return false;
  }
  return true;
}

// Reads `bytes` delivered `cut` bytes at a time (all at once when cut is 0), as the transport does.
inline RequestReading read_requests(std::string_view bytes, server::http::RequestParser::Reading how, std::size_t cut, std::size_t max_header,
                                    std::size_t max_body) {
  using server::http::RequestParser;
  RequestReading out;
  server::http::Request request;
  std::optional<RequestParser> parser;
  parser.emplace(request, max_header, max_body, how);
  std::string buffer;  // received and not yet taken by the parser
  std::size_t given = 0;
  while (given < bytes.size() || !buffer.empty()) {
    if (given < bytes.size()) {
      const std::size_t n = cut == 0 ? bytes.size() - given : std::min(cut, bytes.size() - given);
      buffer.append(bytes.substr(given, n));
      given += n;
    }
    const auto step = parser->feed(buffer);
    buffer.erase(0, step.used);
    if (step.state == RequestParser::State::kError) {
      out.end = static_cast<int>(step.error);
      return out;
    }
    if (step.state == RequestParser::State::kDone) {
      out.requests.push_back(request);
      out.keep_alive.push_back(parser->keep_alive());
      out.plain.push_back(parser->read_plainly());
      out.versions.push_back(parser->version);
      parser.emplace(request, max_header, max_body, how);
      continue;
    }
    if (given == bytes.size()) break;  // needs more than there is
  }
  return out;
}

struct AnswerReading {
  bool head = false, done = false, plain = false, keep_alive = false;
  int status = 0;
  std::string content_type, retry_after, pass_lines, body;
  std::optional<std::uint64_t> length;
  std::string error;  // the first error but need_more, "" for none
  bool operator==(const AnswerReading&) const = default;
};

// The same reading but for which pass read the head.
inline bool same_but_plain(AnswerReading a, AnswerReading b) {
  a.plain = b.plain = false;
  return a == b;
}

// Reads a replica's answer arriving `cut` bytes at a time (all at once for 0), then the
// connection's end, as the proxy feeds its parser; the body is given up after `give_up_after`
// bytes.
inline AnswerReading read_answer(std::string_view bytes, gateway::UpstreamParser::Reading how, std::size_t cut = 0,
                                 std::size_t give_up_after = SIZE_MAX) {
  AnswerReading out;
  gateway::UpstreamParser parser(
      [&](std::string_view b) {
        out.body.append(b);
        return out.body.size() <= give_up_after;
      },
      how);
  std::string buffer;
  std::size_t given = 0;
  while (!parser.is_done() && out.error.empty()) {
    if (given == bytes.size()) {
      if (parser.is_header_done()) {
        boost::beast::error_code ec;
        parser.put_eof(ec);
        if (ec) out.error = ec.message();
      }
      break;
    }
    const std::size_t n = cut == 0 ? bytes.size() - given : std::min(cut, bytes.size() - given);
    buffer.append(bytes.substr(given, n));
    given += n;
    while (!buffer.empty() && !parser.is_done()) {
      boost::beast::error_code ec;
      const bool had_head = parser.is_header_done();
      const std::size_t used = parser.put(boost::asio::buffer(buffer), ec);
      if (used > buffer.size()) std::abort();
      buffer.erase(0, used);
      if (ec == boost::beast::http::error::need_more) break;
      if (ec) {
        out.error = ec.message();
        break;
      }
      if (!had_head && parser.is_header_done()) {
        out.head = true;
        out.status = parser.status;
        out.plain = parser.read_plainly();
        out.keep_alive = parser.keep_alive();
        if (const auto l = parser.content_length()) out.length = *l;
      }
      if (used == 0) break;
    }
  }
  out.done = parser.is_done();
  out.content_type = parser.content_type;
  out.retry_after = parser.retry_after;
  out.pass_lines = parser.pass_lines;
  return out;
}

}  // namespace lmserve::testing
