#include "backend/cpu/cpu_ops.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "common/numeric.h"

namespace lmserve::backend::cpu {

namespace {

// FP8 weights (issue #34): each row of x quantized to e4m3 with its own scale max|x| / 448 (1 for
// a row of zeros), products of the e4m3 values summed in float32, then scaled by the row's and
// the output channel's scales — the arithmetic of an FP8 GEMM with per-token activation scales
// and per-channel (or per-tensor) weight scales.
void matmul_fp8(ThreadPool& pool, const float* x, std::int64_t rows, std::int64_t in, const model::Tensor& w, const model::Tensor* bias,
                float* y, std::int64_t out) {
  static const auto lut = [] {
    std::array<float, 256> t{};
    for (int v = 0; v < 256; ++v) t[static_cast<std::size_t>(v)] = fp8_e4m3_to_float(static_cast<std::uint8_t>(v));
    return t;
  }();
  std::vector<float> xq(static_cast<std::size_t>(rows * in)), xs(static_cast<std::size_t>(rows));
  quantize_rows_fp8(x, rows, in, xq.data(), xs.data());
  const auto* wq = static_cast<const std::uint8_t*>(w.data);
  pool.parallel_for(static_cast<std::size_t>(out), [&](std::size_t b, std::size_t e) {
    std::vector<float> row(static_cast<std::size_t>(in));
    for (std::size_t o = b; o < e; ++o) {
      for (std::int64_t i = 0; i < in; ++i) row[static_cast<std::size_t>(i)] = lut[wq[static_cast<std::int64_t>(o) * in + i]];
      const float ws = w.num_scales == 1 ? w.scales[0] : w.scales[o];
      const float bo = bias && bias->data ? bias->at(static_cast<std::int64_t>(o)) : 0.0f;
      for (std::int64_t t = 0; t < rows; ++t) {
        const float* xr = xq.data() + t * in;
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        std::int64_t i = 0;
        for (; i + 8 <= in; i += 8) {
          for (int k = 0; k < 8; ++k) acc[k] += xr[i + k] * row[static_cast<std::size_t>(i + k)];
        }
        float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
        for (; i < in; ++i) s += xr[i] * row[static_cast<std::size_t>(i)];
        y[t * out + static_cast<std::int64_t>(o)] = s * xs[static_cast<std::size_t>(t)] * ws + bo;
      }
    }
  });
}

}  // namespace

void quantize_rows_fp8(const float* x, std::int64_t rows, std::int64_t in, float* xq, float* scales) {
  for (std::int64_t t = 0; t < rows; ++t) {
    const float* xr = x + t * in;
    float amax = 0.0f;
    for (std::int64_t i = 0; i < in; ++i) amax = std::max(amax, std::fabs(xr[i]));
    const float s = amax > 0.0f && std::isfinite(amax) ? amax / 448.0f : 1.0f;
    scales[t] = s;
    for (std::int64_t i = 0; i < in; ++i) xq[t * in + i] = fp8_e4m3_to_float(float_to_fp8_e4m3(xr[i] / s));
  }
}

void matmul(ThreadPool& pool, const float* x, std::int64_t rows, std::int64_t in, const model::Tensor& w, const model::Tensor* bias,
            float* y, std::int64_t out) {
  if (w.dtype == model::DType::kF8E4M3) return matmul_fp8(pool, x, rows, in, w, bias, y, out);
  pool.parallel_for(static_cast<std::size_t>(out), [&](std::size_t b, std::size_t e) {
    std::vector<float> row(static_cast<std::size_t>(in));
    for (std::size_t o = b; o < e; ++o) {
      const float* wr;
      if (w.dtype == model::DType::kF32) {
        wr = static_cast<const float*>(w.data) + static_cast<std::int64_t>(o) * in;
      } else {
        w.to_float(static_cast<std::int64_t>(o) * in, in, row.data());
        wr = row.data();
      }
      float bo = bias && bias->data ? bias->at(static_cast<std::int64_t>(o)) : 0.0f;
      for (std::int64_t t = 0; t < rows; ++t) {
        const float* xr = x + t * in;
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        std::int64_t i = 0;
        for (; i + 8 <= in; i += 8) {
          for (int k = 0; k < 8; ++k) acc[k] += xr[i + k] * wr[i + k];
        }
        float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
        for (; i < in; ++i) s += xr[i] * wr[i];
        y[t * out + static_cast<std::int64_t>(o)] = s + bo;
      }
    }
  });
}

void rms_norm(const float* x, const model::Tensor& w, float eps, std::int64_t n, float* out) {
  double ss = 0;
  for (std::int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  float inv = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(n)) + eps);
  for (std::int64_t i = 0; i < n; ++i) out[i] = w.at(i) * (x[i] * inv);
}

void apply_rope(float* v, std::int64_t head_dim, std::int32_t pos, std::span<const float> inv_freq) {
  const std::int64_t half = head_dim / 2;
  for (std::int64_t i = 0; i < half; ++i) {
    float angle = static_cast<float>(pos) * inv_freq[static_cast<std::size_t>(i)];
    float c = static_cast<float>(std::cos(static_cast<double>(angle)));
    float s = static_cast<float>(std::sin(static_cast<double>(angle)));
    float a = v[i], b = v[i + half];
    v[i] = a * c - b * s;
    v[i + half] = b * c + a * s;
  }
}

