// The model-loading flags shared by generate, perplexity (and later serve and bench), named
// as vllm serve names them, and the code that turns them into weights, tokenizer and backend.
#pragma once

#include <CLI/CLI.hpp>

#include <memory>
#include <optional>
#include <string>

#include "backend/backend.h"
#include "backend/device/devices.h"
#include "common/status.h"
#include "model/weights.h"
#include "text/tokenizer.h"

namespace lmserve::cli {

// --kv-growth-reserve (SchedulerOptions::kv_growth_reserve), as serve and bench throughput take it.
void add_kv_growth_reserve_option(CLI::App& app, double* reserve);

// --swap-space (EngineOptions::swap_space_bytes, in GiB as vLLM takes it), as serve and bench
// throughput take it.
inline constexpr double kDefaultSwapSpaceGib = 16;
void add_swap_space_option(CLI::App& app, double* gib);
std::uint64_t swap_space_bytes(double gib);

// --async-scheduling / --no-async-scheduling (EngineOptions::async_scheduling), as serve and
// bench throughput take it: on by default.
void add_async_scheduling_option(CLI::App& app, bool* on);
// --tensor-parallel-size N and --tensor-parallel-all-reduce (ModelOptions), as serve and the
// model commands take them.
void add_tensor_parallel_option(CLI::App& app, int* size, std::string* all_reduce);
// --tuning-cache DIR (ModelOptions::tuning_cache).
void add_tuning_cache_option(CLI::App& app, std::string* dir);

struct ModelOptions {
  std::string model;
  std::string tokenizer;  // empty: the model folder
  std::string dtype = "auto";
  std::string quantization = "none";  // none | fp8 (the linear projections' weights)
  std::string load_format = "auto";
  std::string kv_cache_dtype = "auto";
  std::string device = "auto";
  int block_size = 16;
  std::int64_t num_kv_blocks = 0;  // 0: enough for `default_kv_tokens`
  int threads = 0;
  // Ranks of one model (model/shard.h): on the CPU threads with an in-memory all-reduce; on CUDA
  // a GPU of this host each, their collectives over peer pointers ("peer") or NCCL ("nccl").
  int tensor_parallel_size = 1;
  std::string tp_all_reduce = "peer";
  // CUDA backend: the memory plan and the largest step it is planned for.
  double gpu_memory_utilization = 0.9;
  bool enforce_eager = false;
  bool host_sampling = false;
  std::string tuning_cache;  // CUDA backend: the GEMM tuning cache's directory (backend/device/tuning_cache.h); "": none
  std::int64_t max_num_seqs = 256;
  std::int64_t max_num_batched_tokens = 8192;
  std::int64_t max_model_len = 0;  // 0: the model's
  // Measurement on the CUDA backend (bench only): CudaBackendOptions::step_report, profile_step.
  bool step_report = false;
  std::string profile_step;

  void add_to(CLI::App& app);
  // --step-report and --profile-step, for `bench latency` and `bench throughput`.
  void add_measurement_options(CLI::App& app);

  // The GPU load() will run on (CUDA device 0), or nothing when it will use the CPU.
  std::optional<DeviceInfo> gpu() const;
  // max_seqs / max_tokens as given, or where 0 the default for that GPU (default_batch_limits).
  BatchLimits batch_limits(std::int64_t max_seqs, std::int64_t max_tokens, BatchUsage usage) const;

  struct Loaded {
    std::shared_ptr<const model::ModelWeights> weights;
    std::shared_ptr<const text::Tokenizer> tokenizer;
    std::unique_ptr<backend::Backend> backend;
  };
  // Loads everything on the chosen device (auto: CUDA when a GPU is usable, else CPU). The KV
  // cache gets num_kv_blocks, or on the CPU enough for `default_kv_tokens`, on a GPU what the
  // memory plan leaves.
  Result<Loaded> load(std::int64_t default_kv_tokens) const;
};

}  // namespace lmserve::cli
