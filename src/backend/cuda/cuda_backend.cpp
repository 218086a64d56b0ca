// The Backend on top of cuda::DeviceModel: converts ModelWeights and Batch into the device
// model's plain inputs. Compiled by g++ as part of lmserve_backend (device_model.h is plain C++).
#include "backend/cuda/cuda_backend.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>

#include "backend/cpu/rank_group.h"
#include "backend/cuda/comm/tp_group.h"
#include "backend/cuda/model/device_model.h"
#include "backend/device/host_swap.h"
#include "backend/device/tuning_cache.h"
#include "common/build_info.h"
#include "common/numeric.h"
#include "common/progress.h"
#include "common/startup.h"
#include "model/shard.h"

namespace lmserve::backend {
namespace {

using cuda::Slot;

ActDtype act_of(model::DType d) {
  return d == model::DType::kF32 ? ActDtype::kFloat32 : (d == model::DType::kBF16 ? ActDtype::kBFloat16 : ActDtype::kFloat16);
}

// The tensor's elements [offset, offset + count) in the act dtype, as bytes to upload.
std::vector<std::byte> as_act(const model::Tensor& t, std::int64_t offset, std::int64_t count, model::DType act) {
  const int eb = model::dtype_bytes(act);
  std::vector<std::byte> out(static_cast<std::size_t>(count) * static_cast<std::size_t>(eb));
  if (t.dtype == act) {
    std::memcpy(out.data(), static_cast<const std::byte*>(t.data) + offset * eb, out.size());
    return out;
  }
  std::vector<float> f(static_cast<std::size_t>(count));
  t.to_float(offset, count, f.data());
  for (std::size_t i = 0; i < f.size(); ++i) {
    switch (act) {
      case model::DType::kF32: std::memcpy(&out[i * 4], &f[i], 4); break;
      case model::DType::kBF16: {
        std::uint16_t v = float_to_bf16(f[i]);
        std::memcpy(&out[i * 2], &v, 2);
        break;
      }
      case model::DType::kF16: {
        std::uint16_t v = float_to_f16(f[i]);
        std::memcpy(&out[i * 2], &v, 2);
        break;
      }
      case model::DType::kF8E4M3:  // never an act dtype (FP8 projections are uploaded as they are: upload())
        break;
    }
  }
  return out;
}

// fn(rank) for every rank at once on `threads` (on the calling thread for one rank): the first
// error, named by its rank when there are several.
std::string on_ranks(cpu::RankGroup* threads, int ranks, const std::function<std::string(int)>& fn) {
  std::vector<std::string> errors(static_cast<std::size_t>(ranks));
  if (ranks == 1) {
    errors[0] = fn(0);
  } else {
    threads->run([&](int r) { errors[static_cast<std::size_t>(r)] = fn(r); });
  }
  for (int r = 0; r < ranks; ++r) {
    const std::string& e = errors[static_cast<std::size_t>(r)];
    if (!e.empty()) return ranks > 1 ? "rank " + std::to_string(r) + ": " + e : e;
  }
  return {};
}

class CudaBackend final : public Backend {
 public:
  // The largest step the memory plan was made for (as the device model applies them).
  struct Limits {
    std::int64_t tokens = 0, seqs = 0, max_model_len = 0;
    bool device_sampling = false;  // rows of a mode other than kHost are sampled on the device
  };
  // One device model per tensor-parallel rank (one at TP 1), each rank's KV block
  // `rank_block_bytes` (a host swap block holds rank 0's, then rank 1's, ...).
  CudaBackend(std::shared_ptr<const model::ModelWeights> w, std::vector<std::unique_ptr<cuda::DeviceModel>> ranks, std::unique_ptr<cpu::RankGroup> threads,
              KvCacheConfig kv, MemoryInfo mem, Limits limits, std::uint64_t rank_block_bytes)
      : weights_(std::move(w)), ranks_(std::move(ranks)), threads_(std::move(threads)), kv_(kv), mem_(mem), limits_(limits),
        rank_block_bytes_(rank_block_bytes), host_(rank_block_bytes * ranks_.size(), cuda::alloc_mapped_host, cuda::free_mapped_host) {}

