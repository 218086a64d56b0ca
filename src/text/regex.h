// A compiled PCRE2 pattern in UTF + UCP mode (so \p{L}, \p{N}, \s and \w are Unicode-aware, as
// in the Oniguruma patterns of Hugging Face tokenizers), JIT-compiled where available.
// Immutable after compile(); find_all may be called from many threads at once.
#pragma once

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace lmserve::text {

class Regex {
 public:
  // InvalidArgument with PCRE2's message and offset if the pattern does not compile.
  static Result<Regex> compile(std::string_view pattern);

  // Non-overlapping matches, left to right, as [begin, end) byte offsets. Empty matches are
  // skipped. `subject` must be valid UTF-8 (the tokenizer guarantees it).
  std::vector<std::pair<std::size_t, std::size_t>> find_all(std::string_view subject) const;
  // The first non-empty match that starts at or after byte `from` (a character boundary), as
  // find_all would give it; find(s, previous->second) walks the same matches without a vector.
  std::optional<std::pair<std::size_t, std::size_t>> find(std::string_view subject, std::size_t from) const;

  const std::string& pattern() const { return pattern_; }
  // Whether a subject of `bytes` bytes is long enough for a match (PCRE2's minimum length): a
  // check before find() that costs no call.
  bool may_match(std::size_t bytes) const { return bytes >= min_bytes_; }

 private:
  struct CodeDeleter {
    void operator()(pcre2_code* c) const { pcre2_code_free(c); }
  };
  std::string pattern_;
  std::shared_ptr<pcre2_code> code_;
  bool jit_ = false;  // JIT-compiled
  std::size_t min_bytes_ = 0;  // no match is shorter (PCRE2's minimum length in characters)
};

// Escapes `literal` so that it matches itself as a pattern.
std::string regex_escape(std::string_view literal);

}  // namespace lmserve::text
