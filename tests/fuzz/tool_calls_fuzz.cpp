// libFuzzer target: any bytes as a model's output, read for tool calls by each parser
// (server/tool_calls.h) whole and as a stream cut where the input says. The streamed calls'
// pieces must add up to what the whole reading found when the stream calls itself well formed;
// nothing may crash.
#include <cstdint>
#include <set>
#include <string>
#include <string_view>

#include "server/tool_calls.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  using namespace lmserve::server;
  const ToolParser parsers[] = {*tool_parser_named("hermes"), *tool_parser_named("llama3_json"), *tool_parser_named("mistral")};
  const ToolParser parser = parsers[data[0] % 3];
  const std::size_t cut_every = 1 + data[1] % 16;
  const std::string_view text(reinterpret_cast<const char*>(data) + 2, size - 2);
  const ParsedToolOutput whole = parse_tool_calls(parser, text);
  ToolCallStream stream(parser);
  std::string content, args;
  std::set<int> calls;
  auto take = [&](const ToolStreamDelta& d) {
    content += d.content;
    for (const auto& c : d.calls) {
      calls.insert(c.index);
      args += c.arguments;
    }
  };
  for (std::size_t at = 0; at < text.size(); at += cut_every) take(stream.feed(text.substr(at, cut_every)));
  take(stream.finish());
  if (stream.well_formed() && !whole.calls.empty()) {
    std::string whole_args;
    for (const auto& c : whole.calls) whole_args += c.arguments;
    if (calls.size() != whole.calls.size() || args != whole_args) __builtin_trap();
  }
  return 0;
}
