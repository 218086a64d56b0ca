// Tensor parallelism (`--tensor-parallel-size`): one rank's share of a model's weights, the same
// for every backend. With TP ranks, rank r holds:
//  - q, k, v (and their biases), gate, up: column-parallel, a contiguous range of W's rows (its
//    query heads, its KV heads, its part of the intermediate features);
//  - o, down: row-parallel, the matching columns of W: its product is a partial sum that the
//    ranks add up (all-reduce) before the residual;
//  - embedding and LM head: vocabulary-parallel, a contiguous range of token rows. A rank looks
//    up the tokens in its range (zeros for the others; the all-reduce completes the rows) and
//    computes the logits of its range (gathered for sampling);
//  - the norms (and Qwen3's q/k norms): whole.
// KV heads are split when TP divides them; with fewer KV heads than ranks (TP a multiple of
// them) each rank holds the one KV head its query heads read, so a KV head is replicated on
// TP / num_kv_heads ranks. Rank 0 of TP 1 is the whole model, its tensors the model's own.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/status.h"
#include "model/config.h"
#include "model/weights.h"

namespace lmserve::model {

struct ShardPlan {
  int tp = 1, rank = 0;
  std::int64_t heads = 0, first_head = 0;        // query heads
  std::int64_t kv_heads = 0, first_kv_head = 0;  // KV heads (1 when replicated)
  bool kv_replicated = false;
  std::int64_t intermediate = 0, first_intermediate = 0;
  std::int64_t vocab_begin = 0, vocab_end = 0;  // the embedding / LM head rows
};

// InvalidArgument naming what does not divide: TP < 1, query heads or intermediate features
// not divisible by TP, KV heads neither divisible by TP nor dividing it, or a vocabulary
// smaller than TP.
Status check_tensor_parallel(const ModelConfig& config, int tp);
// Rank `rank`'s share (after check_tensor_parallel). The vocabulary is split into TP ranges as
// even as can be (the first vocab % TP ranks one row more).
ShardPlan plan_shard(const ModelConfig& config, int tp, int rank);

class ShardWeights {
 public:
  // Column slices (o, down) are copied into buffers the shard owns; everything else is a view
  // into `weights`, which the shard keeps alive. FP8 projections keep their scales: per channel
  // sliced with their rows, whole for o and down (their rows are not split).
  static Result<std::shared_ptr<const ShardWeights>> make(std::shared_ptr<const ModelWeights> weights, int tp, int rank);

  const ShardPlan& plan() const { return plan_; }
  const ModelWeights& model() const { return *weights_; }
  const ModelConfig& config() const { return weights_->config(); }
  const Tensor& embed_tokens() const { return embed_; }  // rows vocab_begin..vocab_end-1
  const Tensor& lm_head() const { return lm_head_; }     // the same rows of the LM head
  const Tensor& final_norm() const { return weights_->final_norm(); }
  const std::vector<LayerWeights>& layers() const { return layers_; }
  // Bytes of the rank's tensors (a replicated KV head counted on each rank that holds it).
  std::uint64_t bytes() const { return bytes_; }

 private:
  std::shared_ptr<const ModelWeights> weights_;
  ShardPlan plan_;
  Tensor embed_, lm_head_;
  std::vector<LayerWeights> layers_;
  std::vector<std::shared_ptr<std::vector<std::byte>>> owned_;
  std::uint64_t bytes_ = 0;
};

}  // namespace lmserve::model
