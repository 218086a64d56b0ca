// Per-request KV block tables over a BlockPool, with automatic prefix caching.
//
// A request's blocks are append-only: block i holds tokens [i*B, (i+1)*B). When a block is
// full and computed, commit() records its chained hash (parent hash, its tokens, the
// request's cache salt) so later requests with the same prefix reuse it. adopt_prefix()
// finds the longest run of such blocks for a new prompt but never covers the last prompt
// token: its logits must be computed, so at least one token is always recomputed.
//
// Swap space: a preempted request's blocks may move to host blocks (swap_out) and come back
// into new device blocks when it resumes (swap_in), so that its tokens are not computed again.
// The manager only hands out ids; the backend copies (Backend::swap_blocks), and the engine
// makes sure it does so before the next forward pass. A request holds device blocks or host
// blocks, never both.
//
// Not thread-safe: owned by the engine thread.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "engine/kv/block_pool.h"

namespace lmserve::engine {

using RequestId = std::uint64_t;

struct PrefixCacheStats {
  std::uint64_t queries = 0;  // prompt tokens looked up
  std::uint64_t hits = 0;     // of those, found in the cache
};

class KvCacheManager {
 public:
  KvCacheManager(std::int64_t num_blocks, int block_size, bool enable_prefix_caching);

  BlockPool& pool() { return pool_; }
  const BlockPool& pool() const { return pool_; }
  int block_size() const { return block_size_; }

  // Gives `id` (which must hold no blocks) the cached blocks of its longest cached prompt
  // prefix; returns how many tokens they cover (a multiple of the block size, < prompt size).
  std::int64_t adopt_prefix(RequestId id, std::span<const std::int32_t> prompt, std::string_view salt);
  // Counts one lookup of `queried` prompt tokens of which `hit` were cached (the scheduler
  // calls it once per admitted request, so retries while blocked do not count).
  void count_prefix_query(std::int64_t queried, std::int64_t hit);
  // The blocks `id` lacks to hold `num_tokens` tokens.
  std::int64_t blocks_needed(RequestId id, std::int64_t num_tokens) const;
  // Grows `id`'s table to hold `num_tokens` tokens; false (and no change) if the pool is short.
  bool allocate(RequestId id, std::int64_t num_tokens);
  // Records the hashes of `id`'s blocks that are full within tokens [0, num_computed).
  void commit(RequestId id, std::span<const std::int32_t> tokens, std::int64_t num_computed, std::string_view salt);
  // Releases all of `id`'s blocks (last first), host blocks too. No-op for unknown ids.
  void free(RequestId id);

  // Host blocks 0..n-1 for swapped-out requests (0: no swap space). Only while none is held.
  void set_host_blocks(std::int64_t n);
  std::int64_t num_host_blocks() const { return static_cast<std::int64_t>(host_free_.size()) + host_used_; }
  std::int64_t num_host_free() const { return static_cast<std::int64_t>(host_free_.size()); }
  // Moves the blocks holding `id`'s first num_tokens tokens to host blocks: appends a
  // (device, host) pair per block to *copies and releases all of its device blocks (last first;
  // their prefix-cache hashes stay, as after free()). false, and no change, if the host lacks
  // room or num_tokens is 0.
  bool swap_out(RequestId id, std::int64_t num_tokens, std::vector<backend::BlockCopy>* copies);
  // Brings `id`'s host blocks back into newly allocated device blocks, with room for num_tokens
  // tokens: appends a pair per host block to *copies and frees the host blocks. false, and no
  // change, if the pool is short.
  bool swap_in(RequestId id, std::int64_t num_tokens, std::vector<backend::BlockCopy>* copies);
  // Drops `id`'s host blocks (their contents will not be used: e.g. the copy out failed).
  void drop_host(RequestId id);
  bool swapped(RequestId id) const { return host_tables_.contains(id); }
  std::size_t num_swapped() const { return host_tables_.size(); }

  std::span<const BlockId> block_table(RequestId id) const;
  std::size_t num_requests() const { return tables_.size(); }
  const PrefixCacheStats& prefix_stats() const { return stats_; }

 private:
  struct Table {
    std::vector<BlockId> blocks;
    std::vector<BlockHash> hashes;  // of blocks[0..hashes.size()), all full and committed
  };

  BlockPool pool_;
  int block_size_;
  std::unordered_map<RequestId, Table> tables_;
  PrefixCacheStats stats_;
  std::vector<BlockId> host_free_;  // the lowest id on top, so that few host chunks are touched
  std::int64_t host_used_ = 0;
  std::unordered_map<RequestId, std::vector<BlockId>> host_tables_;
};

}  // namespace lmserve::engine
