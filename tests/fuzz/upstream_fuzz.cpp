// libFuzzer target: any bytes as a replica's answer on one connection, read by the gateway's
// answer parser (gateway/upstream_parser.h) as the proxy reads it: the head, then the body, from
// what each read brought, then the connection's end. The bytes are read three times: whole, in
// pieces cut where the input says, and whole by Beast alone (UpstreamParser::Reading::kBeastOnly);
// all three must give the same status, kept headers, body, framing and outcome.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "gateway/upstream_parser.h"

namespace {

using lmserve::gateway::UpstreamParser;

struct Reading {
  bool head = false, done = false, keep_alive = false;
  int status = 0;
  std::string content_type, retry_after, pass_lines, body, error;
  std::optional<std::uint64_t> length;
  bool operator==(const Reading&) const = default;
};

Reading read(std::string_view bytes, std::size_t cut, std::size_t give_up_after, UpstreamParser::Reading how) {
  Reading out;
  UpstreamParser parser(
      [&](std::string_view b) {
        out.body.append(b);
        return out.body.size() <= give_up_after;
      },
      how);
  std::string buffer;
  std::size_t given = 0;
  while (!parser.is_done()) {
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
      if (used > buffer.size()) __builtin_trap();
      buffer.erase(0, used);
      if (ec == boost::beast::http::error::need_more) break;
      if (ec) {
        out.error = ec.message();
        given = bytes.size();
        break;
      }
      if (!had_head && parser.is_header_done()) {
        out.head = true;
        out.status = parser.status;
        out.keep_alive = parser.keep_alive();
        if (const auto l = parser.content_length()) out.length = *l;
      }
      if (used == 0) break;
    }
    if (!out.error.empty()) break;
  }
  out.done = parser.is_done();
  out.content_type = parser.content_type;
  out.retry_after = parser.retry_after;
  out.pass_lines = parser.pass_lines;
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  const std::size_t cut = 1 + data[0] % 32;
  const std::size_t give_up_after = data[1] & 1 ? data[1] : SIZE_MAX;  // now and then the call gives the answer up
  const std::string_view bytes(reinterpret_cast<const char*>(data) + 2, size - 2);
  const Reading whole = read(bytes, 0, give_up_after, UpstreamParser::Reading::kPlainWherePossible);
  const Reading beast = read(bytes, 0, give_up_after, UpstreamParser::Reading::kBeastOnly);
  if (!(whole == beast)) __builtin_trap();
  // In pieces a head is Beast's from its start (the plain pass wants it whole): the same answer.
  const Reading pieces = read(bytes, cut, give_up_after, UpstreamParser::Reading::kPlainWherePossible);
  const Reading beast_pieces = read(bytes, cut, give_up_after, UpstreamParser::Reading::kBeastOnly);
  if (!(pieces == beast_pieces)) __builtin_trap();
  return 0;
}
