// text/token_mask: which tokens of a vocabulary a grammar lets come next (issue #33's constrained
// decoding). The vocabulary's byte strings (Tokenizer::token_bytes; special tokens left out) are
// kept as a trie in depth-first order, so a mask is one pass over it: a node's byte is tried on a
// copy of its parent's grammar state, and a byte the grammar refuses skips the node's whole
// subtree (in a grammar position that allows few bytes, most of the vocabulary is passed over at
// its first byte). The grammar is any type with `bool advance(unsigned char)` that leaves its
// state unchanged on false, copied freely (text/json_prefix.h's JsonPrefix), or with
// `bool advance_into(unsigned char, Grammar& out) const` (text/grammar.h's GrammarState).
#pragma once

#include <cstdint>
#include <list>
#include <string>
#include <unordered_map>
#include <vector>

#include "text/tokenizer.h"

namespace lmserve::text {

class TokenTrie {
 public:
  explicit TokenTrie(const Tokenizer& tokenizer);
  std::size_t vocab_size() const { return vocab_size_; }
  std::size_t nodes() const { return all_.nodes.size(); }
  std::size_t max_depth() const { return all_.max_depth; }

  // Bit `id` of `allowed` (vocab_size() bits in 64-bit words, cleared first) for each token whose
  // bytes the grammar takes whole from `state`.
  //
  // Inside a JSON string (a grammar with `int plain_string(std::uint32_t* room) const` that
  // answers which of the UTF-8 positions below it is in, or -1, and how many characters its
  // length limit leaves), most tokens are plain text: no quote, backslash or control byte.
  // Whether such a token is taken depends only on the UTF-8 position and its length in
  // characters, so those tokens' bits come from tables made once per vocabulary, and only the
  // other tokens (a few percent) are walked.
  template <class Grammar>
  void allowed(const Grammar& state, std::vector<std::uint64_t>& allowed) const;

  // A string's UTF-8 position: 0 between characters, else the continuation bytes still due and
  // the range of the next one (as the JSON grammars keep it).
  static constexpr int kUtf8Positions = 8;

 private:
  struct Node {
    std::uint32_t end;                    // one past the last node of its subtree
    std::uint32_t ids_begin, ids_end;     // the tokens whose bytes end here (in ids)
    std::uint16_t depth;                  // bytes from the root
    unsigned char byte;
  };
  struct Trie {
    std::vector<Node> nodes;  // depth-first order, without the root
    std::vector<std::int32_t> ids;
    std::size_t max_depth = 0;
    explicit Trie(std::vector<std::pair<std::string, std::int32_t>> tokens);
    Trie() = default;
  };
  template <class Grammar>
  static void walk(const Trie& t, const Grammar& state, std::vector<std::uint64_t>& allowed);

  Trie all_;
  Trie escapes_;  // the tokens with a quote, backslash or control byte
  // Per UTF-8 position: the plain tokens a string takes whole from it; the same for each room
  // below kShortRoom characters (plain_short_[position * kShortRoom + room]); and every plain
  // token of kShortRoom characters or more, longest first (a larger room clears those too long).
  static constexpr std::uint32_t kShortRoom = 16;
  std::vector<std::vector<std::uint64_t>> plain_, plain_short_;
  std::vector<std::pair<std::uint32_t, std::int32_t>> long_plain_;  // (characters, id)
  std::size_t vocab_size_ = 0;
};

template <class Grammar>
void TokenTrie::walk(const Trie& t, const Grammar& state, std::vector<std::uint64_t>& allowed) {
  thread_local std::vector<Grammar> states;
  states.assign(t.max_depth + 1, state);  // states[d]: after the first d bytes of the current path
  for (std::uint32_t i = 0; i < t.nodes.size();) {
    const Node& n = t.nodes[i];
    bool taken;
    if constexpr (requires(const Grammar& g, Grammar& out) { g.advance_into(n.byte, out); }) {
      taken = states[n.depth - 1].advance_into(n.byte, states[n.depth]);  // written in place: no copy first
    } else {
      Grammar next = states[n.depth - 1];
      taken = next.advance(n.byte);
      if (taken) states[n.depth] = next;
    }
    if (!taken) {
      i = n.end;  // no token below takes this byte
      continue;
    }
    for (std::uint32_t k = n.ids_begin; k < n.ids_end; ++k) {
      const auto id = static_cast<std::uint32_t>(t.ids[k]);
      allowed[id >> 6] |= std::uint64_t{1} << (id & 63);
    }
    ++i;
  }
}

template <class Grammar>
void TokenTrie::allowed(const Grammar& state, std::vector<std::uint64_t>& allowed) const {
  if constexpr (requires(const Grammar& g, std::uint32_t* room) { g.plain_string(room); }) {
    std::uint32_t room = 0;
    const int pos = state.plain_string(&room);
    if (pos >= 0) {
      const auto p = static_cast<std::size_t>(pos);
      if (room < kShortRoom) {
        allowed = plain_short_[p * kShortRoom + room];
      } else {
        allowed = plain_[p];
        for (const auto& [chars, id] : long_plain_) {
          if (chars <= room) break;
          allowed[static_cast<std::size_t>(id) >> 6] &= ~(std::uint64_t{1} << (id & 63));
        }
      }
      walk(escapes_, state, allowed);
      return;
    }
  }
  allowed.assign((vocab_size_ + 63) / 64, 0);
  walk(all_, state, allowed);
}

// Masks remembered by grammar state (Grammar::key(), with a std::hash-able packing of it given as
// KeyHash): a model writing a string's text, or a number, stays in one state for many tokens, and
// the mask of a state that lets most of the vocabulary through is the costly one to make. The
// least recently used of `capacity` masks gives way.
template <class Grammar, class KeyHash>
class MaskCache {
 public:
  explicit MaskCache(const TokenTrie& trie, std::size_t capacity = 32) : trie_(trie), capacity_(capacity) {}
  const std::vector<std::uint64_t>& allowed(const Grammar& state) {
    const auto key = make_key(state);
    if (auto it = index_.find(key); it != index_.end()) {
      ++hits_;
      order_.splice(order_.begin(), order_, it->second);  // most recent first
      return it->second->second;
    }
    ++misses_;
    if (index_.size() >= capacity_) {
      index_.erase(order_.back().first);
      order_.pop_back();
    }
    order_.emplace_front(key, std::vector<std::uint64_t>{});
    trie_.allowed(state, order_.front().second);
    index_.emplace(key, order_.begin());
    return order_.front().second;
  }
  std::uint64_t hits() const { return hits_; }
  std::uint64_t misses() const { return misses_; }

 private:
  using Key = decltype(std::declval<const Grammar&>().key());
  Key make_key(const Grammar& state) const {
    if constexpr (requires { state.key(std::size_t{}); }) {
      return state.key(trie_.max_depth());
    } else {
      return state.key();
    }
  }
  const TokenTrie& trie_;
  std::size_t capacity_;
  std::list<std::pair<Key, std::vector<std::uint64_t>>> order_;
  std::unordered_map<Key, typename decltype(order_)::iterator, KeyHash> index_;
  std::uint64_t hits_ = 0, misses_ = 0;
};

struct JsonPrefixKeyHash {
  template <class K>
  std::size_t operator()(const K& k) const {
    return std::hash<std::uint64_t>()(k.stack * 0x9E3779B97F4A7C15ull ^ k.rest);
  }
};

}  // namespace lmserve::text