  std::string_view name() const override { return "cuda"; }
  const model::ModelConfig& config() const override { return weights_->config(); }
  const KvCacheConfig& kv_config() const override { return kv_; }
  std::uint64_t kv_block_bytes() const override { return rank_block_bytes_ * ranks_.size(); }
  MemoryInfo memory() const override { return mem_; }

  Status forward(const Batch& b, std::span<float> logits) override {
    LMSERVE_RETURN_IF_ERROR(prepare(b, logits));
    LMSERVE_RETURN_IF_ERROR(launch({}));
    return wait();
  }

  // With device sampling every row of a mode other than kHost gets its token, and launch()
  // returns once the step is enqueued.
  bool asynchronous() const override { return limits_.device_sampling; }
  bool supports_masks() const override { return limits_.device_sampling; }

  Status supply_masks(std::span<const std::uint64_t> masks) override {
    const std::size_t words = mask_words(config().vocab_size);
    if (masks.size() % words != 0) return Status(StatusCode::kInvalidArgument, "supply_masks: not a whole number of masks");
    std::string e = ranks_[0]->supply_masks(masks.data(), static_cast<int>(masks.size() / words));  // rank 0 samples
    if (!e.empty()) return Status(StatusCode::kInvalidArgument, "cuda: " + e);
    return Status::ok();
  }

  // The step's arrays live in this backend's vectors until wait(): prepare() may overwrite them
  // for the next step only after launch() (the device model staged them at prepare()).
  Status prepare(const Batch& b, std::span<float> logits) override {
    const auto t0 = std::chrono::steady_clock::now();
    LMSERVE_RETURN_IF_ERROR(validate_batch(b, config(), kv_, logits.size()));
    LMSERVE_RETURN_IF_ERROR(within_plan(b));
    const std::size_t S = b.seqs.size();
    start_.resize(S);
    len_.resize(S);
    ctx_.resize(S);
    tables_.resize(S);
    for (std::size_t i = 0; i < S; ++i) {
      start_[i] = b.seqs[i].query_start;
      len_[i] = b.seqs[i].query_len;
      ctx_[i] = b.seqs[i].context_len;
      tables_[i] = b.seqs[i].block_table.data();
    }
    cuda::StepInput in{b.tokens.data(),
                       b.positions.data(),
                       b.slot_mapping.data(),
                       static_cast<int>(b.tokens.size()),
                       start_.data(),
                       len_.data(),
                       ctx_.data(),
                       tables_.data(),
                       static_cast<int>(S),
                       b.logits_indices.data(),
                       static_cast<int>(b.logits_indices.size()),
                       logits.data()};
    // The specs are read again when the step's tokens come back (finish), after the next step
    // may have been prepared: one vector per step, alternating.
    auto& specs = specs_[spec_turn_];
    spec_turn_ ^= 1;
    if (b.sample_rows.size() == b.logits_indices.size() && b.sampled_tokens.size() == b.logits_indices.size()) {
      specs.resize(b.sample_rows.size());
      for (std::size_t k = 0; k < specs.size(); ++k) specs[k] = to_spec(b.sample_rows[k]);
      in.sample = specs.data();
      in.sampled_tokens = b.sampled_tokens.data();
    }
    std::string e;
    for (std::size_t r = 0; r < ranks_.size() && e.empty(); ++r) e = ranks_[r]->prepare(in);  // host staging, each rank's own
    staging_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!e.empty()) return Status(StatusCode::kInternal, "cuda: " + e);
    return Status::ok();
  }

  Status launch(std::span<const TokenPatch> patches) override {
    const auto t0 = std::chrono::steady_clock::now();
    patch_index_.resize(patches.size());
    patch_token_.resize(patches.size());
    for (std::size_t i = 0; i < patches.size(); ++i) patch_index_[i] = patches[i].index, patch_token_[i] = patches[i].token;
    // At once on every rank: a launch may wait for its own step (a large head in chunks), which
    // waits for the other ranks' collectives.
    const std::string e = on_ranks(threads_.get(), static_cast<int>(ranks_.size()), [&](int r) {
      return ranks_[static_cast<std::size_t>(r)]->launch(patch_index_.data(), patch_token_.data(), static_cast<int>(patches.size()));
    });
    staging_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!e.empty()) return Status(StatusCode::kInternal, "cuda: " + e);
    return Status::ok();
  }

