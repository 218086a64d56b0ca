// Template source -> syntax tree, with Jinja2's whitespace rules as transformers configures
// them (trim_blocks, lstrip_blocks, newlines normalised, one trailing newline dropped).
#pragma once

#include <string_view>

#include "common/status.h"
#include "text/jinja/ast.h"

namespace lmserve::text::jinja {

// InvalidArgument "line L, column C: ..." on syntax errors. Nesting deeper than 256 levels
// is an error, so hostile input cannot exhaust the stack.
Result<Body> parse_template(std::string_view source);

}  // namespace lmserve::text::jinja
