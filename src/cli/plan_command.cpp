// lmserve plan: the capacity planner (src/plan/plan.h).
#include <cstdio>
#include <filesystem>

#include "backend/backend.h"
#include "bench/load.h"
#include "cli/commands.h"
#include "model/config.h"
#include "plan/plan.h"

namespace lmserve::cli {
namespace {

int fail(const Status& s) {
  std::fprintf(stderr, "lmserve plan: %s\n", s.message().c_str());
  return s.code() == StatusCode::kInvalidArgument || s.code() == StatusCode::kNotFound ? 2 : 1;
}

Result<model::ModelConfig> model_from(const std::string& spec) {
  namespace fs = std::filesystem;
  if (fs::is_directory(spec)) return model::load_config(spec);
  if (fs::is_regular_file(spec)) return model::load_config(fs::path(spec).parent_path());
  auto p = plan::model_preset(spec);
  if (p) return p;
  std::string names;
  for (const auto& n : plan::model_preset_names()) names += " " + n;
  return error(StatusCode::kInvalidArgument, "--model '" + spec + "' is neither a model folder, a config.json nor a preset (" + names.substr(1) + ")");
}

}  // namespace

Command add_plan_command(CLI::App& app) {
  struct Opts {
    std::string model, dtype = "auto", quantization = "none", kv = "auto", gpu = "H200", measured;
    double gpu_memory = 0, util = 0.9, qps = 0, target_latency = 0, redundancy = 1.5;
    int tp = 1;
    std::int64_t max_model_len = 0, max_num_batched_tokens = 0, max_num_seqs = 0, concurrency = 0;
    bench::DatasetOptions d;
    double sigma = 0.8;
    bool json = false, rule = false;
  };
  auto o = std::make_shared<Opts>();
  o->d.name = "mixed";
  o->d.num_prompts = 10000;
  app.add_option("--model", o->model, "model folder, config.json, or a preset (llama-3.1-8b, llama-3.1-70b, qwen2.5-7b/14b/32b/72b)");
  app.add_option("--dtype", o->dtype, "weight dtype: auto (the config's), bfloat16, float16, float32")->capture_default_str();
  app.add_option("--quantization", o->quantization, "none, int8, int4, fp8 (weight bytes)")->capture_default_str();
  app.add_option("--kv-cache-dtype", o->kv, "auto, bfloat16, float16, float32, fp8_e5m2, fp8_e4m3")->capture_default_str();
  app.add_option("--gpu", o->gpu, "H200, H100, A100-80G, A100-40G, L40S, A10, RTX4090")->capture_default_str();
  app.add_option("--gpu-memory", o->gpu_memory, "GiB per GPU (instead of the preset's)");
  app.add_option("--gpu-memory-utilization", o->util, "share of GPU memory lmserve may use")->capture_default_str();
  app.add_option("--tensor-parallel-size", o->tp, "GPUs per replica")->capture_default_str();
  app.add_option("--max-model-len", o->max_model_len, "context length (0: the model's)");
  app.add_option("--max-num-batched-tokens", o->max_num_batched_tokens,
                 "step size the activation reserve is sized for (0: serve's default on that GPU)")
      ->capture_default_str();
  app.add_option("--max-num-seqs", o->max_num_seqs, "sequences a replica runs at once (0: serve's default on that GPU)")->capture_default_str();
  app.add_option("--dataset-name", o->d.name, "length mix: mixed, random, jsonl or sharegpt")->capture_default_str();
  app.add_option("--dataset-path", o->d.path, "jsonl / sharegpt file");
  app.add_option("--random-input-len", o->d.input_len, "random: prompt tokens")->capture_default_str();
  app.add_option("--random-output-len", o->d.output_len, "random: output tokens")->capture_default_str();
  app.add_option("--mixed-input-median", o->d.input_median, "mixed: median prompt tokens")->capture_default_str();
  app.add_option("--mixed-output-median", o->d.output_median, "mixed: median output tokens")->capture_default_str();
  app.add_option("--mixed-sigma", o->sigma, "mixed: sigma of log length")->capture_default_str();
  app.add_option("--concurrency", o->concurrency, "target: concurrent requests");
  app.add_option("--qps", o->qps, "target: requests per second (with --target-latency)");
  app.add_option("--target-latency", o->target_latency, "seconds per request the target allows");
  app.add_option("--redundancy", o->redundancy, "head room factor")->capture_default_str();
  app.add_option("--measured", o->measured, "a bench serve --result-json file: measured latency and throughput");
  app.add_flag("--json", o->json, "print JSON");
  app.add_flag("--rule-of-thumb", o->rule, "also print the rule-of-thumb weight table and how it compares");
  return [o]() -> int {
    if (o->model.empty()) return fail(Status(StatusCode::kInvalidArgument, "--model is required"));
    auto cfg = model_from(o->model);
    if (!cfg) return fail(cfg.error());
    plan::PlanInput in;
    in.model = *cfg;
    in.weight_dtype = o->dtype == "auto" ? std::string(model::dtype_name(cfg->dtype)) : o->dtype;
    if (in.weight_dtype != "bfloat16" && in.weight_dtype != "float16" && in.weight_dtype != "float32") {
      return fail(Status(StatusCode::kInvalidArgument, "--dtype must be auto, bfloat16, float16 or float32"));
    }
    if (o->quantization != "none" && o->quantization != "int8" && o->quantization != "int4" && o->quantization != "fp8") {
      return fail(Status(StatusCode::kInvalidArgument, "--quantization must be none, int8, int4 or fp8"));
    }
    in.quantization = o->quantization;
    auto kv = backend::parse_kv_dtype(o->kv, model::DType::kBF16);
    if (!kv) return fail(kv.error());
    in.kv_dtype = *kv;
    if (o->gpu_memory > 0) {
      in.gpu = plan::GpuSpec{"GPU", o->gpu_memory, 2000, 300};
      if (auto g = plan::gpu_preset(o->gpu); g) {
        char name[64];
        std::snprintf(name, sizeof(name), "%s-class GPU with %.0f GiB", g->name.c_str(), o->gpu_memory);
        in.gpu.name = name;
        in.gpu.bandwidth_gbs = g->bandwidth_gbs;
        in.gpu.bf16_tflops = g->bf16_tflops;
      }
    } else {
      auto g = plan::gpu_preset(o->gpu);
      if (!g) return fail(g.error());
      in.gpu = *g;
    }
    in.gpu_memory_utilization = o->util;
    in.tensor_parallel_size = o->tp;
    in.max_model_len = o->max_model_len;
    in.max_num_batched_tokens = o->max_num_batched_tokens;
    in.max_num_seqs = o->max_num_seqs;
    o->d.input_sigma = o->d.output_sigma = o->sigma;
    auto specs = bench::make_dataset(o->d);
    if (!specs) return fail(specs.error());
    for (auto& s : *specs) {
      if (s.input_len == 0) s.input_len = std::max<std::int64_t>(1, static_cast<std::int64_t>(s.prompt.size() / 4));  // text: ~4 bytes a token
    }
    std::tie(in.mean_input_len, in.mean_output_len) = bench::mean_lengths(*specs);
    if (o->concurrency > 0) in.concurrency = o->concurrency;
    if (o->qps > 0) in.qps = o->qps;
    if (o->target_latency > 0) in.target_latency_s = o->target_latency;
    in.redundancy = o->redundancy;
    if (!o->measured.empty()) {
      auto m = plan::read_measured(o->measured);
      if (!m) return fail(m.error());
      in.measured = *m;
    }
    auto r = plan::make_plan(in);
    if (!r) return fail(r.error());
    if (o->json) {
      std::printf("%s\n", plan::plan_json(in, *r).c_str());
    } else {
      std::printf("%s", plan::plan_text(in, *r).c_str());
      if (o->rule) std::printf("\n%s", plan::rule_of_thumb_table().c_str());
    }
    return r->fits ? 0 : 1;
  };
}

}  // namespace lmserve::cli