  Status wait() override {
    const auto t0 = std::chrono::steady_clock::now();
    cuda::StepTimes t;
    std::string e;
    for (std::size_t r = ranks_.size(); r-- > 0;) {  // rank 0, which has the results, last
      std::string er = ranks_[r]->finish(r == 0 ? &t : nullptr);
      if (e.empty()) e = er;
    }
    // The device model's launch() counts waits for chunks of a large head as device time.
    staging_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() - t.device_seconds;
    if (!e.empty()) return Status(StatusCode::kInternal, "cuda: " + e);
    return Status::ok();
  }

  double staging_seconds_total() const override { return staging_s_; }

  Status set_host_blocks(std::int64_t n) override {
    host_.set_blocks(n);
    return Status::ok();
  }

  Status swap_blocks(std::span<const BlockCopy> to_host, std::span<const BlockCopy> to_device) override {
    LMSERVE_RETURN_IF_ERROR(host_.prepare(to_host, to_device, kv_.num_blocks));
    for (bool out : {true, false}) {
      const auto list = out ? to_host : to_device;
      swap_ids_.clear();
      swap_host_.clear();
      for (const BlockCopy& c : list) {
        swap_ids_.push_back(c.device);
        swap_host_.push_back(reinterpret_cast<char*>(host_.block(c.host)));
      }
      for (std::size_t r = 0; r < ranks_.size(); ++r) {  // each rank's part of the host block
        if (r > 0) {
          for (char*& h : swap_host_) h += rank_block_bytes_;
        }
        if (std::string e = ranks_[r]->swap(swap_ids_.data(), swap_host_.data(), static_cast<int>(list.size()), out); !e.empty()) {
          return Status(StatusCode::kInternal, "cuda: " + e);
        }
      }
    }
    return Status::ok();
  }

  std::uint64_t host_swap_bytes() const override { return host_.bytes(); }

 private:
  static cuda::SampleSpec to_spec(const RowSampling& r) {
    cuda::SampleSpec s;
    s.mode = r.mode == RowSampling::Mode::kGreedy ? 1 : (r.mode == RowSampling::Mode::kRandom ? 2 : 0);
    s.temperature = r.temperature;
    s.top_p = r.top_p;
    s.min_p = r.min_p;
    s.top_k = r.top_k;
    s.key_lo = static_cast<std::uint32_t>(r.key);
    s.key_hi = static_cast<std::uint32_t>(r.key >> 32);
    s.counter = r.counter;
    s.masked = r.masked ? 1 : 0;
    return s;
  }

  Status within_plan(const Batch& b) const {
    const auto T = static_cast<std::int64_t>(b.tokens.size()), S = static_cast<std::int64_t>(b.seqs.size());
    if (T > limits_.tokens || S > limits_.seqs) {
      return Status(StatusCode::kInvalidArgument, "batch: " + std::to_string(T) + " tokens / " + std::to_string(S) +
                                                      " sequences is larger than the backend was planned for (" + std::to_string(limits_.tokens) +
                                                      " / " + std::to_string(limits_.seqs) + ")");
    }
    const std::int64_t bs = kv_.block_size, max_blocks = (limits_.max_model_len + bs - 1) / bs;
    for (const auto& s : b.seqs) {
      if ((s.context_len + bs - 1) / bs > max_blocks) return Status(StatusCode::kInvalidArgument, "batch: a sequence is longer than max_model_len");
    }
    return Status::ok();
  }

  std::shared_ptr<const model::ModelWeights> weights_;
  std::vector<std::unique_ptr<cuda::DeviceModel>> ranks_;  // each holds the group of their collectives (TP > 1)
  std::unique_ptr<cpu::RankGroup> threads_;   // a host thread per rank (TP > 1)
  KvCacheConfig kv_;
  MemoryInfo mem_;
  Limits limits_;
  std::uint64_t rank_block_bytes_;
  std::vector<std::int32_t> start_, len_, ctx_;
  std::vector<const std::int32_t*> tables_;
  std::vector<cuda::SampleSpec> specs_[2];
  int spec_turn_ = 0;
  std::vector<std::int32_t> patch_index_, patch_token_;
  HostBlockChunks host_;  // after model_: released before the device model goes
  std::vector<std::int32_t> swap_ids_;
  std::vector<char*> swap_host_;
  double staging_s_ = 0;  // prepare(), launch() and wait() less the waits for the device (staging_seconds_total)
};

