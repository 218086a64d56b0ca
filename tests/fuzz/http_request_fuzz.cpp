// libFuzzer target: any bytes as what a client sends on one connection, read by the transport's
// request parser (server/http/request_parser.h) as the transport reads it: request after
// request (pipelined), until one is refused or the bytes end. The bytes are read twice, whole
// and in pieces cut where the input says; both readings must give the same requests. Every
// request read must keep the parser's promises: body within the limit, path a prefix of the
// target, HTTP/1.0 or 1.1, exactly one Host in HTTP/1.1.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/http/request_parser.h"

namespace {

using lmserve::server::http::Request;
using lmserve::server::http::RequestParser;

struct Reading {
  std::vector<Request> requests;
  std::vector<bool> keep_alive;
  // -1: the bytes ran out (mid-request or between requests); else the TransportError. Not
  // compared: Beast checks a header's syntax and size when it has found the header's end, so a
  // request cut short may be refused at once in one reading and wait for more bytes in the other
  // (which the transport refuses too, at the client's end or the request timeout).
  int end = -1;
  bool operator==(const Reading& o) const {
    if (requests.size() != o.requests.size() || keep_alive != o.keep_alive) return false;
    for (std::size_t i = 0; i < requests.size(); ++i) {
      const auto &a = requests[i], &b = o.requests[i];
      if (a.method != b.method || a.target != b.target || a.path != b.path || a.headers != b.headers || a.body != b.body) return false;
    }
    return true;
  }
};

// Reads `bytes` delivered `cut` at a time (all at once when cut is 0), as the transport does.
Reading read(std::string_view bytes, std::size_t cut, std::size_t max_header, std::size_t max_body,
             RequestParser::Reading how = RequestParser::Reading::kPlainWherePossible) {
  Reading out;
  Request request;
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
      const unsigned version = parser->version;
      if (version != 10 && version != 11) __builtin_trap();
      if (request.body.size() > max_body || request.path.size() > request.target.size() || request.target.compare(0, request.path.size(), request.path) != 0) {
        __builtin_trap();
      }
      int hosts = 0;
      for (const auto& [k, v] : request.headers) hosts += k.size() == 4 && (k[0] | 0x20) == 'h' && (k[1] | 0x20) == 'o' && (k[2] | 0x20) == 's' && (k[3] | 0x20) == 't';
      if (version == 11 ? hosts != 1 : hosts > 1) __builtin_trap();
      out.keep_alive.push_back(parser->keep_alive());
      out.requests.push_back(request);
      parser.emplace(request, max_header, max_body, how);
      continue;
    }
    if (given == bytes.size()) break;  // needs more than there is
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  const std::size_t cut = 1 + data[0] % 32;
  // Small limits now and then, so that the limits' refusals are reached too.
  const std::size_t max_header = data[1] & 1 ? 64 + data[1] * 4 : 16 * 1024;
  const std::size_t max_body = data[1] & 2 ? data[1] : 8 * 1024 * 1024;
  const std::string_view bytes(reinterpret_cast<const char*>(data) + 2, size - 2);
  const Reading whole = read(bytes, 0, max_header, max_body);
  const Reading pieces = read(bytes, cut, max_header, max_body);
  if (!(whole == pieces)) __builtin_trap();
  const Reading beast = read(bytes, 0, max_header, max_body, RequestParser::Reading::kBeastOnly);
  if (!(whole == beast) || whole.end != beast.end) __builtin_trap();
  return 0;
}
