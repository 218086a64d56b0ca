#include "plan/plan.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/device/devices.h"
#include "backend/step_buffers.h"
#include "model/shard.h"

namespace lmserve::plan {
namespace {

using json = nlohmann::json;
constexpr double kGiB = 1024.0 * 1024 * 1024;

std::string normalized(std::string s) {
  std::string out;
  for (char c : s) {
    if (c != '-' && c != '_' && c != ' ') out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return out;
}

// Published hyper-parameters of common models (their config.json numbers).
struct ModelPreset {
  const char* name;
  const char* config;
};
const ModelPreset kModels[] = {
    {"llama-3.1-8b",
     R"({"architectures":["LlamaForCausalLM"],"vocab_size":128256,"hidden_size":4096,"intermediate_size":14336,"num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,"max_position_embeddings":131072,"rms_norm_eps":1e-5,"rope_theta":500000.0,"rope_scaling":{"rope_type":"llama3","factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":8192},"torch_dtype":"bfloat16"})"},
    {"llama-3.1-70b",
     R"({"architectures":["LlamaForCausalLM"],"vocab_size":128256,"hidden_size":8192,"intermediate_size":28672,"num_hidden_layers":80,"num_attention_heads":64,"num_key_value_heads":8,"max_position_embeddings":131072,"rms_norm_eps":1e-5,"rope_theta":500000.0,"rope_scaling":{"rope_type":"llama3","factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":8192},"torch_dtype":"bfloat16"})"},
    {"qwen2.5-7b",
     R"({"architectures":["Qwen2ForCausalLM"],"vocab_size":152064,"hidden_size":3584,"intermediate_size":18944,"num_hidden_layers":28,"num_attention_heads":28,"num_key_value_heads":4,"max_position_embeddings":32768,"rms_norm_eps":1e-6,"rope_theta":1000000.0,"torch_dtype":"bfloat16"})"},
    {"qwen2.5-14b",
     R"({"architectures":["Qwen2ForCausalLM"],"vocab_size":152064,"hidden_size":5120,"intermediate_size":13824,"num_hidden_layers":48,"num_attention_heads":40,"num_key_value_heads":8,"max_position_embeddings":32768,"rms_norm_eps":1e-5,"rope_theta":1000000.0,"torch_dtype":"bfloat16"})"},
    {"qwen2.5-32b",
     R"({"architectures":["Qwen2ForCausalLM"],"vocab_size":152064,"hidden_size":5120,"intermediate_size":27648,"num_hidden_layers":64,"num_attention_heads":40,"num_key_value_heads":8,"max_position_embeddings":32768,"rms_norm_eps":1e-5,"rope_theta":1000000.0,"torch_dtype":"bfloat16"})"},
    {"qwen2.5-72b",
     R"({"architectures":["Qwen2ForCausalLM"],"vocab_size":152064,"hidden_size":8192,"intermediate_size":29568,"num_hidden_layers":80,"num_attention_heads":64,"num_key_value_heads":8,"max_position_embeddings":32768,"rms_norm_eps":1e-5,"rope_theta":1000000.0,"torch_dtype":"bfloat16"})"},
};

const GpuSpec kGpus[] = {
    {"H200", 141, 4800, 989},    {"H100", 80, 3350, 989},  {"A100-80G", 80, 2039, 312}, {"A100-40G", 40, 1555, 312},
    {"L40S", 48, 864, 362},      {"A10", 24, 600, 125},    {"RTX4090", 24, 1008, 165},
};

double bytes_per_param(const std::string& dtype, const std::string& quant) {
  if (quant == "int8" || quant == "fp8") return 1.0;
  if (quant == "int4") return 0.5;
  return dtype == "float32" ? 4.0 : 2.0;
}

std::string gib(double b) {
  char s[32];
  std::snprintf(s, sizeof(s), "%.2f GiB", b / kGiB);
  return s;
}

std::string params_text(double p) {
  char s[32];
  if (p >= 1e9) {
    std::snprintf(s, sizeof(s), "%.2f B", p / 1e9);
  } else {
    std::snprintf(s, sizeof(s), "%.2f M", p / 1e6);
  }
  return s;
}

}  // namespace

Result<GpuSpec> gpu_preset(std::string name) {
  for (const auto& g : kGpus) {
    if (normalized(g.name) == normalized(name)) return g;
  }
  return error(StatusCode::kInvalidArgument, "unknown --gpu '" + name + "' (H200, H100, A100-80G, A100-40G, L40S, A10, RTX4090; or --gpu-memory GiB)");
}

Result<model::ModelConfig> model_preset(const std::string& name) {
  for (const auto& m : kModels) {
    if (normalized(m.name) == normalized(name)) return model::parse_config(m.config);
  }
  return error(StatusCode::kNotFound, "no model preset '" + name + "'");
}

std::vector<std::string> model_preset_names() {
  std::vector<std::string> out;
  for (const auto& m : kModels) out.push_back(m.name);
  return out;
}

Result<Measured> read_measured(const std::string& path) {
  std::ifstream in(path);
  if (!in) return error(StatusCode::kNotFound, "--measured: cannot read " + path);
  auto j = json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("e2el") || !j["e2el"].contains("mean_ms") || !j.contains("output_throughput")) {
    return error(StatusCode::kInvalidArgument, "--measured: " + path + " is not a bench serve --result-json file");
  }
  Measured m;
  m.mean_e2el_s = j["e2el"]["mean_ms"].get<double>() / 1e3;
  m.output_throughput = j["output_throughput"].get<double>();
  m.request_throughput = j.value("request_throughput", 0.0);
  m.max_in_flight = j.value("max_in_flight", std::int64_t{0});
  if (m.mean_e2el_s <= 0) return error(StatusCode::kInvalidArgument, "--measured: the run has no successful requests");
  return m;
}

