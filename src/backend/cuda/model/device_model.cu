#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <thread>
#include <vector>

#include "backend/cuda/model/cuda_model.cuh"
#include "backend/cuda/common/device_util.cuh"
#include "backend/step_buffers.h"
#include "common/progress.h"
#include "common/startup.h"

namespace lmserve::cuda {
namespace {

int kv_bytes(backend::KvDtype kv) {
  using backend::KvDtype;
  return kv == KvDtype::kFloat32 ? 4 : (kv == KvDtype::kBFloat16 || kv == KvDtype::kFloat16 ? 2 : 1);
}

std::size_t align_up(std::size_t n) { return (n + 255) / 256 * 256; }

}  // namespace

CudaModel::~CudaModel() {
  cudaSetDevice(device_);
  if (o_.step_report) report_.print(gemm_);
  for (auto& [b, g] : graphs_) cudaGraphExecDestroy(g);
  if (stage_) cudaFreeHost(stage_);
  if (host_logits_) cudaFreeHost(host_logits_);
  if (host_tokens_) cudaFreeHost(host_tokens_);
  if (mask_stage_) cudaFreeHost(mask_stage_);
  if (upload_stage_) cudaFreeHost(upload_stage_);
  for (auto& e : upload_done_) {
    if (e) cudaEventDestroy(e);
  }
  if (staged_event_) cudaEventDestroy(staged_event_);
  if (done_event_) cudaEventDestroy(done_event_);
  if (stream_) cudaStreamDestroy(stream_);
}

std::string CudaModel::init() {
  LMSERVE_CUDA_TRY(cudaSetDevice(device_));
  LMSERVE_CUDA_TRY(cudaFree(nullptr));  // create the context before measuring
  LMSERVE_CUDA_TRY(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  LMSERVE_CUDA_TRY(cudaEventCreateWithFlags(&staged_event_, cudaEventDisableTiming));
  LMSERVE_CUDA_TRY(cudaEventCreateWithFlags(&done_event_, cudaEventDisableTiming));
  cudaDeviceProp prop{};
  LMSERVE_CUDA_TRY(cudaGetDeviceProperties(&prop, device_));
  sms_ = prop.multiProcessorCount;
  configure_attention_kernels();
  LMSERVE_CUDA_TRY(cudaGetLastError());
  const std::size_t a = static_cast<std::size_t>(act_bytes(act_));
  const std::size_t H = d_.hidden, I = d_.intermediate, D = d_.head_dim;
  const std::size_t qkvd = (d_.heads + 2 * d_.kv_heads) * D;
  auto add = [&](DeviceBuffer& b, std::size_t elems) {
    weight_bytes_ += elems * a;
    return b.alloc(elems * a);
  };
  // A projection of `rows` output rows: act, or e4m3 with a float32 scale per row.
  auto add_projection = [&](DeviceBuffer& b, DeviceBuffer& scales, std::size_t rows, std::size_t cols) -> std::string {
    if (!d_.fp8_weights) return add(b, rows * cols);
    weight_bytes_ += rows * cols + rows * 4;
    LMSERVE_TRY(b.alloc(rows * cols));
    return scales.alloc(rows * 4);
  };
  LMSERVE_TRY(add(embed_, vocab_rows_ * H));  // the rank's rows (all of them at TP 1)
  LMSERVE_TRY(add(final_norm_, H));
  if (!d_.tied) LMSERVE_TRY(add(lm_head_, vocab_rows_ * H));
  layers_.resize(static_cast<std::size_t>(d_.layers));
  for (auto& L : layers_) {
    LMSERVE_TRY(add(L.input_norm, H));
    LMSERVE_TRY(add(L.post_norm, H));
    LMSERVE_TRY(add_projection(L.qkv, L.qkv_scale, qkvd, H));
    if (d_.qkv_bias) LMSERVE_TRY(add(L.qkv_bias, qkvd));
    if (d_.qk_norm) {
      LMSERVE_TRY(add(L.q_norm, D));
      LMSERVE_TRY(add(L.k_norm, D));
    }
    LMSERVE_TRY(add_projection(L.o, L.o_scale, H, d_.heads * D));
    LMSERVE_TRY(add_projection(L.gate_up, L.gate_up_scale, 2 * I, H));
    LMSERVE_TRY(add_projection(L.down, L.down_scale, H, I));
  }
  LMSERVE_TRY(inv_freq_.alloc(d_.inv_freq.size() * sizeof(float)));
  LMSERVE_CUDA_TRY(cudaMemcpy(inv_freq_.p, d_.inv_freq.data(), d_.inv_freq.size() * sizeof(float), cudaMemcpyHostToDevice));
  return {};
}

std::string CudaModel::set_weight(Slot slot, std::int64_t layer, std::int64_t offset, const void* host, std::size_t bytes) {
  DeviceBuffer* b = nullptr;
  LayerBuffers* L = layer >= 0 && layer < d_.layers ? &layers_[static_cast<std::size_t>(layer)] : nullptr;
  switch (slot) {
    case Slot::kEmbed: b = &embed_; break;
    case Slot::kFinalNorm: b = &final_norm_; break;
    case Slot::kLmHead: b = d_.tied ? nullptr : &lm_head_; break;
    case Slot::kInputNorm: b = L ? &L->input_norm : nullptr; break;
    case Slot::kPostNorm: b = L ? &L->post_norm : nullptr; break;
    case Slot::kQkv: b = L ? &L->qkv : nullptr; break;
    case Slot::kQkvBias: b = L ? &L->qkv_bias : nullptr; break;
    case Slot::kQNorm: b = L ? &L->q_norm : nullptr; break;
    case Slot::kKNorm: b = L ? &L->k_norm : nullptr; break;
    case Slot::kO: b = L ? &L->o : nullptr; break;
    case Slot::kGateUp: b = L ? &L->gate_up : nullptr; break;
    case Slot::kDown: b = L ? &L->down : nullptr; break;
    case Slot::kQkvScale: b = L ? &L->qkv_scale : nullptr; break;
    case Slot::kOScale: b = L ? &L->o_scale : nullptr; break;
    case Slot::kGateUpScale: b = L ? &L->gate_up_scale : nullptr; break;
    case Slot::kDownScale: b = L ? &L->down_scale : nullptr; break;
  }
  const bool projection = slot == Slot::kQkv || slot == Slot::kO || slot == Slot::kGateUp || slot == Slot::kDown;
  const bool scale = slot == Slot::kQkvScale || slot == Slot::kOScale || slot == Slot::kGateUpScale || slot == Slot::kDownScale;
  const std::size_t element = scale ? 4 : (projection && d_.fp8_weights ? 1 : static_cast<std::size_t>(act_bytes(act_)));
  const std::size_t at = static_cast<std::size_t>(offset) * element;
  if (!b || !b->p || at + bytes > b->bytes) return "weight upload outside its buffer (slot " + std::to_string(static_cast<int>(slot)) + ")";
  LMSERVE_CUDA_TRY(cudaSetDevice(device_));  // a tensor-parallel group's ranks share the loading thread
  // Through two pinned halves: host threads fill one (a copy from pageable memory, page-cache
  // pages faulted in by several threads at once) while the other goes to the device. A plain
  // cudaMemcpy from pageable memory ran at ~1.3 GB/s on the H200 machine.
  constexpr std::size_t kHalf = 64u << 20;
  if (!upload_stage_) {
    LMSERVE_CUDA_TRY(cudaHostAlloc(&upload_stage_, 2 * kHalf, cudaHostAllocDefault));
    for (auto& e : upload_done_) {
      if (!e) LMSERVE_CUDA_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
  }
  const auto* src = static_cast<const char*>(host);
  char* dst = static_cast<char*>(b->p) + at;
  const std::size_t threads = std::clamp<std::size_t>(std::thread::hardware_concurrency(), 1, 8);
  for (std::size_t done = 0, k = 0; done < bytes; done += kHalf, ++k) {
    const std::size_t n = std::min(kHalf, bytes - done);
    char* stage = static_cast<char*>(upload_stage_) + (k % 2) * kHalf;
    LMSERVE_CUDA_TRY(cudaEventSynchronize(upload_done_[k % 2]));  // this half's last copy has finished
    if (n < (4u << 20)) {
      std::memcpy(stage, src + done, n);
    } else {
      std::vector<std::thread> pool;
      for (std::size_t t = 0; t < threads; ++t) {
        const std::size_t from = n * t / threads, to = n * (t + 1) / threads;
        pool.emplace_back([=] { std::memcpy(stage + from, src + done + from, to - from); });
      }
      for (auto& th : pool) th.join();
    }
    LMSERVE_CUDA_TRY(cudaMemcpyAsync(dst + done, stage, n, cudaMemcpyHostToDevice, stream_));
    LMSERVE_CUDA_TRY(cudaEventRecord(upload_done_[k % 2], stream_));
  }
  LMSERVE_CUDA_TRY(cudaStreamSynchronize(stream_));
  return {};
}

std::string CudaModel::plan(const PlanOptions& o, MemoryPlan* out) {
  std::string e = plan_rank(o, out);
  if (!e.empty() && tp_) tp_->fail();  // the other ranks stop at their next meeting instead of waiting
  return e;
}

std::string CudaModel::plan_rank(const PlanOptions& o, MemoryPlan* out) {
  LMSERVE_CUDA_TRY(cudaSetDevice(device_));
  if (upload_stage_) {  // the weights are on the device: set_weight's staging is not needed again
    LMSERVE_CUDA_TRY(cudaFreeHost(upload_stage_));
    upload_stage_ = nullptr;
  }
  o_ = o;
  kv_ = static_cast<Kv>(o.kv);
  max_model_len_ = o.max_model_len;
  max_seqs_ = static_cast<int>(std::max<std::int64_t>(1, o.max_seqs));
  max_tokens_ = static_cast<int>(std::max<std::int64_t>(max_seqs_, o.max_tokens));
  max_blocks_per_seq_ = static_cast<int>((max_model_len_ + o.block_size - 1) / o.block_size);
  std::size_t free_before = 0, total = 0;
  LMSERVE_CUDA_TRY(cudaMemGetInfo(&free_before, &total));
  LMSERVE_TRY(allocate_activations());
  {
    StartupPhase phase("gemm_tuning");
    gemm_.set_algo_cache(o.algo_cache);
    std::string e = prepare_gemms();
    gemm_.set_algo_cache(nullptr);  // plans made later (a bucket's exact n) are not timed
    if (!e.empty()) return e;
  }
  std::optional<StartupPhase> profile_phase(std::in_place, "activation_profile");

  // The activation peak: a maximal dummy batch on a temporary KV arena.
  const std::int64_t tmp_blocks = (max_tokens_ + o.block_size - 1) / o.block_size + 1;
  LMSERVE_TRY(allocate_kv(tmp_blocks, &tmp_kv_));
  // The dummy steps from here on meet the other ranks on the device: their tuning and
  // allocations first (TpGroup::meet).
  if (tp_ && !tp_->meet()) return "another rank of the tensor-parallel group failed to start";
  LMSERVE_TRY(run_dummy(max_tokens_, static_cast<int>(std::min<std::int64_t>(max_tokens_, max_model_len_))));
  LMSERVE_CUDA_TRY(cudaStreamSynchronize(stream_));
  std::size_t free_after = 0;
  LMSERVE_CUDA_TRY(cudaMemGetInfo(&free_after, &total));
  const std::size_t tmp_kv_bytes = tmp_kv_.bytes;
  activation_bytes_ = free_before > free_after + tmp_kv_bytes ? free_before - free_after - tmp_kv_bytes : 0;
  profile_phase.reset();

  if (!o.enforce_eager) {
    StartupPhase phase("graph_capture");
    LMSERVE_TRY(capture_graphs());
  }
  std::size_t free_graphs = 0;
  LMSERVE_CUDA_TRY(cudaMemGetInfo(&free_graphs, &total));
  graph_bytes_ = free_after > free_graphs ? free_after - free_graphs : 0;
  tmp_kv_.reset();

  // The KV pool: what gpu_memory_utilization leaves after everything now in use.
  std::size_t free_now = 0;
  LMSERVE_CUDA_TRY(cudaMemGetInfo(&free_now, &total));
  const std::uint64_t block_bytes = static_cast<std::uint64_t>(2 * d_.layers * o.block_size * d_.kv_heads * d_.head_dim * kv_bytes(o.kv));
  const double budget = o.gpu_memory_utilization * static_cast<double>(total) - static_cast<double>(total - free_now);
  std::int64_t blocks = o.num_blocks > 0 ? o.num_blocks : static_cast<std::int64_t>(std::max(0.0, budget) / static_cast<double>(block_bytes));
  if (static_cast<double>(blocks) * static_cast<double>(block_bytes) > static_cast<double>(free_now) * 0.98) {
    blocks = static_cast<std::int64_t>(static_cast<double>(free_now) * 0.98 / static_cast<double>(block_bytes));
  }
  if (blocks < 1) {
    return "no GPU memory left for the KV cache: " + describe(total) + "; raise --gpu-memory-utilization or lower --max-num-batched-tokens";
  }
  {
    StartupPhase phase("kv_allocation");
    LMSERVE_TRY(allocate_kv(blocks, &kv_arena_));
  }
  num_blocks_ = blocks;

  if (tp_ && !tp_->meet()) return "another rank of the tensor-parallel group failed to start";  // (calibration runs collectives)
  if (kv_ == Kv::kE4M3) LMSERVE_TRY(set_scales(o));
  out->total = total;
  out->weights = weight_bytes_;
  out->activations = activation_bytes_;
  out->graphs = graph_bytes_;
  out->kv = kv_arena_.bytes;
  std::size_t free_end = 0;
  LMSERVE_CUDA_TRY(cudaMemGetInfo(&free_end, &total));
  const std::uint64_t used = total - free_end, ours = weight_bytes_ + activation_bytes_ + graph_bytes_ + kv_arena_.bytes;
  out->other = used > ours ? used - ours : 0;
  out->num_blocks = blocks;
  out->graph_buckets = static_cast<int>(graphs_.size());
  out->k_scales = k_scales_host_;
  out->v_scales = v_scales_host_;
  return {};
}

std::string CudaModel::prepare(const StepInput& in) {
  const auto t0 = std::chrono::steady_clock::now();
  if (in.num_tokens > max_tokens_ || in.num_seqs > max_seqs_) {
    return "batch of " + std::to_string(in.num_tokens) + " tokens / " + std::to_string(in.num_seqs) +
           " sequences is larger than the backend was planned for (" + std::to_string(max_tokens_) + " / " + std::to_string(max_seqs_) + ")";
  }
  bool decode = !o_.enforce_eager && in.num_seqs > 0 && in.num_rows == in.num_seqs && in.num_tokens == in.num_seqs;
  for (int i = 0; decode && i < in.num_seqs; ++i) decode = in.seq_len[i] == 1 && in.seq_start[i] == i && in.logits_rows[i] == i;
  int bucket = 0;
  if (decode) {
    auto it = std::find_if(buckets_.begin(), buckets_.end(), [&](int b) { return b >= in.num_seqs; });
    decode = it != buckets_.end();
    if (decode) bucket = *it;
  }
  if (staged_pending_) {
    LMSERVE_CUDA_TRY(cudaEventSynchronize(staged_event_));  // the step launched before has its copy
    staged_pending_ = false;
  }
  LMSERVE_TRY(stage(in, decode ? bucket : 0));
  next_ = Step{in, decode, bucket};
  next_.stage_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  prepared_ = true;
  return {};
}

std::string CudaModel::launch(const std::int32_t* patch_index, const std::int32_t* patch_token, int patches) {
  if (!prepared_) return "launch without a prepared step";
  if (launched_) return "launch while a step is in flight";
  prepared_ = false;
  const auto t0 = std::chrono::steady_clock::now();
  Step& s = next_;
  const StepInput& in = s.in;
  auto* tokens = reinterpret_cast<std::int32_t*>(static_cast<char*>(stage_) + off_tokens_);
  for (int i = 0; i < patches; ++i) {
    if (patch_index[i] < 0 || patch_index[i] >= in.num_tokens || patch_token[i] < 0 || patch_token[i] >= d_.vocab) {
      return "a token patch out of range";
    }
    tokens[patch_index[i]] = patch_token[i];
  }
  LMSERVE_CUDA_TRY(cudaSetDevice(device_));
  // PlanOptions::profile_step brackets one step with cudaProfilerStart/Stop, so that
  // `ncu --profile-from-start off` (with --enforce-eager: kernel by kernel) sees that step alone.
  const int kind = in.num_tokens == in.num_seqs ? 1 : 2;
  const bool profiled =
      o_.profile_step > 0 && (o_.profile_step_kind == 0 || o_.profile_step_kind == kind) && ++steps_ == o_.profile_step;
  if (profiled) LMSERVE_CUDA_TRY(cudaProfilerStart());
  s.report = o_.step_report && !calibrating_;
  s.masked = 0;
  if (sampling_on(in)) {
    for (int r = 0; r < in.num_rows; ++r) s.masked += in.sample[r].masked != 0 && in.sample[r].mode > 0 ? 1 : 0;
  }
  if (s.masked > 0 && in.num_rows > max_seqs_) return "masked rows in a step of more rows than the head holds";
  if (s.report) LMSERVE_TRY(report_.mark(0, stream_));
  LMSERVE_CUDA_TRY(cudaMemcpyAsync(meta_.p, stage_, staged_bytes_, cudaMemcpyHostToDevice, stream_));
  LMSERVE_CUDA_TRY(cudaEventRecord(staged_event_, stream_));
  staged_pending_ = true;
  s.device_seconds = 0;
  if (s.decode) {
    LMSERVE_CUDA_TRY(cudaGraphLaunch(graphs_.at(s.bucket), stream_));
    if (s.report) LMSERVE_TRY(report_.mark(1, stream_));
    if (s.masked == 0) LMSERVE_TRY(enqueue_fetch(s, 0, in.num_rows));
  } else {
    LMSERVE_TRY(enqueue_layers(in.num_tokens, meta_.as<char>() + off_item_tok_, num_items_, num_single_));
    if (s.report) LMSERVE_TRY(report_.mark(1, stream_));
    // More rows than the head's buffers hold go chunk by chunk, each waited for here; the last
    // (or only) chunk is left to finish().
    for (int r0 = 0; r0 < in.num_rows; r0 += max_seqs_) {
      if (r0 > 0) LMSERVE_TRY(collect(s, &s.device_seconds));
      const int R = std::min(max_seqs_, in.num_rows - r0);
      LMSERVE_TRY(enqueue_head(reinterpret_cast<const std::int32_t*>(meta_.as<char>() + off_rows_) + r0, R,
                               reinterpret_cast<const SampleSpec*>(meta_.as<char>() + off_sample_) + r0));
      if (s.masked == 0) LMSERVE_TRY(enqueue_fetch(s, r0, R));
    }
  }
  if (s.masked == 0) LMSERVE_CUDA_TRY(cudaEventRecord(done_event_, stream_));
  LMSERVE_CUDA_TRY(cudaGetLastError());
  if (profiled) LMSERVE_CUDA_TRY(cudaProfilerStop());
  s.launch_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() - s.device_seconds;
  inflight_ = s;
  launched_ = true;
  return {};
}

std::string CudaModel::supply_masks(const std::uint64_t* masks, int n) {
  if (!launched_ || inflight_.masked == 0) return "supply_masks without a launched step with masked rows";
  Step& s = inflight_;
  if (n != s.masked) return "supply_masks: " + std::to_string(n) + " masks for " + std::to_string(s.masked) + " masked rows";
  // After the step's head (stream order): the masks' copy, the masking, the masked rows
  // sampled again, the results' copies, the step's end.
  auto* rows = static_cast<std::int32_t*>(mask_stage_);
  int k = 0;
  for (int r = 0; r < s.in.num_rows; ++r) {
    if (s.in.sample[r].masked != 0 && s.in.sample[r].mode > 0) rows[k++] = r;
  }
  std::memcpy(static_cast<char*>(mask_stage_) + mask_rows_off_, masks, static_cast<std::size_t>(n) * mask_words_ * 8);
  LMSERVE_CUDA_TRY(cudaSetDevice(device_));
  LMSERVE_CUDA_TRY(cudaMemcpyAsync(masks_.p, mask_stage_, mask_rows_off_ + static_cast<std::size_t>(n) * mask_words_ * 8, cudaMemcpyHostToDevice, stream_));
  const auto* dev_rows = masks_.as<std::int32_t>();
  const auto* dev_masks = reinterpret_cast<const std::uint64_t*>(masks_.as<char>() + mask_rows_off_);
  launch_mask_rows(logits_.as<float>(), static_cast<int>(d_.vocab), dev_rows, n, dev_masks, static_cast<int>(mask_words_), stream_);
  launch_sample(logits_.as<float>(), n, static_cast<int>(d_.vocab), reinterpret_cast<const SampleSpec*>(meta_.as<char>() + off_sample_),
                sampled_.as<std::int32_t>(), stream_, dev_rows);
  s.masked = 0;
  LMSERVE_TRY(enqueue_fetch(s, 0, s.in.num_rows));
  LMSERVE_CUDA_TRY(cudaEventRecord(done_event_, stream_));
  LMSERVE_CUDA_TRY(cudaGetLastError());
  return {};
}

std::string CudaModel::finish(StepTimes* times) {
  if (!launched_) return "finish without a launched step";
  if (inflight_.masked > 0) {
    launched_ = false;
    return "finish before supply_masks gave the step's masks";
  }
  launched_ = false;
  Step& s = inflight_;
  const auto t0 = std::chrono::steady_clock::now();
  LMSERVE_CUDA_TRY(cudaEventSynchronize(done_event_));
  s.device_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  LMSERVE_TRY(collect(s, nullptr));
  if (times) {
    times->device_seconds = s.device_seconds;
    times->host_seconds = s.stage_seconds + s.launch_seconds;
    times->stage_seconds = s.stage_seconds;
    times->graph = s.decode;
  }
  if (s.report && times) LMSERVE_TRY(report_.add(s.decode, s.stage_seconds, s.launch_seconds, s.device_seconds, s.in.num_tokens));
  return {};
}

std::string CudaModel::describe(std::size_t total) const {
  auto gib = [](double b) { return std::to_string(b / (1024.0 * 1024 * 1024)).substr(0, 6) + " GiB"; };
  return "total " + gib(static_cast<double>(total)) + ", weights " + gib(static_cast<double>(weight_bytes_)) + ", activations " +
         gib(static_cast<double>(activation_bytes_)) + ", graphs " + gib(static_cast<double>(graph_bytes_));
}

std::string CudaModel::enqueue_fetch(Step& s, int r0, int R) {
  const std::size_t V = static_cast<std::size_t>(d_.vocab);
  s.fetch_r0 = r0;
  s.fetch_rows = rank_ == 0 ? R : 0;  // only rank 0 has the results
  s.fetch_tokens = sampling_on(s.in);
  s.fetch_logits = !s.fetch_tokens || host_rows_;
  if (s.fetch_rows <= 0) return {};
  if (s.fetch_tokens) {
    LMSERVE_CUDA_TRY(cudaMemcpyAsync(host_tokens_, sampled_.p, static_cast<std::size_t>(R) * 4, cudaMemcpyDeviceToHost, stream_));
  }
  if (s.fetch_logits) {
    LMSERVE_CUDA_TRY(cudaMemcpyAsync(host_logits_, logits_.p, static_cast<std::size_t>(R) * V * sizeof(float), cudaMemcpyDeviceToHost, stream_));
  }
  return {};
}

std::string CudaModel::collect(Step& s, double* device_s) {
  if (device_s) {
    const auto t1 = std::chrono::steady_clock::now();
    LMSERVE_CUDA_TRY(cudaStreamSynchronize(stream_));
    *device_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  }
  const std::size_t V = static_cast<std::size_t>(d_.vocab);
  const StepInput& in = s.in;
  if (s.fetch_tokens) {
    for (int r = 0; r < s.fetch_rows; ++r) {
      if (in.sample[s.fetch_r0 + r].mode > 0) in.sampled_tokens[s.fetch_r0 + r] = host_tokens_[r];
    }
  }
  if (s.fetch_logits && s.fetch_rows > 0) {
    std::memcpy(in.logits + static_cast<std::size_t>(s.fetch_r0) * V, host_logits_, static_cast<std::size_t>(s.fetch_rows) * V * sizeof(float));
  }
  s.fetch_rows = 0;
  return {};
}

std::string CudaModel::allocate_activations() {
  const std::size_t T = static_cast<std::size_t>(max_tokens_), R = static_cast<std::size_t>(max_seqs_);
  const std::size_t H = d_.hidden, D = d_.head_dim;
  const std::size_t a = static_cast<std::size_t>(act_bytes(act_));
  const auto per = backend::step_buffer_bytes(d_.hidden, d_.heads, d_.kv_heads, D, d_.intermediate, act_bytes(act_), act_bytes(act_),
                                              d_.fp8_weights);  // per token; `lmserve plan` counts the same
  LMSERVE_TRY(x_.alloc(T * per.residual));
  LMSERVE_TRY(h_.alloc(T * per.normed));
  LMSERVE_TRY(qkv_.alloc(T * per.qkv));
  LMSERVE_TRY(q_.alloc(T * per.q));
  LMSERVE_TRY(attn_.alloc(T * per.attn));
  LMSERVE_TRY(out_.alloc(T * per.layer_out));
  LMSERVE_TRY(gu_.alloc(T * per.gate_up));
  LMSERVE_TRY(mlp_in_.alloc(T * per.mlp_in));
  if (d_.fp8_weights) {
    LMSERVE_TRY(fp8_xq_.alloc(T * (per.quantized - 4)));
    LMSERVE_TRY(fp8_xs_.alloc(T * 4));
    LMSERVE_CUDA_TRY(cudaMemset(fp8_xq_.p, 0, fp8_xq_.bytes));  // prepare_gemms times products on it
    LMSERVE_CUDA_TRY(cudaMemset(fp8_xs_.p, 0, fp8_xs_.bytes));
    gemm_.set_fp8_scratch(fp8_xq_.p, fp8_xs_.as<float>());
  }
  LMSERVE_TRY(hrows_.alloc(R * H * a));
  // The whole logits: rank 0's (the others' LM head writes their range into the group's buffer).
  const std::size_t logit_rows = rank_ == 0 ? R : 0;
  LMSERVE_TRY(logits_.alloc(logit_rows * static_cast<std::size_t>(d_.vocab) * 4));
  if (tp_) LMSERVE_TRY(tp_sum_.alloc(T * H * 4));
  LMSERVE_TRY(sampled_.alloc(R * 4));
  if (o_.device_sampling) {
    mask_words_ = (static_cast<std::size_t>(d_.vocab) + 63) / 64;
    mask_rows_off_ = align_up(R * 4);
    LMSERVE_TRY(masks_.alloc(mask_rows_off_ + R * mask_words_ * 8));
  }
  // Split-context partials: at most 4 x SMs + one wave of (item, head) blocks use splits.
  std::size_t split_blocks = 0;
  for (int n = 1; n <= max_seqs_; ++n) split_blocks = std::max(split_blocks, static_cast<std::size_t>(n * d_.kv_heads * splits_for(n)));
  LMSERVE_TRY(partial_.alloc(split_blocks * kAttnRows * (D + 2) * 4));
  // A folded norm's partial sums of squares: at most a block per row pair of an H-row product.
  LMSERVE_TRY(fold_ss_.alloc(static_cast<std::size_t>(Gemm::kStreamRows) * static_cast<std::size_t>(H) * 4));
  LMSERVE_TRY(kv_ptrs_.alloc(2 * d_.layers * sizeof(void*)));
  LMSERVE_TRY(k_scale_.alloc(d_.layers * d_.kv_heads * 4));
  LMSERVE_TRY(v_scale_.alloc(d_.layers * d_.kv_heads * 4));
  LMSERVE_TRY(amax_.alloc(2 * d_.layers * d_.kv_heads * 4));
  launch_fill(k_scale_.as<float>(), 1.0f, d_.layers * d_.kv_heads, stream_);
  launch_fill(v_scale_.as<float>(), 1.0f, d_.layers * d_.kv_heads, stream_);
  LMSERVE_TRY(gemm_.init(32u << 20));
  // Metadata: one region, copied to the device in one piece each step.
  std::size_t off = 0;
  auto take = [&](std::size_t bytes) {
    std::size_t at = off;
    off = align_up(off + bytes);
    return at;
  };
  off_slots_ = take(T * 8);
  off_tokens_ = take(T * 4);
  off_pos_ = take(T * 4);
  off_item_tok_ = take(T * 4);
  off_item_cnt_ = take(T * 4);
  off_item_seq_ = take(T * 4);
  off_rows_ = take(T * 4);
  off_sample_ = take(std::max<std::size_t>(T, R) * sizeof(SampleSpec));
  off_stride_ = take(4);
  off_tables_ = take(static_cast<std::size_t>(max_seqs_) * static_cast<std::size_t>(std::max(1, max_blocks_per_seq_)) * 4);
  LMSERVE_TRY(meta_.alloc(off));
  LMSERVE_CUDA_TRY(cudaHostAlloc(&stage_, off, cudaHostAllocDefault));
  LMSERVE_CUDA_TRY(cudaHostAlloc(reinterpret_cast<void**>(&host_logits_), std::max<std::size_t>(logit_rows * static_cast<std::size_t>(d_.vocab) * 4, 4),
                                 cudaHostAllocDefault));
  LMSERVE_CUDA_TRY(cudaHostAlloc(reinterpret_cast<void**>(&host_tokens_), R * 4, cudaHostAllocDefault));
  if (o_.device_sampling) LMSERVE_CUDA_TRY(cudaHostAlloc(&mask_stage_, mask_rows_off_ + R * mask_words_ * 8, cudaHostAllocDefault));
  // Decode graphs use identity items and rows: item i = token i of sequence i.
  LMSERVE_TRY(decode_items_.alloc(4 * R * 4));
  std::vector<std::int32_t> ids(4 * R);
  for (std::size_t i = 0; i < R; ++i) {
    ids[i] = static_cast<std::int32_t>(i);
    ids[R + i] = 1;
    ids[2 * R + i] = static_cast<std::int32_t>(i);
    ids[3 * R + i] = static_cast<std::int32_t>(i);
  }
  LMSERVE_CUDA_TRY(cudaMemcpy(decode_items_.p, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
  return {};
}

std::string CudaModel::allocate_kv(std::int64_t blocks, DeviceBuffer* arena) {
  const std::size_t per = static_cast<std::size_t>(blocks) * o_.block_size * d_.kv_heads * d_.head_dim * kv_bytes(o_.kv);
  LMSERVE_TRY(arena->alloc(2 * d_.layers * per));
  LMSERVE_CUDA_TRY(cudaMemsetAsync(arena->p, 0, arena->bytes, stream_));
  std::vector<void*> ptrs(static_cast<std::size_t>(2 * d_.layers));
  for (std::size_t i = 0; i < ptrs.size(); ++i) ptrs[i] = static_cast<char*>(arena->p) + i * per;
  LMSERVE_CUDA_TRY(cudaMemcpyAsync(kv_ptrs_.p, ptrs.data(), ptrs.size() * sizeof(void*), cudaMemcpyHostToDevice, stream_));
  LMSERVE_CUDA_TRY(cudaStreamSynchronize(stream_));
  kv_blocks_now_ = blocks;
  return {};
}

std::string CudaModel::stage(const StepInput& in, int bucket) {
  char* s = static_cast<char*>(stage_);
  auto* slots = reinterpret_cast<std::int64_t*>(s + off_slots_);
  auto* tokens = reinterpret_cast<std::int32_t*>(s + off_tokens_);
  auto* pos = reinterpret_cast<std::int32_t*>(s + off_pos_);
  const int T = std::max(in.num_tokens, bucket);
  for (int i = 0; i < T; ++i) {
    const bool real = i < in.num_tokens;
    slots[i] = real ? in.slots[i] : -1;
    tokens[i] = real ? in.tokens[i] : 0;
    pos[i] = real ? in.positions[i] : 0;
  }
  int stride = 1;
  for (int i = 0; i < in.num_seqs; ++i) stride = std::max(stride, (in.seq_context[i] + o_.block_size - 1) / o_.block_size);
  if (stride > max_blocks_per_seq_) return "a sequence is longer than max_model_len";
  const int S = std::max(in.num_seqs, bucket);
  *reinterpret_cast<std::int32_t*>(s + off_stride_) = stride;
  auto* tables = reinterpret_cast<std::int32_t*>(s + off_tables_);
  for (int i = 0; i < S; ++i) {
    std::int32_t* row = tables + static_cast<std::size_t>(i) * stride;
    if (i < in.num_seqs) {
      const int need = (in.seq_context[i] + o_.block_size - 1) / o_.block_size;
      std::memcpy(row, in.seq_table[i], static_cast<std::size_t>(need) * 4);
      std::fill(row + need, row + stride, 0);
    } else {
      std::fill(row, row + stride, 0);
    }
  }
  if (bucket == 0) {
    // Attention items: runs of consecutive tokens of one sequence (kernels.cuh); the
    // one-token sequences first (the decode kernel's), then the others' runs.
    const int per_item = attention_item_tokens(static_cast<int>(d_.head_dim), static_cast<int>(d_.heads / d_.kv_heads), act_);
    auto* it_tok = reinterpret_cast<std::int32_t*>(s + off_item_tok_);
    auto* it_cnt = reinterpret_cast<std::int32_t*>(s + off_item_cnt_);
    auto* it_seq = reinterpret_cast<std::int32_t*>(s + off_item_seq_);
    int n = 0;
    for (int pass = 0; pass < 2; ++pass) {
      for (int i = 0; i < in.num_seqs; ++i) {
        if ((in.seq_len[i] == 1) != (pass == 0)) continue;
        for (int k = 0; k < in.seq_len[i]; k += per_item) {
          it_tok[n] = in.seq_start[i] + k;
          it_cnt[n] = std::min(per_item, in.seq_len[i] - k);
          it_seq[n] = i;
          ++n;
        }
      }
      if (pass == 0) num_single_ = n;
    }
    num_items_ = n;
    auto* rows = reinterpret_cast<std::int32_t*>(s + off_rows_);
    std::memcpy(rows, in.logits_rows, static_cast<std::size_t>(in.num_rows) * 4);
  }
  // Sampling specs, one per logits row; graph padding rows and rows without one: mode 0.
  auto* specs = reinterpret_cast<SampleSpec*>(s + off_sample_);
  host_rows_ = false;
  for (int r = 0; r < std::max(in.num_rows, bucket); ++r) {
    specs[r] = r < in.num_rows && in.sample ? in.sample[r] : SampleSpec{};
    host_rows_ = host_rows_ || (r < in.num_rows && specs[r].mode <= 0);
  }
  staged_bytes_ = off_tables_ + static_cast<std::size_t>(S) * stride * 4;
  return {};
}

std::string CudaModel::prepare_gemms() {
  const int H = static_cast<int>(d_.hidden), I = static_cast<int>(d_.intermediate), D = static_cast<int>(d_.head_dim);
  const int qd = static_cast<int>(d_.heads) * D, qkvd = (static_cast<int>(d_.heads + 2 * d_.kv_heads)) * D;
  const LayerBuffers& L = layers_.front();
  struct Product {
    int m, k;
    Gemm::Operands on;
    Act out = Act::kF32;
  };
  const Act prod = act_;  // the layer products come out in the act
  // o_proj and down as the step runs them where cuBLASLt runs them (more than Gemm::kStreamRows
  // rows): added into x_ (float32; the timing runs change it, and every forward pass starts by
  // writing it); with tensor parallelism, partial sums in the act for the all-reduce.
  const Product residual_o = tp_ ? Product{H, qd, {L.o.p, attn_.p, out_.p, stream_}, prod} : Product{H, qd, {L.o.p, attn_.p, x_.p, stream_, true}, Act::kF32};
  const Product residual_down = tp_ ? Product{H, I, {L.down.p, mlp_in_.p, out_.p, stream_}, prod} : Product{H, I, {L.down.p, mlp_in_.p, x_.p, stream_, true}, Act::kF32};
  const Product products[] = {{qkvd, H, {L.qkv.p, h_.p, qkv_.p, stream_}, prod}, residual_o, {2 * I, H, {L.gate_up.p, h_.p, gu_.p, stream_}, prod}, residual_down};
  Progress progress("tuning GEMMs", 5, Progress::Unit::kCount, "products");  // the layer's four and the LM head
  if (d_.fp8_weights) {
    // The same products on the quantized inputs (their scratch, any values) and FP8 weights.
    const float* xs = fp8_xs_.as<float>();
    const float* scales[] = {L.qkv_scale.as<float>(), L.o_scale.as<float>(), L.gate_up_scale.as<float>(), L.down_scale.as<float>()};
    for (int i = 0; i < 4; ++i, progress.add(1)) {
      Gemm::Operands on = products[i].on;
      on.x = fp8_xq_.p;
      on.w_scales = scales[i];
      on.x_scales = xs;
      LMSERVE_TRY(gemm_.prepare_fp8(products[i].m, products[i].k, max_tokens_, &on, products[i].out));
    }
  } else {
    for (const Product& p : products) {
      LMSERVE_TRY(gemm_.prepare(p.m, p.k, act_, max_tokens_, &p.on, p.out));
      progress.add(1);
    }
  }
  const Gemm::Operands head{d_.tied ? embed_.p : lm_head_.p, hrows_.p, tp_ ? tp_->gather_buffer(rank_) : logits_.as<float>(), stream_};
  LMSERVE_TRY(gemm_.prepare(static_cast<int>(vocab_rows_), H, act_, max_seqs_, &head));
  progress.add(1);
  return {};
}

std::string CudaModel::run_dummy(int tokens, int seq_len) {
  seq_len = std::max(1, seq_len);
  const int seqs = std::min(max_seqs_, (tokens + seq_len - 1) / seq_len);
  tokens = std::min(tokens, seqs * seq_len);
  std::vector<std::int32_t> tok(static_cast<std::size_t>(tokens)), pos(tok.size()), start, len, ctx, rows;
  std::vector<std::int64_t> slots(tok.size());
  std::vector<std::vector<std::int32_t>> tables;
  std::vector<const std::int32_t*> table_ptrs;
  std::int64_t next_block = 0;
  for (int s = 0; s < seqs; ++s) {
    const int b = s * seq_len, n = std::min(seq_len, tokens - b);
    std::vector<std::int32_t> table;
    for (int p = 0; p < n; p += o_.block_size) table.push_back(static_cast<std::int32_t>(next_block++ % kv_blocks_now_));
    for (int p = 0; p < n; ++p) {
      tok[static_cast<std::size_t>(b + p)] = static_cast<std::int32_t>((static_cast<std::int64_t>(b + p) * 7919 + 13) % d_.vocab);
      pos[static_cast<std::size_t>(b + p)] = p;
      slots[static_cast<std::size_t>(b + p)] = static_cast<std::int64_t>(table[static_cast<std::size_t>(p / o_.block_size)]) * o_.block_size + p % o_.block_size;
    }
    start.push_back(b);
    len.push_back(n);
    ctx.push_back(n);
    rows.push_back(b + n - 1);
    tables.push_back(std::move(table));
  }
  for (auto& t : tables) table_ptrs.push_back(t.data());
  // Greedy on the device where sampling runs there: only the tokens come back. Copying every
  // row's logits into host memory made up nearly all of the graph warm-ups' time (41 buckets up
  // to 1,024 rows of the 8B shape: 8.8 GB, 8.3 of the 8.5 s of graph capture on the H200).
  std::vector<SampleSpec> greedy(rows.size());
  for (SampleSpec& g : greedy) g.mode = 1;
  std::vector<std::int32_t> sampled(rows.size());
  std::vector<float> logits(o_.device_sampling ? 0 : rows.size() * static_cast<std::size_t>(d_.vocab));
  StepInput in{tok.data(), pos.data(), slots.data(), tokens, start.data(), len.data(), ctx.data(), table_ptrs.data(), seqs, rows.data(),
               static_cast<int>(rows.size()), logits.empty() ? nullptr : logits.data(), greedy.data(), sampled.data()};
  const bool eager = o_.enforce_eager;
  o_.enforce_eager = true;
  std::string e = forward(in, nullptr);
  o_.enforce_eager = eager;
  return e;
}

std::string CudaModel::capture_graphs() {
  for (int b : {1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 112, 128}) {
    if (b <= max_seqs_) buckets_.push_back(b);
  }
  for (int b = 160; b <= max_seqs_; b += 32) buckets_.push_back(b);
  if (buckets_.empty() || buckets_.back() != max_seqs_) buckets_.push_back(max_seqs_);
  Progress progress("capturing CUDA graphs", static_cast<double>(buckets_.size()), Progress::Unit::kCount, "graphs");
  // Where the time goes, shown with the final line: the eager warm-up, the capture, the
  // instantiation and upload.
  double seconds[3] = {0, 0, 0};
  auto lap = [t = std::chrono::steady_clock::now()](double* into) mutable {
    const auto now = std::chrono::steady_clock::now();
    *into += std::chrono::duration<double>(now - t).count();
    t = now;
  };
  for (int b : buckets_) {
    // Warm up (cuBLASLt plans for this shape), then capture one decode step of b sequences.
    // Ranks of a group start each warm-up together (TpGroup: no rank may be inside a call that
    // waits for the whole device, such as instantiating a graph, while another's collectives run
    // on a GPU they share).
    if (tp_ && !tp_->meet()) return "another rank of the tensor-parallel group failed to start";
    LMSERVE_TRY(run_dummy(b, 1));
    LMSERVE_CUDA_TRY(cudaStreamSynchronize(stream_));
    lap(&seconds[0]);
    cudaGraph_t graph = nullptr;
    LMSERVE_CUDA_TRY(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    std::string e = enqueue_layers(b, decode_items_.as<char>(), b, b);
    if (e.empty()) e = enqueue_head(decode_items_.as<std::int32_t>() + 3 * max_seqs_, b, reinterpret_cast<const SampleSpec*>(meta_.as<char>() + off_sample_));
    cudaError_t end = cudaStreamEndCapture(stream_, &graph);
    if (!e.empty()) return e;
    if (end != cudaSuccess) return std::string("cudaStreamEndCapture: ") + cudaGetErrorString(end);
    lap(&seconds[1]);
    cudaGraphExec_t exec = nullptr;
    cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    if (inst != cudaSuccess) return std::string("cudaGraphInstantiate: ") + cudaGetErrorString(inst);
    graphs_[b] = exec;
    LMSERVE_CUDA_TRY(cudaGraphUpload(exec, stream_));
    LMSERVE_CUDA_TRY(cudaStreamSynchronize(stream_));
    lap(&seconds[2]);
    progress.add(1);
  }
  char note[128];
  std::snprintf(note, sizeof note, "warm-up %.2f s, capture %.2f s, instantiate %.2f s", seconds[0], seconds[1], seconds[2]);
  progress.set_note(note);
  return {};
}

std::string CudaModel::set_scales(const PlanOptions& o) {
  const std::size_t n = static_cast<std::size_t>(d_.layers * d_.kv_heads);
  if (o.k_scales.size() == n && o.v_scales.size() == n) {
    k_scales_host_ = o.k_scales;
    v_scales_host_ = o.v_scales;
  } else {
    // Calibration: per-layer, per-head |max| of K and V over a fixed batch, x2 head room.
    LMSERVE_CUDA_TRY(cudaMemsetAsync(amax_.p, 0, amax_.bytes, stream_));
    const int len = static_cast<int>(std::min<std::size_t>(o.calibration_tokens.size(), static_cast<std::size_t>(max_tokens_)));
    std::vector<std::int32_t> pos(static_cast<std::size_t>(len)), table;
    std::vector<std::int64_t> slots(pos.size());
    for (int p = 0; p < len; p += o_.block_size) table.push_back(static_cast<std::int32_t>(table.size()));
    if (static_cast<std::int64_t>(table.size()) > num_blocks_) return "the KV cache is too small for fp8_e4m3 calibration";
    for (int p = 0; p < len; ++p) {
      pos[static_cast<std::size_t>(p)] = p;
      slots[static_cast<std::size_t>(p)] = p;
    }
    std::int32_t start = 0, row = len - 1;
    const std::int32_t* tp = table.data();
    std::vector<float> logits(static_cast<std::size_t>(d_.vocab));
    StepInput in{o.calibration_tokens.data(), pos.data(), slots.data(), len, &start, &len, &len, &tp, 1, &row, 1, logits.data()};
    calibrating_ = true;
    std::string e = forward(in, nullptr);
    calibrating_ = false;
    if (!e.empty()) return e;
    std::vector<float> amax(2 * n);
    LMSERVE_CUDA_TRY(cudaMemcpy(amax.data(), amax_.p, amax.size() * 4, cudaMemcpyDeviceToHost));
    k_scales_host_.assign(n, 0);
    v_scales_host_.assign(n, 0);
    for (std::int64_t l = 0; l < d_.layers; ++l) {
      for (std::int64_t h = 0; h < d_.kv_heads; ++h) {
        const std::size_t i = static_cast<std::size_t>(l * d_.kv_heads + h);
        k_scales_host_[i] = std::max(amax[static_cast<std::size_t>(2 * l * d_.kv_heads + h)], 1e-6f) * 2.0f / 448.0f;
        v_scales_host_[i] = std::max(amax[static_cast<std::size_t>((2 * l + 1) * d_.kv_heads + h)], 1e-6f) * 2.0f / 448.0f;
      }
    }
  }
  LMSERVE_CUDA_TRY(cudaMemcpy(k_scale_.p, k_scales_host_.data(), n * 4, cudaMemcpyHostToDevice));
  LMSERVE_CUDA_TRY(cudaMemcpy(v_scale_.p, v_scales_host_.data(), n * 4, cudaMemcpyHostToDevice));
  return {};
}

std::string CudaModel::swap(const std::int32_t* blocks, char* const* host, int n, bool to_host) {
  if (n == 0) return {};
  LMSERVE_CUDA_TRY(cudaSetDevice(device_));
  // The ids and host addresses in one copy; from pageable memory, which the copy has taken in
  // by the time it returns.
  const std::size_t ids = align_up(static_cast<std::size_t>(n) * 4), need = ids + static_cast<std::size_t>(n) * sizeof(char*);
  if (swap_meta_.bytes < need) {
    LMSERVE_CUDA_TRY(cudaStreamSynchronize(stream_));  // an earlier swap may still read it
    LMSERVE_TRY(swap_meta_.alloc(2 * need));
  }
  swap_stage_.resize(need);
  std::memcpy(swap_stage_.data(), blocks, static_cast<std::size_t>(n) * 4);
  std::memcpy(swap_stage_.data() + ids, host, static_cast<std::size_t>(n) * sizeof(char*));
  LMSERVE_CUDA_TRY(cudaMemcpyAsync(swap_meta_.p, swap_stage_.data(), need, cudaMemcpyHostToDevice, stream_));
  const std::size_t chunk = static_cast<std::size_t>(o_.block_size) * d_.kv_heads * d_.head_dim * kv_bytes(o_.kv);
  launch_swap_blocks(kv_ptrs_.as<void*>(), static_cast<int>(2 * d_.layers), swap_meta_.as<std::int32_t>(),
                     reinterpret_cast<char* const*>(swap_meta_.as<char>() + ids), n, chunk, to_host, stream_);
  LMSERVE_CUDA_TRY(cudaGetLastError());
  return {};
}

DeviceIdentity device_identity(int device) {
  DeviceIdentity id;
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) == cudaSuccess) {
    id.name = prop.name;
    id.multiprocessors = prop.multiProcessorCount;
    id.compute_capability = prop.major * 10 + prop.minor;
  }
  cudaDriverGetVersion(&id.driver);
  cudaRuntimeGetVersion(&id.runtime);
  id.cublaslt = cublasLtGetVersion();
  return id;
}

std::unique_ptr<DeviceModel> create_device_model(int device, const ModelDims& dims, std::string* error, std::shared_ptr<TpGroup> group, int rank) {
  const std::size_t ranks = group ? static_cast<std::size_t>(group->size()) : 1;
  if (rank < 0 || static_cast<std::size_t>(rank) >= ranks || (group && dims.vocab_ranges.size() != ranks + 1) || (!group && !dims.vocab_ranges.empty())) {
    *error = "create_device_model: a rank of its group, with one vocabulary range per rank";
    return nullptr;
  }
  auto m = std::make_unique<CudaModel>(device, dims, std::move(group), rank);
  if (std::string e = m->init(); !e.empty()) {
    *error = e;
    return nullptr;
  }
  return m;
}

bool kernels_support(std::int64_t head_dim, std::int64_t group) {
  return attention_supports(static_cast<int>(head_dim), static_cast<int>(group));
}

}  // namespace lmserve::cuda
