// Block pool and prefix cache: exact allocation and eviction order, reference counts, the
// last-prompt-token rule, salts, counters.
#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "engine/kv/kv_cache_manager.h"

namespace lmserve::engine {
namespace {

using V = std::vector<BlockId>;

std::vector<std::int32_t> tokens(int n, int start = 0) {
  std::vector<std::int32_t> t(static_cast<std::size_t>(n));
  std::iota(t.begin(), t.end(), start);
  return t;
}

TEST(BlockPool, AllocatesFromTheFrontAndFreesToTheBack) {
  BlockPool pool(6, true);
  EXPECT_EQ(pool.free_queue(), (V{0, 1, 2, 3, 4, 5}));
  auto a = pool.allocate(2);
  ASSERT_TRUE(a);
  EXPECT_EQ(*a, (V{0, 1}));
  auto b = pool.allocate(3);
  EXPECT_EQ(*b, (V{2, 3, 4}));
  EXPECT_FALSE(pool.allocate(2));  // only block 5 is free: nothing changes
  EXPECT_EQ(pool.num_free(), 1);
  pool.release(V{1, 0});  // a sequence frees last-first
  EXPECT_EQ(pool.free_queue(), (V{5, 1, 0}));
  EXPECT_DOUBLE_EQ(pool.usage(), 3.0 / 6.0);
}

TEST(BlockPool, CachedFreeBlocksAreEvictedLeastRecentlyFreedFirst) {
  BlockPool pool(4, true);
  auto blocks = *pool.allocate(4);
  BlockHash h[4];
  for (int i = 0; i < 4; ++i) {
    auto t = tokens(4, i * 4);
    h[i] = hash_block(i ? &h[i - 1] : nullptr, t, "");
    pool.cache(blocks[static_cast<std::size_t>(i)], h[i]);
  }
  pool.release(V{3, 2});
  pool.release(V{1, 0});
  EXPECT_EQ(pool.free_queue(), (V{3, 2, 1, 0}));
  ASSERT_EQ(pool.lookup(h[2]), 2);
  // A hit on a free block removes it from the middle of the queue.
  pool.acquire(2);
  EXPECT_EQ(pool.free_queue(), (V{3, 1, 0}));
  EXPECT_EQ(pool.ref_count(2), 1);
  // Allocation evicts from the front: block 3 loses its hash, 1 and 0 keep theirs.
  auto x = pool.allocate(1);
  EXPECT_EQ(*x, (V{3}));
  EXPECT_FALSE(pool.lookup(h[3]));
  EXPECT_EQ(pool.lookup(h[1]), 1);
  EXPECT_EQ(pool.lookup(h[0]), 0);
}

TEST(BlockHash, ChainsParentTokensAndSalt) {
  auto t = tokens(16);
  BlockHash a = hash_block(nullptr, t, "");
  EXPECT_EQ(a, hash_block(nullptr, t, ""));
  EXPECT_NE(a, hash_block(nullptr, t, "tenant-b"));
  EXPECT_NE(hash_block(&a, t, ""), hash_block(nullptr, t, ""));
  auto u = t;
  u[15] = 99;
  EXPECT_NE(a, hash_block(nullptr, u, ""));
}

// The bytes hashed are fixed (block_pool.h), so that a block's hash does not change between
// builds: the digests of two blocks, computed independently (Python's hashlib.sha256 over
// zeros(32) | int32 LE tokens | uint64 LE len(extra) | extra, then with the first as parent).
TEST(BlockHash, IsTheSha256OfTheDocumentedBytes) {
  auto hex = [](const BlockHash& h) {
    std::string s;
    for (std::uint8_t b : h) {
      const char* d = "0123456789abcdef";
      s += d[b >> 4];
      s += d[b & 15];
    }
    return s;
  };
  const std::vector<std::int32_t> t = {1, 2, 3, 128000, -1};
  const BlockHash a = hash_block(nullptr, t, "");
  EXPECT_EQ(hex(a), "17f576aa4a12380c02894c88dd265b03303014af18d3861959b7179697e98b36");
  const std::vector<std::int32_t> sevens(16, 7);
  EXPECT_EQ(hex(hash_block(&a, sevens, "tenant-b")), "7917649c75cbfe0ed081c50ff7ab0ca1301b362c08f595f8bd249eee3db5d608");
  // Hashes from several threads at once (each has its own context) are the same.
  std::vector<std::thread> threads;
  std::vector<BlockHash> got(4);
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      for (int k = 0; k < 200; ++k) got[static_cast<std::size_t>(i)] = hash_block(&a, sevens, "tenant-b");
    });
  }
  for (auto& th : threads) th.join();
  for (const BlockHash& g : got) EXPECT_EQ(g, hash_block(&a, sevens, "tenant-b"));
}

TEST(KvCacheManager, PrefixHitsNeverCoverTheLastPromptToken) {
  KvCacheManager kv(16, 4, true);
  auto prompt = tokens(12);  // 3 full blocks
  ASSERT_EQ(kv.adopt_prefix(1, prompt, ""), 0);
  ASSERT_TRUE(kv.allocate(1, 12));
  kv.commit(1, prompt, 12, "");
  EXPECT_EQ(kv.block_table(1).size(), 3u);

  // Same 12 tokens: only 2 blocks may be reused; the block with the last token is recomputed.
  EXPECT_EQ(kv.adopt_prefix(2, prompt, ""), 8);
  EXPECT_EQ((V{kv.block_table(2).begin(), kv.block_table(2).end()}), (V{0, 1}));
  EXPECT_EQ(kv.pool().ref_count(0), 2);
  // A longer prompt with the same start reuses all three.
  auto longer = tokens(13);
  EXPECT_EQ(kv.adopt_prefix(3, longer, ""), 12);
  // A different salt shares nothing.
  EXPECT_EQ(kv.adopt_prefix(4, longer, "other-tenant"), 0);
  kv.count_prefix_query(12, 8);
  kv.count_prefix_query(13, 12);
  EXPECT_EQ(kv.prefix_stats().queries, 25u);
  EXPECT_EQ(kv.prefix_stats().hits, 20u);
}

