// Google Benchmark: generation throughput of the engine on the CPU backend with
// models/demo — 1 and 16 concurrent requests, 64-token prompts, 128 generated tokens each
// (ignore_eos, greedy). Counter output_tok/s = generated tokens per wall-clock second.
//   build/release/tests/bench/engine_benchmark
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "backend/cpu/cpu_backend.h"
#include "engine/engine.h"
#include "test_paths.h"

namespace {

using namespace lmserve;

void BM_Generate(benchmark::State& state) {
  const auto concurrent = static_cast<int>(state.range(0));
  auto dir = lmserve::testing::source_dir() / "models/demo";
  auto weights = model::ModelWeights::load(dir, {});
  auto tok = text::Tokenizer::load(dir);
  if (!weights || !tok) {
    state.SkipWithError("models/demo did not load");
    return;
  }
  auto b = backend::make_cpu_backend(*weights, {.kv = {backend::KvDtype::kBFloat16, 16, 1024}, .threads = 0});
  engine::EngineOptions o;
  o.scheduler.max_model_len = 512;
  o.scheduler.lanes = {{"default", 0, 0, 1024}};
  auto eng = engine::Engine::create(std::move(*b), *tok, o);
  std::int64_t generated = 0;
  for (auto _ : state) {
    std::vector<std::shared_ptr<engine::RequestStream>> streams;
    for (int i = 0; i < concurrent; ++i) {
      std::vector<std::int32_t> prompt(64);
      for (int k = 0; k < 64; ++k) prompt[static_cast<std::size_t>(k)] = (i * 131 + k * 7) % 5000 + 3;  // distinct prompts
      engine::SamplingParams p;
      p.temperature = 0;
      p.max_tokens = 128;
      p.ignore_eos = true;
      streams.push_back((*eng)->submit({.prompt = prompt, .params = p})->stream);
    }
    engine::StreamEvent e;
    for (auto& s : streams) {
      while (s->next(&e)) generated += static_cast<std::int64_t>(e.token_ids.size());
    }
  }
  state.counters["output_tok/s"] = benchmark::Counter(static_cast<double>(generated), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Generate)->Arg(1)->Arg(16)->Unit(benchmark::kSecond)->UseRealTime()->Iterations(2);

// The engine's host work per step at the Llama-3.1-8B shape (vocabulary 128,256) with a
// backend that costs nothing: what a GPU step pays on the CPU (scheduling, inputs, sampling,
// detokenization, streams). Arg 0: batch size; arg 2: requests per batch slot (4: a waiting
// queue three times the batch); arg 1: 1 = the backend decides the rows
// (device sampling: tokens only), 0 = it returns every row's logits (the host takes argmax),
// 2 = logits and requests sampled at temperature 1 (the OpenAI default), top_p 1.
class InstantBackend final : public backend::Backend {
 public:
  // device_ms > 0: each forward also sleeps that long, standing in for a device step during
  // which the host has nothing to do but wait (what the engine's deferred outputs fill). With
  // it and `decides`, the backend is asynchronous (Backend::asynchronous): launch() decides the
  // rows at once and wait() sleeps until device_ms after the launch, so the engine's planning of
  // the next step (asynchronous scheduling) falls inside the step as on a GPU.
  InstantBackend(model::ModelConfig c, std::int64_t blocks, bool decides, double device_ms = 0)
      : c_(std::move(c)), kv_{backend::KvDtype::kBFloat16, 16, blocks}, decides_(decides), device_ms_(device_ms) {}
  std::string_view name() const override { return "instant"; }
  const model::ModelConfig& config() const override { return c_; }
  const backend::KvCacheConfig& kv_config() const override { return kv_; }
  std::uint64_t kv_block_bytes() const override { return 0; }
  backend::MemoryInfo memory() const override { return {}; }
  Status forward(const backend::Batch& b, std::span<float> logits) override {
    const auto V = static_cast<std::size_t>(c_.vocab_size);
    for (std::size_t k = 0; k < b.logits_indices.size(); ++k) {
      // A different winner per row and step, so detokenization sees varied tokens.
      const auto winner = static_cast<std::int32_t>((step_ * 7919 + k * 104729) % 120000 + 1000);
      if (decides_ && k < b.sample_rows.size() && b.sample_rows[k].mode != backend::RowSampling::Mode::kHost) {
        b.sampled_tokens[k] = winner;
        continue;
      }
      float* row = logits.data() + k * V;
      std::fill(row, row + V, 0.0f);  // stands in for the device-to-host copy of the row
      row[winner] = 1.0f;
    }
    ++step_;
    if (device_ms_ > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(device_ms_));
    return Status::ok();
  }
  bool asynchronous() const override { return decides_ && device_ms_ > 0; }
  Status prepare(const backend::Batch& b, std::span<float> logits) override {
    if (!asynchronous()) return Backend::prepare(b, logits);
    batch_ = b;
    logits_ = logits;
    return Status::ok();
  }
  Status launch(std::span<const backend::TokenPatch> patches) override {
    if (!asynchronous()) return Backend::launch(patches);
    const double ms = device_ms_;
    device_ms_ = 0;  // forward() decides the rows; the device's time is waited out in wait()
    Status st = forward(batch_, logits_);
    device_ms_ = ms;
    done_at_ = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double, std::milli>(ms));
    return st;
  }
  Status wait() override {
    if (!asynchronous()) return Backend::wait();
    std::this_thread::sleep_until(done_at_);
    return Status::ok();
  }

 private:
  model::ModelConfig c_;
  backend::KvCacheConfig kv_;
  bool decides_;
  double device_ms_;
  std::uint64_t step_ = 0;
  backend::Batch batch_;
  std::span<float> logits_;
  std::chrono::steady_clock::time_point done_at_;
};

void BM_EngineHostStep(benchmark::State& state) {
  const auto batch = static_cast<int>(state.range(0));
  const bool decides = state.range(1) == 1;
  const bool sampled = state.range(1) == 2;
  const int requests = batch * static_cast<int>(state.range(2));  // > batch: a waiting queue too
  auto config = model::load_config(lmserve::testing::source_dir() / "tests/fixtures/configs/llama-3.1-8b");
  auto tok = text::Tokenizer::load(lmserve::testing::shared_dir() / "data/tokenizers/Llama-3.2-3B-Instruct");
  if (!config || !tok) {
    state.SkipWithError("the Llama-3.1-8B config or tokenizer did not load");
    return;
  }
  constexpr int kIn = 128, kOut = 64;
  // ENGINE_BENCH_DEVICE_MS: a device step of that many ms (the wall time per step then shows
  // how much host work stays outside it; ENGINE_BENCH_OVERLAP_OUTPUTS=0 for the engine without
  // the outputs' overlap, ENGINE_BENCH_ASYNC_SCHEDULING=0 without planning the next step during
  // this one: EngineOptions::overlap_outputs and async_scheduling).
  const char* device_ms = std::getenv("ENGINE_BENCH_DEVICE_MS");
  auto backend = std::make_unique<InstantBackend>(*config, batch * (kIn + kOut) / 16 + batch, decides, device_ms ? std::strtod(device_ms, nullptr) : 0.0);
  engine::EngineOptions o;
  o.scheduler.max_model_len = kIn + kOut;
  o.scheduler.max_num_seqs = batch;
  o.scheduler.max_num_batched_tokens = std::max(8192, batch);
  o.scheduler.kv_watermark = 0.99;
  // For A/B runs of the parallel output processing (EngineOptions::parallel_output_rows).
  if (const char* v = std::getenv("ENGINE_BENCH_PARALLEL_OUTPUT_ROWS")) o.parallel_output_rows = std::strtoull(v, nullptr, 10);
  if (const char* v = std::getenv("ENGINE_BENCH_OVERLAP_OUTPUTS")) o.overlap_outputs = std::string_view(v) != "0";
  if (const char* v = std::getenv("ENGINE_BENCH_ASYNC_SCHEDULING")) o.async_scheduling = std::string_view(v) != "0";
  o.scheduler.lanes = {{"default", 0, 0, 4096}};
  auto eng = engine::Engine::create(std::move(backend), *tok, o);
  double host = 0, steps = 0, wall = 0, ahead = 0;
  engine::EngineStats::HostPhases phases;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto before = (*eng)->stats();
    std::vector<std::shared_ptr<engine::RequestStream>> streams;
    for (int i = 0; i < requests; ++i) {
      std::vector<std::int32_t> prompt(kIn);
      for (int k = 0; k < kIn; ++k) prompt[static_cast<std::size_t>(k)] = (i * 131 + k * 7) % 100000 + 3;
      engine::SamplingParams p;
      p.temperature = sampled ? 1.0 : 0.0;
      p.seed = static_cast<std::uint64_t>(i);
      p.max_tokens = kOut;
      p.ignore_eos = true;
      streams.push_back((*eng)->submit({.prompt = prompt, .params = p})->stream);
    }
    engine::StreamEvent e;
    for (auto& s : streams) {
      while (s->next(&e)) {
      }
    }
    const auto after = (*eng)->stats();
    wall += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    host += after.host_seconds_total - before.host_seconds_total + after.forward_seconds_total - before.forward_seconds_total;
    steps += static_cast<double>(after.steps_total - before.steps_total);
    ahead += static_cast<double>(after.steps_planned_ahead_total - before.steps_planned_ahead_total);
    auto d = after.host_phases;
    d -= before.host_phases;
    phases.schedule += d.schedule, phases.inputs += d.inputs, phases.relock += d.relock, phases.sample += d.sample, phases.outputs += d.outputs;
  }
  // The engine's own split of its host time (EngineStats::host_phases), per step.
  auto per_step = [&](double seconds) { return benchmark::Counter(steps > 0 ? 1e3 * seconds / steps : 0); };
  state.counters["schedule_ms"] = per_step(phases.schedule);
  state.counters["inputs_ms"] = per_step(phases.inputs);
  state.counters["relock_ms"] = per_step(phases.relock);
  state.counters["sample_ms"] = per_step(phases.sample);
  state.counters["outputs_ms"] = per_step(phases.outputs);
  state.counters["planned_ahead"] = benchmark::Counter(steps > 0 ? ahead / steps : 0);  // share of steps
  state.counters["host_ms/step"] = benchmark::Counter(steps > 0 ? 1e3 * host / steps : 0);
  state.counters["wall_ms/step"] = benchmark::Counter(steps > 0 ? 1e3 * wall / steps : 0);
}
BENCHMARK(BM_EngineHostStep)
    ->Args({64, 0, 1})
    ->Args({64, 1, 1})
    ->Args({64, 2, 1})
    ->Args({256, 0, 1})
    ->Args({256, 1, 1})
    ->Args({256, 2, 1})
    ->Args({256, 1, 4})
    ->Args({256, 1, 40})
    ->Args({1024, 1, 3})
    ->Args({1024, 1, 3})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(1);

}  // namespace

BENCHMARK_MAIN();
