// text/json_prefix: JSON text (RFC 8259) recognised a byte at a time — the grammar behind
// `response_format: {"type": "json_object"}` (issue #33). It answers, for the text generated so
// far, whether one more byte still leaves a prefix of some JSON value (an object at the top level
// for json_object) and whether the text is already a whole one. Strings must be valid UTF-8.
//
// The state is a few bytes and a small stack of open containers, copied freely: a token mask
// tries each token's bytes on a copy (the vocabulary walk lives with the masks). Whitespace
// between tokens is limited (`max_space_run` in a row), so that a constrained model cannot fill
// its budget with spaces; depth is limited by `max_depth`.
#pragma once

#include <cstdint>
#include <string_view>

namespace lmserve::text {

class JsonPrefix {
 public:
  struct Options {
    bool object_only = true;  // the top-level value must be an object (json_object)
    int max_depth = 32;  // at most 64
    int max_space_run = 8;  // whitespace bytes in a row outside strings
  };
  JsonPrefix() : JsonPrefix(Options{}) {}
  explicit JsonPrefix(Options options) : opt_(options) {}

  // False when no JSON value begins with the text so far followed by `b`; the state is then
  // unchanged.
  bool advance(unsigned char b);
  // All of `bytes` or nothing (the state is unchanged on false).
  bool advance(std::string_view bytes);
  // The text so far is a whole value (followed by whitespace at most).
  bool complete() const;
  // Everything the next bytes' fate depends on, packed: equal keys take and refuse the same
  // bytes (a mask made for one state holds for every state of the same key).
  struct Key {
    std::uint64_t stack, rest;
    bool operator==(const Key&) const = default;
  };
  Key key() const;

 private:
  enum class Mode : std::uint8_t {
    kValue,      // a value next (the top level, after ':' or ',' in an array)
    kObjFirst,   // after '{': a key or '}'
    kObjKey,     // after ',' in an object: a key
    kColon,      // after a key
    kObjNext,    // after a member's value: ',' or '}'
    kArrFirst,   // after '[': a value or ']'
    kArrNext,    // after an element: ',' or ']'
    kString,     // inside a string (a key when key_ is set)
    kEscape,     // after '\'
    kHex,        // in \uXXXX (hex_left_ digits to go)
    kNumMinus,   // after '-'
    kNumZero,    // a leading 0
    kNumInt,     // integer digits
    kNumDot,     // after '.'
    kNumFrac,    // fraction digits
    kNumE,       // after 'e'
    kNumESign,   // after 'e+' / 'e-'
    kNumExp,     // exponent digits
    kLiteral,    // true / false / null, lit_ and lit_pos_
    kDone,       // a whole top-level value: whitespace only
  };
  bool step(unsigned char b);
  bool value_start(unsigned char b);
  bool string_byte(unsigned char b);
  void value_done();
  bool space(unsigned char b);

  Options opt_;
  Mode mode_ = Mode::kValue;
  // The open containers, innermost at bit depth_ - 1: 1 = object, 0 = array.
  std::uint64_t stack_ = 0;
  std::uint8_t depth_ = 0;
  bool top_is_object() const { return (stack_ >> (depth_ - 1)) & 1; }
  bool key_ = false;          // the string being read is a key
  std::uint8_t hex_left_ = 0;
  std::uint8_t utf8_left_ = 0;               // continuation bytes still due
  std::uint8_t utf8_lo_ = 0x80, utf8_hi_ = 0xBF;  // the range of the next continuation byte
  std::uint8_t lit_ = 0, lit_pos_ = 0;
  std::uint8_t spaces_ = 0;
};

}  // namespace lmserve::text
