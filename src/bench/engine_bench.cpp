#include "bench/engine_bench.h"

#include <algorithm>
#include <chrono>
#include <numeric>
#include <random>
#include <thread>

#include "common/progress.h"

namespace lmserve::bench {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::int32_t argmax(const float* v, std::int64_t n) { return static_cast<std::int32_t>(std::max_element(v, v + n) - v); }

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto i = static_cast<std::size_t>(std::min<double>(static_cast<double>(v.size() - 1), q * static_cast<double>(v.size() - 1) + 0.5));
  return v[i];
}

}  // namespace

Result<LatencyResult> run_latency(backend::Backend& b, const LatencyOptions& o) {
  const auto& c = b.config();
  const auto& kv = b.kv_config();
  const std::int64_t B = o.batch_size, N = o.input_len, M = o.output_len, V = c.vocab_size;
  if (B < 1 || N < 1 || M < 2) return error(StatusCode::kInvalidArgument, "bench latency: batch size and input length >= 1, output length >= 2");
  const std::int64_t per_seq = (N + M + kv.block_size - 1) / kv.block_size;
  if (per_seq * B > kv.num_blocks) {
    return error(StatusCode::kResourceExhausted, "bench latency: " + std::to_string(B) + " sequences of " + std::to_string(N + M) +
                                                     " tokens need " + std::to_string(per_seq * B) + " KV blocks; the cache has " +
                                                     std::to_string(kv.num_blocks));
  }
  std::vector<std::vector<std::int32_t>> tables(static_cast<std::size_t>(B));
  for (std::int64_t s = 0; s < B; ++s) {
    for (std::int64_t i = 0; i < per_seq; ++i) tables[static_cast<std::size_t>(s)].push_back(static_cast<std::int32_t>(s * per_seq + i));
  }
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<std::int32_t> tok(0, static_cast<std::int32_t>(V - 1));
  auto slot = [&](std::int64_t s, std::int64_t p) {
    return static_cast<std::int64_t>(tables[static_cast<std::size_t>(s)][static_cast<std::size_t>(p / kv.block_size)]) * kv.block_size +
           p % kv.block_size;
  };
  std::vector<std::int32_t> next(static_cast<std::size_t>(B));
  std::vector<float> logits;

  auto prefill = [&]() -> Status {
    const std::int64_t per_step = std::max<std::int64_t>(1, o.max_tokens_per_step / N);
    for (std::int64_t s0 = 0; s0 < B; s0 += per_step) {
      const std::int64_t n = std::min(per_step, B - s0);
      std::vector<std::int32_t> tokens, positions, rows;
      std::vector<std::int64_t> slots;
      std::vector<backend::SeqBatch> seqs;
      for (std::int64_t s = s0; s < s0 + n; ++s) {
        const auto start = static_cast<std::int32_t>(tokens.size());
        for (std::int64_t p = 0; p < N; ++p) {
          tokens.push_back(tok(rng));
          positions.push_back(static_cast<std::int32_t>(p));
          slots.push_back(slot(s, p));
        }
        seqs.push_back({start, static_cast<std::int32_t>(N), static_cast<std::int32_t>(N), tables[static_cast<std::size_t>(s)]});
        rows.push_back(static_cast<std::int32_t>(tokens.size()) - 1);
      }
      logits.resize(rows.size() * static_cast<std::size_t>(V));
      LMSERVE_RETURN_IF_ERROR(b.forward({tokens, positions, slots, seqs, rows}, logits));
      for (std::int64_t i = 0; i < n; ++i) next[static_cast<std::size_t>(s0 + i)] = argmax(&logits[static_cast<std::size_t>(i * V)], V);
    }
    return Status::ok();
  };
  // A decode step's arrays, which stay put from prepare() to wait(): two of them when steps overlap.
  struct DecodeStep {
    std::vector<std::int32_t> tokens, positions, rows, picked;
    std::vector<std::int64_t> slots;
    std::vector<backend::SeqBatch> seqs;
    std::vector<backend::RowSampling> greedy;
    std::vector<float> logits;
  };
  DecodeStep steps[2];
  // d as the step at `pos` for every sequence, its tokens `next`. Every row is greedy: a backend
  // with device sampling returns tokens instead of logits.
  auto fill = [&](DecodeStep& d, std::int64_t pos) -> backend::Batch {
    const auto n = static_cast<std::size_t>(B);
    d.tokens = next;
    d.positions.assign(n, static_cast<std::int32_t>(pos));
    d.rows.resize(n);
    d.slots.resize(n);
    d.seqs.clear();
    for (std::int64_t s = 0; s < B; ++s) {
      d.slots[static_cast<std::size_t>(s)] = slot(s, pos);
      d.rows[static_cast<std::size_t>(s)] = static_cast<std::int32_t>(s);
      d.seqs.push_back({static_cast<std::int32_t>(s), 1, static_cast<std::int32_t>(pos + 1), tables[static_cast<std::size_t>(s)]});
    }
    d.logits.resize(n * static_cast<std::size_t>(V));
    d.greedy.assign(n, {.mode = backend::RowSampling::Mode::kGreedy});
    d.picked.assign(n, -1);
    return {d.tokens, d.positions, d.slots, d.seqs, d.rows, d.greedy, d.picked};
  };
  // Each sequence's token from step d.
  auto take = [&](const DecodeStep& d) {
    for (std::int64_t s = 0; s < B; ++s) {
      const auto k = static_cast<std::size_t>(s);
      next[k] = d.picked[k] >= 0 ? d.picked[k] : argmax(&d.logits[static_cast<std::size_t>(s * V)], V);
    }
  };
  auto decode = [&](std::int64_t pos) -> Status {
    const backend::Batch batch = fill(steps[0], pos);
    LMSERVE_RETURN_IF_ERROR(b.forward(batch, steps[0].logits));
    take(steps[0]);
    return Status::ok();
  };
  // Steps at positions pos0 .. pos0 + count - 1, each prepared while the one before runs (the
  // placeholders are the tokens before; the sampled ones are written in and patched at launch).
  Progress* step_progress = nullptr;  // the run's, once it starts (not the warm-up's)
  auto decode_overlapped = [&](std::int64_t pos0, std::int64_t count, std::vector<double>* times) -> Status {
    auto t = Clock::now();
    const backend::Batch first = fill(steps[0], pos0);  // before the logits' span is taken
    LMSERVE_RETURN_IF_ERROR(b.prepare(first, steps[0].logits));
    LMSERVE_RETURN_IF_ERROR(b.launch({}));
    std::vector<backend::TokenPatch> patches(static_cast<std::size_t>(B));
    for (std::int64_t i = 0; i < count; ++i) {
      DecodeStep& cur = steps[i % 2];
      DecodeStep& nxt = steps[(i + 1) % 2];
      const bool more = i + 1 < count;
      if (more) {
        const backend::Batch batch = fill(nxt, pos0 + i + 1);
        if (Status st = b.prepare(batch, nxt.logits); !st.is_ok()) {
          (void)b.wait();  // the step in flight reads cur's arrays until it is done
          return st;
        }
      }
      LMSERVE_RETURN_IF_ERROR(b.wait());
      take(cur);
      const auto now = Clock::now();
      times->push_back(std::chrono::duration<double>(now - t).count());
      if (step_progress) step_progress->add(1);
      t = now;
      if (!more) break;
      for (std::int64_t s = 0; s < B; ++s) {
        const auto k = static_cast<std::size_t>(s);
        nxt.tokens[k] = next[k];
        patches[k] = {static_cast<std::int32_t>(s), next[k]};
      }
      LMSERVE_RETURN_IF_ERROR(b.launch(patches));
    }
    return Status::ok();
  };

  // Warm-up: one prefill and a few decode steps (allocations, GEMM plans), then the run.
  LMSERVE_RETURN_IF_ERROR(prefill());
  for (std::int64_t i = 0; i < std::min<std::int64_t>(3, M - 1); ++i) LMSERVE_RETURN_IF_ERROR(decode(N + i));
  LatencyResult r;
  Progress progress("bench latency", static_cast<double>(M - 1), Progress::Unit::kCount, "steps");
  auto t0 = Clock::now();
  LMSERVE_RETURN_IF_ERROR(prefill());
  r.prefill_seconds = seconds_since(t0);
  r.overlapped = o.overlap && b.asynchronous();
  if (r.overlapped) {
    step_progress = &progress;
    LMSERVE_RETURN_IF_ERROR(decode_overlapped(N, M - 1, &r.step_seconds));
  } else {
    for (std::int64_t i = 0; i < M - 1; ++i) {
      auto t = Clock::now();
      LMSERVE_RETURN_IF_ERROR(decode(N + i));
      r.step_seconds.push_back(seconds_since(t));
      progress.add(1);
    }
  }
  r.last_tokens = next;
  r.mean_step = std::accumulate(r.step_seconds.begin(), r.step_seconds.end(), 0.0) / static_cast<double>(r.step_seconds.size());
  r.p50_step = percentile(r.step_seconds, 0.5);
  r.p99_step = percentile(r.step_seconds, 0.99);
  r.weight_bytes = static_cast<double>(b.memory().weight_bytes);
  // Each step reads the cached context of every sequence once: on average N + M/2 tokens.
  const double kv_per_token = static_cast<double>(b.kv_block_bytes()) / kv.block_size;
  r.kv_bytes_per_step = static_cast<double>(B) * (static_cast<double>(N) + static_cast<double>(M) / 2.0) * kv_per_token;
  if (o.copy_bandwidth > 0) r.bound_seconds = (r.weight_bytes + r.kv_bytes_per_step) / o.copy_bandwidth;
  return r;
}

