// Google Benchmark: generation throughput of the engine on the CPU backend with
// models/demo — 1 and 16 concurrent requests, 64-token prompts, 128 generated tokens each
// (ignore_eos, greedy). Counter output_tok/s = generated tokens per wall-clock second.
//   build/release/tests/bench/engine_benchmark
#include <benchmark/benchmark.h>

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

}  // namespace

BENCHMARK_MAIN();
