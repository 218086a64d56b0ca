#include "backend/device/host_swap.h"

#include <algorithm>
#include <string>

namespace lmserve::backend {

namespace {
constexpr std::uint64_t kChunkBytes = std::uint64_t{256} << 20;
}

HostBlockChunks::HostBlockChunks(std::uint64_t block_bytes, Allocate allocate, Release release)
    : block_bytes_(std::max<std::uint64_t>(1, block_bytes)),
      per_chunk_(static_cast<std::int64_t>(std::max<std::uint64_t>(1, kChunkBytes / block_bytes_))),
      allocate_(std::move(allocate)),
      release_(std::move(release)) {}

HostBlockChunks::~HostBlockChunks() { set_blocks(0); }

void HostBlockChunks::set_blocks(std::int64_t n) {
  for (std::byte* c : chunks_) {
    if (c != nullptr) release_(c);
  }
  blocks_ = std::max<std::int64_t>(0, n);
  chunks_.assign(static_cast<std::size_t>((blocks_ + per_chunk_ - 1) / per_chunk_), nullptr);
}

Status HostBlockChunks::prepare(std::span<const BlockCopy> to_host, std::span<const BlockCopy> to_device, std::int64_t device_blocks) {
  LMSERVE_RETURN_IF_ERROR(validate_swap(to_host, to_device, device_blocks, blocks_));
  for (auto list : {to_host, to_device}) {
    LMSERVE_RETURN_IF_ERROR(allocate_for(list));
  }
  return Status::ok();
}

Status HostBlockChunks::allocate_for(std::span<const BlockCopy> copies) {
  for (const BlockCopy& c : copies) {
    std::byte*& chunk = chunks_[static_cast<std::size_t>(c.host / per_chunk_)];
    if (chunk != nullptr) continue;
    const std::int64_t first = c.host / per_chunk_ * per_chunk_;
    const auto n = static_cast<std::uint64_t>(std::min(per_chunk_, blocks_ - first));
    chunk = static_cast<std::byte*>(allocate_(n * block_bytes_));
    if (chunk == nullptr) {
      return Status(StatusCode::kResourceExhausted, "swap: no host memory for " + std::to_string(n * block_bytes_ >> 20) + " MiB of swap space");
    }
  }
  return Status::ok();
}

std::byte* HostBlockChunks::block(std::int32_t host) const {
  return chunks_[static_cast<std::size_t>(host / per_chunk_)] + static_cast<std::uint64_t>(host % per_chunk_) * block_bytes_;
}

std::uint64_t HostBlockChunks::bytes() const {
  std::uint64_t b = 0;
  for (std::size_t i = 0; i < chunks_.size(); ++i) {
    if (chunks_[i] == nullptr) continue;
    const auto first = static_cast<std::int64_t>(i) * per_chunk_;
    b += static_cast<std::uint64_t>(std::min(per_chunk_, blocks_ - first)) * block_bytes_;
  }
  return b;
}

}  // namespace lmserve::backend
