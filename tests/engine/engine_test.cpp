// The engine end to end on the CPU backend: greedy output equals transformers', seeds, stop
// strings, aborts, rejections, deferred outputs and the stats (KV-cache pressure:
// engine_kv_pressure_test.cpp).
#include "engine/engine.h"
#include "engine/evaluate.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <thread>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/device/devices.h"
#include "engine_test_util.h"
#include "test_paths.h"

namespace lmserve::engine {
namespace {

using nlohmann::json;

TEST(Engine, GreedyMatchesTransformers) {
  std::ifstream in(lmserve::testing::source_dir() / "tests/fixtures/reference/demo.json");
  json ref = json::parse(in);
  auto engine = make_engine(demo(), 64);
  for (const auto& c : ref["cases"]) {
    auto sub = engine->submit({.prompt = c["prompt_ids"].get<std::vector<std::int32_t>>(), .params = greedy(32)});
    ASSERT_TRUE(sub) << sub.error().status.to_string();
    Result r = collect(sub->stream);
    EXPECT_EQ(r.tokens, c["greedy_ids"].get<std::vector<std::int32_t>>()) << c["name"];
    EXPECT_EQ(r.finish, FinishReason::kLength);
    EXPECT_EQ(r.finish_events, 1);
    EXPECT_EQ(r.text, demo().tokenizer->decode(r.tokens, true));
  }
}

// Steps are counted by the sequences they ran: five requests together, then one long one
// alone, whose lone steps land in the first bucket; the buckets add up to the totals.
TEST(Engine, StepsAreCountedByTheirSequences) {
  auto engine = make_engine(demo(), 128);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 5; ++i) {
    auto prompt = demo().tokenizer->encode("Item " + std::to_string(i) + " is", {.add_special_tokens = false});
    auto sub = engine->submit({.prompt = prompt, .params = greedy(i == 0 ? 40 : 4)});
    ASSERT_TRUE(sub);
    streams.push_back(sub->stream);
  }
  for (auto& st : streams) collect(st);
  const auto s = engine->stats();
  std::uint64_t steps = 0;
  double seconds = 0;
  for (std::size_t i = 0; i < s.step_sizes.kUpper.size(); ++i) steps += s.step_sizes.steps[i], seconds += s.step_sizes.forward_seconds[i];
  EXPECT_EQ(steps, s.steps_total);
  EXPECT_NEAR(seconds, s.forward_seconds_total, 1e-9 * std::max(1.0, s.forward_seconds_total));
  // The long request's last 36 or so tokens ran alone (more if the others were admitted late).
  EXPECT_GE(s.step_sizes.steps[0], 30u);
  EXPECT_GT(s.step_sizes.steps[1] + s.step_sizes.steps[2], 0u) << "steps of 2-16 sequences: the short ones ran together";
  EXPECT_EQ(s.step_sizes.steps[3] + s.step_sizes.steps[4] + s.step_sizes.steps[5] + s.step_sizes.steps[6], 0u);
}

// A backend that decides rows itself (as the CUDA backend's device sampling does) and poisons
// their logits: the engine must hand it exactly the rows that need nothing but logits, with
// their sampling parameters and a per-request stream (key, counter), and still sample the other
// rows from logits as before. Random rows get a token that is a function of (key, counter).
class RowDeciding final : public Wrapping {
 public:
  explicit RowDeciding(std::unique_ptr<backend::Backend> inner) : Wrapping(std::move(inner)) {}
  std::string_view name() const override { return "row-deciding"; }
  static std::int32_t drawn(std::uint64_t key, std::uint32_t counter, std::int64_t V) {
    return static_cast<std::int32_t>((key ^ (counter * 0x9E3779B97F4A7C15ull)) % static_cast<std::uint64_t>(V));
  }
  Status forward(const backend::Batch& b, std::span<float> logits) override {
    LMSERVE_RETURN_IF_ERROR(inner_->forward(b, logits));
    const auto V = static_cast<std::size_t>(config().vocab_size);
    for (std::size_t k = 0; k < b.sample_rows.size(); ++k) {
      const backend::RowSampling& r = b.sample_rows[k];
      if (r.mode == backend::RowSampling::Mode::kHost) continue;
      float* row = logits.data() + k * V;
      if (r.mode == backend::RowSampling::Mode::kGreedy) {
        b.sampled_tokens[k] = static_cast<std::int32_t>(std::max_element(row, row + V) - row);
      } else {
        b.sampled_tokens[k] = drawn(r.key, r.counter, static_cast<std::int64_t>(V));
        random_.push_back(r);
      }
      std::fill(row, row + V, std::nanf(""));
      ++decided_;
    }
    return Status::ok();
  }
  int decided_ = 0;
  std::vector<backend::RowSampling> random_;
};

TEST(Engine, RowsDecidedByTheBackendAreExactlyThePlainOnes) {
  if (on_cuda()) GTEST_SKIP() << "a CPU-side test of the engine's contract";
  struct Run {
    std::vector<std::vector<std::int32_t>> tokens;
    int decided = 0;
    std::vector<backend::RowSampling> random;
  };
  auto run = [&](bool deciding) {
    auto b = backend::make_cpu_backend(demo().weights, {.kv = {backend::KvDtype::kFloat32, 16, 64}, .threads = 2});
    EXPECT_TRUE(b);
    std::unique_ptr<backend::Backend> backend = std::move(*b);
    RowDeciding* rd = nullptr;
    if (deciding) {
      auto w = std::make_unique<RowDeciding>(std::move(backend));
      rd = w.get();
      backend = std::move(w);
    }
    EngineOptions o;
    o.scheduler.max_model_len = 1024;
    auto e = Engine::create(std::move(backend), demo().tokenizer, o);
    EXPECT_TRUE(e);
    std::vector<SamplingParams> params(5, greedy(8));
    params[1].temperature = 0.75;  // plain random: the backend draws it
    params[1].top_k = 40;
    params[1].top_p = 0.875;
    params[1].min_p = 0.0625;
    params[1].seed = 5;
    params[2].logprobs = 2;       // greedy with logprobs: needs logits
    params[3].min_tokens = 4;     // greedy once 4 tokens are out
    params[3].ignore_eos = false;
    params[4].temperature = 0.8;  // a penalty: sampled on the host from logits
    params[4].repetition_penalty = 1.2;
    params[4].seed = 9;
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (std::size_t i = 0; i < params.size(); ++i) {
      auto sub = (*e)->submit({.prompt = {5, static_cast<std::int32_t>(17 + i), 99}, .params = params[i]});
      EXPECT_TRUE(sub);
      streams.push_back(sub->stream);
    }
    Run out;
    for (auto& s : streams) out.tokens.push_back(collect(s).tokens);
    if (rd) {
      out.decided = rd->decided_;
      out.random = rd->random_;
    }
    return out;
  };
  const Run host = run(false), device = run(true), again = run(true);
  for (std::size_t i : {0u, 2u, 3u, 4u}) EXPECT_EQ(device.tokens[i], host.tokens[i]) << "request " << i;
  // Request 0: 8 greedy rows; 1: 8 random rows; 3: the rows after its first 4 tokens; 2, 4 never.
  EXPECT_GE(device.decided, 8 + 8 + 3);
  EXPECT_LE(device.decided, 8 + 8 + 4);
  ASSERT_EQ(device.random.size(), 8u);
  const std::int64_t V = demo().weights->config().vocab_size;
  for (std::uint32_t k = 0; k < 8; ++k) {
    const backend::RowSampling& r = device.random[k];
    EXPECT_EQ(r.counter, k) << "the draw index is the output token's index";
    EXPECT_EQ(r.key, device.random[0].key) << "one stream per request";
    EXPECT_FLOAT_EQ(r.temperature, 0.75f);
    EXPECT_EQ(r.top_k, 40);
    EXPECT_FLOAT_EQ(r.top_p, 0.875f);
    EXPECT_FLOAT_EQ(r.min_p, 0.0625f);
    EXPECT_EQ(device.tokens[1][k], RowDeciding::drawn(r.key, k, V));
  }
  EXPECT_EQ(again.tokens, device.tokens) << "the same seed gives the same stream";
  EXPECT_NE(device.random[0].key, 5u) << "the seed is mixed, not used as the key";
}

// A backend that reports staging time: 1 ms per forward pass, counted as it goes.
class Staging final : public Wrapping {
 public:
  explicit Staging(std::unique_ptr<backend::Backend> inner) : Wrapping(std::move(inner)) {}
  std::string_view name() const override { return "staging"; }
  Status forward(const backend::Batch& b, std::span<float> logits) override {
    ++calls_;
    return inner_->forward(b, logits);
  }
  double staging_seconds_total() const override { return 1e-3 * calls_; }

