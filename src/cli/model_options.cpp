#include "cli/model_options.h"

#include <spdlog/spdlog.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/device/devices.h"
#include "common/startup.h"
#include "model/shard.h"

namespace lmserve::cli {

void ModelOptions::add_to(CLI::App& app) {
  app.add_option("--model", model, "model folder (config.json, safetensors, tokenizer)")->required();
  app.add_option("--tokenizer", tokenizer, "tokenizer folder (default: the model folder)");
  app.add_option("--dtype", dtype, "weight dtype: auto, float32, bfloat16, float16")->capture_default_str();
  app.add_option("--quantization", quantization,
                 "none, or fp8: the linear projections' weights as e4m3 with a scale per output channel, quantized at load "
                 "(an FP8 checkpoint is FP8 either way); --dtype stays the activations' dtype")
      ->check(CLI::IsMember({"none", "fp8"}))
      ->capture_default_str();
  app.add_option("--load-format", load_format, "auto, safetensors, or dummy (random weights, config.json only)")
      ->capture_default_str();
  app.add_option("--kv-cache-dtype", kv_cache_dtype, "auto, float32, bfloat16, float16, fp8_e5m2, fp8_e4m3")->capture_default_str();
  app.add_option("--device", device, "auto, cpu or cuda")->capture_default_str();
  app.add_option("--block-size", block_size, "KV block size in tokens")->capture_default_str();
  app.add_option("--num-kv-blocks", num_kv_blocks, "KV blocks to allocate (0: sized for the request)");
  app.add_option("--threads", threads, "CPU threads (0: all cores)");
  add_tensor_parallel_option(app, &tensor_parallel_size, &tp_all_reduce);
  app.add_option("--gpu-memory-utilization", gpu_memory_utilization, "share of GPU memory to use (CUDA backend)")->capture_default_str();
  app.add_flag("--enforce-eager", enforce_eager, "no CUDA graphs (CUDA backend)");
  app.add_flag("--host-sampling", host_sampling, "sample every token on the host from the logits (CUDA backend; default: on the GPU)");
  add_tuning_cache_option(app, &tuning_cache);
}

void add_tensor_parallel_option(CLI::App& app, int* size, std::string* all_reduce) {
  app.add_option("--tensor-parallel-size", *size,
                 "ranks one model is split across (attention heads, KV heads, MLP features and vocabulary): on the CPU backend threads "
                 "that add their partial sums in memory, on the CUDA backend a GPU each")
      ->capture_default_str();
  app.add_option("--tensor-parallel-all-reduce", *all_reduce,
                 "CUDA backend, more than one rank: peer (a one-shot all-reduce over NVLink peer access) or nccl (NCCL, loaded from "
                 "libnccl.so.2)")
      ->check(CLI::IsMember({"peer", "nccl"}))
      ->capture_default_str();
}

void add_tuning_cache_option(CLI::App& app, std::string* dir) {
  app.add_option("--tuning-cache", *dir,
                 "CUDA backend: keep the GEMM algorithms timed at start-up in this directory and reuse them on the same GPU, driver and "
                 "libraries (safe to share between replicas)");
}

void ModelOptions::add_measurement_options(CLI::App& app) {
  app.add_flag("--step-report", step_report,
               "CUDA backend: print where the backend's forward passes spent their time (staging, launch, wait, device) at exit");
  app.add_option("--profile-step", profile_step,
                 "CUDA backend: bracket one step with cudaProfilerStart/Stop for `ncu --profile-from-start off`: N (the N-th "
                 "step), decode:N or prefill:N");
}

void add_kv_growth_reserve_option(CLI::App& app, double* reserve) {
  app.add_option("--kv-growth-reserve", *reserve,
                 "admit a request only if the KV cache can also hold this share of every running request's remaining max_tokens (at most "
                 "4096 each): 0 counts prompts only and preempts when the running requests outgrow the cache (vLLM), 1 never preempts "
                 "requests of up to 4096 output tokens (TensorRT-LLM's guaranteed-no-evict)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
}

void add_swap_space_option(CLI::App& app, double* gib) {
  app.add_option("--swap-space", *gib,
                 "host memory (GiB) where a preempted request's KV cache waits, so that it resumes without computing its tokens "
                 "again; taken only as preemption needs it; 0: none (preemption recomputes)")
      ->check(CLI::Range(0.0, 1048576.0))
      ->capture_default_str();
}

void add_async_scheduling_option(CLI::App& app, bool* on) {
  app.add_flag("--async-scheduling,!--no-async-scheduling", *on,
               "plan each engine step while the one before runs on the GPU (a backend that samples on the device); "
               "--no-async-scheduling plans one step at a time (default: on)");
}

std::uint64_t swap_space_bytes(double gib) { return static_cast<std::uint64_t>(gib * 1073741824.0); }

std::optional<DeviceInfo> ModelOptions::gpu() const {
  if (device == "cpu") return std::nullopt;
  auto probe = probe_devices();
  if (probe.devices.empty()) return std::nullopt;
  return probe.devices.front();
}

BatchLimits ModelOptions::batch_limits(std::int64_t max_seqs, std::int64_t max_tokens, BatchUsage usage) const {
  const auto g = gpu();
  BatchLimits out = default_batch_limits(g ? &*g : nullptr, usage);
  if (max_seqs != 0) out.max_num_seqs = max_seqs;
  if (max_tokens != 0) out.max_num_batched_tokens = max_tokens;
  return out;
}

Result<ModelOptions::Loaded> ModelOptions::load(std::int64_t default_kv_tokens) const {
  if (device != "auto" && device != "cpu" && device != "cuda") {
    return error(StatusCode::kInvalidArgument, "--device must be auto, cpu or cuda");
  }
  if (block_size < 1 || block_size > 1024) return error(StatusCode::kInvalidArgument, "--block-size must be in [1, 1024]");
  model::LoadOptions lo;
  lo.dtype = dtype;
  lo.quantization = quantization;
  if (load_format == "dummy") {
    lo.format = model::LoadOptions::Format::kDummy;
  } else if (load_format != "auto" && load_format != "safetensors") {
    return error(StatusCode::kInvalidArgument, "--load-format must be auto, safetensors or dummy");
  }
  // Tensor parallelism is checked before anything is read: a 16 GB load is not the way to learn
  // that the GPUs are too few or the size does not divide the heads.
  bool use_cuda = device == "cuda";
  if (device == "auto") use_cuda = !probe_devices().devices.empty();
  if (tensor_parallel_size != 1) {
    if (auto c = model::load_config(model); c) LMSERVE_RETURN_IF_ERROR(model::check_tensor_parallel(*c, tensor_parallel_size));
    if (use_cuda && tensor_parallel_size > 1) {
      const auto visible = probe_devices().devices.size();
      if (static_cast<std::size_t>(tensor_parallel_size) > visible) {
        return error(StatusCode::kInvalidArgument, "--tensor-parallel-size " + std::to_string(tensor_parallel_size) + " needs as many GPUs; " +
                                                       std::to_string(visible) + " visible (CUDA_VISIBLE_DEVICES)");
      }
    }
  }
  Loaded out;
  {
    StartupPhase phase("tokenizer");
    auto t = text::Tokenizer::load(tokenizer.empty() ? model : tokenizer);
    if (!t) return error(t.error());
    out.tokenizer = std::move(*t);
  }
  {
    StartupPhase phase("weights_read");
    auto w = model::ModelWeights::load(model, lo);
    if (!w) return error(w.error());
    out.weights = std::move(*w);
  }
  auto kv = backend::parse_kv_dtype(kv_cache_dtype, out.weights->config().dtype == model::DType::kF32 ? model::DType::kF32
                                                                                                     : out.weights->dtype());
  if (!kv) return error(kv.error());
  if (use_cuda) {
    backend::CudaBackendOptions co;
    co.tensor_parallel_size = tensor_parallel_size;
    co.nccl = tp_all_reduce == "nccl";
    co.kv_dtype = *kv;
    co.block_size = block_size;
    co.num_blocks = num_kv_blocks;
    co.gpu_memory_utilization = gpu_memory_utilization;
    co.max_num_seqs = max_num_seqs;
    co.max_num_batched_tokens = max_num_batched_tokens;
    co.max_model_len = max_model_len;
    co.enforce_eager = enforce_eager;
    co.device_sampling = !host_sampling;
    co.step_report = step_report;
    co.profile_step = profile_step;
    co.tuning_cache = tuning_cache;
    auto b = backend::make_cuda_backend(out.weights, co);
    if (b) {
      out.backend = std::move(*b);
      return out;
    }
    // --device auto falls back to the CPU only where the GPU cannot run this model at all;
    // running out of GPU memory stays an error rather than a silent, far slower CPU server.
    const bool unsupported = b.error().code() == StatusCode::kUnavailable ||
                             (b.error().code() == StatusCode::kInvalidArgument && b.error().message().find("not supported") != std::string::npos);
    if (device == "cuda" || !unsupported) return error(b.error());
    spdlog::warn("--device auto: {}; using the CPU backend", b.error().message());
  }
  std::int64_t blocks = num_kv_blocks > 0 ? num_kv_blocks : (default_kv_tokens + block_size - 1) / block_size;
  StartupPhase phase("kv_allocation");
  auto b = backend::make_cpu_backend(out.weights, {.kv = {*kv, block_size, blocks}, .threads = threads, .tensor_parallel_size = tensor_parallel_size});
  if (!b) return error(b.error());
  out.backend = std::move(*b);
  return out;
}

}  // namespace lmserve::cli
