// libFuzzer target: any bytes as what a client sends on one connection, read by the transport's
// request parser (server/http/request_parser.h) as the transport reads it: request after
// request (pipelined), until one is refused or the bytes end. The bytes are read whole, in
// pieces cut where the input says, and whole by Beast alone (RequestParser::Reading::kBeastOnly);
// all three must give the same requests, and Beast's the same end as the whole reading. Every
// request read must keep the parser's promises: body within the limit, path a prefix of the
// target, HTTP/1.0 or 1.1, exactly one Host in HTTP/1.1.
#include <cstdint>
#include <string_view>

#include "parser_readings.h"
#include "server/http/request_parser.h"

namespace {

using lmserve::server::http::RequestParser;
using lmserve::testing::RequestReading;

// The parser's promises for every request it read.
void check_promises(const RequestReading& r, std::size_t max_body) {
  for (std::size_t i = 0; i < r.requests.size(); ++i) {
    const auto& request = r.requests[i];
    const unsigned version = r.versions[i];
    if (version != 10 && version != 11) __builtin_trap();
    if (request.body.size() > max_body || request.path.size() > request.target.size() || request.target.compare(0, request.path.size(), request.path) != 0) {
      __builtin_trap();
    }
    int hosts = 0;
    for (const auto& [k, v] : request.headers) hosts += k.size() == 4 && (k[0] | 0x20) == 'h' && (k[1] | 0x20) == 'o' && (k[2] | 0x20) == 's' && (k[3] | 0x20) == 't';
    if (version == 11 ? hosts != 1 : hosts > 1) __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  const std::size_t cut = 1 + data[0] % 32;
  // Small limits now and then, so that the limits' refusals are reached too.
  const std::size_t max_header = data[1] & 1 ? 64 + data[1] * 4 : 16 * 1024;
  const std::size_t max_body = data[1] & 2 ? data[1] : 8 * 1024 * 1024;
  const std::string_view bytes(reinterpret_cast<const char*>(data) + 2, size - 2);
  const auto read = [&](std::size_t c, RequestParser::Reading how) {
    RequestReading r = lmserve::testing::read_requests(bytes, how, c, max_header, max_body);
    check_promises(r, max_body);
    return r;
  };
  const RequestReading whole = read(0, RequestParser::Reading::kPlainWherePossible);
  // The ends are not compared here: Beast checks a header's syntax and size when it has found the
  // header's end, so a request cut short may be refused at once in one reading and wait for more
  // bytes in the other (which the transport refuses too, at the client's end or the request timeout).
  if (!lmserve::testing::same_requests(whole, read(cut, RequestParser::Reading::kPlainWherePossible))) __builtin_trap();
  const RequestReading beast = read(0, RequestParser::Reading::kBeastOnly);
  if (!lmserve::testing::same_requests(whole, beast) || whole.end != beast.end) __builtin_trap();
  return 0;
}