Result<PlanResult> make_plan(const PlanInput& in) {
  const auto& c = in.model;
  const int tp = in.tensor_parallel_size;
  LMSERVE_RETURN_IF_ERROR(model::check_tensor_parallel(c, tp));
  // A GPU's share (model/shard.h): with fewer KV heads than GPUs each holds one, replicated.
  const model::ShardPlan shard = model::plan_shard(c, tp, 0);
  if (in.mean_input_len <= 0 || in.mean_output_len <= 0) return error(StatusCode::kInvalidArgument, "the length mix needs positive means");
  if (in.gpu.memory_gib <= 0 || in.gpu_memory_utilization <= 0 || in.gpu_memory_utilization > 1) {
    return error(StatusCode::kInvalidArgument, "GPU memory and utilization must be positive (utilization at most 1)");
  }
  if (in.redundancy < 1) return error(StatusCode::kInvalidArgument, "--redundancy must be >= 1");
  if (in.max_num_seqs < 0 || in.max_num_batched_tokens < 0) {
    return error(StatusCode::kInvalidArgument, "--max-num-seqs and --max-num-batched-tokens must be positive (or 0: serve's default)");
  }
  if (!in.concurrency && !in.qps) {
    return error(StatusCode::kInvalidArgument, "give a target: --concurrency N, or --qps Q (with --target-latency S to check it)");
  }
  PlanResult r;
  const double params = static_cast<double>(c.num_parameters());
  r.weight_bytes_per_param = bytes_per_param(in.weight_dtype, in.quantization);
  r.weights_bytes = static_cast<std::uint64_t>(params * r.weight_bytes_per_param);
  if (in.quantization == "fp8") {
    // As serve loads it (model/weights.h): the projections one byte an element and a float32
    // scale per output channel, the embedding, LM head and norms in the checkpoint's dtype.
    const double proj = static_cast<double>(c.num_projection_parameters());
    r.weights_bytes = static_cast<std::uint64_t>(proj + 4.0 * static_cast<double>(c.num_projection_rows()) +
                                                 (params - proj) * bytes_per_param(in.weight_dtype, "none"));
    r.weight_bytes_per_param = static_cast<double>(r.weights_bytes) / params;
  }
  // Replicated KV heads' k and v rows are held by every GPU that reads them.
  const double replicated_kv_params =
      2.0 * static_cast<double>(c.num_layers * c.hidden_size * c.head_dim * (shard.kv_heads * tp - c.num_kv_heads));
  r.weights_per_gpu = static_cast<std::uint64_t>((static_cast<double>(r.weights_bytes) + replicated_kv_params * r.weight_bytes_per_param) / tp);
  model::ModelConfig held = c;  // the KV heads the group holds, each rank its share
  held.num_kv_heads = shard.kv_heads * tp;
  r.kv_bytes_per_token = backend::kv_block_bytes(held, in.kv_dtype, 1);
  // The batch limits `serve` would run with on this GPU, unless given.
  const DeviceInfo device{.name = in.gpu.name, .total_bytes = static_cast<std::uint64_t>(in.gpu.memory_gib * kGiB)};
  const BatchLimits served = default_batch_limits(&device, BatchUsage::kServer);
  r.max_num_seqs = in.max_num_seqs > 0 ? in.max_num_seqs : served.max_num_seqs;
  r.max_num_batched_tokens = in.max_num_batched_tokens > 0 ? in.max_num_batched_tokens : served.max_num_batched_tokens;
  // The CUDA backend's step buffers for max(max_num_batched_tokens, max_num_seqs) tokens, as serve
  // plans them (backend::step_buffer_bytes, for a 16-bit model, FP8 projections' inputs
  // included), logits for max_num_seqs rows, cuBLASLt workspace, plus 0.5 GiB of context.
  const double T = static_cast<double>(std::max(r.max_num_batched_tokens, r.max_num_seqs));
  const double per_token = static_cast<double>(
      backend::step_buffer_bytes(c.hidden_size, shard.heads, shard.kv_heads, c.head_dim, shard.intermediate, 2, 2,
                                 in.quantization == "fp8")
          .total());
  r.activation_reserve_per_gpu =
      static_cast<std::uint64_t>(T * per_token + static_cast<double>(r.max_num_seqs) * static_cast<double>(c.vocab_size) * 4 * 2 +
                                 32.0 * 1048576 + 0.5 * kGiB);
  const double usable = in.gpu_memory_utilization * in.gpu.memory_gib * kGiB;
  const double kv_per_gpu = usable - static_cast<double>(r.weights_per_gpu) - static_cast<double>(r.activation_reserve_per_gpu);
  r.kv_pool_bytes = kv_per_gpu > 0 ? static_cast<std::uint64_t>(kv_per_gpu * tp) : 0;
  r.kv_pool_tokens = static_cast<std::int64_t>(static_cast<double>(r.kv_pool_bytes) / static_cast<double>(r.kv_bytes_per_token));
  const double footprint = in.mean_input_len + in.mean_output_len;
  const auto by_memory = static_cast<std::int64_t>(static_cast<double>(r.kv_pool_tokens) / footprint);
  r.max_concurrent_seqs = std::min(by_memory, r.max_num_seqs);
  if (by_memory > r.max_num_seqs) {
    r.notes.push_back("The KV pool holds " + std::to_string(by_memory) + " requests at these lengths, but a replica runs " +
                      std::to_string(r.max_num_seqs) + " at once (--max-num-seqs); the rest queue.");
  }
  const std::int64_t max_len = in.max_model_len > 0 ? in.max_model_len : c.max_position_embeddings;
  r.fits = r.kv_pool_tokens >= std::min<std::int64_t>(max_len, static_cast<std::int64_t>(footprint) * 4) && r.max_concurrent_seqs >= 1;

  if (in.measured) {
    r.latency_s = in.measured->mean_e2el_s;
    r.latency_measured = true;
  } else {
    // Estimate: prefill at half the matrix rate, then decode steps at 70% of the memory
    // bandwidth over the weights (a lower bound on real latency; --measured replaces it).
    const double prefill = in.mean_input_len * 2 * params / tp / (in.gpu.bf16_tflops * 1e12 * 0.5);
    const double step = static_cast<double>(r.weights_per_gpu) / (in.gpu.bandwidth_gbs * 1e9 * 0.7);
    r.latency_s = prefill + in.mean_output_len * step;
  }
  if (in.concurrency) {
    r.required_concurrency = static_cast<double>(*in.concurrency);
  } else {
    r.required_concurrency = *in.qps * r.latency_s;  // Little's law
  }
  std::int64_t replicas = r.max_concurrent_seqs > 0
                              ? static_cast<std::int64_t>(std::ceil(r.required_concurrency * in.redundancy / static_cast<double>(r.max_concurrent_seqs)))
                              : 0;
  if (in.measured && in.qps && in.measured->output_throughput > 0) {
    // The measured replica's token rate must also cover the load.
    const double need = *in.qps * in.mean_output_len * in.redundancy / in.measured->output_throughput;
    const auto by_rate = static_cast<std::int64_t>(std::ceil(need));
    if (by_rate > replicas) {
      char n[320];
      std::snprintf(n, sizeof(n),
                    "Token rate, not memory, sets the count: the measured replica produced %.0f output tokens/s; %.1f req/s x %.0f tokens x %.1f "
                    "redundancy needs %.0f tokens/s.",
                    in.measured->output_throughput, *in.qps, in.mean_output_len, in.redundancy, *in.qps * in.mean_output_len * in.redundancy);
      r.notes.push_back(n);
    }
    replicas = std::max(replicas, by_rate);
  }
  r.replicas = r.fits ? std::max<std::int64_t>(replicas, 1) : 0;
  r.gpus_needed = r.replicas * tp;

  char v[512];
  if (!r.fits) {
    std::snprintf(v, sizeof(v), "Does not fit: %s of weights per GPU leave %s for the KV cache on a %s at %.0f%% use. Use more GPUs per replica (--tensor-parallel-size), a smaller dtype, or a larger GPU.",
                  gib(static_cast<double>(r.weights_per_gpu)).c_str(), gib(std::max(0.0, kv_per_gpu)).c_str(), in.gpu.name.c_str(),
                  in.gpu_memory_utilization * 100);
  } else {
    std::snprintf(v, sizeof(v), "%lld x %s (%lld replica%s of %d GPU%s) for %.0f concurrent requests with %.1fx redundancy; each replica holds about %lld requests at these lengths.",
                  static_cast<long long>(r.gpus_needed), in.gpu.name.c_str(), static_cast<long long>(r.replicas), r.replicas == 1 ? "" : "s", tp,
                  tp == 1 ? "" : "s", r.required_concurrency, in.redundancy, static_cast<long long>(r.max_concurrent_seqs));
  }
  r.verdict = v;
  if (in.target_latency_s && r.latency_s > *in.target_latency_s) {
    r.notes.push_back("The per-request latency (" + std::to_string(r.latency_s).substr(0, 6) + " s, " +
                      (r.latency_measured ? "measured" : "estimated") + ") is above the target of " +
                      std::to_string(*in.target_latency_s).substr(0, 6) +
                      " s: more GPUs raise capacity but not single-request speed; shorten outputs or use a faster GPU.");
  }
  if (!r.latency_measured) {
    r.notes.push_back("Latency is an estimate from bandwidth and matrix rate; run `lmserve bench serve --result-json` and pass it with --measured.");
  }
  return r;
}