// A rank's share of the weights (the whole model at TP 1) to its device model.
Status upload(cuda::DeviceModel& m, const model::ShardWeights& w, model::DType act) {
  const auto& c = w.config();
  const model::ShardPlan& sp = w.plan();
  Progress progress("weights to device", static_cast<double>(w.bytes()), Progress::Unit::kBytes);  // by layers (the bulk of the bytes)
  auto put = [&](Slot slot, std::int64_t layer, std::int64_t at, const model::Tensor& t) -> Status {
    const std::int64_t n = t.numel(), piece = 64ll << 20;
    if (t.dtype == act) {  // as it is, from the checkpoint's (or the generator's) memory
      if (std::string e = m.set_weight(slot, layer, at, t.data, static_cast<std::size_t>(n * model::dtype_bytes(act))); !e.empty()) {
        return Status(StatusCode::kInternal, "cuda: uploading " + t.name + ": " + e);
      }
      return Status::ok();
    }
    // Converted in pieces of at most 64 Mi elements, so that a conversion never doubles a big tensor.
    for (std::int64_t off = 0; off < n; off += piece) {
      const std::int64_t cnt = std::min(piece, n - off);
      auto bytes = as_act(t, off, cnt, act);
      if (std::string e = m.set_weight(slot, layer, at + off, bytes.data(), bytes.size()); !e.empty()) {
        return Status(StatusCode::kInternal, "cuda: uploading " + t.name + ": " + e);
      }
    }
    return Status::ok();
  };
  // FP8 projections: their e4m3 bytes, and a float32 scale per output row (a per-tensor scale
  // repeated) in the projection's scale slot, at its first row.
  auto put_fp8 = [&](Slot slot, Slot scale_slot, std::int64_t layer, std::int64_t row, const model::Tensor& t) -> Status {
    if (t.dtype != model::DType::kF8E4M3 || t.shape.size() != 2 || (t.num_scales != 1 && t.num_scales != t.shape[0])) {
      return Status(StatusCode::kInvalidArgument, "cuda backend: " + t.name + " is not FP8 with per-tensor or per-channel scales, as the model's other projections");
    }
    const std::int64_t rows = t.shape[0], cols = t.shape[1];
    if (std::string e = m.set_weight(slot, layer, row * cols, t.data, static_cast<std::size_t>(rows * cols)); !e.empty()) {
      return Status(StatusCode::kInternal, "cuda: uploading " + t.name + ": " + e);
    }
    std::vector<float> scales(static_cast<std::size_t>(rows));
    for (std::int64_t r = 0; r < rows; ++r) scales[static_cast<std::size_t>(r)] = t.scales[t.num_scales == 1 ? 0 : r];
    if (std::string e = m.set_weight(scale_slot, layer, row, scales.data(), scales.size() * 4); !e.empty()) {
      return Status(StatusCode::kInternal, "cuda: uploading " + t.name + "'s scales: " + e);
    }
    return Status::ok();
  };
  auto projection = [&](Slot slot, Slot scale_slot, std::int64_t layer, std::int64_t row, const model::Tensor& t) -> Status {
    return w.model().fp8() ? put_fp8(slot, scale_slot, layer, row, t) : put(slot, layer, row * t.shape[1], t);
  };
  LMSERVE_RETURN_IF_ERROR(put(Slot::kEmbed, -1, 0, w.embed_tokens()));
  LMSERVE_RETURN_IF_ERROR(put(Slot::kFinalNorm, -1, 0, w.final_norm()));
  if (!c.tie_word_embeddings) LMSERVE_RETURN_IF_ERROR(put(Slot::kLmHead, -1, 0, w.lm_head()));
  const std::int64_t qrows = sp.heads * c.head_dim, kvrows = sp.kv_heads * c.head_dim;
  for (std::int64_t l = 0; l < c.num_layers; ++l) {
    const auto& L = w.layers()[static_cast<std::size_t>(l)];
    LMSERVE_RETURN_IF_ERROR(put(Slot::kInputNorm, l, 0, L.input_norm));
    LMSERVE_RETURN_IF_ERROR(put(Slot::kPostNorm, l, 0, L.post_attention_norm));
    LMSERVE_RETURN_IF_ERROR(projection(Slot::kQkv, Slot::kQkvScale, l, 0, L.q_proj));
    LMSERVE_RETURN_IF_ERROR(projection(Slot::kQkv, Slot::kQkvScale, l, qrows, L.k_proj));
    LMSERVE_RETURN_IF_ERROR(projection(Slot::kQkv, Slot::kQkvScale, l, qrows + kvrows, L.v_proj));
    if (c.qkv_bias) {
      LMSERVE_RETURN_IF_ERROR(put(Slot::kQkvBias, l, 0, L.q_bias));
      LMSERVE_RETURN_IF_ERROR(put(Slot::kQkvBias, l, qrows, L.k_bias));
      LMSERVE_RETURN_IF_ERROR(put(Slot::kQkvBias, l, qrows + kvrows, L.v_bias));
    }
    if (c.qk_norm) {
      LMSERVE_RETURN_IF_ERROR(put(Slot::kQNorm, l, 0, L.q_norm));
      LMSERVE_RETURN_IF_ERROR(put(Slot::kKNorm, l, 0, L.k_norm));
    }
    LMSERVE_RETURN_IF_ERROR(projection(Slot::kO, Slot::kOScale, l, 0, L.o_proj));
    LMSERVE_RETURN_IF_ERROR(projection(Slot::kGateUp, Slot::kGateUpScale, l, 0, L.gate_proj));
    LMSERVE_RETURN_IF_ERROR(projection(Slot::kGateUp, Slot::kGateUpScale, l, sp.intermediate, L.up_proj));
    LMSERVE_RETURN_IF_ERROR(projection(Slot::kDown, Slot::kDownScale, l, 0, L.down_proj));
    progress.set(static_cast<double>(w.bytes()) * static_cast<double>(l + 1) / static_cast<double>(c.num_layers));
  }
  return Status::ok();
}

}  // namespace

