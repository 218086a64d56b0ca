#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <numbers>
#include <random>
#include <thread>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/rank_group.h"
#include "backend/device/host_swap.h"
#include "common/thread_pool.h"
#include "model/shard.h"

namespace lmserve::backend {
namespace {

using model::LayerWeights;
using model::ModelConfig;
using model::Tensor;
using namespace cpu;

class CpuBackend final : public Backend {
 public:
  CpuBackend(std::shared_ptr<const model::ModelWeights> w, std::vector<std::shared_ptr<const model::ShardWeights>> shards,
             const CpuBackendOptions& o)
      : weights_(std::move(w)), cfg_(weights_->config()), kv_(o.kv), tp_(static_cast<int>(shards.size())), group_(tp_),
        inv_freq_(rope_inv_freq(cfg_)), k_scales_(o.k_scales), v_scales_(o.v_scales),
        block_bytes_(group_block_bytes(cfg_, kv_, shards)), host_(block_bytes_, [](std::size_t n) -> void* { return ::operator new(n, std::nothrow); },
              [](void* p) { ::operator delete(p); }) {
    // One pool per rank, the threads shared out (a rank's pool is used by its own thread only).
    const int threads = o.threads > 0 ? o.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    for (auto& s : shards) {
      Rank& r = ranks_.emplace_back();
      r.w = std::move(s);
      r.pool = std::make_unique<ThreadPool>(static_cast<std::size_t>(tp_ == 1 ? std::max(0, o.threads) : std::max(1, threads / tp_)));
      const std::size_t per_layer = layer_bytes(r) * static_cast<std::size_t>(kv_.num_blocks);
      r.k_cache.assign(static_cast<std::size_t>(cfg_.num_layers), std::vector<std::byte>(per_layer));
      r.v_cache.assign(static_cast<std::size_t>(cfg_.num_layers), std::vector<std::byte>(per_layer));
    }
  }

  std::string_view name() const override { return "cpu"; }
  const ModelConfig& config() const override { return cfg_; }
  const KvCacheConfig& kv_config() const override { return kv_; }
  // Every rank's share of a block: one rank's holds its own KV heads.
  std::uint64_t kv_block_bytes() const override { return block_bytes_; }
  MemoryInfo memory() const override {
    MemoryInfo m;
    m.kv_cache_bytes = kv_block_bytes() * static_cast<std::uint64_t>(kv_.num_blocks);
    if (tp_ == 1) {
      m.weight_bytes = weights_->bytes();
    } else {
      for (const Rank& r : ranks_) m.weight_bytes += r.w->bytes();
    }
    m.used_bytes = m.kv_cache_bytes + m.weight_bytes;
    return m;
  }

  Status set_host_blocks(std::int64_t n) override {
    host_.set_blocks(n);
    return Status::ok();
  }

  // A host block holds rank 0's K then V of layer 0, then of layer 1, ..., then rank 1's.
  Status swap_blocks(std::span<const BlockCopy> to_host, std::span<const BlockCopy> to_device) override {
    LMSERVE_RETURN_IF_ERROR(host_.prepare(to_host, to_device, kv_.num_blocks));
    for (bool out : {true, false}) {
      for (const BlockCopy& c : out ? to_host : to_device) {
        std::byte* h = host_.block(c.host);
        for (Rank& r : ranks_) {
          const std::size_t chunk = layer_bytes(r);
          for (std::size_t l = 0; l < static_cast<std::size_t>(cfg_.num_layers); ++l) {
            for (auto* cache : {&r.k_cache, &r.v_cache}) {
              std::byte* d = (*cache)[l].data() + static_cast<std::size_t>(c.device) * chunk;
              std::memcpy(out ? h : d, out ? d : h, chunk);
              h += chunk;
            }
          }
        }
      }
    }
    return Status::ok();
  }

  std::uint64_t host_swap_bytes() const override { return host_.bytes(); }

  // Calibration for fp8_e4m3 (one rank): record per-layer, per-head absolute maxima of K and V.
  void record_amax(bool on) {
    recording_ = on && tp_ == 1;
    k_amax_.assign(static_cast<std::size_t>(cfg_.num_layers * cfg_.num_kv_heads), 0.0f);
    v_amax_ = k_amax_;
  }
  const std::vector<float>& k_amax() const { return k_amax_; }
  const std::vector<float>& v_amax() const { return v_amax_; }

