// The engine under KV-cache pressure: batch invariance through chunked prefill, prefix hits and
// preemption (recomputed, swapped to host memory, or with a failing swap space), requests the
// cache could never hold, and a randomized stress test that ends with every block free.
#include <gtest/gtest.h>

#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <tuple>

#include "engine/engine.h"
#include "engine_test_util.h"

namespace lmserve::engine {
namespace {

namespace fs = std::filesystem;

// The backend under test, whose swap space runs out at its first swap-out (the engine must
// carry on, recomputing preempted requests instead).
class FailingSwaps final : public Wrapping {
 public:
  explicit FailingSwaps(std::unique_ptr<backend::Backend> inner) : Wrapping(std::move(inner)) {}
  std::string_view name() const override { return inner_->name(); }
  Status forward(const backend::Batch& batch, std::span<float> logits) override { return inner_->forward(batch, logits); }
  Status swap_blocks(std::span<const backend::BlockCopy> to_host, std::span<const backend::BlockCopy> to_device) override {
    if (!to_host.empty()) return Status(StatusCode::kResourceExhausted, "swap: no host memory (test)");
    return inner_->swap_blocks(to_host, to_device);
  }
};

std::unique_ptr<Engine> make_engine_failing_swaps(const Loaded& m, std::int64_t blocks, EngineOptions o, int block_size) {
  auto b = make_backend(m, blocks, o.scheduler, block_size, backend::KvDtype::kFloat32);
  EXPECT_TRUE(b) << b.error().to_string();
  auto e = Engine::create(std::make_unique<FailingSwaps>(std::move(*b)), m.tokenizer, o);
  EXPECT_TRUE(e) << e.error().to_string();
  return std::move(*e);
}

std::vector<std::vector<std::int32_t>> mixed_prompts(int n) {
  std::ifstream in(lmserve::testing::source_dir() / "tests/fixtures/demo_heldout.txt");
  std::string all((std::istreambuf_iterator<char>(in)), {});
  std::vector<std::vector<std::int32_t>> out;
  std::size_t pos = 0;
  const std::string shared = "What does the following mean? ";  // a common prefix for prefix-cache hits
  for (int i = 0; i < n; ++i) {
    std::size_t end = all.find("\n\n", pos);
    std::string doc = all.substr(pos, end - pos).substr(0, 40 + (i * 37) % 300);
    pos = end + 2;
    auto ids = demo().tokenizer->encode((i % 3 == 0 ? shared + shared + shared : "") + doc, {.add_special_tokens = false});
    if (ids.empty()) ids.push_back(1);
    out.push_back(ids);
  }
  return out;
}

TEST(Engine, BatchInvarianceUnderChunkingPrefixHitsAndPreemption) {
  auto prompts = mixed_prompts(32);
  // Each alone, with a roomy pool.
  std::vector<std::vector<std::int32_t>> alone;
  // The tokens a run must compute: each prompt and each output token but the last, less what
  // the prefix cache had.
  std::uint64_t needed = 0;
  for (const auto& p : prompts) needed += p.size() + static_cast<std::uint64_t>(12 + p.size() % 9) - 1;
  {
    auto engine = make_engine(demo(), 256);
    for (const auto& p : prompts) {
      auto sub = engine->submit({.prompt = p, .params = greedy(12 + static_cast<std::int64_t>(p.size() % 9))});
      ASSERT_TRUE(sub);
      alone.push_back(collect(sub->stream).tokens);
    }
    auto s = engine->stats();
    EXPECT_EQ(s.computed_tokens_total, needed - s.prefix_hits) << "no preemption: nothing computed twice";
  }
  // All at once: tiny token budget (chunked prefill), a pool too small for everyone
  // (preemption): preempted requests compute their tokens again (no swap space), or wait in
  // the swap space and compute nothing twice, or find the swap space failing at the first
  // swap-out and compute again from then on.
  for (const char* mode : {"recompute", "swap", "swap fails"}) {
    SCOPED_TRACE(mode);
    const bool swap = std::string_view(mode) != "recompute", fails = std::string_view(mode) == "swap fails";
    EngineOptions o;
    o.scheduler.max_num_batched_tokens = 48;
    o.scheduler.max_num_seqs = 32;
    o.scheduler.kv_watermark = 1.0;
    o.scheduler.lanes = {{"only", 0, 0, 100}};
    o.swap_space_bytes = swap ? std::uint64_t{64} << 20 : 0;
    auto engine = fails ? make_engine_failing_swaps(demo(), 40, o, 8) : make_engine(demo(), 40, o, 8);
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (const auto& p : prompts) {
      auto sub = engine->submit({.prompt = p, .params = greedy(12 + static_cast<std::int64_t>(p.size() % 9))});
      ASSERT_TRUE(sub) << sub.error().status.to_string();
      streams.push_back(sub->stream);
    }
    for (std::size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(collect(streams[i]).tokens, alone[i]) << "request " << i;
    auto s = engine->stats();
    EXPECT_GT(s.preemptions_total, 0) << "the pool was meant to force preemption";
    std::uint64_t limited = 0;
    for (const auto& [reason, n] : s.admission_limits) limited += n;
    EXPECT_GT(limited, 0u) << "admissions were meant to hit the KV limit";
    EXPECT_GT(s.prefix_hits, 0u) << "the shared prefixes were meant to hit";
    if (swap && !fails) {
      EXPECT_EQ(s.swap_outs_total, s.preemptions_total) << "every preempted request had computed tokens to keep";
      EXPECT_EQ(s.swap_ins_total, s.swap_outs_total);
      EXPECT_GT(s.swap_bytes_out_total, 0u);
      EXPECT_EQ(s.swap_bytes_in_total, s.swap_bytes_out_total);
      EXPECT_EQ(s.computed_tokens_total, needed - s.prefix_hits) << "a swapped-out request computes nothing twice";
    } else {
      EXPECT_EQ(s.swap_outs_total, 0);
      EXPECT_GT(s.computed_tokens_total, needed - s.prefix_hits) << "a preempted request computes its tokens again";
    }
    EXPECT_EQ(s.running, 0);
    EXPECT_EQ(s.swapped, 0);
    EXPECT_DOUBLE_EQ(s.kv_usage, 0.0);
    EXPECT_DOUBLE_EQ(s.host_kv_usage, 0.0);
  }
}

// A request whose prompt and max_tokens the KV cache could never hold (the pool less the other
// lanes' reserves) is refused at once instead of waiting forever; one that just fits finishes.
// 10 blocks of 16 tokens, the default lanes: "high" reserves floor(0.2 x 10) = 2 blocks, so a
// "low" request holds at most 128 tokens (its last output token is never cached) and a "high"
// one 160.
TEST(Engine, RequestsTheKvCacheCanNeverHoldAreRefusedNotLeftWaiting) {
  auto engine = make_engine(demo(), 10);
  const std::vector<std::int32_t> prompt = {5, 6, 7};
  auto too_long = engine->submit({.prompt = prompt, .params = greedy(127)});
  ASSERT_FALSE(too_long);
  EXPECT_EQ(too_long.error().rejection, Rejection::kExceedsKvCapacity);
  EXPECT_EQ(too_long.error().status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(too_long.error().status.message(),
            "the request asks for 3 prompt + 127 completion tokens, more than the KV cache can hold for one request (128 tokens)");
  auto fits = engine->submit({.prompt = prompt, .params = greedy(126)});
  auto high = engine->submit({.prompt = prompt, .params = greedy(150), .lane = "high"});
  ASSERT_TRUE(fits);
  ASSERT_TRUE(high);
  EXPECT_EQ(collect(fits->stream).tokens.size(), 126u);
  EXPECT_EQ(collect(high->stream).tokens.size(), 150u);
  auto s = engine->stats();
  EXPECT_DOUBLE_EQ(s.kv_usage, 0.0);
  for (const auto& [reason, n] : s.rejections) EXPECT_EQ(n, reason == "exceeds_kv_capacity" ? 1u : 0u) << reason;
}

// Thousands of requests on a tiny model: random lengths, lanes, priorities and aborts, a
// tiny pool. Every request finishes exactly once, every block comes back, and a high-lane
// request is never left waiting while a low-lane one is admitted after it; with outputs in the
// step (parallel_output_rows 128, above the batch) and deferred to the emitter (2).
// With a swap space of 12 blocks (half the pool), preempted requests swap out while it has
// room and recompute when it does not, and aborts reach requests waiting in it. With an
// asynchronous backend (greedy rows only) the engine plans each step while the one before runs:
// preemptions, swaps and aborts then meet rows planned ahead. With latency targets on the high
// lane (issue #31), its requests also preempt low ones to start and cut low prefills by the
// calibrated step-time model; the same guarantees hold.
class EngineStress : public ::testing::TestWithParam<std::tuple<std::size_t, bool, bool, bool>> {};

TEST_P(EngineStress, RandomizedStress) {
  fs::path dir = lmserve::testing::source_dir() / "tests/fixtures/models/tiny-llama3";
  Loaded tiny{*model::ModelWeights::load(dir, {}), demo().tokenizer};
  const auto [rows, swap, async, targets] = GetParam();
  EngineOptions o;
  o.parallel_output_rows = rows;
  o.swap_space_bytes = swap ? 12 * backend::kv_block_bytes(tiny.weights->config(), backend::KvDtype::kFloat32, 8) : 0;
  o.scheduler.policy = SchedulerOptions::Policy::kPriority;
  o.scheduler.max_num_batched_tokens = 64;
  o.scheduler.max_num_seqs = 16;
  o.scheduler.max_model_len = 256;
  o.scheduler.lanes = {{"high", 0.2, 0.2, 4000}, {"low", 0, 0, 4000}};
  if (targets) {
    o.scheduler.lanes[0].ttft_target_s = 0.05;
    o.scheduler.lanes[0].tpot_target_s = 0.0005;  // about a tiny step: some steps cut, some over
  }
  auto engine = async ? make_async_engine(tiny, 24, o, 8) : make_engine(tiny, 24, o, 8);
  std::mt19937 rng(99);
  const int kRequests = 2000;
  std::vector<Submitted> subs;
  std::vector<bool> high;
  for (int i = 0; i < kRequests; ++i) {
    std::vector<std::int32_t> prompt(1 + rng() % 40);
    for (auto& t : prompt) t = static_cast<std::int32_t>(rng() % 512);
    SamplingParams p;
    p.temperature = (rng() % 2) ? 0.0 : 1.0;
    if (async) {
      p.temperature = 0.0;  // the asynchronous test backend samples greedy rows only
      // Stop tokens end requests while a row is planned ahead for them.
      for (int k = 0; k < 24; ++k) p.stop_token_ids.push_back(static_cast<std::int32_t>(rng() % 512));
    }
    p.max_tokens = 1 + rng() % 24;
    p.ignore_eos = true;
    bool h = rng() % 4 == 0;
    auto sub = engine->submit({.prompt = prompt, .params = p, .lane = h ? "high" : "low", .priority = static_cast<std::int32_t>(rng() % 3)});
    ASSERT_TRUE(sub) << sub.error().status.to_string();
    subs.push_back(*sub);
    high.push_back(h);
    if (rng() % 10 == 0) engine->abort(subs[rng() % subs.size()].id);
  }
  int finished = 0;
  for (std::size_t i = 0; i < subs.size(); ++i) {
    Result r = collect(subs[i].stream);
    EXPECT_EQ(r.finish_events, 1) << "request " << i;
    finished += r.finish_events;
  }
  EXPECT_EQ(finished, kRequests);
  auto s = engine->stats();
  EXPECT_EQ(s.running, 0);
  EXPECT_EQ(s.kv_usage, 0.0);
  EXPECT_EQ(s.requests_finished, static_cast<std::uint64_t>(kRequests));
  EXPECT_EQ(s.swapped, 0);
  EXPECT_EQ(s.host_kv_usage, 0.0);
  EXPECT_LE(s.swap_ins_total, s.swap_outs_total);
  if (async) {
    EXPECT_GT(s.steps_planned_ahead_total, 0u);
  }
  if (targets) {
    // Some term is positive once the model is fitted; which ones depends on the host's timing
    // (on a loaded two-core VM the fit once put all of a step's time on its sequences and KV, with
    // w0 and the per-token term clamped at zero).
    EXPECT_GT(std::accumulate(s.step_time_model.begin(), s.step_time_model.end(), 0.0), 0.0) << "the step-time model was meant to be calibrated";
    ASSERT_EQ(s.tpot_unmet_steps.size(), 1u);
    EXPECT_EQ(s.tpot_unmet_steps[0].first, "high");
  }
  if (swap) {
    EXPECT_GT(s.swap_outs_total, 0) << "the tiny pool was meant to preempt into the swap space";
  } else {
    EXPECT_EQ(s.swap_outs_total, 0);
  }
  // Lane order: a low request never starts while a high request submitted before it waits.
  std::vector<std::pair<Clock::time_point, int>> starts;
  for (std::size_t i = 0; i < subs.size(); ++i) {
    auto t = subs[i].stream->times();
    if (t.first_scheduled != Clock::time_point{}) starts.emplace_back(t.first_scheduled, static_cast<int>(i));
  }
  std::sort(starts.begin(), starts.end());
  for (std::size_t a = 0; a < starts.size(); ++a) {
    int i = starts[a].second;
    if (high[static_cast<std::size_t>(i)]) continue;
    // A low request i started; every high request submitted before i must have started no later.
    for (int j = 0; j < i; ++j) {
      if (!high[static_cast<std::size_t>(j)]) continue;
      auto tj = subs[static_cast<std::size_t>(j)].stream->times().first_scheduled;
      if (tj == Clock::time_point{}) continue;  // aborted while waiting
      ASSERT_LE(tj, starts[a].first) << "high request " << j << " waited on low request " << i;
    }
  }
}

using StressParam = std::tuple<std::size_t, bool, bool, bool>;
std::string stress_name(const ::testing::TestParamInfo<StressParam>& p) {
  return std::string(std::get<0>(p.param) == 2 ? "deferred" : "in_step") + (std::get<1>(p.param) ? "_swap" : "") +
         (std::get<3>(p.param) && !std::get<2>(p.param) ? "_sync" : "");
}
INSTANTIATE_TEST_SUITE_P(OutputRowsAndSwap, EngineStress,
                         ::testing::Combine(::testing::Values(std::size_t{128}, std::size_t{2}), ::testing::Bool(), ::testing::Values(false),
                                            ::testing::Values(false)),
                         stress_name);
INSTANTIATE_TEST_SUITE_P(AsyncScheduling, EngineStress,
                         ::testing::Combine(::testing::Values(std::size_t{128}, std::size_t{2}), ::testing::Bool(), ::testing::Values(true),
                                            ::testing::Values(false)),
                         stress_name);
INSTANTIATE_TEST_SUITE_P(LaneTargets, EngineStress,
                         ::testing::Combine(::testing::Values(std::size_t{2}), ::testing::Bool(), ::testing::Bool(), ::testing::Values(true)),
                         stress_name);

}  // namespace
}  // namespace lmserve::engine
