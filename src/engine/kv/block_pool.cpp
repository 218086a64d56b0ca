#include "engine/kv/block_pool.h"

#include <openssl/evp.h>

#include <cassert>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace lmserve::engine {

namespace {

// SHA-256 fetched once and a context per thread, reused: a fresh context and an implicit fetch
// per block cost more than hashing a block's 100 bytes (a 1,024-row decode step fills ~64 blocks).
struct Sha256 {
  EVP_MD* md = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  std::vector<std::uint8_t> bytes;
  Sha256() = default;
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  ~Sha256() {
    EVP_MD_CTX_free(ctx);
    EVP_MD_free(md);
  }
};

void append_le(std::vector<std::uint8_t>& out, std::uint64_t v, int n) {
  for (int i = 0; i < n; ++i) out.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}

}  // namespace

BlockHash hash_block(const BlockHash* parent, std::span<const std::int32_t> tokens, std::string_view extra) {
  // The bytes block_pool.h lists, gathered for one digest update.
  thread_local Sha256 sha;
  std::vector<std::uint8_t>& b = sha.bytes;
  b.clear();
  const BlockHash zero{};
  const BlockHash& p = parent ? *parent : zero;
  b.insert(b.end(), p.begin(), p.end());
  for (std::int32_t t : tokens) append_le(b, static_cast<std::uint32_t>(t), 4);
  append_le(b, extra.size(), 8);
  b.insert(b.end(), extra.begin(), extra.end());
  BlockHash out{};
  unsigned int len = 0;
  const bool ok = sha.md && sha.ctx && EVP_DigestInit_ex2(sha.ctx, sha.md, nullptr) == 1 && EVP_DigestUpdate(sha.ctx, b.data(), b.size()) == 1 &&
                  EVP_DigestFinal_ex(sha.ctx, out.data(), &len) == 1;
  if (!ok || len != out.size()) {
    // Cannot happen with OpenSSL's default provider. Without a digest every block would share
    // one hash and the prefix cache would hand requests (and tenants) each other's KV: stop.
    std::fputs("lmserve: OpenSSL's SHA-256 failed; stopping rather than caching blocks under a wrong hash\n", stderr);
    std::abort();
  }
  return out;
}

BlockPool::BlockPool(std::int64_t num_blocks, bool enable_prefix_caching)
    : caching_(enable_prefix_caching),
      ref_(static_cast<std::size_t>(num_blocks), 0),
      prev_(static_cast<std::size_t>(num_blocks), -1),
      next_(static_cast<std::size_t>(num_blocks), -1),
      block_hash_(static_cast<std::size_t>(num_blocks)) {
  for (BlockId b = 0; b < num_blocks; ++b) push_back(b);
}

void BlockPool::unlink(BlockId b) {
  auto i = static_cast<std::size_t>(b);
  if (prev_[i] >= 0) {
    next_[static_cast<std::size_t>(prev_[i])] = next_[i];
  } else {
    head_ = next_[i];
  }
  if (next_[i] >= 0) {
    prev_[static_cast<std::size_t>(next_[i])] = prev_[i];
  } else {
    tail_ = prev_[i];
  }
  prev_[i] = next_[i] = -1;
  --free_count_;
}

void BlockPool::push_back(BlockId b) {
  auto i = static_cast<std::size_t>(b);
  prev_[i] = tail_;
  next_[i] = -1;
  if (tail_ >= 0) {
    next_[static_cast<std::size_t>(tail_)] = b;
  } else {
    head_ = b;
  }
  tail_ = b;
  ++free_count_;
}

std::optional<std::vector<BlockId>> BlockPool::allocate(std::int64_t n) {
  if (n > free_count_) return std::nullopt;
  std::vector<BlockId> out;
  out.reserve(static_cast<std::size_t>(n));
  for (std::int64_t k = 0; k < n; ++k) {
    BlockId b = head_;
    unlink(b);
    auto i = static_cast<std::size_t>(b);
    if (block_hash_[i]) {  // evict its cached prefix
      cached_.erase(*block_hash_[i]);
      block_hash_[i].reset();
    }
    ref_[i] = 1;
    out.push_back(b);
  }
  return out;
}

void BlockPool::release(std::span<const BlockId> blocks) {
  for (BlockId b : blocks) {
    auto i = static_cast<std::size_t>(b);
    assert(ref_[i] > 0 && "releasing a free block");
    if (--ref_[i] == 0) push_back(b);
  }
}

void BlockPool::acquire(BlockId b) {
  auto i = static_cast<std::size_t>(b);
  if (ref_[i]++ == 0) unlink(b);
}

std::optional<BlockId> BlockPool::lookup(const BlockHash& hash) const {
  if (!caching_) return std::nullopt;
  auto it = cached_.find(hash);
  if (it == cached_.end()) return std::nullopt;
  return it->second;
}

void BlockPool::cache(BlockId b, const BlockHash& hash) {
  if (!caching_) return;
  auto i = static_cast<std::size_t>(b);
  if (block_hash_[i] || cached_.contains(hash)) return;
  block_hash_[i] = hash;
  cached_.emplace(hash, b);
}

std::vector<BlockId> BlockPool::free_queue() const {
  std::vector<BlockId> out;
  for (BlockId b = head_; b >= 0; b = next_[static_cast<std::size_t>(b)]) out.push_back(b);
  return out;
}

}  // namespace lmserve::engine