  Status forward(const Batch& b, std::span<float> logits) override {
    LMSERVE_RETURN_IF_ERROR(validate_batch(b, cfg_, kv_, logits.size()));
    if (tp_ == 1) {
      rank_forward(0, b, logits);
      return Status::ok();
    }
    try {
      group_.run([&](int r) { rank_forward(r, b, logits); });
    } catch (const std::exception& e) {  // e.g. out of memory on one rank: the group is broken from now on
      return Status(StatusCode::kInternal, std::string("cpu backend: ") + e.what());
    }
    return Status::ok();
  }

 private:
  struct Rank {
    std::shared_ptr<const model::ShardWeights> w;
    std::unique_ptr<ThreadPool> pool;
    std::vector<std::vector<std::byte>> k_cache, v_cache;
  };

  // A rank's K (or V) bytes of one block in one layer.
  static std::size_t layer_bytes(const ModelConfig& c, const KvCacheConfig& kv, const model::ShardPlan& p) {
    return static_cast<std::size_t>(kv.block_size * p.kv_heads * c.head_dim * kv_dtype_bytes(kv.dtype));
  }
  std::size_t layer_bytes(const Rank& r) const { return layer_bytes(cfg_, kv_, r.w->plan()); }
  static std::uint64_t group_block_bytes(const ModelConfig& c, const KvCacheConfig& kv, const std::vector<std::shared_ptr<const model::ShardWeights>>& shards) {
    std::uint64_t n = 0;
    for (const auto& s : shards) n += backend::kv_block_bytes(c, kv.dtype, kv.block_size, s->plan().kv_heads);
    return n;
  }

  // The forward pass of rank `rank` (the whole model at TP 1): its heads, KV heads and
  // intermediate features, the partial sums of o and down all-reduced, the embedding's rows of
  // its vocabulary range all-reduced, its range of the logits written into their columns.
  void rank_forward(int rank, const Batch& b, std::span<float> logits) {
    Rank& R = ranks_[static_cast<std::size_t>(rank)];
    const model::ShardPlan& p = R.w->plan();
    ThreadPool& pool = *R.pool;
    const std::int64_t T = static_cast<std::int64_t>(b.tokens.size());
    const std::int64_t H = cfg_.hidden_size, D = cfg_.head_dim, nh = p.heads, nkv = p.kv_heads;
    const std::int64_t qd = nh * D, kvd = nkv * D, I = p.intermediate, V = cfg_.vocab_size;
    const float eps = static_cast<float>(cfg_.rms_norm_eps);

    std::vector<float> x(static_cast<std::size_t>(T * H)), h(x.size()), q(static_cast<std::size_t>(T * qd)),
        k(static_cast<std::size_t>(T * kvd)), v(k.size()), attn(q.size()), o(x.size()),
        g(static_cast<std::size_t>(T * I)), u(g.size());
    for (std::int64_t t = 0; t < T; ++t) {
      const std::int64_t token = b.tokens[static_cast<std::size_t>(t)];
      if (token >= p.vocab_begin && token < p.vocab_end) R.w->embed_tokens().to_float((token - p.vocab_begin) * H, H, &x[t * H]);
    }
    group_.all_reduce(rank, x.data(), x.size());

    for (std::int64_t l = 0; l < cfg_.num_layers; ++l) {
      const KvLayer kvl = layer_view(R, l);
      const auto amax_at = static_cast<std::size_t>(l * cfg_.num_kv_heads);
      const LayerWeights& L = R.w->layers()[static_cast<std::size_t>(l)];
      for (std::int64_t t = 0; t < T; ++t) rms_norm(&x[t * H], L.input_norm, eps, H, &h[t * H]);
      matmul(pool, h.data(), T, H, L.q_proj, &L.q_bias, q.data(), qd);
      matmul(pool, h.data(), T, H, L.k_proj, &L.k_bias, k.data(), kvd);
      matmul(pool, h.data(), T, H, L.v_proj, &L.v_bias, v.data(), kvd);
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
      paged_attention(pool, kvl, b, nh, q.data(), attn.data());
      matmul(pool, attn.data(), T, qd, L.o_proj, nullptr, o.data(), H);
      group_.all_reduce(rank, o.data(), o.size());
      for (std::size_t i = 0; i < x.size(); ++i) x[i] += o[i];
      for (std::int64_t t = 0; t < T; ++t) rms_norm(&x[t * H], L.post_attention_norm, eps, H, &h[t * H]);
      matmul(pool, h.data(), T, H, L.gate_proj, nullptr, g.data(), I);
      matmul(pool, h.data(), T, H, L.up_proj, nullptr, u.data(), I);
      silu_mul(g.data(), u.data(), g.size(), g.data());
      matmul(pool, g.data(), T, I, L.down_proj, nullptr, o.data(), H);
      group_.all_reduce(rank, o.data(), o.size());
      for (std::size_t i = 0; i < x.size(); ++i) x[i] += o[i];
    }

    const std::int64_t rows = static_cast<std::int64_t>(b.logits_indices.size()), Vr = p.vocab_end - p.vocab_begin;
    std::vector<float> last(static_cast<std::size_t>(rows * H));
    for (std::int64_t r = 0; r < rows; ++r) rms_norm(&x[b.logits_indices[r] * H], R.w->final_norm(), eps, H, &last[r * H]);
    if (tp_ == 1) {
      matmul(pool, last.data(), rows, H, R.w->lm_head(), nullptr, logits.data(), V);
      return;
    }
    // The gather: this rank's columns of every row.
    std::vector<float> part(static_cast<std::size_t>(rows * Vr));
    matmul(pool, last.data(), rows, H, R.w->lm_head(), nullptr, part.data(), Vr);
    for (std::int64_t r = 0; r < rows; ++r) std::memcpy(&logits[r * V + p.vocab_begin], &part[r * Vr], static_cast<std::size_t>(Vr) * sizeof(float));
  }

