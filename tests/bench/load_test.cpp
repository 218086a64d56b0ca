// bench serve's statistics, arrival processes and datasets; plan's arithmetic.
#include "bench/load.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "backend/step_buffers.h"
#include "bench/engine_bench.h"
#include "bench/serve_bench.h"
#include "model/config.h"
#include "plan/plan.h"

namespace lmserve::bench {
namespace {

TEST(Statistics, PercentilesInterpolateLikeNumpy) {
  // numpy.percentile([1..10], q) = 5.5 (50), 9.1 (90), 9.55 (95), 9.91 (99).
  std::vector<double> v = {7, 1, 10, 3, 2, 9, 4, 8, 6, 5};
  EXPECT_DOUBLE_EQ(percentile(v, 50), 5.5);
  EXPECT_NEAR(percentile(v, 90), 9.1, 1e-12);
  EXPECT_NEAR(percentile(v, 95), 9.55, 1e-12);
  EXPECT_NEAR(percentile(v, 99), 9.91, 1e-12);
  EXPECT_DOUBLE_EQ(percentile(v, 0), 1);
  EXPECT_DOUBLE_EQ(percentile(v, 100), 10);
  auto s = summarize(v);
  EXPECT_EQ(s.count, 10u);
  EXPECT_DOUBLE_EQ(s.mean, 5.5);
  EXPECT_DOUBLE_EQ(s.max, 10);
  EXPECT_EQ(summarize({}).count, 0u);
  EXPECT_DOUBLE_EQ(percentile({42}, 99), 42);
}

// Mean gap 1/rate; squared coefficient of variation 1/burstiness (gamma), over 1e5 gaps. The
// bounds are about 4 standard errors of each estimate at burstiness 0.5 (the noisiest case).
TEST(Arrivals, RateAndDispersionMatchTheGammaProcess) {
  for (double b : {1.0, 0.5, 4.0}) {
    Arrivals a(8.0, b, 20261130);
    std::vector<double> g(100000);
    for (auto& x : g) x = a.next_gap();
    const double mean = std::accumulate(g.begin(), g.end(), 0.0) / static_cast<double>(g.size());
    double var = 0;
    for (double x : g) var += (x - mean) * (x - mean);
    var /= static_cast<double>(g.size() - 1);
    EXPECT_NEAR(mean, 1.0 / 8.0, 0.02 / 8.0) << "burstiness " << b;
    EXPECT_NEAR(var / (mean * mean), 1.0 / b, 0.06 / b) << "burstiness " << b;
  }
  Arrivals all(INFINITY, 1.0, 1);
  EXPECT_EQ(all.next_gap(), 0.0);
}

TEST(Datasets, RandomAndMixedLengths) {
  DatasetOptions o;
  o.num_prompts = 1000;
  o.input_len = 100;
  o.output_len = 50;
  auto fixed = make_dataset(o);
  ASSERT_TRUE(fixed);
  EXPECT_TRUE(std::all_of(fixed->begin(), fixed->end(), [](const auto& r) { return r.input_len == 100 && r.output_len == 50; }));
  o.range_ratio = 0.5;
  auto ranged = make_dataset(o);
  ASSERT_TRUE(ranged);
  auto [mi, mo] = mean_lengths(*ranged);
  EXPECT_NEAR(mi, 100, 3);
  EXPECT_TRUE(std::all_of(ranged->begin(), ranged->end(), [](const auto& r) { return r.input_len >= 50 && r.input_len <= 150; }));
  EXPECT_TRUE(std::any_of(ranged->begin(), ranged->end(), [](const auto& r) { return r.input_len != 100; }));

  DatasetOptions m;
  m.name = "mixed";
  m.num_prompts = 100000;
  m.max_input_len = 4096;
  auto mixed = make_dataset(m);
  ASSERT_TRUE(mixed);
  std::vector<double> in, out;
  for (const auto& r : *mixed) {
    in.push_back(static_cast<double>(r.input_len));
    out.push_back(static_cast<double>(r.output_len));
  }
  EXPECT_NEAR(percentile(in, 50), 400, 8) << "median input";
  EXPECT_NEAR(percentile(out, 50), 200, 4) << "median output";
  // Log-normal: the mean sits above the median by exp(sigma^2 / 2) = 1.377 for sigma 0.8.
  EXPECT_NEAR(std::accumulate(in.begin(), in.end(), 0.0) / static_cast<double>(in.size()), 400 * 1.377, 15);
  EXPECT_LE(*std::max_element(in.begin(), in.end()), 4096);
  EXPECT_GE(*std::min_element(in.begin(), in.end()), 4);
  // The same seed, the same requests.
  m.num_prompts = 50;
  auto a = make_dataset(m), b = make_dataset(m);
  for (std::size_t i = 0; i < 50; ++i) EXPECT_EQ((*a)[i].input_len, (*b)[i].input_len);

  DatasetOptions bad;
  bad.name = "nope";
  EXPECT_FALSE(make_dataset(bad));
}

std::filesystem::path write_file(const std::string& name, const std::string& text) {
  auto p = std::filesystem::temp_directory_path() / name;
  std::ofstream(p) << text;
  return p;
}

TEST(Datasets, JsonlTracesAndShareGpt) {
  DatasetOptions o;
  o.name = "jsonl";
  o.path = write_file("lmserve_trace.jsonl", "{\"prompt\": \"hello there\", \"output_len\": 5, \"timestamp\": 0.5}\n\n"
                                             "{\"input_len\": 30, \"output_len\": 7}\n");
  auto t = make_dataset(o);
  ASSERT_TRUE(t) << t.error().to_string();
  ASSERT_EQ(t->size(), 2u);
  EXPECT_EQ((*t)[0].prompt, "hello there");
  EXPECT_DOUBLE_EQ(*(*t)[0].timestamp, 0.5);
  EXPECT_EQ((*t)[1].input_len, 30);
  EXPECT_FALSE((*t)[1].timestamp.has_value());
  o.path = write_file("lmserve_bad.jsonl", "{\"prompt\": \"x\"}\n");
  auto e = make_dataset(o);
  ASSERT_FALSE(e);
  EXPECT_NE(e.error().message().find("lmserve_bad.jsonl:1"), std::string::npos) << e.error().message();

  DatasetOptions s;
  s.name = "sharegpt";
  s.path = write_file("lmserve_sharegpt.json",
                      R"([{"conversations": [{"from": "human", "value": "What is a ledger?"}, {"from": "gpt", "value": "A book of accounts, kept in order."}]},
                          {"conversations": [{"from": "human", "value": "only one turn"}]}])");
  auto g = make_dataset(s);
  ASSERT_TRUE(g) << g.error().to_string();
  ASSERT_EQ(g->size(), 1u);
  EXPECT_EQ((*g)[0].prompt, "What is a ledger?");
  EXPECT_EQ((*g)[0].output_len, 8);  // 34 characters / 4
}

TEST(ServeBench, BaseUrls) {
  auto a = parse_base_url("http://10.0.0.2:9000/prefix/");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->host, "10.0.0.2");
  EXPECT_EQ(a->port, "9000");
  EXPECT_EQ(a->base_path, "/prefix");
  auto b = parse_base_url("https://gateway.bank.internal");
  ASSERT_TRUE(b);
  EXPECT_EQ(b->port, "443");
  EXPECT_FALSE(parse_base_url("ftp://x"));
  EXPECT_FALSE(parse_base_url("http://host:port"));
}

