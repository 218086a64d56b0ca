// Test helper: one sequence through a Backend — prefill, then decode — with the block table
// first_block, first_block + 1, ... Shared by the CPU reference and the CUDA comparison tests.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
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

// The swap space's round trip (Backend::swap_blocks) on a backend with >= 12 blocks of 16
// tokens: a 20-token prompt is computed into blocks 0 and 1, moved to host blocks 5 and 2, its
// blocks are overwritten by another prompt, and it comes back into blocks 3 and 4 through host
// blocks; one copy goes to the host and back within one call (host block 0, block 8 -> 9:
// to_host runs first). Returns the next token's logits from blocks {3, 4} (`swapped`), from a
// plain computation into blocks {6, 7} (`direct`, what they must equal), from blocks {9, 10}
// (`in_one_call`, which must equal it too) and from the overwritten blocks {0, 1}
// (`overwritten`, which must not).
struct SwapRoundTrip {
  std::vector<float> swapped, in_one_call, direct, overwritten;
  Status error = Status::ok();
};

inline SwapRoundTrip swap_round_trip(backend::Backend& b) {
  SwapRoundTrip r;
  const std::int64_t V = b.config().vocab_size;
  auto run = [&](const std::vector<std::int32_t>& toks, std::int32_t first_pos, const std::vector<std::int32_t>& table) {
    std::vector<std::int32_t> positions;
    std::vector<std::int64_t> slots;
    for (std::size_t i = 0; i < toks.size(); ++i) {
      const std::int32_t p = first_pos + static_cast<std::int32_t>(i);
      positions.push_back(p);
      slots.push_back(static_cast<std::int64_t>(table[static_cast<std::size_t>(p / 16)]) * 16 + p % 16);
    }
    backend::SeqBatch seq{0, static_cast<std::int32_t>(toks.size()), first_pos + static_cast<std::int32_t>(toks.size()), table};
    const std::int32_t row = static_cast<std::int32_t>(toks.size()) - 1;
    std::vector<float> logits(static_cast<std::size_t>(V));
    Status s = b.forward({toks, positions, slots, std::span<const backend::SeqBatch>(&seq, 1), std::span<const std::int32_t>(&row, 1)}, logits);
    if (!s.is_ok() && r.error.is_ok()) r.error = s;
    return logits;
  };
  std::vector<std::int32_t> prompt, other;
  for (std::int32_t i = 0; i < 20; ++i) {
    prompt.push_back((i * 37 + 11) % static_cast<std::int32_t>(V));
    other.push_back((i * 53 + 7) % static_cast<std::int32_t>(V));
  }
  auto keep = [&](Status s) {
    if (!s.is_ok() && r.error.is_ok()) r.error = s;
  };
  keep(b.set_host_blocks(8));
  run(prompt, 0, {0, 1});
  run(prompt, 0, {8, 10});
  keep(b.swap_blocks(std::vector<backend::BlockCopy>{{0, 5}, {1, 2}, {8, 0}}, std::vector<backend::BlockCopy>{{9, 0}}));
  run(other, 0, {0, 1});
  keep(b.swap_blocks({}, std::vector<backend::BlockCopy>{{3, 5}, {4, 2}}));
  const std::vector<std::int32_t> next = {42};
  r.swapped = run(next, 20, {3, 4});
  r.overwritten = run(next, 20, {0, 1});
  run(prompt, 0, {6, 7});
  r.direct = run(next, 20, {6, 7});
  r.in_one_call = run(next, 20, {9, 10});
  return r;
}

// A 21-token prompt's logits at every position, then `steps` decode steps of one sequence: the
// logits of each and the greedy tokens chosen. With `fed`, decode step s is given fed[s] instead
// of the greedy token, so that two backends are compared over the same context. Shared by the
// tensor-parallel tests (CPU and CUDA: TP N against TP 1).
struct GreedyPass {
  std::vector<float> prefill;
  std::vector<std::vector<float>> decode;
  std::vector<std::int32_t> greedy;
};

inline std::int32_t argmax_of(const float* v, std::int64_t n) { return static_cast<std::int32_t>(std::max_element(v, v + n) - v); }

inline GreedyPass greedy_pass(backend::Backend& b, int steps, const std::vector<std::int32_t>* fed = nullptr) {
  const std::int64_t V = b.config().vocab_size;
  BackendSequence seq(b);
  std::vector<std::int32_t> prompt, all;
  for (std::int32_t i = 0; i < 21; ++i) {
    prompt.push_back((i * 97 + 5) % static_cast<std::int32_t>(V));
    all.push_back(i);
  }
  GreedyPass r;
  r.prefill = seq.step(prompt, all);
  std::int32_t next = argmax_of(&r.prefill[(prompt.size() - 1) * static_cast<std::size_t>(V)], V);
  for (int s = 0; s < steps; ++s) {
    r.greedy.push_back(next);
    r.decode.push_back(seq.step({fed ? (*fed)[static_cast<std::size_t>(s)] : next}, {0}));
    next = argmax_of(r.decode.back().data(), V);
  }
  return r;
}

}  // namespace lmserve::testing
