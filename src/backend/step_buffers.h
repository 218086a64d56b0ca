// Bytes per token of the buffers a device step holds for each of its tokens, by layer input and
// product: the float32 residual, the normalised input (act), the QKV product, the roped Q
// (act), the attention output (act), the layer output, the gate/up product and the SiLU
// output (act); the products take `product_bytes` each. The CUDA backend allocates these for
// max_num_batched_tokens tokens and `lmserve plan` reserves the same, so both read them here.
// `heads`, `kv_heads` and `intermediate` are one GPU's share under tensor parallelism. With FP8
// weights a product's input is also held quantized (one byte an element of the widest input,
// and its float32 scale).
// C++17 and header-only: the CUDA sources include it.
#pragma once

#include <algorithm>
#include <cstdint>

namespace lmserve::backend {

struct StepBufferBytes {
  std::uint64_t residual = 0, normed = 0, qkv = 0, q = 0, attn = 0, layer_out = 0, gate_up = 0, mlp_in = 0, quantized = 0;
  std::uint64_t total() const { return residual + normed + qkv + q + attn + layer_out + gate_up + mlp_in + quantized; }
};

inline StepBufferBytes step_buffer_bytes(std::int64_t hidden, std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim,
                                         std::int64_t intermediate, int act_bytes, int product_bytes, bool fp8_weights = false) {
  const auto H = static_cast<std::uint64_t>(hidden), qd = static_cast<std::uint64_t>(heads * head_dim),
             kvd = static_cast<std::uint64_t>(kv_heads * head_dim), I = static_cast<std::uint64_t>(intermediate);
  const auto a = static_cast<std::uint64_t>(act_bytes), p = static_cast<std::uint64_t>(product_bytes);
  StepBufferBytes b;
  b.residual = H * 4;
  b.normed = H * a;
  b.qkv = (qd + 2 * kvd) * p;
  b.q = qd * a;
  b.attn = qd * a;
  b.layer_out = H * p;
  b.gate_up = 2 * I * p;
  b.mlp_in = I * a;
  if (fp8_weights) b.quantized = std::max({H, qd, I}) + 4;
  return b;
}

}  // namespace lmserve::backend
