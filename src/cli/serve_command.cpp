// lmserve serve: flags as `vllm serve` names them where the meaning is the same.
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <thread>

#include "backend/cpu/cpu_backend.h"
#include "backend/device/device_memory.h"
#include "backend/fault/fault_injection.h"
#include "cli/commands.h"
#include "cli/model_options.h"
#include "cli/yaml_config.h"
#include "common/startup.h"
#include "engine/engine.h"
#include "model/manifest.h"
#include "server/server.h"
#include "text/chat_template.h"

namespace lmserve::cli {
namespace {

}  // namespace

Command add_serve_command(CLI::App& app) {
  struct Opts {
    ModelOptions model;
    std::string positional_model;
    server::ServerOptions server;
    std::int64_t max_model_len = 0;
    std::int64_t max_num_seqs = 0;            // 0: the device's default (default_batch_limits)
    std::int64_t max_num_batched_tokens = 0;
    std::int64_t max_num_queued_reqs = 256;
    double gpu_memory_utilization = 0.9;
    double kv_watermark = 0.85;
    double kv_growth_reserve = 0.0;
    double swap_space_gib = kDefaultSwapSpaceGib;
    bool async_scheduling = true;
    double device_memory_limit = 0.95;
    bool enable_prefix_caching = true;
    bool no_prefix_caching = false;
    bool enforce_eager = false;
    bool verify_model = false;
    std::uint64_t seed = 0;
    std::string chat_template;
    std::string tool_call_parser;  // --tool-call-parser, by name
    std::string scheduling_policy = "fcfs";
    std::string lanes = "high:0.2,low";
    int shutdown_timeout = 30;
    std::string config;
    int request_timeout_s = 30, idle_timeout_s = 60;
    double step_timeout_s = 600, failure_exit_s = 5;
    std::string fault_injection;
  };
  auto o = std::make_shared<Opts>();
  o->model.model = "models/demo";
  app.add_option("model_tag", o->positional_model, "model folder (same as --model)");
  app.add_option("--model", o->model.model, "model folder")->capture_default_str();
  app.add_option("--tokenizer", o->model.tokenizer, "tokenizer folder, with the chat template (default: the model folder)");
  app.add_option("--dtype", o->model.dtype, "weight dtype: auto, float32, bfloat16, float16")->capture_default_str();
  app.add_option("--load-format", o->model.load_format, "auto, safetensors or dummy")->capture_default_str();
  app.add_option("--kv-cache-dtype", o->model.kv_cache_dtype, "auto, float32, bfloat16, float16, fp8_e5m2, fp8_e4m3")->capture_default_str();
  app.add_option("--device", o->model.device, "auto, cpu or cuda")->capture_default_str();
  app.add_option("--block-size", o->model.block_size, "KV block size in tokens")->capture_default_str();
  app.add_option("--num-kv-blocks", o->model.num_kv_blocks, "KV blocks (0: from max-num-seqs x max-model-len, at most 65536)");
  app.add_option("--threads", o->model.threads, "CPU backend threads (0: all cores)")->capture_default_str();
  add_tensor_parallel_option(app, &o->model.tensor_parallel_size, &o->model.tp_all_reduce);
  app.add_option("--step-timeout", o->step_timeout_s,
                 "seconds a step may run before the watchdog fails the engine (every request in flight ends with an error; 0: no watchdog)")
      ->capture_default_str();
  app.add_option("--failure-exit-s", o->failure_exit_s,
                 "seconds after the engine fails (a failed or stalled step) before the process exits with status 3, for its supervisor to restart it")
      ->capture_default_str();
  app.add_option("--fault-injection", o->fault_injection,
                 "debugging only: fail=STEP, oom=STEP, nan=STEP:ROW, stall=STEP:MILLISECONDS (comma-separated; steps from 1) injected into the backend");
  app.add_option("--served-model-name", o->server.served_model_name, "model name in the API")->capture_default_str();
  app.add_option("--host", o->server.host, "address to listen on")->capture_default_str();
  app.add_option("--port", o->server.port, "port (0: any free port)")->capture_default_str();
  app.add_option("--api-key", o->server.api_key, "require 'Authorization: Bearer KEY' (all routes but /health and /metrics)");
  app.add_flag("--metrics-require-key", o->server.metrics_require_key, "also require the key on /metrics");
  app.add_option("--max-model-len", o->max_model_len, "context length (0: the model's)")->capture_default_str();
  app.add_option("--max-num-seqs", o->max_num_seqs,
                 "sequences in a batch at most (0: vLLM's default, 1024 on a GPU of 70 GiB or more other than an A100, 256 on other GPUs, 64 "
                 "on the CPU)")
      ->capture_default_str();
  app.add_option("--max-num-batched-tokens", o->max_num_batched_tokens,
                 "tokens per engine step at most (0: 8192 on a GPU of 70 GiB or more other than an A100, else 2048)")
      ->capture_default_str();
  app.add_option("--max-num-queued-reqs", o->max_num_queued_reqs, "waiting requests per lane before 429")->capture_default_str();
  app.add_option("--gpu-memory-utilization", o->gpu_memory_utilization, "share of GPU memory to use (CUDA backend)")->capture_default_str();
  app.add_option("--kv-watermark", o->kv_watermark, "admit new requests only while KV usage stays below this")->capture_default_str();
  add_kv_growth_reserve_option(app, &o->kv_growth_reserve);
  add_swap_space_option(app, &o->swap_space_gib);
  add_async_scheduling_option(app, &o->async_scheduling);
  app.add_option("--device-memory-limit", o->device_memory_limit, "admit nothing while device memory use is above this share")
      ->capture_default_str();
  app.add_option("--lanes", o->lanes, "priority lanes, first most urgent: NAME[:RESERVED_SHARE][:ttft=DURATION][:tpot=DURATION],... (durations as 300ms or 0.3s)")->capture_default_str();
  app.add_option("--scheduling-policy", o->scheduling_policy, "fcfs or priority")->capture_default_str();
  app.add_flag("--enable-prefix-caching,!--no-enable-prefix-caching", o->enable_prefix_caching, "automatic prefix caching")
      ->capture_default_str();
  app.add_flag("--enforce-eager", o->enforce_eager, "no CUDA graphs (CUDA backend)");
  app.add_flag("--verify-model", o->verify_model,
               "check the model folder against its lmserve-manifest.json (lmserve model manifest) before loading; refuse to start on any "
               "changed, missing or unlisted file");
  add_tuning_cache_option(app, &o->model.tuning_cache);
  app.add_flag("--host-sampling", o->model.host_sampling, "sample every token on the host from the logits (CUDA backend; default: on the GPU)");
  app.add_option("--seed", o->seed, "seed for requests without one")->capture_default_str();
  app.add_option("--chat-template", o->chat_template, "a .jinja file instead of the model's chat template");
  app.add_option("--shutdown-timeout", o->shutdown_timeout, "seconds in-flight requests get after SIGTERM")->capture_default_str();
  app.add_flag("--log-prompts", o->server.log_prompts, "include prompt text in request logs");
  app.add_option("--tool-call-parser", o->tool_call_parser, "read tool calls from chat outputs in this format: hermes, llama3_json or mistral");
  app.add_flag("--enable-auto-tool-choice", o->server.enable_auto_tool_choice,
               "answer requests with tools and tool_choice auto, their calls read by --tool-call-parser");
  app.add_option("--max-connections", o->server.max_connections, "open connections at most (more get 503)")->capture_default_str();
  app.add_option("--max-header-bytes", o->server.max_header_bytes, "request header size limit (431 beyond)")->capture_default_str();
  app.add_option("--max-body-bytes", o->server.max_body_bytes, "request body size limit (413 beyond)")->capture_default_str();
  app.add_option("--request-timeout", o->request_timeout_s, "seconds to receive a whole request (408 beyond)")->capture_default_str();
  app.add_option("--idle-timeout", o->idle_timeout_s, "seconds a keep-alive connection may sit idle")->capture_default_str();
  app.add_option("--io-threads", o->server.io_threads, "HTTP I/O threads")->capture_default_str();
  app.add_option("--ssl-certfile", o->server.ssl_certfile, "PEM certificate chain: serve HTTPS");
  app.add_option("--ssl-keyfile", o->server.ssl_keyfile, "PEM private key for --ssl-certfile");
  add_config_option(app, &o->config);
  return [o, &app]() -> int {
    auto fail = [](const Status& s) {
      std::fprintf(stderr, "lmserve serve: %s\n", s.message().c_str());
      return s.code() == StatusCode::kInvalidArgument ? 2 : 1;
    };
    if (!o->config.empty()) {
      if (Status s = apply_yaml_config(app, o->config); !s.is_ok()) return fail(s);
    }
    if (!o->positional_model.empty()) o->model.model = o->positional_model;
    if (!o->tool_call_parser.empty()) {
      o->server.tool_call_parser = server::tool_parser_named(o->tool_call_parser);
      if (!o->server.tool_call_parser) {
        return fail(Status(StatusCode::kInvalidArgument, "--tool-call-parser must be hermes, llama3_json or mistral, not " + o->tool_call_parser));
      }
    }
    if (o->server.enable_auto_tool_choice && !o->server.tool_call_parser) {
      return fail(Status(StatusCode::kInvalidArgument, "--enable-auto-tool-choice needs --tool-call-parser"));
    }
    if (!(o->step_timeout_s >= 0) || !(o->failure_exit_s >= 0)) {
      return fail(Status(StatusCode::kInvalidArgument, "--step-timeout and --failure-exit-s must be 0 or more"));
    }
    auto faults = backend::parse_fault_plan(o->fault_injection);
    if (!faults) return fail(faults.error());
    engine::EngineOptions eo;
    eo.seed = o->seed;
    eo.step_timeout_s = o->step_timeout_s;
    eo.enable_prefix_caching = o->enable_prefix_caching;
    eo.swap_space_bytes = swap_space_bytes(o->swap_space_gib);
    eo.async_scheduling = o->async_scheduling;
    auto& so = eo.scheduler;
    const BatchLimits limits = o->model.batch_limits(o->max_num_seqs, o->max_num_batched_tokens, BatchUsage::kServer);
    so.max_num_seqs = limits.max_num_seqs;
    so.max_num_batched_tokens = limits.max_num_batched_tokens;
    so.kv_watermark = o->kv_watermark;
    so.kv_growth_reserve = o->kv_growth_reserve;
    if (o->scheduling_policy == "priority") {
      so.policy = engine::SchedulerOptions::Policy::kPriority;
    } else if (o->scheduling_policy != "fcfs") {
      return fail(Status(StatusCode::kInvalidArgument, "--scheduling-policy must be fcfs or priority"));
    }
    auto lanes = engine::parse_lanes(o->lanes, o->max_num_queued_reqs);
    if (!lanes) return fail(lanes.error());
    so.lanes = *lanes;

    o->server.shutdown_timeout = std::chrono::seconds(o->shutdown_timeout);
    o->server.request_timeout = std::chrono::seconds(o->request_timeout_s);
    o->server.idle_timeout = std::chrono::seconds(o->idle_timeout_s);
    o->server.device_memory_limit = o->device_memory_limit;
    if (o->server.io_threads < 1 || o->request_timeout_s < 1 || o->idle_timeout_s < 1 || o->server.max_connections < 1) {
      return fail(Status(StatusCode::kInvalidArgument, "--io-threads, --max-connections and the timeouts must be positive"));
    }
    if (o->verify_model) {
      StartupPhase phase("verify_model");
      const auto t0 = std::chrono::steady_clock::now();
      auto v = model::verify_model(o->model.model);
      if (!v) return fail(v.error());
      if (!v->ok()) {
        for (const auto& p : v->problems) spdlog::error("model verification: {}", model::describe(p));
        return fail(Status(StatusCode::kFailedPrecondition, fmt::format("{} does not match its manifest ({} problem(s), the first: {}); not starting",
                                                                        o->model.model, v->problems.size(), model::describe(v->problems.front()))));
      }
      spdlog::info("model verified: {} {} ({} files, {:.2f} GiB, SHA-256) in {:.1f} s", v->manifest.name, v->manifest.version, v->files,
                   v->bytes / 1073741824.0, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::optional<StartupPhase> config_phase(std::in_place, "config");
    auto config = model::load_config(o->model.model);
    if (!config) return fail(config.error());
    so.max_model_len = o->max_model_len > 0 ? o->max_model_len : config->max_position_embeddings;
    if (Status s = so.validate(); !s.is_ok()) return fail(s);
    config_phase.reset();

    // Listening from here on: a port in use fails now, and while the model loads every route
    // answers 503 naming the phase under way (server.h).
    server::Server srv(o->server);
    {
      StartupPhase phase("listen");
      if (Status s = srv.start(); !s.is_ok()) return fail(s);
    }
    const std::string url = fmt::format("{}://{}:{}", o->server.ssl_certfile.empty() ? "http" : "https", o->server.host, srv.port());
    // Not "on URL": that line (below) tells scripts and tests that the server is ready.
    spdlog::info("lmserve serve: listening at {}:{} while {} loads (every route answers 503 until it is ready)", o->server.host, srv.port(),
                 o->model.model);
    std::thread io([&srv] { srv.run(true); });
    auto stop = [&](int code) {
      srv.shutdown();
      io.join();
      return code;
    };
    // The model, its tokenizer and chat template, the backend and the engine; every failure
    // is the start's.
    struct Ready {
      std::unique_ptr<engine::Engine> engine;
      std::shared_ptr<const text::Tokenizer> tokenizer;
      std::optional<text::ChatTemplate> chat_template;
      std::function<std::vector<GpuMemorySample>()> gpu_memory;
    };
    auto load = [&]() -> Result<Ready> {
      Ready r;
      const std::int64_t kv_tokens = std::min<std::int64_t>(so.max_model_len * std::min<std::int64_t>(so.max_num_seqs, 16), 65536 * 16);
      o->model.gpu_memory_utilization = o->gpu_memory_utilization;
      o->model.enforce_eager = o->enforce_eager;
      o->model.max_num_seqs = so.max_num_seqs;
      o->model.max_num_batched_tokens = std::max(so.max_num_batched_tokens, so.max_num_seqs);
      o->model.max_model_len = so.max_model_len;
      auto m = o->model.load(kv_tokens);
      if (!m) return error(m.error());
      r.tokenizer = m->tokenizer;
      std::optional<std::filesystem::path> tfile;
      if (!o->chat_template.empty()) tfile = o->chat_template;
      // The chat template comes with the tokenizer (tokenizer_config.json), as in vLLM.
      if (auto t = text::ChatTemplate::load(o->model.tokenizer.empty() ? o->model.model : o->model.tokenizer, tfile)) {
        r.chat_template = std::move(*t);
      } else if (tfile || t.error().code() != StatusCode::kNotFound) {
        return error(t.error());
      }
      const auto mem = m->backend->memory();
      const auto& kvc = m->backend->kv_config();
      // As vLLM does at start-up: every lane must be able to hold one request of max_model_len,
      // else such a request (a request without max_tokens is one) would be refused.
      for (std::size_t lane = 0; lane < so.lanes.size(); ++lane) {
        const std::int64_t cap = engine::lane_kv_capacity_tokens(so, kvc.num_blocks, kvc.block_size, lane);
        if (so.max_model_len - 1 > cap) {
          return error(StatusCode::kInvalidArgument,
                       fmt::format("max_model_len {} is more than the KV cache holds for one request of lane '{}' ({} tokens); lower "
                                   "--max-model-len, or give the KV cache more memory",
                                   so.max_model_len, so.lanes[lane].name, cap));
        }
      }
      const std::string kv_text =
          fmt::format("KV cache {:.2f} GiB ({} blocks of {} tokens = {} tokens, {}), swap space {:.4g} GiB in host memory (taken as preemption needs it)",
                      mem.kv_cache_bytes / 1073741824.0, kvc.num_blocks, kvc.block_size, kvc.num_blocks * kvc.block_size,
                      backend::kv_dtype_name(kvc.dtype), o->swap_space_gib);
      const int tp = o->model.tensor_parallel_size;
      const std::string where = tp > 1 ? fmt::format("{}, {} tensor-parallel ranks", m->backend->name(), tp) : std::string(m->backend->name());
      if (mem.total_bytes > 0) {
        spdlog::info("memory plan ({}): total {:.2f} GiB, weights {:.2f} GiB, activations {:.2f} GiB, CUDA graphs {:.2f} GiB, {}, max_model_len {}",
                     where, mem.total_bytes / 1073741824.0, mem.weight_bytes / 1073741824.0, mem.activation_bytes / 1073741824.0,
                     mem.graph_bytes / 1073741824.0, kv_text, so.max_model_len);
      } else {
        spdlog::info("memory plan ({}): weights {:.2f} GiB, {}, max_model_len {}", where, mem.weight_bytes / 1073741824.0, kv_text,
                     so.max_model_len);
      }
      // The device-memory hard limit: sampled by a thread, read by the engine once per step.
      if (m->backend->name() == "cuda") {
        auto monitor = std::make_shared<DeviceMemoryMonitor>(std::vector<int>{0});
        const double limit = o->device_memory_limit;
        eo.device_memory_ok = [monitor, limit] { return monitor->max_used_share() <= limit; };
        r.gpu_memory = [monitor] { return monitor->latest(); };
        for (const auto& g : monitor->latest()) {
          spdlog::info("device memory: GPU {} {:.2f} of {:.2f} GiB in use ({}), admission stops above {:.0f}%", g.device,
                       g.used_bytes / 1073741824.0, g.total_bytes / 1073741824.0, g.source, limit * 100);
        }
      }
      if (faults->any()) spdlog::warn("lmserve serve: fault injection on ({}): for tests only", o->fault_injection);
      StartupPhase phase("engine_start");
      auto eng = engine::Engine::create(backend::inject_faults(std::move(m->backend), *faults), m->tokenizer, eo);
      if (!eng) return error(eng.error());
      r.engine = std::move(*eng);
      return r;
    };
    auto loaded = load();
    if (!loaded) return stop(fail(loaded.error()));
    if (srv.draining()) {  // a signal came while the model loaded
      spdlog::info("lmserve serve: stopped before it was ready");
      return stop(0);
    }
    const engine::Engine* engine = loaded->engine.get();  // owned by the server below
    srv.attach(std::move(loaded->engine), std::move(loaded->tokenizer), std::move(loaded->chat_template), std::move(loaded->gpu_memory));
    startup_complete();
    spdlog::info("lmserve serve: {} on {}", o->server.served_model_name, url);
    std::fflush(stdout);
    // A failed engine does not come back: once its requests have had their error events, the
    // process exits non-zero so that systemd or Kubernetes starts a new one (/health answers
    // 503 meanwhile). A stalled step's thread cannot be joined, hence _Exit.
    std::atomic<bool> serving{true};
    std::thread exit_on_failure([&] {
      while (serving.load()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        if (engine->alive()) continue;
        spdlog::error("lmserve serve: the engine failed; exiting with status 3 in {:g} s", o->failure_exit_s);
        const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(o->failure_exit_s);
        while (serving.load() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(50));
        spdlog::shutdown();
        std::fflush(nullptr);
        std::_Exit(3);
      }
    });
    io.join();  // until the shutdown completes
    serving = false;
    exit_on_failure.join();
    spdlog::info("lmserve serve: stopped");
    return 0;
  };
}

}  // namespace lmserve::cli
