// Test helper: one sequence through a Backend — prefill, then decode — with the block table
// first_block, first_block + 1, ... Shared by the CPU reference and the CUDA comparison tests.
#pragma once

#include <gtest/gtest.h>

#include <vector>

#include "backend/backend.h"

namespace lmserve::testing {

class BackendSequence {
 public:
  explicit BackendSequence(backend::Backend& b, std::int32_t first_block = 0) : b_(b), first_(first_block) {}

  // Appends `tokens`; returns logits for the positions in `want` (indices into `tokens`).
  std::vector<float> step(const std::vector<std::int32_t>& tokens, const std::vector<std::int32_t>& want) {
    const int bs = b_.kv_config().block_size;
    std::vector<std::int32_t> positions;
    std::vector<std::int64_t> slots;
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      std::int32_t p = len_++;
      positions.push_back(p);
      while (static_cast<std::int32_t>(table_.size()) * bs <= p) table_.push_back(first_ + static_cast<std::int32_t>(table_.size()));
      slots.push_back(static_cast<std::int64_t>(table_[static_cast<std::size_t>(p / bs)]) * bs + p % bs);
    }
    backend::SeqBatch seq{0, static_cast<std::int32_t>(tokens.size()), len_, table_};
    std::vector<float> logits(want.size() * static_cast<std::size_t>(b_.config().vocab_size));
    Status s = b_.forward({tokens, positions, slots, std::span<const backend::SeqBatch>(&seq, 1), want}, logits);
    EXPECT_TRUE(s.is_ok()) << s.to_string();
    return logits;
  }

 private:
  backend::Backend& b_;
  std::int32_t first_;
  std::int32_t len_ = 0;
  std::vector<std::int32_t> table_;
};

}  // namespace lmserve::testing
