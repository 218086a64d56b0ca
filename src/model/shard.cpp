#include "model/shard.h"

#include <cstring>
#include <string>

namespace lmserve::model {

namespace {

// Rows [begin, begin + count) of a [rows, cols] tensor (or of a vector), as a view.
Tensor rows_of(const Tensor& t, std::int64_t begin, std::int64_t count) {
  if (t.data == nullptr || t.shape.empty()) return t;  // an absent bias
  Tensor s = t;
  const std::int64_t row_elems = t.shape.size() > 1 ? t.shape[1] : 1;
  s.shape[0] = count;
  s.data = static_cast<const std::byte*>(t.data) + begin * row_elems * dtype_bytes(t.dtype);
  if (t.num_scales > 1) {
    s.scales = t.scales + begin;
    s.num_scales = count;
  }
  return s;
}

// Columns [begin, begin + count) of a [rows, cols] tensor, copied into `owned`.
Tensor columns_of(const Tensor& t, std::int64_t begin, std::int64_t count, std::vector<std::shared_ptr<std::vector<std::byte>>>& owned) {
  const std::int64_t rows = t.shape[0], cols = t.shape[1];
  const auto elem = static_cast<std::size_t>(dtype_bytes(t.dtype));
  auto buf = std::make_shared<std::vector<std::byte>>(static_cast<std::size_t>(rows * count) * elem);
  const auto* src = static_cast<const std::byte*>(t.data);
  for (std::int64_t r = 0; r < rows; ++r) {
    std::memcpy(buf->data() + static_cast<std::size_t>(r * count) * elem, src + static_cast<std::size_t>(r * cols + begin) * elem,
                static_cast<std::size_t>(count) * elem);
  }
  Tensor s = t;
  s.shape = {rows, count};
  s.data = buf->data();
  owned.push_back(std::move(buf));
  return s;
}

std::string tp_prefix(int tp) { return "--tensor-parallel-size " + std::to_string(tp) + ": "; }

}  // namespace

Status check_tensor_parallel(const ModelConfig& c, int tp) {
  if (tp < 1) return Status(StatusCode::kInvalidArgument, tp_prefix(tp) + "must be at least 1");
  if (c.num_heads % tp != 0) {
    return Status(StatusCode::kInvalidArgument, tp_prefix(tp) + "does not divide the model's " + std::to_string(c.num_heads) + " attention heads");
  }
  if (c.num_kv_heads % tp != 0 && tp % c.num_kv_heads != 0) {
    return Status(StatusCode::kInvalidArgument,
                  tp_prefix(tp) + "neither divides the model's " + std::to_string(c.num_kv_heads) + " KV heads nor is a multiple of them");
  }
  if (c.intermediate_size % tp != 0) {
    return Status(StatusCode::kInvalidArgument,
                  tp_prefix(tp) + "does not divide the model's " + std::to_string(c.intermediate_size) + " intermediate features");
  }
  if (c.vocab_size < tp) return Status(StatusCode::kInvalidArgument, tp_prefix(tp) + "is larger than the vocabulary");
  return Status::ok();
}

ShardPlan plan_shard(const ModelConfig& c, int tp, int rank) {
  ShardPlan p;
  p.tp = tp;
  p.rank = rank;
  p.heads = c.num_heads / tp;
  p.first_head = rank * p.heads;
  p.kv_replicated = c.num_kv_heads < tp;
  if (p.kv_replicated) {
    p.kv_heads = 1;
    p.first_kv_head = p.first_head / (c.num_heads / c.num_kv_heads);
  } else {
    p.kv_heads = c.num_kv_heads / tp;
    p.first_kv_head = rank * p.kv_heads;
  }
  p.intermediate = c.intermediate_size / tp;
  p.first_intermediate = rank * p.intermediate;
  const std::int64_t base = c.vocab_size / tp, extra = c.vocab_size % tp;
  p.vocab_begin = rank * base + std::min<std::int64_t>(rank, extra);
  p.vocab_end = p.vocab_begin + base + (rank < extra ? 1 : 0);
  return p;
}

Result<std::shared_ptr<const ShardWeights>> ShardWeights::make(std::shared_ptr<const ModelWeights> weights, int tp, int rank) {
  if (!weights) return error(StatusCode::kInvalidArgument, "shard: no weights");
  const ModelConfig& c = weights->config();
  LMSERVE_RETURN_IF_ERROR(check_tensor_parallel(c, tp));
  if (rank < 0 || rank >= tp) return error(StatusCode::kInvalidArgument, "shard: rank " + std::to_string(rank) + " outside 0.." + std::to_string(tp - 1));
  auto s = std::shared_ptr<ShardWeights>(new ShardWeights());
  s->weights_ = weights;
  s->plan_ = plan_shard(c, tp, rank);
  const ShardPlan& p = s->plan_;
  const std::int64_t D = c.head_dim, vocab = p.vocab_end - p.vocab_begin;
  s->embed_ = rows_of(weights->embed_tokens(), p.vocab_begin, vocab);
  s->lm_head_ = rows_of(weights->lm_head(), p.vocab_begin, vocab);
  for (const LayerWeights& L : weights->layers()) {
    LayerWeights r = L;
    if (tp > 1) {
      r.q_proj = rows_of(L.q_proj, p.first_head * D, p.heads * D);
      r.q_bias = rows_of(L.q_bias, p.first_head * D, p.heads * D);
      for (auto [w, b, sw, sb] : {std::tuple{&L.k_proj, &L.k_bias, &r.k_proj, &r.k_bias}, std::tuple{&L.v_proj, &L.v_bias, &r.v_proj, &r.v_bias}}) {
        *sw = rows_of(*w, p.first_kv_head * D, p.kv_heads * D);
        *sb = rows_of(*b, p.first_kv_head * D, p.kv_heads * D);
      }
      r.o_proj = columns_of(L.o_proj, p.first_head * D, p.heads * D, s->owned_);
      r.gate_proj = rows_of(L.gate_proj, p.first_intermediate, p.intermediate);
      r.up_proj = rows_of(L.up_proj, p.first_intermediate, p.intermediate);
      r.down_proj = columns_of(L.down_proj, p.first_intermediate, p.intermediate, s->owned_);
    }
    for (const Tensor* t : {&r.input_norm, &r.post_attention_norm, &r.q_proj, &r.k_proj, &r.v_proj, &r.o_proj, &r.q_bias, &r.k_bias, &r.v_bias,
                            &r.q_norm, &r.k_norm, &r.gate_proj, &r.up_proj, &r.down_proj}) {
      if (t->data) s->bytes_ += t->bytes();
    }
    s->layers_.push_back(std::move(r));
  }
  s->bytes_ += s->embed_.bytes() + weights->final_norm().bytes() + (c.tie_word_embeddings ? 0 : s->lm_head_.bytes());
  return std::shared_ptr<const ShardWeights>(std::move(s));
}

}  // namespace lmserve::model
