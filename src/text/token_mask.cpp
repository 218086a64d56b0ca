#include "text/token_mask.h"

#include <algorithm>

namespace lmserve::text {

TokenTrie::TokenTrie(const Tokenizer& tokenizer) : vocab_size_(tokenizer.vocab_size()) {
  std::vector<std::pair<std::string, std::int32_t>> tokens;
  tokens.reserve(vocab_size_);
  for (std::size_t id = 0; id < vocab_size_; ++id) {
    auto bytes = tokenizer.token_bytes(static_cast<std::int32_t>(id));
    if (bytes && !bytes->empty() && bytes->size() < 65536) tokens.emplace_back(std::move(*bytes), static_cast<std::int32_t>(id));
  }
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
      nodes_[path.back()].end = static_cast<std::uint32_t>(nodes_.size());
      path.pop_back();
    }
    for (std::size_t d = common; d < bytes.size(); ++d) {
      path.push_back(static_cast<std::uint32_t>(nodes_.size()));
      nodes_.push_back({.end = 0, .ids_begin = 0, .ids_end = 0, .depth = static_cast<std::uint16_t>(d + 1),
                        .byte = static_cast<unsigned char>(bytes[d])});
    }
    Node& last = nodes_[path.back()];
    if (last.ids_end == 0) last.ids_begin = last.ids_end = static_cast<std::uint32_t>(ids_.size());
    ids_.push_back(id);  // identical strings are neighbours: the node's range grows
    last.ids_end = static_cast<std::uint32_t>(ids_.size());
    max_depth_ = std::max(max_depth_, bytes.size());
    prev = &bytes;
  }
  for (auto n : path) nodes_[n].end = static_cast<std::uint32_t>(nodes_.size());
}

}  // namespace lmserve::text
