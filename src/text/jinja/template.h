// lmserve's Jinja2 interpreter: the subset of Jinja2 that Hugging Face chat templates use,
// rendering byte-identically to jinja2 as transformers configures it
// (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, tojson as
// json.dumps(ensure_ascii=False), raise_exception, strftime_now).
//
// Supported: text, {{ }}, {# #}, whitespace control (- and +); if/elif/else, for (loop.*,
// else, `if` filter, tuple targets), set (names, tuples, namespace attributes, block set),
// macros and calls, filter blocks, break/continue, raw, generation (transformers); literals,
// lists, dicts, tuples, attribute/subscript/slice access, calls with keyword arguments,
// filters, tests, `not`/`and`/`or`, comparisons, `in`/`not in`, arithmetic, `~`, inline if.
// Mutating methods (list.append, dict.update) raise, as in the immutable sandbox.
//
// Limits: rendering stops with ResourceExhausted after `max_steps` evaluation steps or
// `max_output_bytes` of output, so no template or input can hang or exhaust memory.
// A parsed Template is immutable and may be rendered from many threads at once.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"
#include "text/jinja/value.h"

namespace lmserve::text::jinja {

struct Node;

struct RenderOptions {
  // strftime_now's clock (local time of the server, as Python's datetime.now()).
  std::function<std::chrono::system_clock::time_point()> now = [] { return std::chrono::system_clock::now(); };
  std::size_t max_steps = 20'000'000;
  std::size_t max_output_bytes = 64u << 20;
};

class Template {
 public:
  // InvalidArgument "template syntax error at line L, column C: ..." for bad syntax.
  static Result<Template> parse(std::string_view source);

  // Renders with `variables` as the template's globals. Errors: InvalidArgument for template
  // runtime errors (undefined attribute access, type errors) and for raise_exception(msg),
  // whose message is kept verbatim after "raise_exception: "; ResourceExhausted for limits.
  Result<Str> render(const std::vector<std::pair<std::string, Value>>& variables, const RenderOptions& options = {}) const;

 private:
  std::shared_ptr<const std::vector<std::unique_ptr<Node>>> body_;
};

}  // namespace lmserve::text::jinja