 private:
  int calls_ = 0;
};

// Tensor parallelism is invisible to the engine (issue #36): the CPU backend's TP 2 and TP 4
// ranks give the greedy text of TP 1 for a batch of requests that share a prefix (prefix cache
// hits), are batched together and grow past their first blocks.
TEST(Engine, TensorParallelRanksGiveTheTextOfOneRank) {
  if (on_cuda()) GTEST_SKIP() << "the CPU backend's ranks";
  auto texts = [&](int tp) {
    auto b = backend::make_cpu_backend(demo().weights, {.kv = {backend::KvDtype::kFloat32, 16, 64}, .threads = 2, .tensor_parallel_size = tp});
    EXPECT_TRUE(b) << b.error().to_string();
    EngineOptions o;
    o.scheduler.max_model_len = 1024;
    auto e = Engine::create(std::move(*b), demo().tokenizer, o);
    EXPECT_TRUE(e);
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (std::int32_t i = 0; i < 6; ++i) {
      std::vector<std::int32_t> prompt;
      for (std::int32_t t = 0; t < 40; ++t) prompt.push_back((t * 131 + 7) % 5000 + 10);  // the shared prefix
      prompt.push_back(100 + i);
      auto sub = (*e)->submit({.prompt = prompt, .params = greedy(24)});
      EXPECT_TRUE(sub);
      streams.push_back(sub->stream);
    }
    std::vector<std::vector<std::int32_t>> out;
    for (auto& s : streams) out.push_back(collect(s).tokens);
    return out;
  };
  const auto one = texts(1);
  for (const auto& r : one) EXPECT_EQ(r.size(), 24u);
  EXPECT_EQ(texts(2), one);
  EXPECT_EQ(texts(4), one);
}

TEST(Engine, HostTimeIsSplitIntoPhasesAndStagingComesFromTheBackend) {
  auto b = backend::make_cpu_backend(demo().weights, {.kv = {backend::KvDtype::kFloat32, 16, 64}, .threads = 2});
  ASSERT_TRUE(b);
  auto e = Engine::create(std::make_unique<Staging>(std::move(*b)), demo().tokenizer, {});
  ASSERT_TRUE(e) << e.error().to_string();
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 4; ++i) {
    auto sub = (*e)->submit({.prompt = {5, 6, 7, static_cast<std::int32_t>(8 + i)}, .params = greedy(6)});
    ASSERT_TRUE(sub);
    streams.push_back(sub->stream);
  }
  for (auto& s : streams) EXPECT_EQ(collect(s).tokens.size(), 6u);
  const auto s = (*e)->stats();
  ASSERT_GT(s.steps_total, 0u);
  EXPECT_DOUBLE_EQ(s.forward_staging_seconds_total, 1e-3 * static_cast<double>(s.steps_total));
  const auto& h = s.host_phases;
  for (double v : {h.schedule, h.inputs, h.relock, h.sample, h.outputs}) EXPECT_GE(v, 0.0);
  EXPECT_GT(h.outputs, 0.0) << "24 tokens were turned into text and events";
  EXPECT_NEAR(h.schedule + h.inputs + h.relock + h.sample + h.outputs, s.host_seconds_total, 1e-9);
}

