// libFuzzer target: any bytes as the body of /v1/chat/completions (first byte odd) or
// /v1/completions (even), through the OpenAI request decoder that serve runs on every request
// (server/openai.h, parse_request). Bodies that are not JSON stop at the parser, as in serve;
// the decoder must answer every JSON value with a request or an ApiError, never crash or throw.
#include <cstdint>
#include <string_view>

#include <nlohmann/json.hpp>

#include "server/openai.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  auto json = nlohmann::ordered_json::parse(body, nullptr, false);
  if (json.is_discarded()) return 0;
  auto parsed = lmserve::server::parse_request(json, (data[0] & 1) != 0);
  if (!parsed) {
    const auto& e = parsed.error();
    if (e.message.empty()) __builtin_trap();  // every refusal says why
  }
  return 0;
}
