// Template source -> tokens (internal to text/jinja): text runs with Jinja2's whitespace rules
// applied (trim_blocks, lstrip_blocks, '-' and '+' markers, newlines normalised, one trailing
// newline dropped), and the tokens inside {{ }} and {% %}.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace lmserve::text::jinja {

enum class Tok { kText, kVarBegin, kVarEnd, kBlockBegin, kBlockEnd, kName, kString, kInt, kFloat, kOp, kEof };

struct Token {
  Tok type;
  std::string value;
  int line, col;
};

// InvalidArgument "template syntax error at line L, column C: msg".
Status syntax_error(int line, int col, const std::string& msg);

Result<std::vector<Token>> lex_template(std::string_view source);

}  // namespace lmserve::text::jinja