std::string plan_json(const PlanInput& in, const PlanResult& r) {
  json j{{"model_parameters", in.model.num_parameters()},
         {"gpu", in.gpu.name},
         {"tensor_parallel_size", in.tensor_parallel_size},
         {"weights_bytes", r.weights_bytes},
         {"weights_per_gpu_bytes", r.weights_per_gpu},
         {"kv_bytes_per_token", r.kv_bytes_per_token},
         {"kv_cache_dtype", std::string(backend::kv_dtype_name(in.kv_dtype))},
         {"activation_reserve_per_gpu_bytes", r.activation_reserve_per_gpu},
         {"kv_pool_bytes", r.kv_pool_bytes},
         {"kv_pool_tokens", r.kv_pool_tokens},
         {"max_num_seqs", r.max_num_seqs},
         {"max_num_batched_tokens", r.max_num_batched_tokens},
         {"max_concurrent_seqs", r.max_concurrent_seqs},
         {"latency_s", r.latency_s},
         {"latency_measured", r.latency_measured},
         {"required_concurrency", r.required_concurrency},
         {"replicas", r.replicas},
         {"gpus_needed", r.gpus_needed},
         {"fits", r.fits},
         {"verdict", r.verdict},
         {"notes", r.notes}};
  return j.dump(2);
}