// bench serve --group: a second client group inherits the server, model and headers, replaces
// the lane header, and takes its own arrivals and lengths; anything else is a usage error.
TEST(ServeBench, LoadGroups) {
  ServeBenchOptions base;
  base.model = "m";
  base.api_key = "k";
  base.max_concurrency = 300;
  base.headers = {{"X-Lmserve-Lane", "low"}, {"x-tenant", "t"}};
  auto g = parse_load_group("name=hi,lane=high,num-prompts=40,request-rate=0.5,max-concurrency=1,input-len=300,output-len=64,range-ratio=0.1",
                            base, 7, 2);
  ASSERT_TRUE(g) << g.error().to_string();
  EXPECT_EQ(g->name, "hi");
  EXPECT_EQ(g->lane, "high");
  EXPECT_EQ(g->options.model, "m");
  EXPECT_EQ(g->options.api_key, "k");
  EXPECT_EQ(g->options.headers, (std::vector<std::pair<std::string, std::string>>{{"x-tenant", "t"}, {"x-lmserve-lane", "high"}}));
  EXPECT_DOUBLE_EQ(g->options.request_rate, 0.5);
  EXPECT_EQ(g->options.max_concurrency, 1);
  EXPECT_EQ(g->dataset.name, "random");
  EXPECT_EQ(g->dataset.num_prompts, 40);
  EXPECT_EQ(g->dataset.input_len, 300);
  EXPECT_EQ(g->dataset.output_len, 64);
  EXPECT_DOUBLE_EQ(g->dataset.range_ratio, 0.1);
  EXPECT_EQ(g->dataset.seed, 9u);
  auto d = parse_load_group("lane=x", base, 0, 1);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->name, "group1");
  EXPECT_TRUE(std::isinf(d->options.request_rate));
  EXPECT_EQ(d->options.max_concurrency, 0);
  for (const char* bad : {"lane", "=x", "lane=", "num-prompts=0", "num-prompts=1.5", "request-rate=-1", "max-concurrency=x", "range-ratio=1",
                          "colour=red"}) {
    auto r = parse_load_group(bad, base, 0, 1);
    ASSERT_FALSE(r) << bad;
    EXPECT_NE(r.error().message().find("--group"), std::string::npos) << bad;
  }
}

}  // namespace
}  // namespace lmserve::bench