// The first `n` documents of tests/fixtures/demo_heldout.txt (blank-line separated), each closed
// by <|endoftext|>, as the model card scores them (empty when the file or the token is missing).
std::vector<std::vector<std::int32_t>> held_out_documents(std::size_t n) {
  std::vector<std::vector<std::int32_t>> docs;
  std::ifstream in(lmserve::testing::source_dir() / "tests/fixtures/demo_heldout.txt", std::ios::binary);
  const auto eot = demo().tokenizer->token_to_id("<|endoftext|>");
  if (!in || !eot) return docs;
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  for (std::size_t at = 0; at < text.size() && docs.size() < n;) {
    std::size_t end = std::min(text.find("\n\n", at), text.size());
    docs.push_back(demo().tokenizer->encode(std::string_view(text).substr(at, end - at), {.add_special_tokens = false}));
    docs.back().push_back(*eot);
    at = end + 2;
  }
  return docs;
}

// Issue #4's accuracy bar: fp8 KV keeps the demo model's held-out perplexity within 1% of
// float32 KV, measured as the model card measures it (each document on its own, followed by
// <|endoftext|>; `lmserve perplexity --documents`) — here on the first 700 held-out documents,
// docs/perf.md has the whole file.
TEST(Engine, Fp8KvKeepsHeldOutPerplexityWithinOnePercent) {
  const auto docs = held_out_documents(700);
  ASSERT_EQ(docs.size(), 700u);
  SchedulerOptions so;
  so.max_model_len = 512;
  so.max_num_batched_tokens = 512;
  auto ppl = [&](backend::KvDtype kv) {
    auto b = make_backend(demo(), 40, so, 16, kv);
    EXPECT_TRUE(b) << b.error().to_string();
    auto r = perplexity(**b, std::span<const std::vector<std::int32_t>>(docs), 512);
    EXPECT_TRUE(r) << r.error().to_string();
    return r->perplexity;
  };
  const double f32 = ppl(backend::KvDtype::kFloat32);
  EXPECT_GT(f32, 10.0);
  EXPECT_LT(f32, 60.0) << "the demo model's held-out perplexity is about 32";
  for (auto kv : {backend::KvDtype::kFp8E5M2, backend::KvDtype::kFp8E4M3}) {
    const double q = ppl(kv);
    std::printf("[ ppl ] float32 %.4f, %s %.4f (%+.2f%%)\n", f32, std::string(backend::kv_dtype_name(kv)).c_str(), q, 100.0 * (q / f32 - 1));
    EXPECT_LE(q, 1.01 * f32) << backend::kv_dtype_name(kv);
    EXPECT_NE(q, f32) << backend::kv_dtype_name(kv) << " should change something";
  }
}

