// libFuzzer target: any bytes as a replica's answer on one connection, read by the gateway's
// answer parser (gateway/upstream_parser.h) as the proxy reads it: the head, then the body, from
// what each read brought, then the connection's end. The bytes are read whole and in pieces cut
// where the input says, each by default and by Beast alone (UpstreamParser::Reading::kBeastOnly);
// each pair must give the same status, kept headers, body, framing and outcome.
#include <cstdint>
#include <string_view>

#include "gateway/upstream_parser.h"
#include "parser_readings.h"

using lmserve::gateway::UpstreamParser;
using lmserve::testing::AnswerReading;
using lmserve::testing::read_answer;
using lmserve::testing::same_but_plain;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  const std::size_t cut = 1 + data[0] % 32;
  const std::size_t give_up_after = data[1] & 1 ? data[1] : SIZE_MAX;  // now and then the call gives the answer up
  const std::string_view bytes(reinterpret_cast<const char*>(data) + 2, size - 2);
  const AnswerReading whole = read_answer(bytes, UpstreamParser::Reading::kPlainWherePossible, 0, give_up_after);
  const AnswerReading beast = read_answer(bytes, UpstreamParser::Reading::kBeastOnly, 0, give_up_after);
  if (!same_but_plain(whole, beast)) __builtin_trap();
  // In pieces a head is Beast's from its start (the plain pass wants it whole): the same answer.
  const AnswerReading pieces = read_answer(bytes, UpstreamParser::Reading::kPlainWherePossible, cut, give_up_after);
  const AnswerReading beast_pieces = read_answer(bytes, UpstreamParser::Reading::kBeastOnly, cut, give_up_after);
  if (!same_but_plain(pieces, beast_pieces)) __builtin_trap();
  return 0;
}