  KvLayer layer_view(Rank& r, std::int64_t l) {
    const model::ShardPlan& p = r.w->plan();
    KvLayer L{r.k_cache[static_cast<std::size_t>(l)].data(), r.v_cache[static_cast<std::size_t>(l)].data(), kv_.dtype, p.kv_heads,
              cfg_.head_dim, kv_.block_size};
    if (!k_scales_.empty()) {
      const auto at = static_cast<std::size_t>(l * cfg_.num_kv_heads + p.first_kv_head), n = static_cast<std::size_t>(p.kv_heads);
      L.k_scales = std::span<const float>(k_scales_).subspan(at, n);
      L.v_scales = std::span<const float>(v_scales_).subspan(at, n);
    }
    return L;
  }

  std::shared_ptr<const model::ModelWeights> weights_;
  const ModelConfig& cfg_;
  KvCacheConfig kv_;
  int tp_;
  RankGroup group_;
  std::vector<float> inv_freq_;
  std::vector<float> k_scales_, v_scales_;
  std::vector<Rank> ranks_;
  bool recording_ = false;
  std::vector<float> k_amax_, v_amax_;
  std::uint64_t block_bytes_;  // kv_block_bytes(): every rank's share
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
  auto whole = model::ShardWeights::make(w, 1, 0);
  if (!whole) return whole.error();
  CpuBackend cal(w, {*whole}, co);
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
  const int tp = options.tensor_parallel_size;
  LMSERVE_RETURN_IF_ERROR(model::check_tensor_parallel(c, tp));
  std::vector<std::shared_ptr<const model::ShardWeights>> shards;
  for (int r = 0; r < tp; ++r) {
    auto s = model::ShardWeights::make(weights, tp, r);
    if (!s) return error(s.error());
    shards.push_back(std::move(*s));
  }
  const std::size_t n_scales = static_cast<std::size_t>(c.num_layers * c.num_kv_heads);
  CpuBackendOptions o = options;
  if (o.kv.dtype == KvDtype::kFp8E4M3 && o.k_scales.empty()) {
    LMSERVE_RETURN_IF_ERROR(calibrate_e4m3(weights, options, &o.k_scales, &o.v_scales));
  }
  if (o.kv.dtype == KvDtype::kFp8E4M3 && (o.k_scales.size() != n_scales || o.v_scales.size() != n_scales)) {
    return error(StatusCode::kInvalidArgument, "cpu backend: fp8_e4m3 needs num_layers x num_kv_heads K and V scales");
  }
  return std::unique_ptr<Backend>(new CpuBackend(std::move(weights), std::move(shards), o));
}

}  // namespace lmserve::backend