// FP8 weights (issue #34): the demo model with every projection quantized at load
// (--quantization fp8, per-channel scales; on the CPU activations quantized per token too)
// scores the held-out documents within 1% of the unquantized model's perplexity.
TEST(Engine, Fp8WeightsKeepHeldOutPerplexityWithinOnePercent) {
  const auto docs = held_out_documents(300);
  ASSERT_EQ(docs.size(), 300u);
  model::LoadOptions lo{.quantization = "fp8"};
  if (on_cuda()) lo.dtype = "float32";
  auto fp8 = model::ModelWeights::load(lmserve::testing::source_dir() / "models/demo", lo);
  ASSERT_TRUE(fp8) << fp8.error().to_string();
  const Loaded quantized{*fp8, demo().tokenizer};
  SchedulerOptions so;
  so.max_model_len = 512;
  so.max_num_batched_tokens = 512;
  auto ppl = [&](const Loaded& m) {
    auto b = make_backend(m, 40, so, 16, backend::KvDtype::kFloat32);
    EXPECT_TRUE(b) << b.error().to_string();
    auto r = perplexity(**b, std::span<const std::vector<std::int32_t>>(docs), 512);
    EXPECT_TRUE(r) << r.error().to_string();
    return r->perplexity;
  };
  const double base = ppl(demo()), q = ppl(quantized);
  std::printf("[ ppl ] unquantized %.4f, fp8 weights %.4f (%+.2f%%)\n", base, q, 100.0 * (q / base - 1));
  EXPECT_LE(q, 1.01 * base);
  EXPECT_NE(q, base) << "fp8 weights should change something";
}

// The device-memory signal stops admissions (running requests go on) and lets them resume.
TEST(Engine, DeviceMemorySignalHoldsNewRequestsBack) {
  auto full = std::make_shared<std::atomic<bool>>(true);
  EngineOptions o;
  o.device_memory_ok = [full] { return !full->load(); };
  auto engine = make_engine(demo(), 64, o);
  auto sub = engine->submit({.prompt = {5, 6, 7}, .params = greedy(4)});
  ASSERT_TRUE(sub);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  auto s = engine->stats();
  EXPECT_EQ(s.running, 0) << "admitted while the device was over its limit";
  EXPECT_EQ(s.generation_tokens_total, 0u);
  std::uint64_t device_limited = 0;
  for (const auto& [reason, n] : s.admission_limits) device_limited += reason == "device_memory" ? n : 0;
  EXPECT_EQ(device_limited, 1u) << "one episode, logged once";
  full->store(false);
  auto r = collect(sub->stream);
  EXPECT_EQ(r.tokens.size(), 4u);
  EXPECT_EQ(r.finish, FinishReason::kLength);
}

TEST(Engine, SeededSamplingIgnoresTheRestOfTheBatch) {
  auto engine = make_engine(demo(), 128);
  auto prompt = demo().tokenizer->encode("The hacker", {.add_special_tokens = false});
  SamplingParams p;
  p.temperature = 0.9;
  p.top_p = 0.95;
  p.top_k = 50;
  p.seed = 1234;
  p.max_tokens = 24;
  p.ignore_eos = true;
  auto first = collect(engine->submit({.prompt = prompt, .params = p})->stream).tokens;
  // Same request among noisy neighbours.
  std::vector<std::shared_ptr<RequestStream>> noise;
  for (int i = 0; i < 5; ++i) {
    SamplingParams q = p;
    q.seed.reset();
    noise.push_back(engine->submit({.prompt = prompt, .params = q})->stream);
  }
  auto again = engine->submit({.prompt = prompt, .params = p});
  EXPECT_EQ(collect(again->stream).tokens, first);
  for (auto& s : noise) collect(s);
}

TEST(Engine, SeveralChoicesShareThePromptBlocks) {
  auto engine = make_engine(demo(), 128);
  auto prompt = demo().tokenizer->encode(std::string(200, 'a') + " is the start", {.add_special_tokens = false});
  SamplingParams p;
  p.n = 3;
  p.seed = 11;
  p.max_tokens = 8;
  p.ignore_eos = true;
  auto sub = engine->submit({.prompt = prompt, .params = p});
  ASSERT_TRUE(sub);
  std::map<std::int32_t, std::vector<std::int32_t>> by_choice;
  std::map<std::int32_t, int> finishes;
  StreamEvent e;
  while (sub->stream->next(&e)) {
    by_choice[e.index].insert(by_choice[e.index].end(), e.token_ids.begin(), e.token_ids.end());
    if (e.finish != FinishReason::kNone) finishes[e.index]++;
  }
  ASSERT_EQ(by_choice.size(), 3u);
  for (auto& [i, toks] : by_choice) {
    EXPECT_EQ(toks.size(), 8u);
    EXPECT_EQ(finishes[i], 1);
  }
  auto s = engine->stats();
  // Choices 2 and 3 found every full prompt block of choice 1 in the prefix cache.
  const std::uint64_t full_blocks = (prompt.size() - 1) / 16 * 16;
  EXPECT_EQ(s.prefix_hits, 2 * full_blocks);
}

