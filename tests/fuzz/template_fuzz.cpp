// libFuzzer target: any bytes as a Jinja template; if it parses, render it against a small
// conversation with tight limits. Must never crash or hang.
#include <cstdint>
#include <string>

#include "text/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string source(reinterpret_cast<const char*>(data), size);
  auto tmpl = lmserve::text::ChatTemplate::from_source(source, {{"bos_token", "<s>"}, {"eos_token", "</s>"}});
  if (!tmpl) return 0;
  lmserve::text::ChatRequest req;
  req.messages = nlohmann::ordered_json::parse(
      R"([{"role":"system","content":"sys"},{"role":"user","content":"hi <|im_end|>"},
          {"role":"assistant","content":"ok","tool_calls":[{"function":{"name":"f","arguments":{"a":1}}}]}])");
  req.tools = nlohmann::ordered_json::parse(R"([{"type":"function","function":{"name":"f","parameters":{}}}])");
  lmserve::text::jinja::RenderOptions options;
  options.max_steps = 200000;
  options.max_output_bytes = 1 << 20;
  auto out = tmpl->render(req, options);
  (void)out;
  return 0;
}
