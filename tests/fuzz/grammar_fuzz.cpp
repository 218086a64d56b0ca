// libFuzzer target: any bytes as a JSON Schema, a regular expression or a list of choices (the
// first byte picks which); whatever compiles is then walked with the rest of the input as a
// candidate text, a byte at a time, and with every byte tried at each step. Must never crash or
// hang (a pattern's automaton and a schema's grammar are bounded).
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "text/grammar.h"
#include "text/json_schema.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  using lmserve::text::Grammar;
  const std::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);
  // The spec and the text: split at the first NUL (all of it is the spec without one).
  const std::size_t cut = in.find('\0');
  const std::string spec(in.substr(0, cut));
  const std::string_view text = cut == std::string_view::npos ? std::string_view() : in.substr(cut + 1);
  lmserve::Result<std::shared_ptr<const Grammar>> g = lmserve::error(lmserve::StatusCode::kInvalidArgument, "");
  switch (data[0] % 3) {
    case 0: {
      auto schema = nlohmann::ordered_json::parse(spec, nullptr, false);
      if (schema.is_discarded()) return 0;
      g = lmserve::text::compile_json_schema(schema);
      break;
    }
    case 1:
      g = Grammar::regex(spec);
      break;
    default: {
      std::vector<std::string> choices;
      for (std::size_t at = 0; at <= spec.size();) {
        const std::size_t end = std::min(spec.find('\n', at), spec.size());
        choices.emplace_back(spec.substr(at, end - at));
        at = end + 1;
      }
      g = Grammar::choice(choices);
      break;
    }
  }
  if (!g) return 0;
  lmserve::text::GrammarState s(*g), next(*g);
  for (unsigned char b : text) {
    for (int x = 0; x < 256; ++x) (void)s.advance_into(static_cast<unsigned char>(x), next);
    (void)s.complete();
    (void)s.key(64);
    std::uint32_t room = 0;
    (void)s.plain_string(&room);
    if (!s.advance(b)) break;
  }
  (void)s.finished();
  return 0;
}