namespace lmserve::bench {
namespace {

TEST(ModelFlops, LlamaEightBPrefillAndDecodeCountedByHand) {
  auto c = model::load_config(std::filesystem::path(LMSERVE_SOURCE_DIR) / "tests/fixtures/configs/llama-3.1-8b");
  ASSERT_TRUE(c) << c.error().to_string();
  // Per token through the projections: 2 * 32 layers * (4096 * 6144 + 4096 * 4096 + 3 * 4096 * 14336);
  // the LM head 2 * 4096 * 128256; attention 4 * 32 layers * 32 heads * 128 per key of context.
  const double proj = 2.0 * 32 * (4096.0 * 6144 + 4096.0 * 4096 + 3.0 * 4096 * 14336), head = 2.0 * 4096 * 128256, key = 4.0 * 32 * 32 * 128;
  EXPECT_DOUBLE_EQ(proj, 13958643712.0);
  // One 8192-token prefill with one output token: contexts 1 .. 8192.
  ModelFlops f = model_flops(*c, {8192}, {1});
  EXPECT_DOUBLE_EQ(f.matmul, proj * 8192 + head);
  EXPECT_DOUBLE_EQ(f.attention, key * 8192.0 * 8193 / 2);
  EXPECT_NEAR(f.total() / 1e12, 131.9, 0.1);  // 114.4 TFLOP of projections and the head + 17.6 of attention
  // Two requests: 3 in / 2 out (contexts 1..4) and 1 in / 3 out (contexts 1..3).
  f = model_flops(*c, {3, 1}, {2, 3});
  EXPECT_DOUBLE_EQ(f.matmul, proj * (4 + 3) + head * (2 + 3));
  EXPECT_DOUBLE_EQ(f.attention, key * (10 + 6));
}

}  // namespace
}  // namespace lmserve::bench

