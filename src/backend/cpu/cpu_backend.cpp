#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <numbers>
#include <random>

#include "backend/cpu/cpu_ops.h"
#include "backend/device/host_swap.h"
#include "common/thread_pool.h"

namespace lmserve::backend {
namespace {

using model::LayerWeights;
using model::ModelConfig;
using model::Tensor;
using namespace cpu;

class CpuBackend final : public Backend {
 public:
  CpuBackend(std::shared_ptr<const model::ModelWeights> w, const CpuBackendOptions& o)
      : weights_(std::move(w)), cfg_(weights_->config()), kv_(o.kv), pool_(static_cast<std::size_t>(std::max(0, o.threads))),
        inv_freq_(rope_inv_freq(cfg_)), k_scales_(o.k_scales), v_scales_(o.v_scales),
        host_(backend::kv_block_bytes(cfg_, kv_.dtype, kv_.block_size), [](std::size_t n) -> void* { return ::operator new(n, std::nothrow); },
              [](void* p) { ::operator delete(p); }) {
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

  Status set_host_blocks(std::int64_t n) override {
    host_.set_blocks(n);
    return Status::ok();
  }

  // A host block holds the block's K then V of layer 0, then layer 1, ...
  Status swap_blocks(std::span<const BlockCopy> to_host, std::span<const BlockCopy> to_device) override {
    LMSERVE_RETURN_IF_ERROR(host_.prepare(to_host, to_device, kv_.num_blocks));
    const std::size_t chunk = kv_block_bytes() / static_cast<std::size_t>(2 * cfg_.num_layers);
    for (bool out : {true, false}) {
      for (const BlockCopy& c : out ? to_host : to_device) {
        std::byte* h = host_.block(c.host);
        for (std::size_t l = 0; l < static_cast<std::size_t>(cfg_.num_layers); ++l) {
          for (auto* cache : {&k_cache_, &v_cache_}) {
            std::byte* d = (*cache)[l].data() + static_cast<std::size_t>(c.device) * chunk;
            std::memcpy(out ? h : d, out ? d : h, chunk);
            h += chunk;
          }
        }
      }
    }
    return Status::ok();
  }

  std::uint64_t host_swap_bytes() const override { return host_.bytes(); }

  // Calibration for fp8_e4m3: record per-layer, per-head absolute maxima of K and V.
  void record_amax(bool on) {
    recording_ = on;
    k_amax_.assign(static_cast<std::size_t>(cfg_.num_layers * cfg_.num_kv_heads), 0.0f);
    v_amax_ = k_amax_;
  }
  const std::vector<float>& k_amax() const { return k_amax_; }
  const std::vector<float>& v_amax() const { return v_amax_; }

  Status forward(const Batch& b, std::span<float> logits) override {
    LMSERVE_RETURN_IF_ERROR(validate_batch(b, cfg_, kv_, logits.size()));
    const std::int64_t T = static_cast<std::int64_t>(b.tokens.size());
    const std::int64_t H = cfg_.hidden_size, D = cfg_.head_dim, nh = cfg_.num_heads, nkv = cfg_.num_kv_heads;
    const std::int64_t qd = nh * D, kvd = nkv * D, I = cfg_.intermediate_size;
    const float eps = static_cast<float>(cfg_.rms_norm_eps);

    std::vector<float> x(static_cast<std::size_t>(T * H)), h(x.size()), q(static_cast<std::size_t>(T * qd)),
        k(static_cast<std::size_t>(T * kvd)), v(k.size()), attn(q.size()), o(x.size()),
        g(static_cast<std::size_t>(T * I)), u(g.size());
    for (std::int64_t t = 0; t < T; ++t) weights_->embed_tokens().to_float(b.tokens[t] * H, H, &x[t * H]);

    for (std::int64_t l = 0; l < cfg_.num_layers; ++l) {
      const KvLayer kvl = layer_view(l);
      const auto amax_at = static_cast<std::size_t>(l * nkv);
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
        if (recording_) {
          write_kv(kvl, b.slot_mapping[t], &k[t * kvd], &v[t * kvd], std::span(k_amax_).subspan(amax_at, static_cast<std::size_t>(nkv)),
                   std::span(v_amax_).subspan(amax_at, static_cast<std::size_t>(nkv)));
        } else {
          write_kv(kvl, b.slot_mapping[t], &k[t * kvd], &v[t * kvd]);
        }
      }
      paged_attention(pool_, kvl, b, nh, q.data(), attn.data());
      matmul(pool_, attn.data(), T, qd, L.o_proj, nullptr, o.data(), H);
      for (std::size_t i = 0; i < x.size(); ++i) x[i] += o[i];
      for (std::int64_t t = 0; t < T; ++t) rms_norm(&x[t * H], L.post_attention_norm, eps, H, &h[t * H]);
      matmul(pool_, h.data(), T, H, L.gate_proj, nullptr, g.data(), I);
      matmul(pool_, h.data(), T, H, L.up_proj, nullptr, u.data(), I);
      silu_mul(g.data(), u.data(), g.size(), g.data());
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
  KvLayer layer_view(std::int64_t l) {
    const auto n = static_cast<std::size_t>(cfg_.num_kv_heads);
    KvLayer L{k_cache_[static_cast<std::size_t>(l)].data(), v_cache_[static_cast<std::size_t>(l)].data(), kv_.dtype, cfg_.num_kv_heads,
              cfg_.head_dim, kv_.block_size};
    if (!k_scales_.empty()) {
      L.k_scales = std::span<const float>(k_scales_).subspan(static_cast<std::size_t>(l) * n, n);
      L.v_scales = std::span<const float>(v_scales_).subspan(static_cast<std::size_t>(l) * n, n);
    }
    return L;
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
  HostBlockChunks host_;
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
