// libFuzzer target: any bytes as a tenant's guard rules and a text (gateway/guard.h): lines
// before the first NUL are rules (a line "d:" + regex is a deny rule, "a:" + regex an allow rule,
// "k:" + phrase a keyword; the first byte's low bit turns the default rules on or off, its next
// bit the injection model off), the rest is what a user says. Rules build or are refused with the
// reason; a text is checked against them, and each normal form keeps its map to the folded bytes.
// Nothing may crash or hang (PCRE2 matches are bounded).
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "gateway/guard.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  using namespace lmserve::gateway;
  const std::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);
  const std::size_t cut = in.find('\0');
  const std::string_view rules = in.substr(0, cut);
  const std::string text(cut == std::string_view::npos ? std::string_view() : in.substr(cut + 1));
  GuardSpec spec;
  spec.default_rules = (data[0] & 1) != 0;
  spec.injection_model = (data[0] & 2) == 0;
  for (std::size_t at = 0; at < rules.size();) {
    const std::size_t end = std::min(rules.find('\n', at), rules.size());
    const std::string_view line = rules.substr(at, end - at);
    at = end + 1;
    if (line.size() < 2 || line[1] != ':') continue;
    const std::string body(line.substr(2));
    if (line[0] == 'd') spec.deny.push_back(body);
    if (line[0] == 'a') spec.allow.push_back(body);
    if (line[0] == 'k' && !body.empty()) spec.keywords.push_back(body);
  }
  const GuardText forms = guard_normalise(text);
  if (forms.to_folded.size() != forms.compact.size()) __builtin_trap();
  for (std::size_t f : forms.to_folded) {
    if (f >= forms.folded.size()) __builtin_trap();
  }
  auto guard = Guard::build(spec);
  if (!guard) {
    if (guard.error().message().empty()) __builtin_trap();
    return 0;
  }
  const std::vector<std::string> texts = {text};
  (void)(*guard)->check(texts);
  return 0;
}
