// The CPU reference ops, one function per op, float32 arithmetic. The CPU backend is these ops
// in sequence; tests/backend_compare checks every CUDA op against the op of the same name here.
//
// KV cache layout (shared with every backend): per layer, K and V each hold
// [slot][kv_head][head_dim] elements of the cache dtype, slot = block * block_size + offset.
// fp8_e4m3 stores value / scale with one scale per (layer, KV head); other dtypes ignore scales.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "backend/backend.h"
#include "common/thread_pool.h"
#include "model/weights.h"

namespace lmserve::backend::cpu {

// y[t, o] = sum_i x[t, i] * W[o, i] (+ bias[o]) for t < rows; W row-major [out, in] in its
// stored dtype. `bias` may be null or empty. FP8 weights (model::DType::kF8E4M3): x's rows are
// quantized first (quantize_rows_fp8), y[t, o] = (sum_i xq[t, i] * e4m3(W[o, i])) x scale_x[t] x
// scale_w[o], summed in float32.
void matmul(ThreadPool& pool, const float* x, std::int64_t rows, std::int64_t in, const model::Tensor& w,
            const model::Tensor* bias, float* y, std::int64_t out);

// Per-token FP8 activations: row t's scale max|x[t]| / 448 (1 for a row of zeros) in scales[t],
// xq[t, i] = the e4m3 value of x[t, i] / scales[t] (round to nearest even, saturated) as float.
void quantize_rows_fp8(const float* x, std::int64_t rows, std::int64_t in, float* xq, float* scales);

// out = w * x / sqrt(mean(x^2) + eps) over n elements (in place allowed).
void rms_norm(const float* x, const model::Tensor& w, float eps, std::int64_t n, float* out);

// Rotates the two halves of one head (the "rotate_half" convention of Llama/Qwen/Mistral).
void apply_rope(float* v, std::int64_t head_dim, std::int32_t pos, std::span<const float> inv_freq);

// out[i] = silu(gate[i]) * up[i].
void silu_mul(const float* gate, const float* up, std::size_t n, float* out);

struct KvLayer {
  std::byte* k = nullptr;
  std::byte* v = nullptr;
  KvDtype dtype = KvDtype::kFloat32;
  std::int64_t num_kv_heads = 0, head_dim = 0;
  int block_size = 16;
  std::span<const float> k_scales, v_scales;  // per KV head (fp8_e4m3); empty: 1
};

// Stores one token's K and V (num_kv_heads * head_dim floats each) at `slot`, converted with
// round-to-nearest-even and saturation. Records per-head |max| into the amax spans if given.
void write_kv(const KvLayer& layer, std::int64_t slot, const float* k, const float* v, std::span<float> k_amax = {},
              std::span<float> v_amax = {});

// Causal attention of every token in `batch` over its sequence's cached positions 0..pos.
// q: [tokens, num_heads * head_dim]; out: the same shape. Grouped-query heads share KV head
// h / (num_heads / num_kv_heads).
void paged_attention(ThreadPool& pool, const KvLayer& layer, const Batch& batch, std::int64_t num_heads, const float* q, float* out);

}  // namespace lmserve::backend::cpu