Result<ThroughputResult> run_throughput(engine::Engine& e, std::int64_t V, const ThroughputOptions& o) {
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<std::int32_t> tok(0, static_cast<std::int32_t>(V - 1));
  std::vector<std::shared_ptr<engine::RequestStream>> streams;
  ThroughputResult r;
  const auto before = e.stats();
  std::vector<engine::GenerateRequest> reqs;
  for (std::int64_t i = 0; i < o.num_prompts; ++i) {
    const std::int64_t in = o.input_lens.empty() ? o.input_len : o.input_lens[static_cast<std::size_t>(i)];
    const std::int64_t out = o.output_lens.empty() ? o.output_len : o.output_lens[static_cast<std::size_t>(i)];
    engine::GenerateRequest g;
    for (std::int64_t k = 0; k < in; ++k) g.prompt.push_back(tok(rng));
    g.params.temperature = 0;
    g.params.ignore_eos = true;
    g.params.max_tokens = out;
    g.params.grammar = o.grammar;
    r.prompt_tokens += in;
    reqs.push_back(std::move(g));
  }
  const auto t0 = Clock::now();
  // All at once, as an offline batch starts: the first step sees every request the queue takes,
  // however the threads interleave. The queue may be bounded: the rest wait for room, in order.
  auto first = e.submit_all(reqs);
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    auto sub = std::move(first[i]);
    while (true) {
      if (sub) {
        streams.push_back(sub->stream);
        break;
      }
      const auto why = sub.error().rejection;
      if (why != engine::Rejection::kQueueFull && why != engine::Rejection::kKvWatermark) {
        return error(sub.error().status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      sub = e.submit(reqs[i]);
    }
  }
  // Streams are read in order; they end in about that order, so the count follows the run.
  Progress progress("bench throughput", static_cast<double>(streams.size()), Progress::Unit::kCount, "requests");
  for (auto& s : streams) {
    engine::StreamEvent ev;
    while (s->next(&ev)) {
      if (ev.finish == engine::FinishReason::kError) return error(StatusCode::kInternal, "bench throughput: " + ev.error);
      if (ev.finish != engine::FinishReason::kNone) r.output_tokens += ev.completion_tokens;
    }
    progress.set_note("output " + std::to_string(std::llround(static_cast<double>(r.output_tokens) / std::max(1e-9, seconds_since(t0)))) + " tok/s");
    progress.add(1);
  }
  r.seconds = seconds_since(t0);
  r.requests = static_cast<std::int64_t>(streams.size());
  r.stats = e.stats();
  r.stats.forward_seconds_total -= before.forward_seconds_total;
  r.stats.host_seconds_total -= before.host_seconds_total;
  r.stats.forward_staging_seconds_total -= before.forward_staging_seconds_total;
  r.stats.host_phases -= before.host_phases;
  r.stats.steps_total -= before.steps_total;
  r.stats.steps_planned_ahead_total -= before.steps_planned_ahead_total;
  r.stats.step_sizes -= before.step_sizes;
  r.stats.computed_tokens_total -= before.computed_tokens_total;
  r.stats.prefix_hits -= before.prefix_hits;
  r.stats.preemptions_total -= before.preemptions_total;
  r.stats.swap_outs_total -= before.swap_outs_total;
  r.stats.swap_ins_total -= before.swap_ins_total;
  r.stats.swap_bytes_out_total -= before.swap_bytes_out_total;
  r.stats.swap_bytes_in_total -= before.swap_bytes_in_total;
  return r;
}

ModelFlops model_flops(const model::ModelConfig& c, const std::vector<std::int64_t>& input_lens, const std::vector<std::int64_t>& output_lens) {
  const double q = static_cast<double>(c.num_heads * c.head_dim), kv = static_cast<double>(c.num_kv_heads * c.head_dim);
  const double H = static_cast<double>(c.hidden_size), I = static_cast<double>(c.intermediate_size), L = static_cast<double>(c.num_layers);
  const double per_token = 2.0 * L * (H * (q + 2 * kv) + q * H + 3.0 * H * I), head = 2.0 * H * static_cast<double>(c.vocab_size);
  // A query at context length n (keys 1..n): 2 * n * head_dim for QK^T and as much for PV, per head.
  const double per_key = 4.0 * L * q;
  ModelFlops f;
  for (std::size_t i = 0; i < input_lens.size() && i < output_lens.size(); ++i) {
    const double n = static_cast<double>(input_lens[i]), m = static_cast<double>(std::max<std::int64_t>(1, output_lens[i]));
    const double tokens = n + m - 1;  // contexts 1 .. n + m - 1
    f.matmul += per_token * tokens + head * m;
    f.attention += per_key * tokens * (tokens + 1) / 2;
  }
  return f;
}

}  // namespace lmserve::bench
