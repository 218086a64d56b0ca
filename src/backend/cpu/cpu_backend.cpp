#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <random>

#include "common/numeric.h"
#include "common/thread_pool.h"

namespace lmserve::backend {
namespace {

using model::LayerWeights;
using model::ModelConfig;
using model::Tensor;

// y[t, o] = sum_i x[t, i] * W[o, i] (+ bias[o]) for t < rows; W row-major [out, in].
void matmul(ThreadPool& pool, const float* x, std::int64_t rows, std::int64_t in, const Tensor& w, const Tensor* bias,
            float* y, std::int64_t out) {
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

void rms_norm(const float* x, const Tensor& w, float eps, std::int64_t n, float* out) {
  double ss = 0;
  for (std::int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  float inv = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(n)) + eps);
  for (std::int64_t i = 0; i < n; ++i) out[i] = w.at(i) * (x[i] * inv);
}

// Rotary inverse frequencies as transformers computes them (float32), with linear or
// llama3 scaling.
std::vector<float> rope_inv_freq(const ModelConfig& c) {
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

void apply_rope(float* v, std::int64_t head_dim, std::int32_t pos, const std::vector<float>& inv_freq) {
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

class CpuBackend final : public Backend {
 public:
  CpuBackend(std::shared_ptr<const model::ModelWeights> w, const CpuBackendOptions& o)
      : weights_(std::move(w)), cfg_(weights_->config()), kv_(o.kv), pool_(static_cast<std::size_t>(std::max(0, o.threads))),
        inv_freq_(rope_inv_freq(cfg_)), k_scales_(o.k_scales), v_scales_(o.v_scales) {
    const std::size_t per_layer =
        static_cast<std::size_t>(kv_.num_blocks * kv_.block_size * cfg_.num_kv_heads * cfg_.head_dim * kv_dtype_bytes(kv_.dtype));
    k_cache_.assign(static_cast<std::size_t>(cfg_.num_layers), std::vector<std::byte>(per_layer));
    v_cache_.assign(static_cast<std::size_t>(cfg_.num_layers), std::vector<std::byte>(per_layer));
  }

  std::string_view name() const override { return "cpu"; }
  const ModelConfig& config() const override { return cfg_; }
  const KvCacheConfig& kv_config() const override { return kv_; }
  std::uint64_t kv_block_bytes() const override { return backend::kv_block_bytes(cfg_, kv_.dtype, kv_.block_size); }
  MemoryInfo memory() const override {
    MemoryInfo m;
    m.kv_cache_bytes = kv_block_bytes() * static_cast<std::uint64_t>(kv_.num_blocks);
    m.weight_bytes = weights_->bytes();
    m.used_bytes = m.kv_cache_bytes + m.weight_bytes;
    return m;
  }

  // Calibration for fp8_e4m3: record per-layer, per-head absolute maxima of K and V.
  void record_amax(bool on) {
    recording_ = on;
    k_amax_.assign(static_cast<std::size_t>(cfg_.num_layers * cfg_.num_kv_heads), 0.0f);
    v_amax_ = k_amax_;
  }
  const std::vector<float>& k_amax() const { return k_amax_; }
  const std::vector<float>& v_amax() const { return v_amax_; }

  Status forward(const Batch& b, std::span<float> logits) override {
    LMSERVE_RETURN_IF_ERROR(validate(b, logits));
    const std::int64_t T = static_cast<std::int64_t>(b.tokens.size());
    const std::int64_t H = cfg_.hidden_size, D = cfg_.head_dim, nh = cfg_.num_heads, nkv = cfg_.num_kv_heads;
    const std::int64_t qd = nh * D, kvd = nkv * D, I = cfg_.intermediate_size;
    const float eps = static_cast<float>(cfg_.rms_norm_eps);

    std::vector<float> x(static_cast<std::size_t>(T * H)), h(x.size()), q(static_cast<std::size_t>(T * qd)),
        k(static_cast<std::size_t>(T * kvd)), v(k.size()), attn(q.size()), o(x.size()),
        g(static_cast<std::size_t>(T * I)), u(g.size());
    for (std::int64_t t = 0; t < T; ++t) weights_->embed_tokens().to_float(b.tokens[t] * H, H, &x[t * H]);

    for (std::int64_t l = 0; l < cfg_.num_layers; ++l) {
      const LayerWeights& L = weights_->layers()[static_cast<std::size_t>(l)];
      for (std::int64_t t = 0; t < T; ++t) rms_norm(&x[t * H], L.input_norm, eps, H, &h[t * H]);
      matmul(pool_, h.data(), T, H, L.q_proj, &L.q_bias, q.data(), qd);
      matmul(pool_, h.data(), T, H, L.k_proj, &L.k_bias, k.data(), kvd);
      matmul(pool_, h.data(), T, H, L.v_proj, &L.v_bias, v.data(), kvd);
      for (std::int64_t t = 0; t < T; ++t) {
        for (std::int64_t hd = 0; hd < nh; ++hd) {
          float* qh = &q[t * qd + hd * D];
          if (cfg_.qk_norm) rms_norm(qh, L.q_norm, eps, D, qh);
          apply_rope(qh, D, b.positions[t], inv_freq_);
        }
        for (std::int64_t hd = 0; hd < nkv; ++hd) {
          float* kh = &k[t * kvd + hd * D];
          if (cfg_.qk_norm) rms_norm(kh, L.k_norm, eps, D, kh);
          apply_rope(kh, D, b.positions[t], inv_freq_);
        }
        write_kv(l, b.slot_mapping[t], &k[t * kvd], &v[t * kvd]);
      }
      attention(l, b, q.data(), attn.data());
      matmul(pool_, attn.data(), T, qd, L.o_proj, nullptr, o.data(), H);
      for (std::size_t i = 0; i < x.size(); ++i) x[i] += o[i];
      for (std::int64_t t = 0; t < T; ++t) rms_norm(&x[t * H], L.post_attention_norm, eps, H, &h[t * H]);
      matmul(pool_, h.data(), T, H, L.gate_proj, nullptr, g.data(), I);
      matmul(pool_, h.data(), T, H, L.up_proj, nullptr, u.data(), I);
      for (std::size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
      matmul(pool_, g.data(), T, I, L.down_proj, nullptr, o.data(), H);
      for (std::size_t i = 0; i < x.size(); ++i) x[i] += o[i];
    }

    const std::int64_t R = static_cast<std::int64_t>(b.logits_indices.size());
    std::vector<float> last(static_cast<std::size_t>(R * H));
    for (std::int64_t r = 0; r < R; ++r) rms_norm(&x[b.logits_indices[r] * H], weights_->final_norm(), eps, H, &last[r * H]);
    matmul(pool_, last.data(), R, H, weights_->lm_head(), nullptr, logits.data(), cfg_.vocab_size);
    return Status::ok();
  }

 private:
  Status validate(const Batch& b, std::span<float> logits) const {
    auto bad = [](const std::string& m) { return Status(StatusCode::kInvalidArgument, "batch: " + m); };
    const std::size_t T = b.tokens.size();
    if (b.positions.size() != T || b.slot_mapping.size() != T) return bad("tokens, positions and slot_mapping differ in length");
    if (logits.size() != b.logits_indices.size() * static_cast<std::size_t>(cfg_.vocab_size)) return bad("logits buffer has the wrong size");
    const std::int64_t slots = kv_.num_blocks * kv_.block_size;
    for (std::size_t i = 0; i < T; ++i) {
      if (b.tokens[i] < 0 || b.tokens[i] >= cfg_.vocab_size) return bad("token id " + std::to_string(b.tokens[i]) + " out of range");
      if (b.slot_mapping[i] < 0 || b.slot_mapping[i] >= slots) return bad("slot outside the KV cache");
      if (b.positions[i] < 0 || b.positions[i] >= cfg_.max_position_embeddings * 64) return bad("position out of range");
    }
    std::size_t covered = 0;
    for (const auto& s : b.seqs) {
      if (s.query_len <= 0 || s.query_start < 0 || static_cast<std::size_t>(s.query_start + s.query_len) > T) {
        return bad("sequence tokens outside the batch");
      }
      covered += static_cast<std::size_t>(s.query_len);
      if (s.context_len < s.query_len) return bad("context shorter than the new tokens");
      if (static_cast<std::int64_t>(s.block_table.size()) * kv_.block_size < s.context_len) return bad("block table too short for the context");
      for (auto blk : s.block_table) {
        if (blk < 0 || blk >= kv_.num_blocks) return bad("block id outside the KV cache");
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

  std::size_t slot_offset(std::int64_t slot, std::int64_t head) const {
    return static_cast<std::size_t>((slot * cfg_.num_kv_heads + head) * cfg_.head_dim);
  }

  void store(std::vector<std::byte>& cache, std::size_t idx, float val, float scale) const {
    std::byte* p = cache.data();
    switch (kv_.dtype) {
      case KvDtype::kFloat32: reinterpret_cast<float*>(p)[idx] = val; break;
      case KvDtype::kBFloat16: reinterpret_cast<std::uint16_t*>(p)[idx] = float_to_bf16(val); break;
      case KvDtype::kFloat16: reinterpret_cast<std::uint16_t*>(p)[idx] = float_to_f16(val); break;
      case KvDtype::kFp8E5M2: reinterpret_cast<std::uint8_t*>(p)[idx] = float_to_fp8_e5m2(val); break;
      case KvDtype::kFp8E4M3: reinterpret_cast<std::uint8_t*>(p)[idx] = float_to_fp8_e4m3(val / scale); break;
    }
  }

  float load(const std::vector<std::byte>& cache, std::size_t idx, float scale) const {
    const std::byte* p = cache.data();
    switch (kv_.dtype) {
      case KvDtype::kFloat32: return reinterpret_cast<const float*>(p)[idx];
      case KvDtype::kBFloat16: return bf16_to_float(reinterpret_cast<const std::uint16_t*>(p)[idx]);
      case KvDtype::kFloat16: return f16_to_float(reinterpret_cast<const std::uint16_t*>(p)[idx]);
      case KvDtype::kFp8E5M2: return fp8_e5m2_to_float(reinterpret_cast<const std::uint8_t*>(p)[idx]);
      case KvDtype::kFp8E4M3: return fp8_e4m3_to_float(reinterpret_cast<const std::uint8_t*>(p)[idx]) * scale;
    }
    return 0.0f;
  }

  float scale_of(const std::vector<float>& scales, std::int64_t layer, std::int64_t head) const {
    std::size_t i = static_cast<std::size_t>(layer * cfg_.num_kv_heads + head);
    return i < scales.size() ? scales[i] : 1.0f;
  }

  void write_kv(std::int64_t layer, std::int64_t slot, const float* k, const float* v) {
    const std::int64_t D = cfg_.head_dim;
    auto& kc = k_cache_[static_cast<std::size_t>(layer)];
    auto& vc = v_cache_[static_cast<std::size_t>(layer)];
    for (std::int64_t hd = 0; hd < cfg_.num_kv_heads; ++hd) {
      const float ks = scale_of(k_scales_, layer, hd), vs = scale_of(v_scales_, layer, hd);
      std::size_t base = slot_offset(slot, hd);
      for (std::int64_t d = 0; d < D; ++d) {
        float kd = k[hd * D + d], vd = v[hd * D + d];
        if (recording_) {
          auto i = static_cast<std::size_t>(layer * cfg_.num_kv_heads + hd);
          k_amax_[i] = std::max(k_amax_[i], std::fabs(kd));
          v_amax_[i] = std::max(v_amax_[i], std::fabs(vd));
        }
        store(kc, base + static_cast<std::size_t>(d), kd, ks);
        store(vc, base + static_cast<std::size_t>(d), vd, vs);
      }
    }
  }

  void attention(std::int64_t layer, const Batch& b, const float* q, float* out) {
    const std::int64_t D = cfg_.head_dim, nh = cfg_.num_heads, nkv = cfg_.num_kv_heads, group = nh / nkv;
    const std::int64_t qd = nh * D;
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    const auto& kc = k_cache_[static_cast<std::size_t>(layer)];
    const auto& vc = v_cache_[static_cast<std::size_t>(layer)];
    const std::size_t items = b.seqs.size() * static_cast<std::size_t>(nkv);
    pool_.parallel_for(items, [&](std::size_t begin, std::size_t end) {
      std::vector<float> keys, vals, scores;
      for (std::size_t it = begin; it < end; ++it) {
        const SeqBatch& s = b.seqs[it / static_cast<std::size_t>(nkv)];
        const std::int64_t g = static_cast<std::int64_t>(it % static_cast<std::size_t>(nkv));
        const float ks = scale_of(k_scales_, layer, g), vs = scale_of(v_scales_, layer, g);
        const std::int64_t ctx = s.context_len;
        keys.resize(static_cast<std::size_t>(ctx * D));
        vals.resize(keys.size());
        for (std::int64_t p = 0; p < ctx; ++p) {  // gather this KV head's context once for the group
          std::int64_t slot = static_cast<std::int64_t>(s.block_table[static_cast<std::size_t>(p / kv_.block_size)]) * kv_.block_size +
                              p % kv_.block_size;
          std::size_t base = slot_offset(slot, g);
          for (std::int64_t d = 0; d < D; ++d) {
            keys[static_cast<std::size_t>(p * D + d)] = load(kc, base + static_cast<std::size_t>(d), ks);
            vals[static_cast<std::size_t>(p * D + d)] = load(vc, base + static_cast<std::size_t>(d), vs);
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

  std::shared_ptr<const model::ModelWeights> weights_;
  const ModelConfig& cfg_;
  KvCacheConfig kv_;
  ThreadPool pool_;
  std::vector<float> inv_freq_;
  std::vector<float> k_scales_, v_scales_;
  std::vector<std::vector<std::byte>> k_cache_, v_cache_;
  bool recording_ = false;
  std::vector<float> k_amax_, v_amax_;
};

// Per-layer, per-head fp8_e4m3 scales from a fixed pseudo-random 256-token batch run with a
// float32 cache: scale = 2 x amax / 448, so typical values use the format's range and
// outliers up to twice the calibration maximum still fit.
Status calibrate_e4m3(const std::shared_ptr<const model::ModelWeights>& w, const CpuBackendOptions& o,
                      std::vector<float>* k_scales, std::vector<float>* v_scales) {
  constexpr int kTokens = 256;
  CpuBackendOptions co;
  co.threads = o.threads;
  co.kv = {KvDtype::kFloat32, 16, kTokens / 16};
  CpuBackend cal(w, co);
  cal.record_amax(true);
  std::mt19937 rng(20261130);
  std::uniform_int_distribution<std::int32_t> tok(0, static_cast<std::int32_t>(w->config().vocab_size - 1));
  std::vector<std::int32_t> tokens(kTokens), positions(kTokens), table(kTokens / 16);
  std::vector<std::int64_t> slots(kTokens);
  for (int i = 0; i < kTokens; ++i) {
    tokens[static_cast<std::size_t>(i)] = tok(rng);
    positions[static_cast<std::size_t>(i)] = i;
    slots[static_cast<std::size_t>(i)] = i;
  }
  for (int i = 0; i < kTokens / 16; ++i) table[static_cast<std::size_t>(i)] = i;
  SeqBatch seq{0, kTokens, kTokens, table};
  std::int32_t last = kTokens - 1;
  std::vector<float> logits(static_cast<std::size_t>(w->config().vocab_size));
  Batch batch{tokens, positions, slots, std::span<const SeqBatch>(&seq, 1), std::span<const std::int32_t>(&last, 1)};
  LMSERVE_RETURN_IF_ERROR(cal.forward(batch, logits));
  for (float a : cal.k_amax()) k_scales->push_back(std::max(a, 1e-6f) * 2.0f / 448.0f);
  for (float a : cal.v_amax()) v_scales->push_back(std::max(a, 1e-6f) * 2.0f / 448.0f);
  return Status::ok();
}

}  // namespace

Result<std::unique_ptr<Backend>> make_cpu_backend(std::shared_ptr<const model::ModelWeights> weights, const CpuBackendOptions& options) {
  if (!weights) return error(StatusCode::kInvalidArgument, "cpu backend: no weights");
  if (options.kv.block_size <= 0 || options.kv.num_blocks <= 0) {
    return error(StatusCode::kInvalidArgument, "cpu backend: block_size and num_blocks must be positive");
  }
  const auto& c = weights->config();
  const std::size_t n_scales = static_cast<std::size_t>(c.num_layers * c.num_kv_heads);
  CpuBackendOptions o = options;
  if (o.kv.dtype == KvDtype::kFp8E4M3 && o.k_scales.empty()) {
    LMSERVE_RETURN_IF_ERROR(calibrate_e4m3(weights, options, &o.k_scales, &o.v_scales));
  }
  if (o.kv.dtype == KvDtype::kFp8E4M3 && (o.k_scales.size() != n_scales || o.v_scales.size() != n_scales)) {
    return error(StatusCode::kInvalidArgument, "cpu backend: fp8_e4m3 needs num_layers x num_kv_heads K and V scales");
  }
  return std::unique_ptr<Backend>(new CpuBackend(std::move(weights), o));
}

}  // namespace lmserve::backend
