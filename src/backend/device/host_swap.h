// The host side of a backend's swap space (Backend::set_host_blocks / swap_blocks): host blocks
// 0..n-1 of a fixed size, whose memory is taken on first use in chunks of ~256 MiB, so that a
// swap space of many GiB costs nothing until requests are preempted, and the chunks a swap
// touches are all allocated before it copies anything. The allocator is the backend's (pinned,
// device-mapped memory for CUDA; plain memory for the CPU backend).
//
// Not thread-safe: the engine thread calls the backend.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "backend/backend.h"

namespace lmserve::backend {

class HostBlockChunks {
 public:
  using Allocate = std::function<void*(std::size_t bytes)>;  // nullptr on failure
  using Release = std::function<void(void*)>;

  HostBlockChunks(std::uint64_t block_bytes, Allocate allocate, Release release);
  ~HostBlockChunks();
  HostBlockChunks(const HostBlockChunks&) = delete;
  HostBlockChunks& operator=(const HostBlockChunks&) = delete;

  // Addressable blocks 0..n-1; the memory taken before is released (blocks held there are lost).
  void set_blocks(std::int64_t n);
  std::int64_t blocks() const { return blocks_; }
  std::int64_t blocks_per_chunk() const { return per_chunk_; }

  // What Backend::swap_blocks does before it copies: checks the ids (validate_swap, against
  // `device_blocks` and blocks()) and allocates the chunks their host blocks lie in.
  // InvalidArgument, or ResourceExhausted if a chunk cannot be had (those allocated before stay).
  Status prepare(std::span<const BlockCopy> to_host, std::span<const BlockCopy> to_device, std::int64_t device_blocks);
  // The memory of host block `host`, whose chunk prepare() allocated.
  std::byte* block(std::int32_t host) const;
  // Memory taken so far.
  std::uint64_t bytes() const;

 private:
  Status allocate_for(std::span<const BlockCopy> copies);

  std::uint64_t block_bytes_;
  std::int64_t per_chunk_;
  std::int64_t blocks_ = 0;
  Allocate allocate_;
  Release release_;
  std::vector<std::byte*> chunks_;  // nullptr: not allocated yet
};

}  // namespace lmserve::backend
