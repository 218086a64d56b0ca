// The forward pass of the CUDA model (cuda_model.cuh): a step's layers and its head enqueued on
// the model's stream, and the key splits of its decode attention.

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "backend/cuda/model/cuda_model.cuh"
#include "backend/cuda/common/device_util.cuh"

namespace lmserve::cuda {

int CudaModel::splits_for(int single_items) const { return decode_splits(static_cast<std::int64_t>(single_items) * d_.kv_heads, sms_); }

std::string CudaModel::enqueue_layers(int T, const char* items, int num_items, int num_single) {
  char* m = meta_.as<char>();
  const auto* tokens = reinterpret_cast<const std::int32_t*>(m + off_tokens_);
  const auto* pos = reinterpret_cast<const std::int32_t*>(m + off_pos_);
  const auto* slots = reinterpret_cast<const std::int64_t*>(m + off_slots_);
  const int H = static_cast<int>(d_.hidden), I = static_cast<int>(d_.intermediate), D = static_cast<int>(d_.head_dim);
  const int nh = static_cast<int>(d_.heads), nkv = static_cast<int>(d_.kv_heads), qd = nh * D, qkvd = (nh + 2 * nkv) * D;
  const std::size_t item_stride = items == decode_items_.as<char>() ? static_cast<std::size_t>(max_seqs_) * 4
                                                                    : off_item_cnt_ - off_item_tok_;
  const Act prod = act_;  // the layer products' dtype (out_, qkv_, gu_): the act, as vLLM keeps them
  // o_proj and down add into the residual x_ themselves, or write out_ for the next norm to add.
  // Not at one or two rows: there the weight-streaming kernel's last step would wait on the
  // residual's load, for a norm kernel that moves a few KB (docs/perf.md, "residual in the
  // epilogue").
  // With tensor parallelism (tp_) o_proj and down write this rank's partial sums into the group's
  // buffers (alternating), the all-reduce adds them up into tp_sum_ (float32), and the next norm
  // adds that to x_; nothing is fused or folded across them.
  const bool fused = !tp_ && T > Gemm::kStreamRows;
  float* x = x_.as<float>();
  void* const layer_sum = tp_ ? tp_sum_.p : out_.p;  // what the next norm adds to x_, in sum_act
  const Act sum_act = tp_ ? Act::kF32 : prod;
  const std::int64_t rows_h = static_cast<std::int64_t>(T) * H;
  // With FP8 weights every product quantizes its input per token first (Gemm, "FP8 weights").
  const bool fp8 = d_.fp8_weights;
  // The norms before QKV and gate/up quantize their output for those products themselves.
  const bool norm_quant = fp8 && H % 16 == 0;
  void* nq = norm_quant ? fp8_xq_.p : nullptr;
  float* nqs = norm_quant ? fp8_xs_.as<float>() : nullptr;
  const void* h_in = norm_quant ? nullptr : h_.p;  // an FP8 product's input after a norm
  // Past the streaming kernel's rows the SiLU kernel quantizes down_proj's input itself.
  const bool mlp_quant = fp8 && I % 16 == 0 && T > Gemm::kStreamRows;
  auto product = [&](const DeviceBuffer& w, const DeviceBuffer& scales, const void* in, void* y, int m, int k) {
    return fp8 ? gemm_.run_fp8({w.p, scales.as<float>()}, in, y, prod, m, T, k, act_, stream_) : gemm_.run(w.p, in, y, prod, m, T, k, act_, stream_);
  };
  auto residual_product = [&](const DeviceBuffer& w, const DeviceBuffer& scales, const void* in, int m, int k, int which) {
    if (tp_) {
      LMSERVE_TRY(product(w, scales, in, tp_->product_buffer(rank_, which), m, k));
      return tp_->all_reduce(rank_, which, d_.act, tp_sum_.as<float>(), rows_h, stream_);
    }
    if (!fused) return product(w, scales, in, out_.p, m, k);
    return fp8 ? gemm_.run_add_fp8({w.p, scales.as<float>()}, in, x, m, T, k, act_, stream_) : gemm_.run_add(w.p, in, x, m, T, k, act_, stream_);
  };
  // At one or two 16-bit rows the norms fold into the products around them (Gemm::NormFold):
  // o_proj and down add into x and leave g = x * w and partial sums of squares in h_ and
  // fold_ss_, and QKV and gate/up scale their sums by the norm's inverse RMS; no norm kernel
  // runs in a layer. The final norm (head) stays.
  const bool fold = !tp_ && !fp8 && Gemm::can_fold(T, H, act_) && Gemm::can_fold(T, qd, act_) && Gemm::can_fold(T, I, act_);
  const void* pending = fused || fold ? nullptr : layer_sum;  // what the next norm adds to x_ first
  Gemm::NormFold nf;
  nf.H = H;
  nf.eps = d_.eps;
  nf.g = h_.p;
  nf.in_partials = fold_ss_.as<float>();
  nf.out_partials = fold_ss_.as<float>();
  if (tp_) {  // the rank's vocabulary rows (zeros for the other tokens), added up over the ranks
    auto* rows = static_cast<float*>(tp_->product_buffer(rank_, 2));
    launch_embed_rows(embed_.p, act_, tokens, T, H, vocab_begin_, vocab_rows_, rows, stream_);
    LMSERVE_TRY(tp_->all_reduce(rank_, 2, backend::ActDtype::kFloat32, x, rows_h, stream_));
  } else {
    launch_embed(embed_.p, act_, tokens, T, H, x, stream_);
  }
  if (fold) {
    launch_norm_fold_start(x, T, H, layers_[0].input_norm.p, act_, h_.p, fold_ss_.as<float>(), stream_);
    nf.in_parts = 1;
  }
  for (int l = 0; l < d_.layers; ++l) {
    const LayerBuffers& L = layers_[static_cast<std::size_t>(l)];
    if (fold) {
      LMSERVE_TRY(gemm_.run_folded(L.qkv.p, h_.p, qkv_.p, prod, qkvd, T, H, act_, nf, stream_));
    } else {
      // Unfused, x was last written by the norm before the product(s) that precede this norm.
      launch_add_rmsnorm(x, l == 0 ? nullptr : pending, sum_act, nullptr, T, H, L.input_norm.p, act_, d_.eps, h_.p, stream_, !fused && l > 0, nq, nqs);
      LMSERVE_TRY(product(L.qkv, L.qkv_scale, fp8 ? h_in : h_.p, qkv_.p, qkvd, H));
    }
    QkvRopeArgs r;
    r.qkv = qkv_.p;
    r.qkv_act = prod;
    r.bias = d_.qkv_bias ? L.qkv_bias.p : nullptr;
    r.q_norm = d_.qk_norm ? L.q_norm.p : nullptr;
    r.k_norm = d_.qk_norm ? L.k_norm.p : nullptr;
    r.act = act_;
    r.inv_freq = inv_freq_.as<float>();
    r.positions = pos;
    r.slots = slots;
    r.T = T;
    r.nh = nh;
    r.nkv = nkv;
    r.D = D;
    r.eps = d_.eps;
    r.q_out = q_.p;
    r.kv_ptrs = kv_ptrs_.as<void*>();
    r.layer = l;
    r.kv = kv_;
    if (kv_ == Kv::kE4M3) {
      r.k_scale = k_scale_.as<float>() + l * nkv;
      r.v_scale = v_scale_.as<float>() + l * nkv;
    }
    if (calibrating_) {
      r.k_amax = amax_.as<float>() + 2 * l * nkv;
      r.v_amax = amax_.as<float>() + (2 * l + 1) * nkv;
    }
    launch_qkv_rope(r, stream_);
    AttnArgs at;
    at.q = q_.p;
    at.kv_ptrs = kv_ptrs_.as<void*>();
    at.layer = l;
    at.kv = kv_;
    at.k_scale = r.k_scale;
    at.v_scale = r.v_scale;
    at.positions = pos;
    at.item_token = reinterpret_cast<const std::int32_t*>(items);
    at.item_count = reinterpret_cast<const std::int32_t*>(items + item_stride);
    at.item_seq = reinterpret_cast<const std::int32_t*>(items + 2 * item_stride);
    at.num_items = num_items;
    at.block_tables = reinterpret_cast<const std::int32_t*>(m + off_tables_);
    at.bt_stride = reinterpret_cast<const std::int32_t*>(m + off_stride_);
    at.block_size = o_.block_size;
    at.nh = nh;
    at.nkv = nkv;
    at.D = D;
    at.scale = 1.0f / std::sqrt(static_cast<float>(D));
    at.num_single = num_single;
    at.splits = splits_for(num_single);
    at.warp_units = decode_warp_units(static_cast<std::int64_t>(num_single) * nkv, sms_);
    at.wide_blocks = decode_wide_blocks(static_cast<std::int64_t>(num_single) * nkv, sms_);
    at.partial = partial_.as<float>();
    at.out = attn_.p;
    at.act = act_;
    launch_attention(at, stream_);
    if (fold) {
      nf.norm_w = L.post_norm.p;
      LMSERVE_TRY(gemm_.run_add_fold(L.o.p, attn_.p, x, H, T, qd, act_, nf, &nf.in_parts, stream_));
      LMSERVE_TRY(gemm_.run_gate_up_silu_folded(L.gate_up.p, h_.p, mlp_in_.p, I, T, H, act_, nf, stream_));
      if (l + 1 < d_.layers) {
        nf.norm_w = layers_[static_cast<std::size_t>(l) + 1].input_norm.p;
        LMSERVE_TRY(gemm_.run_add_fold(L.down.p, mlp_in_.p, x, H, T, I, act_, nf, &nf.in_parts, stream_));
      } else {
        LMSERVE_TRY(gemm_.run_add(L.down.p, mlp_in_.p, x, H, T, I, act_, stream_));  // the head's norm follows
      }
      continue;
    }
    LMSERVE_TRY(residual_product(L.o, L.o_scale, attn_.p, H, qd, 0));
    launch_add_rmsnorm(x, pending, sum_act, nullptr, T, H, L.post_norm.p, act_, d_.eps, h_.p, stream_, !fused, nq, nqs);
    if (fp8) {
      LMSERVE_TRY(gemm_.run_gate_up_silu_fp8({L.gate_up.p, L.gate_up_scale.as<float>()}, h_in, gu_.p, mlp_in_.p, I, T, H, act_, stream_, mlp_quant));
    } else {
      LMSERVE_TRY(gemm_.run_gate_up_silu(L.gate_up.p, h_.p, gu_.p, mlp_in_.p, I, T, H, act_, stream_));
    }
    LMSERVE_TRY(residual_product(L.down, L.down_scale, mlp_quant ? nullptr : mlp_in_.p, H, I, 1));
  }
  if (pending) launch_add(x, pending, sum_act, rows_h, stream_);
  return {};
}

std::string CudaModel::enqueue_head(const std::int32_t* rows, int R, const SampleSpec* specs) {
  const int H = static_cast<int>(d_.hidden);
  launch_add_rmsnorm(x_.as<float>(), nullptr, Act::kF32, rows, R, H, final_norm_.p, act_, d_.eps, hrows_.p, stream_);
  const void* head = d_.tied ? embed_.p : lm_head_.p;
  if (tp_) {  // the rank's vocabulary range, gathered into rank 0's logits
    LMSERVE_TRY(gemm_.run(head, hrows_.p, tp_->gather_buffer(rank_), static_cast<int>(vocab_rows_), R, H, act_, stream_));
    LMSERVE_TRY(tp_->gather_rows(rank_, logits_.as<float>(), R, d_.vocab_ranges, stream_));
    if (rank_ != 0) return {};
  } else {
    LMSERVE_TRY(gemm_.run(head, hrows_.p, logits_.as<float>(), static_cast<int>(d_.vocab), R, H, act_, stream_));
  }
  // Part of every head (and so of every graph) when device sampling is on: a few passes over
  // the logits, small next to the lm_head GEMM; rows of mode 0 return at once.
  if (o_.device_sampling) launch_sample(logits_.as<float>(), R, static_cast<int>(d_.vocab), specs, sampled_.as<std::int32_t>(), stream_);
  return {};
}

}  // namespace lmserve::cuda