std::string plan_text(const PlanInput& in, const PlanResult& r) {
  const auto& c = in.model;
  char b[4096];
  std::snprintf(b, sizeof(b),
                "model: %s parameters, %s%s -> weights %s (%s per GPU at TP %d)\n"
                "KV per token: 2 x %lld layers x %lld KV heads x %lld head_dim x %d bytes (%s) = %llu bytes (%.0f KiB)\n"
                "per GPU (%s, %.0f GiB x %.2f): weights %s + activation reserve %s -> KV %s\n"
                "KV pool per replica: %s = %lld tokens; at %.0f in + %.0f out per request: %lld concurrent requests\n"
                "latency per request: %.3f s (%s); concurrency needed: %.1f%s\n"
                "GPUs needed: %lld (%lld replicas x TP %d, redundancy %.1f)\n\n%s\n",
                params_text(static_cast<double>(c.num_parameters())).c_str(), in.weight_dtype.c_str(),
                in.quantization == "none" ? "" : (" quantized " + in.quantization).c_str(), gib(static_cast<double>(r.weights_bytes)).c_str(),
                gib(static_cast<double>(r.weights_per_gpu)).c_str(), in.tensor_parallel_size, static_cast<long long>(c.num_layers),
                static_cast<long long>(c.num_kv_heads), static_cast<long long>(c.head_dim), backend::kv_dtype_bytes(in.kv_dtype),
                std::string(backend::kv_dtype_name(in.kv_dtype)).c_str(), static_cast<unsigned long long>(r.kv_bytes_per_token),
                static_cast<double>(r.kv_bytes_per_token) / 1024, in.gpu.name.c_str(), in.gpu.memory_gib, in.gpu_memory_utilization,
                gib(static_cast<double>(r.weights_per_gpu)).c_str(), gib(static_cast<double>(r.activation_reserve_per_gpu)).c_str(),
                gib(static_cast<double>(r.kv_pool_bytes) / in.tensor_parallel_size).c_str(), gib(static_cast<double>(r.kv_pool_bytes)).c_str(),
                static_cast<long long>(r.kv_pool_tokens), in.mean_input_len, in.mean_output_len, static_cast<long long>(r.max_concurrent_seqs),
                r.latency_s, r.latency_measured ? "measured" : "estimated", r.required_concurrency,
                in.concurrency ? " (given)" : " (Little's law: QPS x latency)", static_cast<long long>(r.gpus_needed),
                static_cast<long long>(r.replicas), in.tensor_parallel_size, in.redundancy, r.verdict.c_str());
  std::string out = b;
  for (const auto& n : r.notes) out += "note: " + n + "\n";
  return out;
}

std::string rule_of_thumb_table() {
  std::string out = "weights: rule of thumb (params x bytes x 1.2) vs exact params x bytes\n";
  out += "params   FP16 rule/exact      INT8 rule/exact      INT4 rule/exact\n";
  for (double p : {7.0, 13.0, 33.0, 70.0}) {
    char line[160];
    std::snprintf(line, sizeof(line), "%-6.0fB  %6.1f / %6.1f GB    %6.1f / %6.1f GB    %6.1f / %6.1f GB\n", p, p * 2 * 1.2, p * 2, p * 1 * 1.2, p * 1,
                  p * 0.5 * 1.2, p * 0.5);
    out += line;
  }
  out += "The rule's 20% covers activations, the CUDA context and fragmentation; lmserve's plan counts\n"
         "the activation reserve for the step size instead (about 1.2 GiB for an 8B model at 8,192 tokens)\n"
         "and gives everything else to the KV cache, so its weight figure is the exact one.\n";
  return out;
}

}  // namespace lmserve::plan