// With one sequence slot the later choices of a request can start only after the first one
// has finished: its finish must release exactly its own siblings (two groups in flight, the
// second one's siblings wait on the second group's first choice), or they wait forever.
TEST(Engine, SiblingsWaitingOnTheFirstChoiceStartWhenItFinishes) {
  EngineOptions o;
  o.scheduler.max_num_seqs = 1;
  auto engine = make_engine(demo(), 128, o);
  auto prompt = demo().tokenizer->encode(std::string(40, 'b') + " and then", {.add_special_tokens = false});
  SamplingParams p;
  p.n = 3;
  p.seed = 5;
  p.max_tokens = 2;
  p.ignore_eos = true;
  auto a = engine->submit({.prompt = prompt, .params = p});
  p.n = 2;
  auto b = engine->submit({.prompt = prompt, .params = p});
  ASSERT_TRUE(a && b);
  for (auto* sub : {&*a, &*b}) {
    std::map<std::int32_t, int> finishes;
    StreamEvent e;
    bool timed_out = false;
    while (sub->stream->next(&e, std::chrono::seconds(60), &timed_out)) {
      if (e.finish != FinishReason::kNone) finishes[e.index]++;
    }
    ASSERT_FALSE(timed_out) << "a choice never started";
    EXPECT_EQ(finishes.size(), static_cast<std::size_t>(sub == &*a ? 3 : 2));
  }
  EXPECT_EQ(engine->stats().requests_finished, 5u);
}

TEST(Engine, StopStringsAreNeverStreamedAndThenRetracted) {
  auto engine = make_engine(demo(), 64);
  auto prompt = demo().tokenizer->encode("<|im_start|>user\nWhat does \"kernel\" mean?<|im_end|>\n<|im_start|>assistant\n");
  auto full = collect(engine->submit({.prompt = prompt, .params = greedy(30)})->stream).text;
  ASSERT_GT(full.size(), 12u);
  std::string stop = full.substr(6, 5);  // somewhere inside the greedy text
  SamplingParams p = greedy(30);
  p.stop = {stop};
  auto sub = engine->submit({.prompt = prompt, .params = p});
  std::string streamed;
  StreamEvent e;
  FinishReason fin = FinishReason::kNone;
  while (sub->stream->next(&e)) {
    streamed += e.text;
    EXPECT_EQ(streamed.find(stop), std::string::npos) << "stop text was streamed";
    if (e.finish != FinishReason::kNone) {
      fin = e.finish;
      EXPECT_EQ(e.stop_reason, stop);
    }
  }
  EXPECT_EQ(fin, FinishReason::kStop);
  EXPECT_EQ(streamed, full.substr(0, full.find(stop)));
}

