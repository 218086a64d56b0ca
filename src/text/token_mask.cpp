#include "text/token_mask.h"

#include <algorithm>
#include <functional>

namespace lmserve::text {
namespace {

// The range of the next continuation byte at each UTF-8 position (TokenTrie::kUtf8Positions):
// between characters; 1, 2 or 3 bytes due with any continuation; after E0, ED, F0, F4.
struct Utf8Position {
  int left;
  unsigned char lo, hi;
};
constexpr Utf8Position kPositions[TokenTrie::kUtf8Positions] = {{0, 0, 0},       {1, 0x80, 0xBF}, {2, 0x80, 0xBF}, {3, 0x80, 0xBF},
                                                               {2, 0xA0, 0xBF}, {2, 0x80, 0x9F}, {3, 0x90, 0xBF}, {3, 0x80, 0x8F}};

// A plain token (no quote, backslash or control byte) taken whole by a string's text from UTF-8
// position `p`: every byte continues or begins a character validly.
bool plain_from(const std::string& bytes, Utf8Position p) {
  int left = p.left;
  unsigned char lo = p.lo, hi = p.hi;
  for (unsigned char b : bytes) {
    if (left > 0) {
      if (b < lo || b > hi) return false;
      --left;
      lo = 0x80, hi = 0xBF;
      continue;
    }
    if (b < 0x80) continue;
    lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) {
      left = 1;
    } else if (b >= 0xE0 && b <= 0xEF) {
      left = 2;
      if (b == 0xE0) lo = 0xA0;
      if (b == 0xED) hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
      left = 3;
      if (b == 0xF0) lo = 0x90;
      if (b == 0xF4) hi = 0x8F;
    } else {
      return false;
    }
  }
  return true;
}

bool escapes(const std::string& bytes) {
  return std::any_of(bytes.begin(), bytes.end(), [](char c) {
    const auto b = static_cast<unsigned char>(c);
    return b == '"' || b == '\\' || b < 0x20;
  });
}

}  // namespace

TokenTrie::Trie::Trie(std::vector<std::pair<std::string, std::int32_t>> tokens) {
  std::sort(tokens.begin(), tokens.end());
  // Sorted, a token shares with the one before it the path of their common prefix: the nodes
  // past it are new, in depth-first order; a path left behind closes its nodes' subtrees.
  std::vector<std::uint32_t> path;  // node indices of the current path, by depth - 1
  const std::string* prev = nullptr;
  for (const auto& [bytes, id] : tokens) {
    std::size_t common = 0;
    if (prev) {
      while (common < prev->size() && common < bytes.size() && (*prev)[common] == bytes[common]) ++common;
    }
    while (path.size() > common) {
      nodes[path.back()].end = static_cast<std::uint32_t>(nodes.size());
      path.pop_back();
    }
    for (std::size_t d = common; d < bytes.size(); ++d) {
      path.push_back(static_cast<std::uint32_t>(nodes.size()));
      nodes.push_back({.end = 0, .ids_begin = 0, .ids_end = 0, .depth = static_cast<std::uint16_t>(d + 1),
                       .byte = static_cast<unsigned char>(bytes[d])});
    }
    Node& last = nodes[path.back()];
    if (last.ids_end == 0) last.ids_begin = last.ids_end = static_cast<std::uint32_t>(ids.size());
    ids.push_back(id);  // identical strings are neighbours: the node's range grows
    last.ids_end = static_cast<std::uint32_t>(ids.size());
    max_depth = std::max(max_depth, bytes.size());
    prev = &bytes;
  }
  for (auto n : path) nodes[n].end = static_cast<std::uint32_t>(nodes.size());
}

TokenTrie::TokenTrie(const Tokenizer& tokenizer) : vocab_size_(tokenizer.vocab_size()) {
  std::vector<std::pair<std::string, std::int32_t>> tokens, escaping;
  tokens.reserve(vocab_size_);
  const std::size_t words = (vocab_size_ + 63) / 64;
  plain_.assign(kUtf8Positions, std::vector<std::uint64_t>(words, 0));
  plain_short_.assign(kUtf8Positions * kShortRoom, std::vector<std::uint64_t>(words, 0));
  for (std::size_t id = 0; id < vocab_size_; ++id) {
    auto bytes = tokenizer.token_bytes(static_cast<std::int32_t>(id));
    if (!bytes || bytes->empty() || bytes->size() >= 65536) continue;
    if (escapes(*bytes)) {
      escaping.emplace_back(*bytes, static_cast<std::int32_t>(id));
    } else {
      // Characters: the bytes that begin one (a continuation byte never does).
      const auto chars = static_cast<std::uint32_t>(
          std::count_if(bytes->begin(), bytes->end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }));
      const std::uint64_t bit = std::uint64_t{1} << (id & 63);
      for (int p = 0; p < kUtf8Positions; ++p) {
        if (!plain_from(*bytes, kPositions[p])) continue;
        plain_[static_cast<std::size_t>(p)][id >> 6] |= bit;
        for (std::uint32_t room = chars; room < kShortRoom; ++room) plain_short_[static_cast<std::size_t>(p) * kShortRoom + room][id >> 6] |= bit;
      }
      if (chars >= kShortRoom) long_plain_.emplace_back(chars, static_cast<std::int32_t>(id));
    }
    tokens.emplace_back(std::move(*bytes), static_cast<std::int32_t>(id));
  }
  std::sort(long_plain_.begin(), long_plain_.end(), std::greater<>());
  all_ = Trie(std::move(tokens));
  escapes_ = Trie(std::move(escaping));
}

}  // namespace lmserve::text
