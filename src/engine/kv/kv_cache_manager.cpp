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
  drop_host(id);
  auto it = tables_.find(id);
  if (it == tables_.end()) return;
  std::vector<BlockId> reversed(it->second.blocks.rbegin(), it->second.blocks.rend());
  pool_.release(reversed);
  tables_.erase(it);
}

void KvCacheManager::set_host_blocks(std::int64_t n) {
  host_free_.clear();
  host_used_ = 0;
  host_tables_.clear();
  for (std::int64_t b = n - 1; b >= 0; --b) host_free_.push_back(static_cast<BlockId>(b));
}

bool KvCacheManager::swap_out(RequestId id, std::int64_t num_tokens, std::vector<backend::BlockCopy>* copies) {
  auto it = tables_.find(id);
  if (it == tables_.end() || num_tokens <= 0 || host_tables_.contains(id)) return false;
  const auto n = static_cast<std::size_t>((num_tokens + block_size_ - 1) / block_size_);
  if (n > it->second.blocks.size() || n > host_free_.size()) return false;
  std::vector<BlockId>& host = host_tables_[id];
  for (std::size_t i = 0; i < n; ++i) {
    host.push_back(host_free_.back());
    host_free_.pop_back();
    copies->push_back({it->second.blocks[i], host.back()});
  }
  host_used_ += static_cast<std::int64_t>(n);
  std::vector<BlockId> reversed(it->second.blocks.rbegin(), it->second.blocks.rend());
  pool_.release(reversed);
  tables_.erase(it);
  return true;
}

bool KvCacheManager::swap_in(RequestId id, std::int64_t num_tokens, std::vector<backend::BlockCopy>* copies) {
  auto h = host_tables_.find(id);
  if (h == host_tables_.end() || tables_.contains(id)) return false;
  const std::int64_t need = std::max<std::int64_t>(static_cast<std::int64_t>(h->second.size()), (num_tokens + block_size_ - 1) / block_size_);
  auto blocks = pool_.allocate(need);
  if (!blocks) return false;
  for (std::size_t i = 0; i < h->second.size(); ++i) copies->push_back({(*blocks)[i], h->second[i]});
  tables_[id].blocks = std::move(*blocks);
  drop_host(id);
  return true;
}

void KvCacheManager::drop_host(RequestId id) {
  auto h = host_tables_.find(id);
  if (h == host_tables_.end()) return;
  // Back in reverse, so that the lowest ids end on top of the stack.
  for (auto b = h->second.rbegin(); b != h->second.rend(); ++b) host_free_.push_back(*b);
  host_used_ -= static_cast<std::int64_t>(h->second.size());
  host_tables_.erase(h);
}

std::span<const BlockId> KvCacheManager::block_table(RequestId id) const {
  auto it = tables_.find(id);
  if (it == tables_.end()) return {};
  return it->second.blocks;
}

}  // namespace lmserve::engine
