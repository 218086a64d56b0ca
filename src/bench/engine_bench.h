// In-process benchmarks of the engine and its backend (no HTTP): `lmserve bench latency` and
// `lmserve bench throughput`. The same code measures the CPU and the CUDA backend.
//
// latency: batch_size sequences of input_len random tokens are prefilled (in chunks of at most
// max_tokens_per_step tokens), then output_len - 1 decode steps run with greedy tokens; every
// step is timed end to end (forward and the argmax: on the device with device sampling, only
// the tokens crossing to the host; else logits to the host, argmax there). On an asynchronous
// backend (Backend::asynchronous) with `overlap`, as the engine's asynchronous scheduling runs
// it, step k + 1 is prepared while the device runs step k and launched with step k's tokens
// patched in; a step's time is then from one step's end to the next one's. With a copy
// bandwidth, the bound of a step is (weight bytes + KV bytes read) / bandwidth: what a
// memory-bound decode step cannot beat.
//
// throughput: num_prompts requests of random tokens submitted at once to an Engine (greedy,
// ignore_eos, exactly output_len tokens each, or per-request lengths); the clock runs from
// the first submit to the last token.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "common/status.h"
#include "engine/engine.h"
#include "model/config.h"

namespace lmserve::bench {

struct LatencyOptions {
  std::int64_t batch_size = 8, input_len = 128, output_len = 128;
  std::int64_t max_tokens_per_step = 8192;
  std::uint64_t seed = 0;
  double copy_bandwidth = 0;  // bytes/s; 0: no bound
  bool overlap = true;        // stage step k + 1 during step k where the backend is asynchronous
};

struct LatencyResult {
  double prefill_seconds = 0;
  std::vector<double> step_seconds;  // each decode step
  double mean_step = 0, p50_step = 0, p99_step = 0;
  double bound_seconds = 0;  // of the mean step; 0 without a bandwidth
  double weight_bytes = 0, kv_bytes_per_step = 0;
  bool overlapped = false;                 // the decode steps were staged during the ones before
  std::vector<std::int32_t> last_tokens;  // each sequence's token from the last decode step
};

Result<LatencyResult> run_latency(backend::Backend& backend, const LatencyOptions& options);

struct ThroughputOptions {
  std::int64_t num_prompts = 100, input_len = 128, output_len = 128;
  // Per-request lengths (a length mix); when set they replace input_len/output_len.
  std::vector<std::int64_t> input_lens, output_lens;
  std::uint64_t seed = 0;
  // Constrained decoding: every request's output held to this grammar (null: none).
  std::shared_ptr<const text::Grammar> grammar;
};

struct ThroughputResult {
  double seconds = 0;
  std::int64_t requests = 0, prompt_tokens = 0, output_tokens = 0;
  engine::EngineStats stats;
};

Result<ThroughputResult> run_throughput(engine::Engine& engine, std::int64_t vocab_size, const ThroughputOptions& options);

// The floating-point operations a run of requests asks of the model (multiply-add = 2), the
// usual count for a prefill's share of the matrix rate: every processed token (the prompt's,
// then each output token but the last) through every projection; the LM head once per output
// token (a prefill computes logits only for its last position); attention's QK^T and PV over
// the token's causal context (itself included). Norms, RoPE and activations are left out.
struct ModelFlops {
  double matmul = 0, attention = 0;
  double total() const { return matmul + attention; }
};
// input_lens[i] / output_lens[i]: request i's prompt and output tokens (output >= 1).
ModelFlops model_flops(const model::ModelConfig& config, const std::vector<std::int64_t>& input_lens, const std::vector<std::int64_t>& output_lens);

}  // namespace lmserve::bench
