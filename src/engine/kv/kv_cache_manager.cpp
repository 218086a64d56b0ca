#include "engine/kv/kv_cache_manager.h"

#include <algorithm>

namespace lmserve::engine {

KvCacheManager::KvCacheManager(std::int64_t num_blocks, int block_size, bool enable_prefix_caching)
    : pool_(num_blocks, enable_prefix_caching), block_size_(block_size) {}

std::int64_t KvCacheManager::adopt_prefix(RequestId id, std::span<const std::int32_t> prompt, std::string_view salt) {
  Table& t = tables_[id];
  if (!pool_.prefix_caching() || prompt.empty()) return 0;
  // Only blocks whose tokens all precede the last prompt token: that token is always computed.
  const std::int64_t max_blocks = static_cast<std::int64_t>(prompt.size() - 1) / block_size_;
  const BlockHash* parent = nullptr;
  for (std::int64_t i = 0; i < max_blocks; ++i) {
    BlockHash h = hash_block(parent, prompt.subspan(static_cast<std::size_t>(i * block_size_), static_cast<std::size_t>(block_size_)), salt);
    auto hit = pool_.lookup(h);
    if (!hit) break;
    pool_.acquire(*hit);
    t.blocks.push_back(*hit);
    t.hashes.push_back(h);
    parent = &t.hashes.back();
  }
  return static_cast<std::int64_t>(t.blocks.size()) * block_size_;
}

void KvCacheManager::count_prefix_query(std::int64_t queried, std::int64_t hit) {
  stats_.queries += static_cast<std::uint64_t>(queried);
  stats_.hits += static_cast<std::uint64_t>(hit);
}

std::int64_t KvCacheManager::blocks_needed(RequestId id, std::int64_t num_tokens) const {
  std::int64_t need = (num_tokens + block_size_ - 1) / block_size_;
  auto it = tables_.find(id);
  std::int64_t have = it == tables_.end() ? 0 : static_cast<std::int64_t>(it->second.blocks.size());
  return std::max<std::int64_t>(0, need - have);
}

bool KvCacheManager::allocate(RequestId id, std::int64_t num_tokens) {
  std::int64_t n = blocks_needed(id, num_tokens);
  if (n == 0) {
    tables_[id];
    return true;
  }
  auto blocks = pool_.allocate(n);
  if (!blocks) return false;
  auto& t = tables_[id].blocks;
  t.insert(t.end(), blocks->begin(), blocks->end());
  return true;
}

void KvCacheManager::commit(RequestId id, std::span<const std::int32_t> tokens, std::int64_t num_computed, std::string_view salt) {
  if (!pool_.prefix_caching()) return;
  auto it = tables_.find(id);
  if (it == tables_.end()) return;
  Table& t = it->second;
  const std::int64_t full = std::min<std::int64_t>(num_computed / block_size_, static_cast<std::int64_t>(t.blocks.size()));
  for (auto i = static_cast<std::int64_t>(t.hashes.size()); i < full; ++i) {
    const BlockHash* parent = t.hashes.empty() ? nullptr : &t.hashes.back();
    BlockHash h = hash_block(parent, tokens.subspan(static_cast<std::size_t>(i * block_size_), static_cast<std::size_t>(block_size_)), salt);
    t.hashes.push_back(h);
    pool_.cache(t.blocks[static_cast<std::size_t>(i)], h);
  }
}

void KvCacheManager::free(RequestId id) {
  auto it = tables_.find(id);
  if (it == tables_.end()) return;
  std::vector<BlockId> reversed(it->second.blocks.rbegin(), it->second.blocks.rend());
  pool_.release(reversed);
  tables_.erase(it);
}

std::span<const BlockId> KvCacheManager::block_table(RequestId id) const {
  auto it = tables_.find(id);
  if (it == tables_.end()) return {};
  return it->second.blocks;
}

}  // namespace lmserve::engine
