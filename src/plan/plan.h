// `lmserve plan`: GPU memory and GPU counts for a model and a target load — sized from
// arithmetic and, when given, from a measured `bench serve` result, not from instinct.
//
// Per GPU (tensor parallel size TP, model/shard.h): usable = gpu_memory_utilization x memory;
// weights / TP (KV heads replicated where there are fewer than GPUs counted on each);
// an activation reserve for a max_num_batched_tokens step (the CUDA backend's buffers, whose
// total the memory plan measured at 1.82 GiB for Llama-3.1-8B at 8,192 tokens on an H200) and
// the CUDA context; the rest is KV. KV bytes per token = 2 x layers x KV heads x head_dim x
// dtype bytes (split over TP; with fewer KV heads than TP, one per GPU). Concurrency a replica
// holds = KV tokens / (mean input + mean output) of the length mix. GPUs by Little's law: concurrency = QPS x latency, times the
// redundancy factor.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "common/status.h"
#include "model/config.h"

namespace lmserve::plan {

struct GpuSpec {
  std::string name;
  double memory_gib = 0;
  double bandwidth_gbs = 0;  // HBM/GDDR, GB/s
  double bf16_tflops = 0;    // dense
};

// "H200", "H100", "A100-80G", "A100-40G", "L40S", "A10", "RTX4090" (case-insensitive, '-' optional).
Result<GpuSpec> gpu_preset(std::string name);
// "llama-3.1-8b", "llama-3.1-70b", "qwen2.5-7b", "qwen2.5-14b", "qwen2.5-32b", "qwen2.5-72b".
Result<model::ModelConfig> model_preset(const std::string& name);
std::vector<std::string> model_preset_names();

struct Measured {  // from a bench serve --result-json
  double mean_e2el_s = 0, output_throughput = 0, request_throughput = 0;
  std::int64_t max_in_flight = 0;
};
Result<Measured> read_measured(const std::string& path);

struct PlanInput {
  model::ModelConfig model;
  std::string weight_dtype = "bfloat16";  // of the checkpoint / --dtype
  std::string quantization = "none";      // none | int8 | int4 | fp8 (weight bytes)
  backend::KvDtype kv_dtype = backend::KvDtype::kBFloat16;
  GpuSpec gpu;
  double gpu_memory_utilization = 0.9;
  int tensor_parallel_size = 1;
  std::int64_t max_model_len = 0;            // 0: the model's
  // 0: what `serve` uses on this GPU (default_batch_limits): the step the activation reserve is
  // sized for, and the sequences one replica runs at once (which caps max_concurrent_seqs).
  std::int64_t max_num_batched_tokens = 0;
  std::int64_t max_num_seqs = 0;
  double mean_input_len = 400, mean_output_len = 200;
  std::optional<std::int64_t> concurrency;   // target: concurrent requests, or
  std::optional<double> qps, target_latency_s;  // requests/s, and optionally a latency goal
  double redundancy = 1.5;
  std::optional<Measured> measured;
};

struct PlanResult {
  double weight_bytes_per_param = 0;
  std::uint64_t weights_bytes = 0, weights_per_gpu = 0;
  std::uint64_t kv_bytes_per_token = 0;  // whole model (all GPUs of a replica)
  std::uint64_t activation_reserve_per_gpu = 0;
  std::uint64_t kv_pool_bytes = 0;  // per replica
  std::int64_t kv_pool_tokens = 0;
  std::int64_t max_num_seqs = 0, max_num_batched_tokens = 0;  // the batch limits planned for
  std::int64_t max_concurrent_seqs = 0;  // per replica at the mix's mean lengths, at most max_num_seqs
  double latency_s = 0;                  // per request: measured or estimated
  bool latency_measured = false;
  double required_concurrency = 0;
  std::int64_t replicas = 0, gpus_needed = 0;
  bool fits = false;
  std::string verdict;
  std::vector<std::string> notes;
};

// InvalidArgument for impossible inputs (TP not dividing the heads, zero lengths, ...).
Result<PlanResult> make_plan(const PlanInput& in);
std::string plan_json(const PlanInput& in, const PlanResult& r);
std::string plan_text(const PlanInput& in, const PlanResult& r);
// The field rule of thumb (weights = params x bytes x 1.2) next to the exact weight bytes for
// 7B/13B/33B/70B at FP16/INT8/INT4, with why they differ.
std::string rule_of_thumb_table();

}  // namespace lmserve::plan