void silu_mul(const float* gate, const float* up, std::size_t n, float* out) {
  for (std::size_t i = 0; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

namespace {

void store(std::byte* p, KvDtype dtype, std::size_t idx, float val, float scale) {
  switch (dtype) {
    case KvDtype::kFloat32: reinterpret_cast<float*>(p)[idx] = val; break;
    case KvDtype::kBFloat16: reinterpret_cast<std::uint16_t*>(p)[idx] = float_to_bf16(val); break;
    case KvDtype::kFloat16: reinterpret_cast<std::uint16_t*>(p)[idx] = float_to_f16(val); break;
    case KvDtype::kFp8E5M2: reinterpret_cast<std::uint8_t*>(p)[idx] = float_to_fp8_e5m2(val); break;
    case KvDtype::kFp8E4M3: reinterpret_cast<std::uint8_t*>(p)[idx] = float_to_fp8_e4m3(val / scale); break;
  }
}

float load(const std::byte* p, KvDtype dtype, std::size_t idx, float scale) {
  switch (dtype) {
    case KvDtype::kFloat32: return reinterpret_cast<const float*>(p)[idx];
    case KvDtype::kBFloat16: return bf16_to_float(reinterpret_cast<const std::uint16_t*>(p)[idx]);
    case KvDtype::kFloat16: return f16_to_float(reinterpret_cast<const std::uint16_t*>(p)[idx]);
    case KvDtype::kFp8E5M2: return fp8_e5m2_to_float(reinterpret_cast<const std::uint8_t*>(p)[idx]);
    case KvDtype::kFp8E4M3: return fp8_e4m3_to_float(reinterpret_cast<const std::uint8_t*>(p)[idx]) * scale;
  }
  return 0.0f;
}

float scale_of(std::span<const float> scales, std::int64_t head) {
  return static_cast<std::size_t>(head) < scales.size() ? scales[static_cast<std::size_t>(head)] : 1.0f;
}

}  // namespace

void write_kv(const KvLayer& L, std::int64_t slot, const float* k, const float* v, std::span<float> k_amax, std::span<float> v_amax) {
  const std::int64_t D = L.head_dim;
  for (std::int64_t hd = 0; hd < L.num_kv_heads; ++hd) {
    const float ks = scale_of(L.k_scales, hd), vs = scale_of(L.v_scales, hd);
    const auto base = static_cast<std::size_t>((slot * L.num_kv_heads + hd) * D);
    for (std::int64_t d = 0; d < D; ++d) {
      float kd = k[hd * D + d], vd = v[hd * D + d];
      if (!k_amax.empty()) {
        auto& ka = k_amax[static_cast<std::size_t>(hd)];
        auto& va = v_amax[static_cast<std::size_t>(hd)];
        ka = std::max(ka, std::fabs(kd));
        va = std::max(va, std::fabs(vd));
      }
      store(L.k, L.dtype, base + static_cast<std::size_t>(d), kd, ks);
      store(L.v, L.dtype, base + static_cast<std::size_t>(d), vd, vs);
    }
  }
}

void paged_attention(ThreadPool& pool, const KvLayer& L, const Batch& b, std::int64_t nh, const float* q, float* out) {
  const std::int64_t D = L.head_dim, nkv = L.num_kv_heads, group = nh / nkv;
  const std::int64_t qd = nh * D;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const std::size_t items = b.seqs.size() * static_cast<std::size_t>(nkv);
  pool.parallel_for(items, [&](std::size_t begin, std::size_t end) {
    std::vector<float> keys, vals, scores;
    for (std::size_t it = begin; it < end; ++it) {
      const SeqBatch& s = b.seqs[it / static_cast<std::size_t>(nkv)];
      const std::int64_t g = static_cast<std::int64_t>(it % static_cast<std::size_t>(nkv));
      const float ks = scale_of(L.k_scales, g), vs = scale_of(L.v_scales, g);
      const std::int64_t ctx = s.context_len;
      keys.resize(static_cast<std::size_t>(ctx * D));
      vals.resize(keys.size());
      for (std::int64_t p = 0; p < ctx; ++p) {  // gather this KV head's context once for the group
        std::int64_t slot = static_cast<std::int64_t>(s.block_table[static_cast<std::size_t>(p / L.block_size)]) * L.block_size +
                            p % L.block_size;
        const auto base = static_cast<std::size_t>((slot * nkv + g) * D);
        for (std::int64_t d = 0; d < D; ++d) {
          keys[static_cast<std::size_t>(p * D + d)] = load(L.k, L.dtype, base + static_cast<std::size_t>(d), ks);
          vals[static_cast<std::size_t>(p * D + d)] = load(L.v, L.dtype, base + static_cast<std::size_t>(d), vs);
        }
      }
      for (std::int32_t i = 0; i < s.query_len; ++i) {
        const std::int64_t t = s.query_start + i;
        const std::int64_t n = b.positions[static_cast<std::size_t>(t)] + 1;  // causal: positions 0..p
        scores.resize(static_cast<std::size_t>(n));
        for (std::int64_t hh = g * group; hh < (g + 1) * group; ++hh) {
          const float* qh = q + t * qd + hh * D;
          float mx = -INFINITY;
          for (std::int64_t p = 0; p < n; ++p) {
            float dot = 0;
            const float* kp = &keys[static_cast<std::size_t>(p * D)];
            for (std::int64_t d = 0; d < D; ++d) dot += qh[d] * kp[d];
            scores[static_cast<std::size_t>(p)] = dot * scale;
            mx = std::max(mx, scores[static_cast<std::size_t>(p)]);
          }
          float sum = 0;
          for (auto& sc : scores) {
            sc = std::exp(sc - mx);
            sum += sc;
          }
          float* oh = out + t * qd + hh * D;
          std::fill(oh, oh + D, 0.0f);
          for (std::int64_t p = 0; p < n; ++p) {
            const float w = scores[static_cast<std::size_t>(p)] / sum;
            const float* vp = &vals[static_cast<std::size_t>(p * D)];
            for (std::int64_t d = 0; d < D; ++d) oh[d] += w * vp[d];
          }
        }
      }
    }
  });
}

}  // namespace lmserve::backend::cpu
