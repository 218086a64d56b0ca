// lmserve bench latency | throughput (in-process, CPU or CUDA); bench serve is issue #7.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>

#include "backend/device/gpu_power.h"
#include "bench/device_rates.h"
#include "bench/engine_bench.h"
#include "bench/load.h"
#include "cli/commands.h"
#include "cli/model_options.h"
#include "common/file.h"
#include "text/json_schema.h"

namespace lmserve::cli {
namespace {

int fail(const char* what, const Status& s) {
  std::fprintf(stderr, "lmserve bench %s: %s\n", what, s.message().c_str());
  return s.code() == StatusCode::kInvalidArgument ? 2 : 1;
}

void print_memory(const backend::Backend& b) {
  const auto m = b.memory();
  const auto& kv = b.kv_config();
  const double gib = 1024.0 * 1024 * 1024;
  std::printf("backend %s, weights %.2f GiB, activations %.2f GiB, graphs %.2f GiB, KV %.2f GiB = %lld tokens (%s, block %d)\n",
              std::string(b.name()).c_str(), m.weight_bytes / gib, m.activation_bytes / gib, m.graph_bytes / gib, m.kv_cache_bytes / gib,
              static_cast<long long>(kv.num_blocks * kv.block_size), std::string(backend::kv_dtype_name(kv.dtype)).c_str(), kv.block_size);
}

void print_throughput(const bench::ThroughputResult& r) {
  const double s = r.seconds;
  std::printf("requests %lld, prompt tokens %lld, output tokens %lld, %.2f s\n", static_cast<long long>(r.requests),
              static_cast<long long>(r.prompt_tokens), static_cast<long long>(r.output_tokens), s);
  std::printf("engine: %llu steps, forward %.2f s, host %.2f s (%.1f%% of step time), preemptions %lld\n",
              static_cast<unsigned long long>(r.stats.steps_total), r.stats.forward_seconds_total, r.stats.host_seconds_total,
              100.0 * r.stats.host_seconds_total / std::max(1e-9, r.stats.host_seconds_total + r.stats.forward_seconds_total),
              static_cast<long long>(r.stats.preemptions_total));
  // Tokens the model ran against the least the run needs: every prompt token not found in the
  // prefix cache and every output token but each request's last; the rest was computed again
  // after a preemption.
  const auto needed = static_cast<std::int64_t>(r.prompt_tokens + r.output_tokens - r.requests) - static_cast<std::int64_t>(r.stats.prefix_hits);
  const auto again = static_cast<std::int64_t>(r.stats.computed_tokens_total) - needed;
  std::printf("tokens computed: %llu (prefix-cache hits %llu; computed again after preemption %lld, %.1f%%)\n",
              static_cast<unsigned long long>(r.stats.computed_tokens_total), static_cast<unsigned long long>(r.stats.prefix_hits),
              static_cast<long long>(again), 100.0 * static_cast<double>(again) / static_cast<double>(std::max<std::int64_t>(1, needed)));
  if (r.stats.swap_outs_total > 0) {
    std::printf("swap space: %lld of the preempted requests waited in host memory (%.2f GiB out, %.2f GiB back; %.2f GiB taken)\n",
                static_cast<long long>(r.stats.swap_outs_total), static_cast<double>(r.stats.swap_bytes_out_total) / 1073741824.0,
                static_cast<double>(r.stats.swap_bytes_in_total) / 1073741824.0, static_cast<double>(r.stats.host_swap_bytes) / 1073741824.0);
  }
  // Steps by the sequences they ran: "1: 3012 x 5.02 ms" (count x mean forward time).
  std::printf("steps by sequences:");
  const auto& z = r.stats.step_sizes;
  for (std::size_t i = 0; i < z.kUpper.size(); ++i) {
    if (z.steps[i] == 0) continue;
    const std::int64_t lo = i == 0 ? 1 : z.kUpper[i - 1] + 1;
    const std::string range = i + 1 == z.kUpper.size() ? std::to_string(lo) + "+"
                              : lo == z.kUpper[i]      ? std::to_string(lo)
                                                       : std::to_string(lo) + "-" + std::to_string(z.kUpper[i]);
    std::printf(" %s: %llu x %.2f ms (%.1f s);", range.c_str(), static_cast<unsigned long long>(z.steps[i]),
                1e3 * z.forward_seconds[i] / static_cast<double>(z.steps[i]), z.forward_seconds[i]);
  }
  std::printf("\n");
  const auto& h = r.stats.host_phases;
  const double ms = 1e3 / static_cast<double>(std::max<std::uint64_t>(1, r.stats.steps_total));
  std::printf("per step: host %.3f ms (schedule %.3f, inputs %.3f, relock %.3f, sample %.3f, outputs %.3f); forward %.3f ms, of it staging %.3f ms; "
              "planned ahead %llu of %llu steps\n",
              r.stats.host_seconds_total * ms, h.schedule * ms, h.inputs * ms, h.relock * ms, h.sample * ms, h.outputs * ms,
              r.stats.forward_seconds_total * ms, r.stats.forward_staging_seconds_total * ms,
              static_cast<unsigned long long>(r.stats.steps_planned_ahead_total), static_cast<unsigned long long>(r.stats.steps_total));
  std::printf("throughput: %.2f requests/s, %.1f output tokens/s, %.1f total tokens/s\n", static_cast<double>(r.requests) / s,
              static_cast<double>(r.output_tokens) / s, static_cast<double>(r.output_tokens + r.prompt_tokens) / s);
}

// Model FLOPs of a run (bench::model_flops) per second, and their share of the matrix rate.
// Against both measured rates: the burst (top clock) and, where measured, the rate sustained at the
// board's power limit.
void print_flops(const bench::ThroughputResult& r, const model::ModelConfig& config, const bench::ThroughputOptions& o, double matmul_rate,
                 double sustained_rate, double sustain_seconds) {
  std::vector<std::int64_t> in = o.input_lens, out = o.output_lens;
  if (in.empty()) {
    in.assign(static_cast<std::size_t>(o.num_prompts), o.input_len);
    out.assign(static_cast<std::size_t>(o.num_prompts), o.output_len);
  }
  const bench::ModelFlops f = bench::model_flops(config, in, out);
  const double rate = f.total() / std::max(1e-9, r.seconds);
  std::printf("model FLOPs: %.4g TFLOP (matmul %.4g, attention %.4g) in %.2f s = %.4g TFLOP/s", f.total() / 1e12, f.matmul / 1e12,
              f.attention / 1e12, r.seconds, rate / 1e12);
  if (matmul_rate > 0) std::printf(" = %.1f%% of the measured bf16 matrix rate (%.0f TFLOP/s)", 100.0 * rate / matmul_rate, matmul_rate / 1e12);
  if (sustained_rate > 0) {
    std::printf("; %.1f%% of the rate it sustains (%.0f TFLOP/s, the last %.3g s of %.3g s of products)", 100.0 * rate / sustained_rate,
                sustained_rate / 1e12, sustain_seconds / 2, sustain_seconds);
  }
  std::printf("\n");
}

}  // namespace

Command add_bench_command(CLI::App& app) {
  struct Opts {
    ModelOptions model;
    std::int64_t batch_size = 8, input_len = 128, output_len = 128, num_prompts = 100;
    std::uint64_t seed = 0;
    std::int64_t max_num_seqs = 0, max_num_batched_tokens = 0;  // 0: the device's default (throughput)
    std::string dataset = "random";  // throughput: random (fixed lengths) or mixed (log-normal)
    bench::DatasetOptions mix;
    bool compare_uniform = false;
    double kv_growth_reserve = 0.0;
    double swap_space_gib = kDefaultSwapSpaceGib;
    bool async_scheduling = true;
    double sustain_seconds = 6.0;  // throughput on a GPU: the sustained matrix rate's measurement
    std::string json_schema;       // throughput: a file; every output held to it
  };
  auto lat = std::make_shared<Opts>();
  auto thr = std::make_shared<Opts>();
  app.require_subcommand(1);
  auto* latency = app.add_subcommand("latency", "prefill time and decode step time of one batch (with the memory-bandwidth bound on a GPU)");
  lat->model.add_to(*latency);
  lat->model.add_measurement_options(*latency);
  latency->add_option("--batch-size", lat->batch_size, "sequences decoded together")->capture_default_str();
  latency->add_option("--input-len", lat->input_len, "prompt tokens per sequence")->capture_default_str();
  latency->add_option("--output-len", lat->output_len, "tokens generated per sequence")->capture_default_str();
  latency->add_option("--seed", lat->seed, "random prompt tokens")->capture_default_str();
  add_async_scheduling_option(*latency, &lat->async_scheduling);
  auto* throughput = app.add_subcommand("throughput", "requests/s and tokens/s of many requests through the engine");
  thr->model.add_to(*throughput);
  thr->model.add_measurement_options(*throughput);
  throughput->add_option("--num-prompts", thr->num_prompts, "requests")->capture_default_str();
  throughput->add_option("--input-len", thr->input_len, "prompt tokens per request")->capture_default_str();
  throughput->add_option("--output-len", thr->output_len, "tokens generated per request")->capture_default_str();
  throughput->add_option("--max-num-seqs", thr->max_num_seqs,
                         "sequences in a batch at most (0: vLLM's default, 1024 on a GPU of 70 GiB or more other than an A100, else 256)")
      ->capture_default_str();
  throughput->add_option("--max-num-batched-tokens", thr->max_num_batched_tokens,
                         "tokens per step at most (0: vLLM's offline default, 16384 on a GPU of 70 GiB or more other than an A100, else 8192)")
      ->capture_default_str();
  add_kv_growth_reserve_option(*throughput, &thr->kv_growth_reserve);
  add_swap_space_option(*throughput, &thr->swap_space_gib);
  add_async_scheduling_option(*throughput, &thr->async_scheduling);
  throughput->add_option("--seed", thr->seed, "random prompt tokens (and mixed lengths)")->capture_default_str();
  throughput->add_option("--dataset-name", thr->dataset, "random (--input-len/--output-len) or mixed (log-normal lengths)")
      ->check(CLI::IsMember({"random", "mixed"}))
      ->capture_default_str();
  add_mixed_length_options(*throughput, thr->mix);
  throughput->add_option("--json-schema", thr->json_schema,
                         "hold every request's output to the JSON Schema in this file (constrained decoding, as response_format json_schema)")
      ->check(CLI::ExistingFile);
  throughput->add_flag("--compare-uniform", thr->compare_uniform, "mixed: also run uniform lengths with the same means and compare");
  throughput->add_option("--sustained-rate-seconds", thr->sustain_seconds,
                         "GPU: after the run, time bf16 products this long for the matrix rate the power limit sustains (0: skip)")
      ->check(CLI::Range(0.0, 600.0))
      ->capture_default_str();
  auto* serve = app.add_subcommand("serve", "load test an OpenAI-compatible endpoint (streaming; datasets, sweeps, goodput)");
  Command serve_run = add_bench_serve(*serve);

  return [=]() -> int {
    std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines reach a log file even if the run is cut short
    if (serve->parsed()) return serve_run();
    if (latency->parsed()) {
      auto& o = *lat;
      o.model.max_num_seqs = o.batch_size;
      o.model.max_num_batched_tokens = std::max<std::int64_t>({8192, o.input_len, o.batch_size});
      o.model.max_model_len = o.input_len + o.output_len;
      const std::int64_t blocks_needed = o.batch_size * ((o.input_len + o.output_len + o.model.block_size - 1) / o.model.block_size);
      auto m = o.model.load(blocks_needed * o.model.block_size);
      if (!m) return fail("latency", m.error());
      print_memory(*m->backend);
      bench::LatencyOptions lo{o.batch_size, o.input_len, o.output_len, o.model.max_num_batched_tokens, o.seed, 0, o.async_scheduling};
      if (m->backend->name() == "cuda") lo.copy_bandwidth = bench::measure_copy_bandwidth(0);
      std::optional<GpuPowerRecorder> recorder;
      if (m->backend->name() == "cuda") recorder.emplace(0, std::chrono::milliseconds(50));
      auto r = bench::run_latency(*m->backend, lo);
      if (!r) return fail("latency", r.error());
      if (recorder) recorder->stop();
      std::printf("batch %lld, input %lld, output %lld\n", static_cast<long long>(o.batch_size), static_cast<long long>(o.input_len),
                  static_cast<long long>(o.output_len));
      std::printf("prefill %.2f ms (%.0f tokens/s)\n", r->prefill_seconds * 1e3,
                  static_cast<double>(o.batch_size * o.input_len) / r->prefill_seconds);
      std::printf("decode step: mean %.3f ms, p50 %.3f ms, p99 %.3f ms, %.0f output tokens/s%s\n", r->mean_step * 1e3, r->p50_step * 1e3,
                  r->p99_step * 1e3, static_cast<double>(o.batch_size) / r->mean_step,
                  r->overlapped ? " (each step staged during the one before)" : "");
      if (r->bound_seconds > 0) {
        std::printf("bandwidth bound: %.3f ms per step (weights %.2f GB + KV %.3f GB at a measured %.0f GB/s copy); mean step / bound = %.2f\n",
                    r->bound_seconds * 1e3, r->weight_bytes / 1e9, r->kv_bytes_per_step / 1e9, lo.copy_bandwidth / 1e9,
                    r->mean_step / r->bound_seconds);
      }
      if (recorder) std::printf("gpu 0 during the run: %s\n", recorder->summary().describe().c_str());
      return 0;
    }
    auto& o = *thr;
    // Per-request lengths of a mixed run, and the uniform run with the same means.
    bench::ThroughputOptions to{o.num_prompts, o.input_len, o.output_len, {}, {}, o.seed, nullptr};
    if (!o.json_schema.empty()) {
      auto text = read_file(o.json_schema);
      if (!text) return fail("throughput", text.error());
      auto schema = nlohmann::ordered_json::parse(*text, nullptr, false);
      if (schema.is_discarded()) return fail("throughput", Status(StatusCode::kInvalidArgument, o.json_schema + ": not JSON"));
      auto g = text::compile_json_schema(schema);
      if (!g) return fail("throughput", g.error());
      to.grammar = *g;
      std::printf("constrained decoding: every output held to %s\n", o.json_schema.c_str());
    }
    std::int64_t longest = o.input_len + o.output_len;
    std::optional<bench::ThroughputOptions> uniform;
    if (o.dataset == "mixed") {
      o.mix.name = "mixed";
      o.mix.num_prompts = o.num_prompts;
      o.mix.seed = o.seed;
      auto specs = bench::make_dataset(o.mix);
      if (!specs) return fail("throughput", specs.error());
      longest = 0;
      for (const auto& r : *specs) {
        to.input_lens.push_back(r.input_len);
        to.output_lens.push_back(r.output_len);
        longest = std::max(longest, r.input_len + r.output_len);
      }
      if (o.compare_uniform) {
        const auto [mi, mo] = bench::mean_lengths(*specs);
        uniform = bench::ThroughputOptions{o.num_prompts, std::max<std::int64_t>(1, std::llround(mi)), std::max<std::int64_t>(1, std::llround(mo)),
                                           {}, {}, o.seed + 1};
        longest = std::max(longest, uniform->input_len + uniform->output_len);
      }
    } else if (o.compare_uniform) {
      return fail("throughput", Status(StatusCode::kInvalidArgument, "--compare-uniform compares a mixed run (--dataset-name mixed)"));
    }
    const BatchLimits limits = o.model.batch_limits(o.max_num_seqs, o.max_num_batched_tokens, BatchUsage::kOffline);
    if (limits.max_num_seqs < 1 || limits.max_num_batched_tokens < 1) {
      return fail("throughput", Status(StatusCode::kInvalidArgument, "--max-num-seqs and --max-num-batched-tokens must be positive (or 0: the default)"));
    }
    o.model.max_num_seqs = limits.max_num_seqs;
    o.model.max_num_batched_tokens = std::max(limits.max_num_batched_tokens, limits.max_num_seqs);
    o.model.max_model_len = longest;
    auto m = o.model.load(std::max<std::int64_t>(limits.max_num_seqs, 16) * longest);
    if (!m) return fail("throughput", m.error());
    print_memory(*m->backend);
    std::printf("batch limits: %lld sequences, %lld tokens per step%s\n", static_cast<long long>(limits.max_num_seqs),
                static_cast<long long>(limits.max_num_batched_tokens),
                o.max_num_seqs == 0 && o.max_num_batched_tokens == 0 ? " (defaults for this device)" : "");
    engine::EngineOptions eo;
    eo.scheduler.max_num_seqs = limits.max_num_seqs;
    eo.scheduler.max_num_batched_tokens = limits.max_num_batched_tokens;
    eo.scheduler.max_model_len = longest;
    eo.scheduler.lanes = {{"default", 0.0, 0.0, std::max<std::int64_t>(o.num_prompts, 1)}};
    eo.scheduler.kv_watermark = 0.99;
    eo.scheduler.kv_growth_reserve = o.kv_growth_reserve;
    eo.swap_space_bytes = swap_space_bytes(o.swap_space_gib);
    eo.async_scheduling = o.async_scheduling;
    const std::int64_t vocab = m->weights->config().vocab_size;
    const model::ModelConfig config = m->weights->config();
    const bool on_gpu = m->backend->name() == "cuda";
    const double matmul_rate = on_gpu ? bench::measure_matmul_rate(0) : 0;
    auto e = engine::Engine::create(std::move(m->backend), m->tokenizer, eo);
    if (!e) return fail("throughput", e.error());
    // A run with the GPU's clocks and power sampled beside it; the summary is printed with it.
    auto run = [&](const bench::ThroughputOptions& opts, std::string* power) {
      std::optional<GpuPowerRecorder> recorder;
      if (on_gpu) recorder.emplace(0);
      auto result = bench::run_throughput(**e, vocab, opts);
      if (recorder) {
        recorder->stop();
        *power = recorder->summary().describe();
      }
      return result;
    };
    auto print_power = [](const std::string& power) {
      if (!power.empty()) std::printf("gpu 0 during the run: %s\n", power.c_str());
    };
    std::string power, uniform_power;
    auto r = run(to, &power);
    if (!r) return fail("throughput", r.error());
    const double sustained_rate = on_gpu && o.sustain_seconds > 0 ? bench::measure_matmul_rate(0, o.sustain_seconds) : 0;
    if (o.dataset == "mixed") {
      std::printf("==== mixed: log-normal lengths, medians %.0f in / %.0f out, sigma %.2f, clipped at %lld / %lld\n", o.mix.input_median,
                  o.mix.output_median, o.mix.input_sigma, static_cast<long long>(o.mix.max_input_len), static_cast<long long>(o.mix.max_output_len));
    }
    print_throughput(*r);
    print_power(power);
    print_flops(*r, config, to, matmul_rate, sustained_rate, o.sustain_seconds);
    if (uniform) {
      auto u = run(*uniform, &uniform_power);
      if (!u) return fail("throughput", u.error());
      std::printf("==== uniform: %lld in / %lld out (the mixed run's mean lengths)\n", static_cast<long long>(uniform->input_len),
                  static_cast<long long>(uniform->output_len));
      print_throughput(*u);
      print_power(uniform_power);
      print_flops(*u, config, *uniform, matmul_rate, sustained_rate, o.sustain_seconds);
      const double mixed_tps = static_cast<double>(r->output_tokens) / r->seconds, uni_tps = static_cast<double>(u->output_tokens) / u->seconds;
      std::printf("mixed lengths reach %.1f%% of the uniform run's output tokens/s (%.1f vs %.1f): size on the mixed number\n",
                  100.0 * mixed_tps / std::max(1e-9, uni_tps), mixed_tps, uni_tps);
    }
    return 0;
  };
}

}  // namespace lmserve::cli