TEST(KvCacheManager, AllocateIsAllOrNothingAndFreeReturnsEverything) {
  KvCacheManager kv(4, 16, true);
  ASSERT_TRUE(kv.allocate(1, 40));  // 3 blocks
  EXPECT_EQ(kv.blocks_needed(1, 48), 0);
  EXPECT_EQ(kv.blocks_needed(1, 49), 1);
  EXPECT_FALSE(kv.allocate(2, 20));  // needs 2, 1 free
  EXPECT_TRUE(kv.block_table(2).empty());
  EXPECT_EQ(kv.pool().num_free(), 1);
  kv.free(1);
  kv.free(2);
  kv.free(99);  // unknown ids are fine
  EXPECT_EQ(kv.pool().num_free(), 4);
  EXPECT_EQ(kv.num_requests(), 0u);
}

TEST(KvCacheManager, CommitOnlyHashesFullComputedBlocks) {
  KvCacheManager kv(8, 4, true);
  auto t = tokens(10);
  ASSERT_TRUE(kv.allocate(1, 10));
  kv.commit(1, t, 6, "");  // one full block computed so far
  EXPECT_EQ(kv.adopt_prefix(2, tokens(9), ""), 4);
  kv.commit(1, t, 10, "");  // second block now full
  EXPECT_EQ(kv.adopt_prefix(3, tokens(9), ""), 8);
}

// Swap out copies the blocks that hold the computed tokens (here 9 of 12: 3 blocks of the 4 the
// request holds) to the lowest free host blocks and gives every device block back; swap in
// allocates new device blocks (room for the tokens asked, at least the host blocks) and gives
// the host blocks back. Each is all or nothing.
TEST(KvCacheManager, SwapMovesBlocksToTheHostAndBack) {
  KvCacheManager kv(6, 4, false);
  kv.set_host_blocks(4);
  ASSERT_TRUE(kv.allocate(1, 16));  // device blocks 0 1 2 3
  std::vector<backend::BlockCopy> out;
  ASSERT_TRUE(kv.swap_out(1, 9, &out));
  ASSERT_EQ(out.size(), 3u);
  for (std::int32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(out[static_cast<std::size_t>(i)].device, i);
    EXPECT_EQ(out[static_cast<std::size_t>(i)].host, i);
  }
  EXPECT_EQ(kv.pool().num_free(), 6);
  EXPECT_TRUE(kv.swapped(1));
  EXPECT_TRUE(kv.block_table(1).empty());
  EXPECT_EQ(kv.num_host_free(), 1);

  ASSERT_TRUE(kv.allocate(2, 8));                  // takes device blocks 4 and 5
  ASSERT_TRUE(kv.allocate(3, 4));                  // then the blocks request 1 gave up: 3 (its last went first)
  EXPECT_FALSE(kv.swap_out(2, 8, &out));           // two blocks, one host block free
  EXPECT_EQ(out.size(), 3u);
  EXPECT_EQ(kv.block_table(2).size(), 2u);
  std::vector<backend::BlockCopy> in;
  EXPECT_FALSE(kv.swap_in(1, 13, &in));            // 4 blocks wanted, 3 free
  EXPECT_TRUE(in.empty());
  EXPECT_TRUE(kv.swapped(1));
  ASSERT_TRUE(kv.swap_in(1, 12, &in));             // 3 blocks: 2, 1, 0
  ASSERT_EQ(in.size(), 3u);
  EXPECT_EQ(kv.block_table(1).size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(in[i].device, kv.block_table(1)[i]);
    EXPECT_EQ(in[i].host, static_cast<std::int32_t>(i));
  }
  EXPECT_FALSE(kv.swapped(1));
  EXPECT_EQ(kv.num_host_free(), 4);
  EXPECT_EQ(kv.pool().num_free(), 0);
  EXPECT_FALSE(kv.swap_out(1, 0, &out));  // nothing computed: nothing to keep
}

TEST(KvCacheManager, FreeReleasesHostBlocksAndNoSwapSpaceMeansNoSwap) {
  KvCacheManager kv(4, 4, false);
  std::vector<backend::BlockCopy> out;
  ASSERT_TRUE(kv.allocate(1, 8));
  EXPECT_FALSE(kv.swap_out(1, 8, &out));  // no swap space
  EXPECT_EQ(kv.block_table(1).size(), 2u);
  kv.set_host_blocks(2);
  ASSERT_TRUE(kv.swap_out(1, 8, &out));
  EXPECT_EQ(kv.num_swapped(), 1u);
  kv.free(1);
  EXPECT_EQ(kv.num_swapped(), 0u);
  EXPECT_EQ(kv.num_host_free(), 2);
  EXPECT_EQ(kv.pool().num_free(), 4);
  ASSERT_TRUE(kv.allocate(2, 4));
  ASSERT_TRUE(kv.swap_out(2, 4, &out));
  kv.drop_host(2);
  EXPECT_FALSE(kv.swapped(2));
  EXPECT_EQ(kv.num_host_free(), 2);
}

}  // namespace
}  // namespace lmserve::engine
