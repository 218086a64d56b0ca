// The CUDA backend's layer products at the Llama-3.1-8B shapes, one at a time, each reading its
// weights from memory as a decode step does (cuda::product_seconds): the weight-streaming
// kernel at 1-2 rows, cuBLASLt above. And one layer's decode attention at that shape for a
// batch of sequences of one context length (cuda::decode_attention_seconds), narrow and wide
// blocks. A quick way to compare configurations (the LMSERVE_CUDA_* switches) shape by shape
// before a whole `lmserve bench latency` run.
// Usage (GPU machine): cuda_benchmark [--benchmark_filter=...]; without a GPU every case is
// skipped. Counters: GB/s of weights (or K and V) read, TFLOP/s.
#include <benchmark/benchmark.h>

#include <string>

#include "backend/cuda/measure/rates.h"
#include "backend/cuda/model/device_model.h"
#include "backend/device/probe.h"

namespace {

bool have_gpu() {
  static const bool yes = [] {
    const auto p = lmserve::cuda::probe();
    return p.error.empty() && !p.devices.empty();
  }();
  return yes;
}

// Args: m (outputs per row), k, n (token rows), gate_up (1: W is [2m, k] with SiLU x mul).
void BM_Product(benchmark::State& state) {
  if (!have_gpu()) {
    state.SkipWithError("no GPU");
    return;
  }
  const auto m = static_cast<int>(state.range(0)), k = static_cast<int>(state.range(1)), n = static_cast<int>(state.range(2));
  const bool gate_up = state.range(3) == 1;
  double seconds = 0;
  for (auto _ : state) {
    seconds = lmserve::cuda::product_seconds(0, m, n, k, gate_up, 200);
    if (seconds <= 0) {
      state.SkipWithError("the product failed");
      return;
    }
    state.SetIterationTime(seconds);
  }
  const double rows = gate_up ? 2.0 * m : m;
  state.counters["GB/s"] = rows * k * 2 / seconds / 1e9;
  state.counters["TFLOP/s"] = 2.0 * rows * k * n / seconds / 1e12;
  state.counters["us"] = seconds * 1e6;
}

void shapes(benchmark::internal::Benchmark* b) {
  // QKV, o_proj, gate/up (with SiLU x mul), down, LM head of Llama-3.1-8B.
  const long long kShapes[][3] = {{6144, 4096, 0}, {4096, 4096, 0}, {14336, 4096, 1}, {4096, 14336, 0}, {128256, 4096, 0}};
  for (const auto& s : kShapes) {
    for (long long n : {1, 2, 64, 1024}) b->Args({s[0], s[1], n, s[2]});
  }
  b->ArgNames({"m", "k", "n", "gate_up"});
}

BENCHMARK(BM_Product)->Apply(shapes)->UseManualTime()->Iterations(3)->Unit(benchmark::kMicrosecond);

// Args: items (one-token sequences), context (keys each), kv (PlanOptions::kv: 1 bf16, 3
// fp8_e5m2), wide (-1 the rule, 0 blocks of 4 warps, 1 of 8).
void BM_DecodeAttention(benchmark::State& state) {
  if (!have_gpu()) {
    state.SkipWithError("no GPU");
    return;
  }
  const auto items = static_cast<int>(state.range(0)), context = static_cast<int>(state.range(1));
  const auto kv = static_cast<int>(state.range(2)), wide = static_cast<int>(state.range(3));  // kv: backend::KvDtype
  double seconds = 0;
  for (auto _ : state) {
    seconds = lmserve::cuda::decode_attention_seconds(0, items, context, static_cast<lmserve::backend::KvDtype>(kv), wide, 200);
    if (seconds <= 0) {
      state.SkipWithError("the attention failed");
      return;
    }
    state.SetIterationTime(seconds);
  }
  const double bytes = 2.0 * items * context * 8 * 128 * (kv == 3 || kv == 4 ? 1 : 2);  // K and V of 8 heads of 128
  state.counters["GB/s"] = bytes / seconds / 1e9;
  state.counters["us"] = seconds * 1e6;
}

void attention_shapes(benchmark::internal::Benchmark* b) {
  // From batch 1 at a short context to the 1000/1000 run's ~1,500 keys at 1,024 sequences; at
  // most ~1.5 M keys (6 GB of bf16 K and V a layer).
  for (long long kv : {1, 3}) {
    for (long long context : {256, 1536, 4096}) {
      for (long long items : {1, 2, 4, 8, 16, 32, 64, 256, 1024}) {
        if (items * context > 1536 * 1024) continue;
        for (long long wide : {0, 1}) b->Args({items, context, kv, wide});
      }
    }
  }
  b->ArgNames({"items", "context", "kv", "wide"});
}

BENCHMARK(BM_DecodeAttention)->Apply(attention_shapes)->UseManualTime()->Iterations(3)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
