#include "backend/backend.h"

#include <cmath>
#include <numbers>
#include <utility>

namespace lmserve::backend {

Result<KvDtype> parse_kv_dtype(std::string_view n, model::DType model_dtype) {
  if (n == "auto") {
    switch (model_dtype) {
      case model::DType::kF32: return KvDtype::kFloat32;
      case model::DType::kF16: return KvDtype::kFloat16;
      case model::DType::kBF16:
      case model::DType::kF8E4M3:  // never an activation dtype; bf16 as an FP8 checkpoint's activations
        return KvDtype::kBFloat16;
    }
  }
  if (n == "float32" || n == "fp32") return KvDtype::kFloat32;
  if (n == "bfloat16" || n == "bf16") return KvDtype::kBFloat16;
  if (n == "float16" || n == "fp16" || n == "half") return KvDtype::kFloat16;
  if (n == "fp8" || n == "fp8_e5m2") return KvDtype::kFp8E5M2;
  if (n == "fp8_e4m3") return KvDtype::kFp8E4M3;
  return error(StatusCode::kInvalidArgument, "unknown KV cache dtype '" + std::string(n) +
                                                 "' (auto, float32, bfloat16, float16, fp8_e5m2, fp8_e4m3)");
}

std::string_view kv_dtype_name(KvDtype d) {
  switch (d) {
    case KvDtype::kFloat32: return "float32";
    case KvDtype::kBFloat16: return "bfloat16";
    case KvDtype::kFloat16: return "float16";
    case KvDtype::kFp8E5M2: return "fp8_e5m2";
    case KvDtype::kFp8E4M3: return "fp8_e4m3";
  }
  return "?";
}

int kv_dtype_bytes(KvDtype d) {
  switch (d) {
    case KvDtype::kFloat32: return 4;
    case KvDtype::kBFloat16:
    case KvDtype::kFloat16: return 2;
    default: return 1;
  }
}

std::uint64_t kv_block_bytes(const model::ModelConfig& c, KvDtype dtype, int block_size, std::int64_t kv_heads) {
  return static_cast<std::uint64_t>(2 * c.num_layers * block_size * (kv_heads > 0 ? kv_heads : c.num_kv_heads) * c.head_dim * kv_dtype_bytes(dtype));
}

Status Backend::prepare(const Batch& batch, std::span<float> logits) {
  prepared_ = batch;
  prepared_logits_ = logits;
  has_prepared_ = true;
  return Status::ok();
}

Status Backend::launch(std::span<const TokenPatch> /*patches: already in the caller's tokens*/) {
  if (!has_prepared_) return Status(StatusCode::kFailedPrecondition, "launch: no prepared batch");
  has_prepared_ = false;
  launched_ = forward(prepared_, prepared_logits_);
  return Status::ok();
}

Status Backend::wait() { return std::exchange(launched_, Status::ok()); }

Status validate_batch(const Batch& b, const model::ModelConfig& c, const KvCacheConfig& kv, std::size_t logits_size) {
  auto bad = [](const std::string& m) { return Status(StatusCode::kInvalidArgument, "batch: " + m); };
  const std::size_t T = b.tokens.size();
  if (b.positions.size() != T || b.slot_mapping.size() != T) return bad("tokens, positions and slot_mapping differ in length");
  if (logits_size != b.logits_indices.size() * static_cast<std::size_t>(c.vocab_size)) return bad("logits buffer has the wrong size");
  const std::int64_t slots = kv.num_blocks * kv.block_size;
  for (std::size_t i = 0; i < T; ++i) {
    if (b.tokens[i] < 0 || b.tokens[i] >= c.vocab_size) return bad("token id " + std::to_string(b.tokens[i]) + " out of range");
    if (b.slot_mapping[i] < 0 || b.slot_mapping[i] >= slots) return bad("slot outside the KV cache");
    if (b.positions[i] < 0 || b.positions[i] >= c.max_position_embeddings * 64) return bad("position out of range");
  }
  std::size_t covered = 0;
  for (const auto& s : b.seqs) {
    if (s.query_len <= 0 || s.query_start < 0 || static_cast<std::size_t>(s.query_start + s.query_len) > T) {
      return bad("sequence tokens outside the batch");
    }
    covered += static_cast<std::size_t>(s.query_len);
    if (s.context_len < s.query_len) return bad("context shorter than the new tokens");
    if (static_cast<std::int64_t>(s.block_table.size()) * kv.block_size < s.context_len) return bad("block table too short for the context");
    for (auto blk : s.block_table) {
      if (blk < 0 || blk >= kv.num_blocks) return bad("block id outside the KV cache");
    }
    for (std::int32_t i = 0; i < s.query_len; ++i) {
      if (b.positions[static_cast<std::size_t>(s.query_start + i)] >= s.context_len) return bad("position past the context");
    }
  }
  if (covered != T) return bad("sequences do not cover the batch");
  for (auto r : b.logits_indices) {
    if (r < 0 || static_cast<std::size_t>(r) >= T) return bad("logits index out of range");
  }
  return Status::ok();
}

Status validate_swap(std::span<const BlockCopy> to_host, std::span<const BlockCopy> to_device, std::int64_t num_blocks,
                     std::int64_t host_blocks) {
  for (auto list : {to_host, to_device}) {
    for (const BlockCopy& c : list) {
      if (c.device < 0 || c.device >= num_blocks) return Status(StatusCode::kInvalidArgument, "swap: device block outside the KV cache");
      if (c.host < 0 || c.host >= host_blocks) return Status(StatusCode::kInvalidArgument, "swap: host block outside the swap space");
    }
  }
  return Status::ok();
}

std::vector<float> rope_inv_freq(const model::ModelConfig& c) {
  const std::int64_t half = c.head_dim / 2;
  std::vector<float> f(static_cast<std::size_t>(half));
  for (std::int64_t i = 0; i < half; ++i) {
    float exponent = static_cast<float>(2 * i) / static_cast<float>(c.head_dim);
    f[static_cast<std::size_t>(i)] = 1.0f / static_cast<float>(std::pow(static_cast<float>(c.rope_theta), exponent));
  }
  const auto& rs = c.rope_scaling;
  if (rs.type == model::RopeScaling::Type::kLinear) {
    for (auto& x : f) x = x / static_cast<float>(rs.factor);
  } else if (rs.type == model::RopeScaling::Type::kLlama3) {
    const float old_len = static_cast<float>(rs.original_max_position_embeddings);
    const float lo = static_cast<float>(rs.low_freq_factor), hi = static_cast<float>(rs.high_freq_factor);
    const float factor = static_cast<float>(rs.factor);
    const float low_wavelen = old_len / lo, high_wavelen = old_len / hi;
    for (auto& x : f) {
      float wavelen = 2.0f * std::numbers::pi_v<float> / x;
      float scaled = wavelen > low_wavelen ? x / factor : x;
      if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
        float smooth = (old_len / wavelen - lo) / (hi - lo);
        scaled = (1.0f - smooth) * scaled / factor + smooth * scaled;
      }
      x = scaled;
    }
  }
  return f;
}

}  // namespace lmserve::backend
