// text/byte_dfa: a regular expression compiled to a deterministic automaton over UTF-8 bytes,
// for constrained decoding (issue #33): `guided_regex`, a JSON Schema string's `pattern` and
// `format`. A grammar walks it a byte at a time, so a token mask can try any token's bytes.
//
// The syntax is the common subset of ECMA-262 (JSON Schema's dialect) and Python's `re`:
// literals, `.`, classes `[...]` with ranges and negation, `\d \w \s` and their negations,
// `\t \n \r \f \v \0 \xHH \uHHHH` and escaped metacharacters, groups `(...)`, `(?:...)`,
// `(?<name>...)`, alternation, `* + ? {n} {n,} {n,m}` (a lazy `?` after them changes nothing for
// a language). `^` may open and `$` close the pattern. Backreferences, lookaround, word
// boundaries and flags are refused with a message naming them.
//
// Anchoring: guided_regex matches the whole output (Options::anchored). A JSON Schema pattern
// is a search (ECMA `RegExp.test`): unless it opens with `^` any text may come before it, and
// unless it closes with `$` any text may follow.
//
// States that cannot reach an accepting one are removed, so every byte string the automaton
// takes can still be completed: a grammar that follows it never paints itself into a corner.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace lmserve::text {

class ByteDfa {
 public:
  struct Options {
    bool anchored = true;  // false: a search, as a JSON Schema pattern (above)
    // `.` takes a newline too (Python's DOTALL). Off: as in ECMA and Python by default.
    bool dot_all = false;
    int max_states = 4096;  // more: InvalidArgument ("pattern is too complex")
  };
  // InvalidArgument naming what is wrong or unsupported.
  static Result<ByteDfa> compile(std::string_view pattern, Options options);
  static Result<ByteDfa> compile(std::string_view pattern) { return compile(pattern, Options{}); }

  static constexpr std::int32_t kDead = -1;
  std::int32_t start() const { return 0; }
  // The state after byte `b`, or kDead.
  std::int32_t next(std::int32_t state, unsigned char b) const { return next_[static_cast<std::size_t>(state) * 256 + b]; }
  bool accepting(std::int32_t state) const { return accept_[static_cast<std::size_t>(state)] != 0; }
  std::size_t states() const { return accept_.size(); }
  // The fewest characters (UTF-8 sequences) that lead from `state` to an accepting state: a
  // string with a length limit takes a character only if the pattern can still end in time.
  std::uint32_t chars_to_accept(std::int32_t state) const { return to_accept_[static_cast<std::size_t>(state)]; }
  // Whole text matched (from the start state).
  bool matches(std::string_view text) const;

 private:
  std::vector<std::int32_t> next_;  // states x 256
  std::vector<char> accept_;
  std::vector<std::uint32_t> to_accept_;
};

}  // namespace lmserve::text
