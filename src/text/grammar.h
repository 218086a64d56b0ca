// text/grammar: the grammars of constrained decoding (issue #33) — a JSON Schema, any JSON
// object, a regular expression, a list of choices, a tool call's text — as one graph of nodes,
// and GrammarState, which follows a text through it a byte at a time.
//
// A node is a JSON object (named properties in order, or free keys), an array (an item node,
// min/max items), a string (min/max length, a ByteDfa over its decoded characters), a number
// (integer or not, bounds), any JSON value, a set of literal byte strings (enum, const, true,
// false, null, choices), a raw ByteDfa (guided_regex), a sequence, an alternative or a
// repetition. The state is a small set of threads (alternatives still open: anyOf branches
// that read the same so far), each a stack of frames; a frame is 16 bytes, so trying a byte on
// a copy of the state — what a token mask does for every node of the vocabulary trie — costs a
// few dozen bytes of copying.
//
// Guarantees: every text the state takes is a prefix of a text of the grammar (no byte is
// taken that leads nowhere, within the depth and whitespace limits), and complete() says when
// the text so far is a whole one. Whitespace between JSON tokens is allowed in runs of at most
// Limits::max_space_run bytes; nesting is limited by Limits::max_depth.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "text/byte_dfa.h"

namespace lmserve::text {

struct GrammarNode {
  enum class Kind : std::uint8_t { kAny, kObject, kArray, kString, kNumber, kLiterals, kRegex, kSeq, kAlt, kRepeat };
  Kind kind = Kind::kAny;
  // kAny: only an object may start it (json_object's top level).
  bool object_only = false;
  // kObject: named properties in the order they are written (an optional one may be left out);
  // without any, free keys whose values are `extra` (kAny when it is -1).
  struct Property {
    std::string key;  // the JSON text of the name, quotes included
    std::int32_t value = -1;
    bool required = true;
  };
  std::vector<Property> properties;
  std::vector<std::uint32_t> next_required;  // per index i: the first required property at or after i
  std::int32_t extra = -1;
  // kArray: item; kRepeat: item (and separator, -1 for none) between min and max times.
  std::int32_t item = -1, separator = -1;
  std::uint32_t min = 0, max = UINT32_MAX;  // kString: length in characters; kArray/kRepeat: items
  // kString / kRegex: the automaton, an index into Grammar::dfas (-1: none).
  std::int32_t dfa = -1;
  // kNumber.
  bool integer = false, has_lo = false, has_hi = false, lo_exclusive = false, hi_exclusive = false;
  double lo = 0, hi = 0;
  // kLiterals: sorted, unique, non-empty byte strings.
  std::vector<std::string> literals;
  // kSeq, kAlt.
  std::vector<std::int32_t> children;
  bool nullable = false;  // takes the empty text (kRepeat of min 0, kSeq of nullables, ...)
};

class Grammar {
 public:
  struct Limits {
    int max_depth = 24;       // frames per thread (nested values)
    int max_space_run = 6;    // whitespace bytes in a row between JSON tokens (a model that pads wastes little)
  };
  std::vector<GrammarNode> nodes;
  std::vector<ByteDfa> dfas;
  std::int32_t root = -1;
  Limits limits;
  // The nodes kAny turns into at its first byte (made by finish() where needed).
  std::int32_t any_value = -1, any_object = -1, any_array = -1, any_string = -1, any_number = -1, any_literal = -1;

  std::int32_t add(GrammarNode n) {
    nodes.push_back(std::move(n));
    return static_cast<std::int32_t>(nodes.size()) - 1;
  }
  // Computes the derived fields (next_required, nullable); call once the nodes are all added.
  // InvalidArgument when the grammar is larger than its states can address (65,535 nodes;
  // literals and keys of 65,535 bytes).
  Status finish();

  // Ready-made grammars.
  static std::shared_ptr<const Grammar> json_object();
  // A whole-output regular expression (vLLM's guided_regex); InvalidArgument from ByteDfa.
  static Result<std::shared_ptr<const Grammar>> regex(std::string_view pattern);
  // Exactly one of `choices` (vLLM's guided_choice); InvalidArgument when empty or one is "".
  static Result<std::shared_ptr<const Grammar>> choice(const std::vector<std::string>& choices);
};

class GrammarState {
 public:
  explicit GrammarState(std::shared_ptr<const Grammar> grammar);
  GrammarState(const GrammarState& o) { copy_from(o); }
  GrammarState& operator=(const GrammarState& o) {
    if (this != &o) copy_from(o);
    return *this;
  }

  // False when no text of the grammar begins with the text so far and `b`; unchanged then.
  bool advance(unsigned char b);
  bool advance(std::string_view bytes);
  // The state after `b` into `out` (TokenTrie's walk: no copy of this state first).
  bool advance_into(unsigned char b, GrammarState& out) const;
  // The text so far is a whole text of the grammar.
  bool complete() const;
  // Nothing may follow (complete, and no byte is taken).
  bool finished() const;
  // Everything the future depends on, as bytes: equal keys take the same texts of up to
  // `longest` bytes (a string's length so far counts only where its limits are that near).
  std::string key(std::size_t longest = 65535) const;
  // Inside a JSON string without a pattern, the only thread: its UTF-8 position
  // (TokenTrie::kUtf8Positions), and in *room the characters its maximum length leaves
  // (UINT32_MAX: none); else -1. Text without a quote, backslash or control byte is then taken
  // or refused by its UTF-8 and its length alone.
  int plain_string(std::uint32_t* room) const;
  const Grammar& grammar() const { return *g_; }

  struct Frame {
    std::uint16_t node;
    std::uint8_t phase;
    std::uint8_t ws;  // whitespace run
    std::uint16_t c;
    std::uint8_t d, e;
    std::uint32_t a, b;
  };
  static constexpr int kMaxThreads = 16;
  static constexpr int kMaxFrames = 128;

 private:
  GrammarState() = default;
  void copy_from(const GrammarState& o);
  struct Out;
  void feed(Frame* st, int n, unsigned char b, Out& out) const;
  bool thread_complete(const Frame* st, int n) const;
  Frame start_frame(std::int32_t node) const;
  void child_done(Frame& f) const;
  bool can_end(const Frame& f) const;

  std::shared_ptr<const Grammar> g_;
  const Grammar* raw_ = nullptr;
  std::uint8_t threads_ = 0;
  std::uint8_t used_ = 0;
  std::array<std::uint8_t, kMaxThreads> end_{};  // thread t's frames: [end_[t-1], end_[t])
  std::array<Frame, kMaxFrames> frames_;
};

struct GrammarKeyHash {
  std::size_t operator()(const std::string& k) const { return std::hash<std::string>()(k); }
};

}  // namespace lmserve::text