// Steps of at least parallel_output_rows rows detokenize and match stop strings on the sampler
// threads; what each request streams must not depend on it.
// A step's outputs three ways: serially in the step, on the sampler threads in the step, and
// (overlap_outputs) decided by token in the step with the text and events deferred to the
// emitter while the next step runs. Every request gets the same tokens, text, end, stop reason,
// counts and log-probabilities each way: greedy and seeded choices, stop strings (always in the
// step), end-of-sequence and stop tokens past min_tokens, max_tokens, n = 2.
TEST(Engine, OutputsDeferredOrOnTheSamplerThreadsMatchTheSerialOnes) {
  auto run = [](std::size_t parallel_rows, bool overlap) {
    EngineOptions o;
    o.parallel_output_rows = parallel_rows;
    o.overlap_outputs = overlap;
    o.sampler_threads = 4;
    auto engine = make_engine(demo(), 256, o);
    std::vector<std::shared_ptr<RequestStream>> streams;
    std::vector<std::int32_t> choices;
    for (int i = 0; i < 30; ++i) {
      auto prompt = demo().tokenizer->encode("<|im_start|>user\nTell me about item " + std::to_string(i) +
                                             ", please.<|im_end|>\n<|im_start|>assistant\n");
      SamplingParams p = greedy(12 + i);
      switch (i % 6) {
        case 1: p.stop = {" the", "."}; break;
        case 2: p.temperature = 0.8, p.seed = i; break;
        case 3: p.ignore_eos = false, p.min_tokens = 3, p.max_tokens = 200; break;  // ends on end-of-sequence
        case 4:  // the tokens of the stop strings above, as stop tokens
          for (const char* t : {" the", "."}) {
            for (auto id : demo().tokenizer->encode(t, {.add_special_tokens = false})) p.stop_token_ids.push_back(id);
          }
          p.min_tokens = 2, p.logprobs = 2;
          break;
        case 5: p.n = 2, p.temperature = 1.0, p.seed = i; break;
        default: break;
      }
      auto sub = engine->submit({.prompt = prompt, .params = p});
      EXPECT_TRUE(sub);
      if (sub) {
        streams.push_back(sub->stream);
        choices.push_back(p.n);
      }
    }
    std::vector<std::vector<Result>> results;
    for (std::size_t k = 0; k < streams.size(); ++k) {
      // n choices share a stream; split their events by choice index.
      std::vector<Result> by_choice(static_cast<std::size_t>(choices[k]));
      StreamEvent e;
      while (streams[k]->next(&e)) add_event(&by_choice.at(static_cast<std::size_t>(e.index)), e);
      results.push_back(std::move(by_choice));
    }
    auto s = engine->stats();
    EXPECT_EQ(s.running, 0);
    EXPECT_DOUBLE_EQ(s.kv_usage, 0.0);
    EXPECT_EQ(s.requests_finished, 35u);
    return results;
  };
  const auto serial = run(1000, false), parallel = run(1, false), deferred = run(1, true);
  ASSERT_EQ(serial.size(), 30u);
  ASSERT_EQ(parallel.size(), 30u);
  ASSERT_EQ(deferred.size(), 30u);
  int stopped = 0, eos = 0, stop_tokens = 0, with_logprobs = 0;
  for (std::size_t i = 0; i < serial.size(); ++i) {
    for (std::size_t c = 0; c < serial[i].size(); ++c) {
      SCOPED_TRACE("request " + std::to_string(i) + " choice " + std::to_string(c));
      const Result& want = serial[i][c];
      for (const auto* got : {&parallel[i][c], &deferred[i][c]}) {
        EXPECT_EQ(got->tokens, want.tokens);
        EXPECT_EQ(got->text, want.text);
        EXPECT_EQ(got->finish, want.finish);
        EXPECT_EQ(got->stop_reason, want.stop_reason);
        EXPECT_EQ(got->completion_tokens, want.completion_tokens);
        if (on_cuda()) {
          // The CUDA backend's sums depend on the batch a row lands in (the three engines batch
          // their arrivals differently), so its log-probabilities agree to rounding, not bit for bit.
          ASSERT_EQ(got->logprobs.size(), want.logprobs.size());
          for (std::size_t t = 0; t < want.logprobs.size(); ++t) EXPECT_NEAR(got->logprobs[t], want.logprobs[t], 1e-4) << t;
        } else {
          EXPECT_EQ(got->logprobs, want.logprobs);
        }
        EXPECT_EQ(got->finish_events, 1);
      }
      EXPECT_EQ(want.completion_tokens, static_cast<std::int64_t>(want.tokens.size()));
      if (want.finish == FinishReason::kLength) {
        EXPECT_EQ(want.text, demo().tokenizer->decode(want.tokens, true));
      }
      stopped += want.finish == FinishReason::kStop && i % 6 == 1;
      eos += want.finish == FinishReason::kStop && i % 6 == 3;
      stop_tokens += !want.stop_reason.empty() && i % 6 == 4;
      with_logprobs += !want.logprobs.empty();
    }
  }
  // Each path ran: a stop string matched, a request ended on end-of-sequence and one on a stop token.
  EXPECT_GT(stopped, 0);
  EXPECT_GT(eos, 0);
  EXPECT_GT(stop_tokens, 0);
  EXPECT_GT(with_logprobs, 0);
}