Result<std::unique_ptr<Backend>> make_cuda_backend(std::shared_ptr<const model::ModelWeights> weights, const CudaBackendOptions& o) {
  if (!weights) return error(StatusCode::kInvalidArgument, "cuda backend: no weights");
  const auto& c = weights->config();
  if (o.block_size < 1 || o.block_size > 1024) return error(StatusCode::kInvalidArgument, "cuda backend: block size must be in [1, 1024]");
  if (o.gpu_memory_utilization <= 0 || o.gpu_memory_utilization > 1) {
    return error(StatusCode::kInvalidArgument, "--gpu-memory-utilization must be in (0, 1]");
  }
  if (o.max_num_seqs < 1 || o.max_num_batched_tokens < 1) {
    return error(StatusCode::kInvalidArgument, "cuda backend: max_num_seqs and max_num_batched_tokens must be positive");
  }
  const int tp = o.tensor_parallel_size;
  LMSERVE_RETURN_IF_ERROR(model::check_tensor_parallel(c, tp));
  std::vector<int> devices = o.devices;
  for (int r = 0; devices.empty() && r < tp; ++r) devices.push_back(o.device + r);
  if (static_cast<int>(devices.size()) != tp || tp > cuda::TpGroup::kMaxRanks) {
    return error(StatusCode::kInvalidArgument, "cuda backend: one GPU per tensor-parallel rank, at most " + std::to_string(cuda::TpGroup::kMaxRanks));
  }
  std::vector<std::shared_ptr<const model::ShardWeights>> shards;
  for (int r = 0; r < tp; ++r) {
    auto sh = model::ShardWeights::make(weights, tp, r);
    if (!sh) return error(sh.error());
    shards.push_back(std::move(*sh));
  }
  const model::ShardPlan& sp = shards[0]->plan();  // every rank's shape (the vocabulary ranges aside)
  if (!cuda::kernels_support(c.head_dim, sp.heads / sp.kv_heads) || c.head_dim / 2 > 128) {
    return error(StatusCode::kInvalidArgument, "cuda backend: head_dim " + std::to_string(c.head_dim) + " with " +
                                                   std::to_string(sp.heads / sp.kv_heads) +
                                                   " query heads per KV head is not supported (head_dim 16/32/64/128, up to 16 per group)");
  }
  const model::DType act = weights->dtype();
  cuda::ModelDims d;
  d.vocab = c.vocab_size;
  d.hidden = c.hidden_size;
  d.intermediate = sp.intermediate;
  d.layers = c.num_layers;
  d.heads = sp.heads;
  d.kv_heads = sp.kv_heads;
  d.head_dim = c.head_dim;
  d.eps = static_cast<float>(c.rms_norm_eps);
  d.act = act_of(act);
  d.qkv_bias = c.qkv_bias;
  d.qk_norm = c.qk_norm;
  d.tied = c.tie_word_embeddings;
  d.fp8_weights = weights->fp8();
  d.inv_freq = rope_inv_freq(c);
  if (d.fp8_weights && (c.hidden_size % 16 != 0 || (d.heads * c.head_dim) % 16 != 0 || d.intermediate % 16 != 0)) {
    return error(StatusCode::kInvalidArgument, "cuda backend: FP8 weights need hidden_size, num_heads x head_dim and intermediate_size (a rank's) divisible by 16");
  }
  const std::int64_t step_tokens = std::max(o.max_num_batched_tokens, o.max_num_seqs);
  std::shared_ptr<cuda::TpGroup> group;
  std::string err;
  if (tp > 1) {
    std::int64_t widest = 0;
    for (const auto& sh : shards) {
      d.vocab_ranges.push_back(sh->plan().vocab_begin);
      widest = std::max(widest, sh->plan().vocab_end - sh->plan().vocab_begin);
    }
    d.vocab_ranges.push_back(c.vocab_size);
    const auto rows_h = static_cast<std::size_t>(step_tokens * c.hidden_size);
    group = cuda::TpGroup::create(devices, rows_h * static_cast<std::size_t>(model::dtype_bytes(act)), rows_h * 4,
                                  static_cast<std::size_t>(o.max_num_seqs * widest) * 4,
                                  o.nccl ? cuda::TpGroup::Transport::kNccl : cuda::TpGroup::Transport::kPeer, &err);
    if (!group) return error(StatusCode::kUnavailable, "cuda backend: tensor parallelism: " + err);
  }
  std::vector<std::unique_ptr<cuda::DeviceModel>> ranks;
  {
    StartupPhase phase("weights_to_device");
    for (int r = 0; r < tp; ++r) {
      auto m = cuda::create_device_model(devices[static_cast<std::size_t>(r)], d, &err, group, r);
      if (!m) return error(StatusCode::kUnavailable, "cuda backend: " + err);
      LMSERVE_RETURN_IF_ERROR(upload(*m, *shards[static_cast<std::size_t>(r)], act));
      ranks.push_back(std::move(m));
    }
  }

  cuda::PlanOptions p;
  p.kv = o.kv_dtype;
  p.block_size = o.block_size;
  p.num_blocks = o.num_blocks;
  p.gpu_memory_utilization = o.gpu_memory_utilization;
  p.max_tokens = o.max_num_batched_tokens;
  p.max_seqs = o.max_num_seqs;
  p.max_model_len = o.max_model_len > 0 ? o.max_model_len : c.max_position_embeddings;
  p.enforce_eager = o.enforce_eager;
  p.device_sampling = o.device_sampling;
  p.k_scales = o.k_scales;
  p.v_scales = o.v_scales;
  p.step_report = o.step_report;
  if (!o.profile_step.empty()) {
    const std::string& v = o.profile_step;
    p.profile_step_kind = v.rfind("decode:", 0) == 0 ? 1 : (v.rfind("prefill:", 0) == 0 ? 2 : 0);
    const std::string n = p.profile_step_kind == 0 ? v : v.substr(v.find(':') + 1);
    char* end = nullptr;
    const long step = std::strtol(n.c_str(), &end, 10);
    if (n.empty() || *end != '\0' || step < 1 || step > 1000000) {
      return error(StatusCode::kInvalidArgument, "--profile-step must be N, decode:N or prefill:N with N >= 1");
    }
    p.profile_step = static_cast<int>(step);
  }
  if (o.kv_dtype == KvDtype::kFp8E4M3 && o.k_scales.empty()) {
    // The CPU backend's calibration batch: 256 tokens from the same generator.
    std::mt19937 rng(20261130);
    std::uniform_int_distribution<std::int32_t> tok(0, static_cast<std::int32_t>(c.vocab_size - 1));
    for (int i = 0; i < 256; ++i) p.calibration_tokens.push_back(tok(rng));
  }
  std::unique_ptr<TuningCache> tuning;
  if (!o.tuning_cache.empty()) {
    const auto id = cuda::device_identity(devices[0]);
    tuning = TuningCache::open(o.tuning_cache, {id.name, id.multiprocessors, id.compute_capability, id.driver, id.runtime, id.cublaslt,
                                                std::string(build_info().version) + " " + std::string(build_info().git_commit)});
    if (!tuning->note().empty()) spdlog::info("tuning cache {}: {}", tuning->file().string(), tuning->note());
    p.algo_cache = tuning.get();
  }
  // Every rank plans at once (its dummy steps meet the others'), with its own KV heads' scales.
  std::unique_ptr<cpu::RankGroup> threads = tp > 1 ? std::make_unique<cpu::RankGroup>(tp) : nullptr;
  std::vector<cuda::MemoryPlan> plans(static_cast<std::size_t>(tp));
  const std::string plan_error = on_ranks(threads.get(), tp, [&](int r) {
    cuda::PlanOptions pr = p;
    if (tp > 1 && !p.k_scales.empty()) {
      const model::ShardPlan& rp = shards[static_cast<std::size_t>(r)]->plan();
      pr.k_scales.clear();
      pr.v_scales.clear();
      for (std::int64_t l = 0; l < c.num_layers; ++l) {
        for (std::int64_t h = rp.first_kv_head; h < rp.first_kv_head + rp.kv_heads; ++h) {
          pr.k_scales.push_back(p.k_scales[static_cast<std::size_t>(l * c.num_kv_heads + h)]);
          pr.v_scales.push_back(p.v_scales[static_cast<std::size_t>(l * c.num_kv_heads + h)]);
        }
      }
    }
    return ranks[static_cast<std::size_t>(r)]->plan(pr, &plans[static_cast<std::size_t>(r)]);
  });
  if (tuning) {
    spdlog::info("tuning cache {}: {} GEMM algorithms reused, {} timed", tuning->file().string(), tuning->hits(), tuning->misses());
    if (Status s = tuning->save(); !s.is_ok()) spdlog::warn("{}", s.message());
  }
  if (const std::string& e = plan_error; !e.empty()) {
    const bool no_memory = e.find("no GPU memory left") != std::string::npos || e.find("out of memory") != std::string::npos;
    return error(no_memory ? StatusCode::kResourceExhausted : StatusCode::kInternal, "cuda backend: " + e);
  }
  // The group's memory (every rank's GPU) and the blocks every rank holds.
  MemoryInfo mem;
  std::int64_t blocks = plans[0].num_blocks;
  for (const cuda::MemoryPlan& plan : plans) {
    mem.total_bytes += plan.total;
    mem.weight_bytes += plan.weights;
    mem.activation_bytes += plan.activations;
    mem.graph_bytes += plan.graphs;
    mem.kv_cache_bytes += plan.kv;
    blocks = std::min(blocks, plan.num_blocks);
  }
  mem.used_bytes = mem.weight_bytes + mem.activation_bytes + mem.graph_bytes + mem.kv_cache_bytes;
  KvCacheConfig kv{o.kv_dtype, o.block_size, blocks};
  const CudaBackend::Limits limits{std::max(p.max_tokens, p.max_seqs), p.max_seqs, p.max_model_len, p.device_sampling};
  const std::uint64_t rank_block_bytes = backend::kv_block_bytes(c, o.kv_dtype, o.block_size, sp.kv_heads);
  return std::unique_ptr<Backend>(new CudaBackend(std::move(weights), std::move(ranks), std::move(threads), kv, mem, limits, rank_block_bytes));
}

}  // namespace lmserve::backend