namespace lmserve::plan {
namespace {

TEST(Plan, KvBytesPerTokenOfTheBenchmarkModels) {
  auto llama = model_preset("llama-3.1-8b");
  auto qwen = model_preset("Qwen2.5-7B");
  ASSERT_TRUE(llama && qwen);
  PlanInput in;
  in.model = *llama;
  in.gpu = *gpu_preset("h200");
  in.concurrency = 64;
  auto r = make_plan(in);
  ASSERT_TRUE(r) << r.error().to_string();
  EXPECT_EQ(r->kv_bytes_per_token, 128u * 1024);
  in.kv_dtype = backend::KvDtype::kFp8E5M2;
  EXPECT_EQ(make_plan(in)->kv_bytes_per_token, 64u * 1024);
  in.model = *qwen;
  in.kv_dtype = backend::KvDtype::kBFloat16;
  EXPECT_EQ(make_plan(in)->kv_bytes_per_token, 56u * 1024);
}

TEST(Plan, WeightsPoolAndGpusByLittlesLaw) {
  PlanInput in;
  in.model = *model_preset("llama-3.1-8b");
  in.gpu = *gpu_preset("H200");
  in.mean_input_len = 1000;
  in.mean_output_len = 1000;
  in.qps = 20;
  in.measured = Measured{2.0, 5000, 10, 32};  // 2 s per request, 5000 tokens/s per replica
  in.redundancy = 1.5;
  auto r = make_plan(in);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->weights_bytes, static_cast<std::uint64_t>(in.model.num_parameters()) * 2);
  // FP8 (issue #34): 6.98e9 projection parameters of one byte and 0.5 MB of scales; the
  // embedding and LM head (2 x 128,256 x 4,096) and the norms stay two bytes.
  PlanInput f = in;
  f.quantization = "fp8";
  const auto& c = in.model;
  EXPECT_EQ(c.num_projection_parameters(), 6979321856);
  EXPECT_EQ(make_plan(f)->weights_bytes,
            static_cast<std::uint64_t>(c.num_projection_parameters() + 4 * c.num_projection_rows() + 2 * (c.num_parameters() - c.num_projection_parameters())));
  // KV pool = 0.9 x 141 GiB - weights - activation reserve, in 128 KiB tokens.
  const double pool = 0.9 * 141 * 1073741824.0 - static_cast<double>(r->weights_per_gpu) - static_cast<double>(r->activation_reserve_per_gpu);
  EXPECT_NEAR(static_cast<double>(r->kv_pool_bytes), pool, 1.0);
  EXPECT_EQ(r->kv_pool_tokens, static_cast<std::int64_t>(pool / 131072.0));
  EXPECT_EQ(r->max_concurrent_seqs, r->kv_pool_tokens / 2000);
  EXPECT_EQ(r->max_num_seqs, 1024);  // serve's default on the H200 (default_batch_limits)
  EXPECT_EQ(r->max_num_batched_tokens, 8192);
  EXPECT_DOUBLE_EQ(r->required_concurrency, 40.0);  // 20 req/s x 2 s
  // Memory allows it on one replica; the measured token rate needs 20 x 1000 x 1.5 / 5000 = 6.
  EXPECT_EQ(r->replicas, 6);
  EXPECT_EQ(r->gpus_needed, 6);
  EXPECT_TRUE(r->fits);
  // 70B in bf16 does not fit one 80 GiB GPU; at TP 4 it does.
  PlanInput big;
  big.model = *model_preset("llama-3.1-70b");
  big.gpu = *gpu_preset("H100");
  big.concurrency = 10;
  EXPECT_FALSE(make_plan(big)->fits);
  big.tensor_parallel_size = 4;
  auto tp = make_plan(big);
  ASSERT_TRUE(tp);
  EXPECT_TRUE(tp->fits);
  EXPECT_EQ(tp->gpus_needed % 4, 0);
  big.tensor_parallel_size = 3;
  EXPECT_FALSE(make_plan(big)) << "3 does not divide 64 heads";
  // 16 GPUs over 8 KV heads: each GPU holds one, so a token's KV across the group is twice the
  // model's, and each GPU's weights carry its KV head's k and v rows.
  big.tensor_parallel_size = 8;
  auto tp8 = make_plan(big);
  big.tensor_parallel_size = 16;
  auto tp16 = make_plan(big);
  ASSERT_TRUE(tp8 && tp16);
  EXPECT_EQ(tp16->kv_bytes_per_token, 2 * tp8->kv_bytes_per_token);
  const auto& m = big.model;
  const double replicated = 2.0 * static_cast<double>(m.num_layers * m.hidden_size * m.head_dim * (16 - m.num_kv_heads)) * 2;  // bf16
  EXPECT_NEAR(static_cast<double>(tp16->weights_per_gpu), (static_cast<double>(tp8->weights_bytes) + replicated) / 16, 1.0);
  PlanInput none;
  none.model = *model_preset("qwen2.5-7b");
  none.gpu = *gpu_preset("A10");
  EXPECT_FALSE(make_plan(none)) << "no target";
  EXPECT_FALSE(gpu_preset("TPU"));
}

// The architecture-only configs that benches load with --load-format dummy have the shapes of
// the planner's presets of the same name.
TEST(Plan, TheBenchConfigsAreThePresets) {
  for (const char* name : {"llama-3.1-8b", "llama-3.1-70b", "qwen2.5-7b"}) {
    SCOPED_TRACE(name);
    auto file = model::load_config(std::filesystem::path(LMSERVE_SOURCE_DIR) / "tests/fixtures/configs" / name);
    auto preset = model_preset(name);
    ASSERT_TRUE(file && preset);
    EXPECT_EQ(file->vocab_size, preset->vocab_size);
    EXPECT_EQ(file->hidden_size, preset->hidden_size);
    EXPECT_EQ(file->intermediate_size, preset->intermediate_size);
    EXPECT_EQ(file->num_layers, preset->num_layers);
    EXPECT_EQ(file->num_heads, preset->num_heads);
    EXPECT_EQ(file->num_kv_heads, preset->num_kv_heads);
    EXPECT_EQ(file->head_dim, preset->head_dim);
    EXPECT_EQ(file->num_parameters(), preset->num_parameters());
  }
}

// The activation reserve is the CUDA backend's step buffers (backend::step_buffer_bytes, which
// the backend allocates from too) for the step's tokens, logits for every sequence, the cuBLASLt
// workspace and 0.5 GiB of context. At the Llama-3.1-8B shape a token's buffers are 144 KiB with
// 16-bit products and Q (220 KiB with float32 products).
TEST(Plan, ActivationReserveIsTheBackendsStepBuffers) {
  const auto per = backend::step_buffer_bytes(4096, 32, 8, 128, 14336, 2, 2);
  EXPECT_EQ(per.residual, 4096u * 4);
  EXPECT_EQ(per.qkv, 6144u * 2);
  EXPECT_EQ(per.q, 4096u * 2);
  EXPECT_EQ(per.gate_up, 2u * 14336 * 2);
  EXPECT_EQ(per.total(), 147456u);
  EXPECT_EQ(backend::step_buffer_bytes(4096, 32, 8, 128, 14336, 2, 4).total(), 225280u);
  // FP8 weights: each product's input also quantized, one byte an element of the widest (the
  // 14,336 of down_proj) and a float32 scale.
  EXPECT_EQ(backend::step_buffer_bytes(4096, 32, 8, 128, 14336, 2, 2, true).total(), 147456u + 14336 + 4);
  PlanInput in;
  in.model = *model_preset("llama-3.1-8b");
  in.gpu = *gpu_preset("H200");
  in.concurrency = 10;
  in.max_num_seqs = 1024;
  in.max_num_batched_tokens = 8192;
  auto r = make_plan(in);
  ASSERT_TRUE(r);
  // 8,192 tokens of step buffers, 1,024 rows of float32 logits (and their sampling copy), 32 MiB
  // of cuBLASLt workspace, 0.5 GiB of context.
  auto reserve = [](double per_token) {
    return static_cast<std::uint64_t>(8192.0 * per_token + 1024.0 * 128256 * 4 * 2 + 32.0 * 1048576 + 0.5 * 1073741824.0);
  };
  EXPECT_EQ(r->activation_reserve_per_gpu, reserve(147456));
  in.quantization = "fp8";
  EXPECT_EQ(make_plan(in)->activation_reserve_per_gpu, reserve(147456 + 14336 + 4));
  in.quantization = "none";
  // Under tensor parallelism a GPU holds its share of the heads and of the MLP.
  in.model = *model_preset("llama-3.1-70b");
  in.tensor_parallel_size = 4;
  auto tp = make_plan(in);
  ASSERT_TRUE(tp);
  const double per70 = static_cast<double>(backend::step_buffer_bytes(8192, 16, 2, 128, 7168, 2, 2).total());
  EXPECT_EQ(tp->activation_reserve_per_gpu, reserve(per70));
}

// A replica runs at most max_num_seqs requests at once, whatever its KV pool holds; the limits
// default to serve's on that GPU, and the activation reserve grows with them (step buffers for
// the token limit, logits for every sequence).
TEST(Plan, ConcurrencyIsCappedByTheBatchLimitsServeRunsWith) {
  PlanInput in;
  in.model = *model_preset("llama-3.1-8b");
  in.gpu = *gpu_preset("H200");
  in.mean_input_len = 128;
  in.mean_output_len = 128;
  in.concurrency = 4000;
  auto r = make_plan(in);
  ASSERT_TRUE(r);
  EXPECT_GT(r->kv_pool_tokens / 256, 1024);  // memory would hold more than 1,024 such requests
  EXPECT_EQ(r->max_concurrent_seqs, 1024);
  EXPECT_EQ(r->replicas, 6);  // ceil(4000 x 1.5 / 1024)
  ASSERT_FALSE(r->notes.empty());
  EXPECT_NE(r->notes.front().find("--max-num-seqs"), std::string::npos) << r->notes.front();
  in.max_num_seqs = 64;
  auto small = make_plan(in);
  ASSERT_TRUE(small);
  EXPECT_EQ(small->max_concurrent_seqs, 64);
  EXPECT_LT(small->activation_reserve_per_gpu, r->activation_reserve_per_gpu);  // 64 logits rows, not 1,024
  in.max_num_seqs = 0;
  in.gpu = *gpu_preset("A100-80G");  // vLLM's rule leaves the A100 at 256 / 2,048
  auto a100 = make_plan(in);
  ASSERT_TRUE(a100);
  EXPECT_EQ(a100->max_num_seqs, 256);
  EXPECT_EQ(a100->max_num_batched_tokens, 2048);
  EXPECT_EQ(a100->max_concurrent_seqs, 256);
  in.max_num_seqs = -1;
  EXPECT_FALSE(make_plan(in));
}

}  // namespace
}  // namespace lmserve::plan