// Asynchronous scheduling (EngineOptions::async_scheduling) on an asynchronous backend: each
// step is planned while the one before runs, a request that ends (end-of-sequence, a stop token
// or string) has the row planned ahead for it dropped, and rows left to the host (min_tokens,
// penalties, log-probabilities) are sampled before the step planned ahead starts, without the
// placeholder of their own token. Every request's tokens, text and end are those of the engine
// that plans one step at a time, and every block comes back.
TEST(Engine, AsyncSchedulingMatchesOneStepAtATime) {
  auto run = [](bool async, bool plain_only, bool pressed, EngineStats* stats) {
    EngineOptions o;
    o.async_scheduling = async;
    o.parallel_output_rows = 8;  // large steps defer their outputs too
    o.sampler_threads = 2;
    // Pressed: a pool too small for all of them at once, and a swap space for half of it.
    if (pressed) o.swap_space_bytes = 12 * backend::kv_block_bytes(demo().weights->config(), backend::KvDtype::kFloat32, 16);
    auto engine = make_async_engine(demo(), pressed ? 24 : 256, o);
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (int i = 0; i < 30; ++i) {
      auto prompt = demo().tokenizer->encode("<|im_start|>user\nWhat is thing " + std::to_string(i) +
                                             "?<|im_end|>\n<|im_start|>assistant\n");
      SamplingParams p = greedy(6 + i);
      switch (i % 6) {
        case 1: p.ignore_eos = false, p.max_tokens = 200; break;  // ends on end-of-sequence
        case 2:
          for (const char* t : {" the", "."}) {
            for (auto id : demo().tokenizer->encode(t, {.add_special_tokens = false})) p.stop_token_ids.push_back(id);
          }
          break;
        case 3: p.ignore_eos = false, p.min_tokens = 4, p.max_tokens = 200; break;  // kHost rows until min_tokens
        case 4:
          if (!plain_only) p.stop = {" the", "."};
          break;
        case 5:
          if (!plain_only) p.logprobs = 1;
          break;
        default:
          if (!plain_only) p.frequency_penalty = 0.7, p.presence_penalty = 0.3;  // counts the output so far
          break;
      }
      auto sub = engine->submit({.prompt = prompt, .params = p});
      EXPECT_TRUE(sub);
      if (sub) streams.push_back(sub->stream);
    }
    std::vector<Result> results;
    for (auto& st : streams) results.push_back(collect(st));
    *stats = engine->stats();
    EXPECT_EQ(stats->running, 0);
    EXPECT_DOUBLE_EQ(stats->kv_usage, 0.0);
    EXPECT_EQ(stats->requests_finished, 30u);
    return results;
  };
  for (auto [plain_only, pressed] : {std::pair{true, false}, {false, false}, {true, true}, {false, true}}) {
    SCOPED_TRACE(std::string(plain_only ? "device-sampled rows" : "with stop strings, penalties and log-probabilities") +
                 (pressed ? ", preempted" : ""));
    EngineStats one{}, ahead{};
    const auto want = run(false, plain_only, pressed, &one), got = run(true, plain_only, pressed, &ahead);
    ASSERT_EQ(want.size(), 30u);
    ASSERT_EQ(got.size(), 30u);
    int ended_by_token = 0;
    for (std::size_t i = 0; i < want.size(); ++i) {
      SCOPED_TRACE("request " + std::to_string(i));
      EXPECT_EQ(got[i].tokens, want[i].tokens);
      EXPECT_EQ(got[i].text, want[i].text);
      EXPECT_EQ(got[i].finish, want[i].finish);
      EXPECT_EQ(got[i].stop_reason, want[i].stop_reason);
      EXPECT_EQ(got[i].completion_tokens, want[i].completion_tokens);
      EXPECT_EQ(got[i].finish_events, 1);
      if (!on_cuda()) {
        EXPECT_EQ(got[i].logprobs, want[i].logprobs);
      }
      ended_by_token += want[i].finish == FinishReason::kStop && (i % 6 == 1 || i % 6 == 2 || i % 6 == 3);
    }
    EXPECT_GT(ended_by_token, 0) << "some request should end on end-of-sequence or a stop token";
    EXPECT_EQ(one.steps_planned_ahead_total, 0u);
    EXPECT_GT(2 * ahead.steps_planned_ahead_total, ahead.steps_total) << "most steps should be planned ahead";
    EXPECT_LE(ahead.steps_planned_ahead_total, ahead.steps_total);
    if (pressed) {
      EXPECT_GT(ahead.preemptions_total, 0) << "the small pool was meant to preempt";
    }
    // Requests that ended before their max_tokens had a row of the step after computed for nothing.
    EXPECT_GT(ahead.computed_tokens_total, one.computed_tokens_total);
    EXPECT_EQ(ahead.generation_tokens_total, one.generation_tokens_total);
  }
}

TEST(Engine, AbortFinishesOnceAndFreesBlocks) {
  auto engine = make_engine(demo(), 64);
  auto prompt = demo().tokenizer->encode("The hacker", {.add_special_tokens = false});
  auto sub = engine->submit({.prompt = prompt, .params = greedy(800)});
  ASSERT_TRUE(sub);
  StreamEvent e;
  ASSERT_TRUE(sub->stream->next(&e));  // it is running
  engine->abort(sub->id);
  Result r = collect(sub->stream);
  EXPECT_EQ(r.finish, FinishReason::kAbort);
  EXPECT_EQ(r.finish_events, 1);
  auto s = engine->stats();
  EXPECT_EQ(s.running, 0);
  EXPECT_DOUBLE_EQ(s.kv_usage, 0.0);
}

TEST(Engine, BadRequestsAreRejectedWithReasons) {
  EngineOptions o;
  o.scheduler.lanes = {{"high", 0.2, 0.2, 1}, {"low", 0, 0, 1}};
  auto engine = make_engine(demo(), 64, o);
  SamplingParams p = greedy(4);
  auto bad = engine->submit({.prompt = {}, .params = p});
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().status.code(), StatusCode::kInvalidArgument);
  bad = engine->submit({.prompt = {999999}, .params = p});
  EXPECT_FALSE(bad);
  SamplingParams nan = p;
  nan.temperature = std::nan("");
  bad = engine->submit({.prompt = {1, 2}, .params = nan});
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().status.message().find("temperature"), std::string::npos);
  bad = engine->submit({.prompt = {1, 2}, .params = p, .lane = "vip"});
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().status.message().find("unknown lane"), std::string::npos);
  SamplingParams huge = p;
  huge.max_tokens = 5000;
  bad = engine->submit({.prompt = {1, 2}, .params = huge});
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().rejection, Rejection::kExceedsMaxModelLen);
}

