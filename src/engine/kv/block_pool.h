// The KV block pool: fixed-size blocks identified by id only (no device pointers), reference
// counted, with an LRU free queue and the prefix cache's hash index.
//
// Free queue: blocks with no references, least recently freed first. Allocation takes from
// the front; if the block taken still holds a cached prefix, its hash is dropped then (that is
// the LRU eviction). A prefix-cache hit on a free block removes it from the middle of the
// queue in O(1) (intrusive doubly-linked list over block ids).
//
// Not thread-safe: owned by the engine thread.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace lmserve::engine {

using BlockId = std::int32_t;
using BlockHash = std::array<std::uint8_t, 32>;

struct BlockHashHasher {
  std::size_t operator()(const BlockHash& h) const {
    std::size_t v = 0;
    for (int i = 0; i < 8; ++i) v = (v << 8) | h[static_cast<std::size_t>(i)];
    return v;
  }
};

// The hash of a full block given the hash of the block before it (nullptr for the first
// block): SHA-256 of the parent's 32 bytes (zeros for a first block), each token id as 4 bytes
// little-endian, the length of `extra` as 8 bytes little-endian (so that (tokens, extra) pairs
// cannot collide by shifting bytes), then `extra`. `extra` carries per-request keys such as the
// cache salt, so tenants never share blocks.
BlockHash hash_block(const BlockHash* parent, std::span<const std::int32_t> tokens, std::string_view extra);

class BlockPool {
 public:
  BlockPool(std::int64_t num_blocks, bool enable_prefix_caching);

  std::int64_t num_blocks() const { return static_cast<std::int64_t>(ref_.size()); }
  // Blocks with no references (cached ones included: they can be evicted any time).
  std::int64_t num_free() const { return free_count_; }
  std::int64_t num_used() const { return num_blocks() - free_count_; }
  // Fraction of blocks referenced by requests, in [0, 1].
  double usage() const { return static_cast<double>(num_used()) / static_cast<double>(num_blocks()); }

  // `n` blocks from the front of the free queue with one reference each, or nullopt (and no
  // change) if fewer than `n` are free.
  std::optional<std::vector<BlockId>> allocate(std::int64_t n);
  // Drops one reference from each block; blocks reaching zero join the back of the free queue
  // in the order given (callers pass a sequence's blocks last-first, so that on eviction the
  // tail of a prefix goes before its head).
  void release(std::span<const BlockId> blocks);
  // Adds a reference (a prefix-cache hit); a free block leaves the free queue.
  void acquire(BlockId block);

  // The cached block holding `hash`, if any.
  std::optional<BlockId> lookup(const BlockHash& hash) const;
  // Records that full block `block` holds `hash` (no-op without prefix caching, or if another
  // block already holds it).
  void cache(BlockId block, const BlockHash& hash);

  bool prefix_caching() const { return caching_; }
  std::int32_t ref_count(BlockId b) const { return ref_[static_cast<std::size_t>(b)]; }
  // The free queue, front first (for tests and debugging).
  std::vector<BlockId> free_queue() const;

 private:
  void unlink(BlockId b);
  void push_back(BlockId b);

  bool caching_;
  std::vector<std::int32_t> ref_;
  std::vector<BlockId> prev_, next_;  // free queue links; -1 = none
  BlockId head_ = -1, tail_ = -1;
  std::int64_t free_count_ = 0;
  std::vector<std::optional<BlockHash>> block_hash_;
  std::unordered_map<BlockHash, BlockId, BlockHashHasher> cached_;
};

}  // namespace lmserve::engine