// submit_all: every request gets submit()'s result in its place (a bad one its error, the rest
// accepted with ids in order), and one step starts all that were accepted. A long request keeps
// the loop stepping meanwhile; requests submitted one by one are split across steps whenever the
// loop takes the lock between two of them (rarely here: Cli.BenchLatencyAndThroughput... failed
// on it about once in twelve runs). These four, of the same lengths, run together to the end:
// every step runs the long one alone or with all four. Each one's tokens are what it gets alone.
TEST(Engine, SubmitAllStartsEveryAcceptedRequestInOneStep) {
  auto engine = make_engine(demo(), 64);
  auto prompt = [](int i) { return demo().tokenizer->encode("Item " + std::to_string(i) + " is", {.add_special_tokens = false}); };
  auto long_one = engine->submit({.prompt = prompt(9), .params = greedy(300)});
  ASSERT_TRUE(long_one);
  StreamEvent first;
  ASSERT_TRUE(long_one->stream->next(&first));  // the loop is stepping
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < 4; ++i) reqs.push_back({.prompt = prompt(i), .params = greedy(6)});
  reqs.insert(reqs.begin() + 2, GenerateRequest{.prompt = {}, .params = greedy(6)});
  auto subs = engine->submit_all(reqs);
  ASSERT_EQ(subs.size(), 5u);
  ASSERT_FALSE(subs[2]);
  EXPECT_EQ(subs[2].error().status.code(), StatusCode::kInvalidArgument);
  std::vector<Result> results;
  RequestId last = long_one->id;
  for (std::size_t i : {0u, 1u, 3u, 4u}) {
    ASSERT_TRUE(subs[i]) << subs[i].error().status.to_string();
    EXPECT_GT(subs[i]->id, last);
    last = subs[i]->id;
    results.push_back(collect(subs[i]->stream));
  }
  collect(long_one->stream);
  const auto s = engine->stats();
  EXPECT_EQ(s.step_sizes.steps[1], 0u) << "a step ran 2-4 sequences: the four were split";
  EXPECT_GE(s.step_sizes.steps[2], 6u) << "the four ran with the long one";
  auto alone = make_engine(demo(), 64);
  std::size_t k = 0;
  for (std::size_t i : {0u, 1u, 3u, 4u}) {
    auto sub = alone->submit(reqs[i]);
    ASSERT_TRUE(sub);
    EXPECT_EQ(collect(sub->stream).tokens, results[k++].tokens) << i;
  }
}

TEST(Engine, ShutdownRejectsNewWorkAndAbortsTheRest) {
  auto engine = make_engine(demo(), 64);
  auto sub = engine->submit({.prompt = {1, 2, 3}, .params = greedy(800)});
  ASSERT_TRUE(sub);
  engine->shutdown(std::chrono::milliseconds(20));
  Result r = collect(sub->stream);
  EXPECT_EQ(r.finish_events, 1);
  auto late = engine->submit({.prompt = {1, 2, 3}, .params = greedy(4)});
  ASSERT_FALSE(late);
  EXPECT_EQ(late.error().rejection, Rejection::kShuttingDown);
}

// With outputs deferred to the emitter (overlap_outputs, from 2 rows a step): requests that end
// by length while others run, aborts and a shutdown mid-run each end every request exactly once,
// and every block comes back.
TEST(Engine, AbortsAndShutdownWhileOutputsAreDeferred) {
  EngineOptions o;
  o.parallel_output_rows = 1;
  auto engine = make_engine(demo(), 256, o);
  std::vector<Submitted> subs;
  for (int i = 0; i < 8; ++i) {
    auto sub = engine->submit({.prompt = {1, 2, 3, static_cast<std::int32_t>(10 + i)}, .params = greedy(i % 2 == 0 ? 3 : 900)});
    ASSERT_TRUE(sub);
    subs.push_back(*sub);
  }
  std::vector<Result> results(subs.size());
  for (std::size_t i = 0; i < subs.size(); i += 2) results[i] = collect(subs[i].stream);  // the short ones end by length
  engine->abort(subs[1].id);
  engine->abort(subs[0].id);  // ended already: nothing to do
  engine->shutdown(std::chrono::milliseconds(0));
  for (std::size_t i = 1; i < subs.size(); i += 2) results[i] = collect(subs[i].stream);
  for (std::size_t i = 0; i < subs.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    EXPECT_EQ(results[i].finish_events, 1);
    EXPECT_EQ(results[i].finish, i % 2 == 0 ? FinishReason::kLength : FinishReason::kAbort);
    if (i % 2 == 0) {
      EXPECT_EQ(results[i].completion_tokens, 3);
    }
  }
  auto s = engine->stats();
  EXPECT_EQ(s.running, 0);
  EXPECT_DOUBLE_EQ(s.kv_usage, 0.0);
  EXPECT_EQ(s.requests_finished, 8u);
}

}  // namespace
}  // namespace lmserve::engine
