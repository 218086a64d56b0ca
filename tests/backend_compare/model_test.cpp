// Whole models on CUDA. float32: every fixture model matches the transformers fixtures as the
// CPU backend does (last-position logits within 1e-4 relative L2, top-1 at every position,
// the 32-token greedy continuation identical; decode steps run as CUDA graphs). bfloat16:
// logits within 2e-2 relative L2 of float32 and the top-1 token the same at >= 99% of
// positions. A padded multi-sequence graph step against the CPU backend.
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <tuple>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend_sequence.h"
#include "compare_util.h"
#include "test_paths.h"
#include "test_util.h"

namespace lmserve::compare {
namespace {

namespace fs = std::filesystem;
using backend::Backend;
using backend::KvDtype;
using nlohmann::json;

std::unique_ptr<Backend> cuda_backend(std::shared_ptr<const model::ModelWeights> w, KvDtype kv, bool eager = false,
                                      const std::string& tuning_cache = "") {
  backend::CudaBackendOptions o;
  o.tuning_cache = tuning_cache;
  o.kv_dtype = kv;
  o.num_blocks = 64;
  o.max_num_seqs = 8;
  o.max_num_batched_tokens = 512;
  o.max_model_len = 1024;
  o.enforce_eager = eager;
  auto b = backend::make_cuda_backend(std::move(w), o);
  EXPECT_TRUE(b) << b.error().to_string();
  return b ? std::move(*b) : nullptr;
}

using Sequence = lmserve::testing::BackendSequence;

std::int32_t argmax(const float* v, std::int64_t n) { return static_cast<std::int32_t>(std::max_element(v, v + n) - v); }

class CudaModel : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaModel, Float32MatchesTransformersAndBfloat16StaysClose) {
  LMSERVE_REQUIRE_GPU();
  fs::path root = lmserve::testing::source_dir();
  json ref = lmserve::testing::read_json(root / "tests/fixtures/reference" / (GetParam() + ".json"));
  const fs::path dir = root / ref.at("model").get<std::string>();
  auto w32 = model::ModelWeights::load(dir, {.dtype = "float32"});
  auto w16 = model::ModelWeights::load(dir, {.dtype = "bfloat16"});
  ASSERT_TRUE(w32 && w16);
  const std::int64_t V = (*w32)->config().vocab_size;
  std::size_t all_positions = 0, positions = 0, agree = 0;
  for (const auto& c : ref.at("cases")) {
    SCOPED_TRACE(c.at("name").get<std::string>());
    auto b32 = cuda_backend(*w32, KvDtype::kFloat32);
    auto b16 = cuda_backend(*w16, KvDtype::kBFloat16);
    ASSERT_TRUE(b32 && b16);
    auto prompt = c.at("prompt_ids").get<std::vector<std::int32_t>>();
    std::vector<std::int32_t> all(prompt.size());
    for (std::size_t i = 0; i < prompt.size(); ++i) all[i] = static_cast<std::int32_t>(i);
    Sequence s32(*b32), s16(*b16);
    auto l32 = s32.step(prompt, all);
    auto l16 = s16.step(prompt, all);
    auto top5 = c.at("top5_ids").get<std::vector<std::vector<std::int32_t>>>();
    for (std::size_t p = 0; p < prompt.size(); ++p) {
      const float* row = &l32[p * V];
      const std::int32_t top = argmax(row, V), pick16 = argmax(&l16[p * V], V);
      EXPECT_EQ(top, top5[p][0]) << "position " << p;
      // A near tie may go either way under bfloat16's rounding: a position counts only when float32's
      // top-1 leads bfloat16's pick by more than the logits' own bound (2e-2 of the row's RMS).
      double sq = 0;
      for (std::int64_t v = 0; v < V; ++v) sq += static_cast<double>(row[v]) * row[v];
      const double gap = row[top] - row[pick16], tie = 2e-2 * std::sqrt(sq / static_cast<double>(V));
      ++all_positions;
      if (pick16 != top) std::printf("[ top-1 ] position %zu: bf16 %d, fp32 %d, fp32 gap %.4g (near tie below %.4g)\n", p, pick16, top, gap, tie);
      if (pick16 != top && gap <= tie) continue;
      agree += pick16 == top;
      ++positions;
    }
    auto expected = c.at("last_logits").get<std::vector<float>>();
    std::vector<float> last(l32.end() - V, l32.end()), last16(l16.end() - V, l16.end());
    EXPECT_LE(rel_l2(last, expected), 1e-4) << "float32 last-position logits vs transformers";
    EXPECT_LE(rel_l2(last16, last), 2e-2) << "bfloat16 vs float32 logits";
    std::printf("[ rel-L2 ] %s/%s fp32 %.3g, bf16 %.3g\n", GetParam().c_str(), c.at("name").get<std::string>().c_str(),
                rel_l2(last, expected), rel_l2(last16, last));
    auto greedy = c.at("greedy_ids").get<std::vector<std::int32_t>>();
    std::int32_t next = argmax(last.data(), V);
    for (std::size_t i = 0; i < greedy.size(); ++i) {
      ASSERT_EQ(next, greedy[i]) << "greedy token " << i;
      const auto step32 = s32.step({next}, {0});  // a decode step: the bucket-1 graph
      // The same step in bfloat16: one row, so the weight-streaming products with the norms
      // folded into them (Gemm::NormFold).
      EXPECT_LE(rel_l2(s16.step({next}, {0}), step32), 2e-2) << "bfloat16 decode step " << i;
      next = argmax(step32.data(), V);
    }
  }
  EXPECT_GE(static_cast<double>(agree), 0.99 * static_cast<double>(positions)) << "bfloat16 top-1 agreement";
  EXPECT_GE(static_cast<double>(positions), 0.9 * static_cast<double>(all_positions)) << "near ties are rare";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaModel,
                         ::testing::Values("demo", "tiny-llama3", "tiny-llama-linear", "tiny-qwen2", "tiny-qwen3", "tiny-mistral"),
                         lmserve::testing::ParamName());

// Three sequences decoding together run in the 4-sequence graph (one padding row) and give
// the CPU's logits; the same in eager mode. Every KV dtype.
// --tuning-cache (backend/device/tuning_cache.h): the first start times the GEMM algorithms and
// writes them; the second takes them from the file (the same algorithms: the same logits); a
// file whose algorithms cuBLASLt refuses (bytes changed) is not trusted: the plans are timed
// again (written back) and the logits agree with the first start's to the product's rounding.
TEST(CudaBackend, TheTuningCacheIsReusedAndAFalseOneIsNotTrusted) {
  LMSERVE_REQUIRE_GPU();
  const fs::path dir = lmserve::testing::source_dir() / "models/demo";
  const fs::path cache = fs::temp_directory_path() / ("lmserve_tuning_gpu_" + std::to_string(::getpid()));
  fs::remove_all(cache);
  auto w = model::ModelWeights::load(dir, {.dtype = "bfloat16"});
  ASSERT_TRUE(w);
  auto logits_of = [&]() -> std::vector<float> {
    auto b = cuda_backend(*w, KvDtype::kBFloat16, false, cache.string());
    if (!b) return {};
    Sequence seq(*b);
    std::vector<std::int32_t> prompt;
    for (int i = 0; i < 40; ++i) prompt.push_back((i * 37 + 5) % 1000);  // 40 rows: cuBLASLt's products
    return seq.step(prompt, {39});
  };
  const auto first = logits_of();
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(cache)) files.push_back(e.path());
  ASSERT_EQ(files.size(), 1u);
  const json written = json::parse(std::ifstream(files[0]));
  ASSERT_GE(written["plans"].size(), 5u);
  EXPECT_LE(rel_l2(logits_of(), first), 1e-6);
  EXPECT_EQ(json::parse(std::ifstream(files[0]))["plans"], written["plans"]);  // nothing timed, nothing new
  // Every algorithm's bytes replaced by ones no algorithm has.
  json forged = written;
  for (auto& [shape, algo] : forged["plans"].items()) algo = std::string(128, 'f');
  std::ofstream(files[0], std::ios::trunc) << forged.dump();
  const auto again = logits_of();
  EXPECT_LE(rel_l2(again, first), 2e-2);
  EXPECT_EQ(argmax(again.data(), static_cast<std::int64_t>(again.size())), argmax(first.data(), static_cast<std::int64_t>(first.size())));
  const json rewritten = json::parse(std::ifstream(files[0]));
  ASSERT_EQ(rewritten["plans"].size(), written["plans"].size());
  for (const auto& [shape, algo] : rewritten["plans"].items()) EXPECT_NE(algo, std::string(128, 'f')) << shape << ": the forged one kept";
  fs::remove_all(cache);
}

TEST(CudaBackend, PaddedGraphDecodeMatchesTheCpu) {
  LMSERVE_REQUIRE_GPU();
  auto w = model::ModelWeights::load(lmserve::testing::source_dir() / "models/demo", {.dtype = "float32"});
  ASSERT_TRUE(w);
  const std::int64_t V = (*w)->config().vocab_size;
  for (KvDtype kv : {KvDtype::kFloat32, KvDtype::kBFloat16, KvDtype::kFp8E5M2, KvDtype::kFp8E4M3}) {
    for (bool eager : {false, true}) {
      SCOPED_TRACE(std::string(backend::kv_dtype_name(kv)) + (eager ? " eager" : " graphs"));
      auto gpu = cuda_backend(*w, kv, eager);
      ASSERT_TRUE(gpu);
      auto cpu = backend::make_cpu_backend(*w, {.kv = {kv, 16, 64}, .threads = 2});
      ASSERT_TRUE(cpu);
      // Prefill three prompts of different lengths into blocks 0.., 20.., 40.. then decode.
      std::vector<std::vector<std::int32_t>> prompts = {{5, 17, 99, 1000, 3}, {42}, {7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 8}};
      std::vector<std::int32_t> lens, firsts = {0, 20, 40};
      std::vector<std::vector<std::int32_t>> tables(3);
      for (int s = 0; s < 3; ++s) {
        for (int b = 0; b < 4; ++b) tables[static_cast<std::size_t>(s)].push_back(firsts[static_cast<std::size_t>(s)] + b);
      }
      auto run = [&](Backend& b, const std::vector<std::vector<std::int32_t>>& toks, const std::vector<std::int32_t>& start_pos) {
        std::vector<std::int32_t> tokens, positions, rows;
        std::vector<std::int64_t> slots;
        std::vector<backend::SeqBatch> seqs;
        for (std::size_t s = 0; s < toks.size(); ++s) {
          const auto start = static_cast<std::int32_t>(tokens.size());
          for (std::size_t i = 0; i < toks[s].size(); ++i) {
            const std::int32_t p = start_pos[s] + static_cast<std::int32_t>(i);
            tokens.push_back(toks[s][i]);
            positions.push_back(p);
            slots.push_back(static_cast<std::int64_t>(tables[s][static_cast<std::size_t>(p / 16)]) * 16 + p % 16);
          }
          seqs.push_back({start, static_cast<std::int32_t>(toks[s].size()), start_pos[s] + static_cast<std::int32_t>(toks[s].size()), tables[s]});
          rows.push_back(static_cast<std::int32_t>(tokens.size()) - 1);
        }
        std::vector<float> logits(rows.size() * static_cast<std::size_t>(V));
        Status st = b.forward({tokens, positions, slots, seqs, rows}, logits);
        EXPECT_TRUE(st.is_ok()) << st.to_string();
        return logits;
      };
      std::vector<std::int32_t> zero = {0, 0, 0};
      auto g = run(*gpu, prompts, zero);
      auto c = run(**cpu, prompts, zero);
      // A value that lands on a rounding boundary may round the other way on the other device;
      // narrower KV dtypes make such a flip larger. fp8_e4m3 scales are calibrated on each device.
      const double bound = kv == KvDtype::kFloat32 ? 1e-4 : (kv == KvDtype::kBFloat16 ? 1e-3 : (kv == KvDtype::kFp8E5M2 ? 1e-2 : 5e-2));
      EXPECT_LE(rel_l2(g, c), bound) << "prefill";
      std::vector<std::int32_t> pos = {5, 1, 18};
      for (int step = 0; step < 6; ++step) {
        std::vector<std::vector<std::int32_t>> next;
        for (int s = 0; s < 3; ++s) next.push_back({argmax(&c[static_cast<std::size_t>(s) * V], V)});
        g = run(*gpu, next, pos);
        c = run(**cpu, next, pos);
        EXPECT_LE(rel_l2(g, c), bound) << "decode step " << step;
        for (auto& p : pos) ++p;
      }
    }
  }
}

// The swap space on the GPU: blocks copied to pinned host memory and back by the swap kernel
// give the logits of blocks that never moved; those of the overwritten blocks differ. Every KV
// dtype's block size, through graphs and eagerly, bf16 weights (the 8B runs' layout).
TEST(CudaBackend, SwappedBlocksComeBackExactly) {
  LMSERVE_REQUIRE_GPU();
  auto w = model::ModelWeights::load(lmserve::testing::source_dir() / "models/demo", {.dtype = "bfloat16"});
  ASSERT_TRUE(w);
  for (KvDtype kv : {KvDtype::kFloat32, KvDtype::kBFloat16, KvDtype::kFp8E5M2}) {
    for (bool eager : {false, true}) {
      SCOPED_TRACE(std::string(backend::kv_dtype_name(kv)) + (eager ? " eager" : " graphs"));
      auto gpu = cuda_backend(*w, kv, eager);
      ASSERT_TRUE(gpu);
      auto r = lmserve::testing::swap_round_trip(*gpu);
      ASSERT_TRUE(r.error.is_ok()) << r.error.to_string();
      EXPECT_LE(rel_l2(r.swapped, r.direct), 1e-6);
      EXPECT_LE(rel_l2(r.in_one_call, r.direct), 1e-6);
      EXPECT_GT(rel_l2(r.overwritten, r.direct), 1e-3);
      EXPECT_EQ(gpu->host_swap_bytes(), 8 * gpu->kv_block_bytes());
      using Copies = std::vector<backend::BlockCopy>;
      EXPECT_EQ(gpu->swap_blocks(Copies{{64, 0}}, {}).code(), StatusCode::kInvalidArgument);
      EXPECT_EQ(gpu->swap_blocks({}, Copies{{0, 8}}).code(), StatusCode::kInvalidArgument);
    }
  }
}

// The demo model on the GPU with device sampling and small limits, through graphs or eagerly.
Result<std::unique_ptr<Backend>> demo_sampling_gpu(const std::shared_ptr<const model::ModelWeights>& w, bool eager) {
  backend::CudaBackendOptions o;
  o.kv_dtype = KvDtype::kFloat32;
  o.num_blocks = 64;
  o.max_num_seqs = 8;
  o.max_num_batched_tokens = 512;
  o.max_model_len = 1024;
  o.enforce_eager = eager;
  o.device_sampling = true;
  return backend::make_cuda_backend(w, o);
}

// Five sequences of one prompt token each (blocks 0, 4, 8, ... of 16 slots), then one token a
// step: the flattened batch of step `step` (at()).
struct FiveDecodes {
  std::vector<std::vector<std::int32_t>> tables;
  std::vector<std::int32_t> positions, rows = {0, 1, 2, 3, 4};
  std::vector<std::int64_t> slots;
  std::vector<backend::SeqBatch> seqs;
  FiveDecodes() : tables(5) {
    for (int s = 0; s < 5; ++s) {
      for (int b = 0; b < 4; ++b) tables[static_cast<std::size_t>(s)].push_back(s * 4 + b);
    }
  }
  void at(int step) {
    positions.assign(5, step);
    slots.clear();
    seqs.clear();
    for (int s = 0; s < 5; ++s) {
      slots.push_back(static_cast<std::int64_t>(tables[static_cast<std::size_t>(s)][0]) * 16 + step);
      seqs.push_back({s, 1, step + 1, tables[static_cast<std::size_t>(s)]});
    }
  }
  auto batch() const { return std::tie(positions, rows, slots, seqs); }
};

// Device sampling: greedy rows (and random rows with top_k 1) get the CPU's argmax; a step
// whose rows are all decided returns no logits, a step with a host row returns every row's
// logits and leaves that row's token -1 — through graphs and eagerly.
TEST(CudaBackend, DeviceSampledGreedyTokensAreTheCpuArgmax) {
  LMSERVE_REQUIRE_GPU();
  auto w = model::ModelWeights::load(lmserve::testing::source_dir() / "models/demo", {.dtype = "float32"});
  ASSERT_TRUE(w);
  const std::int64_t V = (*w)->config().vocab_size;
  for (bool eager : {false, true}) {
    SCOPED_TRACE(eager ? "eager" : "graphs");
    auto gpu = demo_sampling_gpu(*w, eager);
    ASSERT_TRUE(gpu) << gpu.error().to_string();
    auto cpu = backend::make_cpu_backend(*w, {.kv = {KvDtype::kFloat32, 16, 64}, .threads = 2});
    ASSERT_TRUE(cpu);
    FiveDecodes d;
    std::vector<std::int32_t> next = {11, 222, 3333, 444, 55};
    for (int step = 0; step < 6; ++step) {
      d.at(step);
      const auto& [positions, rows, slots, seqs] = d.batch();
      std::vector<float> cl(5 * static_cast<std::size_t>(V)), gl(cl.size(), 7.0f);
      ASSERT_TRUE((*cpu)->forward({next, positions, slots, seqs, rows}, cl).is_ok());
      using Mode = backend::RowSampling::Mode;
      std::vector<backend::RowSampling> modes(5, {.mode = Mode::kGreedy});
      if (step == 3) modes[2].mode = Mode::kHost;  // a host row: every row's logits come back
      if (step >= 4) modes[1] = {.mode = Mode::kRandom, .temperature = 0.7f, .top_k = 1, .key = 77, .counter = 9};
      std::vector<std::int32_t> picked(5, -1);
      Status st = (*gpu)->forward({next, positions, slots, seqs, rows, modes, picked}, gl);
      ASSERT_TRUE(st.is_ok()) << st.to_string();
      for (int s = 0; s < 5; ++s) {
        const std::int32_t want = argmax(&cl[static_cast<std::size_t>(s) * V], V);
        if (step == 3) {
          EXPECT_EQ(argmax(&gl[static_cast<std::size_t>(s) * V], V), want) << "a mixed step returns logits";
        }
        EXPECT_EQ(picked[static_cast<std::size_t>(s)], step == 3 && s == 2 ? -1 : want) << "step " << step << " row " << s;
        next[static_cast<std::size_t>(s)] = want;
      }
    }
  }
}

// Constrained decoding: masked rows (RowSampling::masked) are decided again once their masks
// arrive (supply_masks between launch and wait): a greedy row gets the CPU's argmax among its
// allowed tokens, a random row a token of its mask, a row of one allowed token that token; the
// other rows are untouched — through graphs and eagerly.
TEST(CudaBackend, MaskedRowsDrawOnlyAllowedTokens) {
  LMSERVE_REQUIRE_GPU();
  auto w = model::ModelWeights::load(lmserve::testing::source_dir() / "models/demo", {.dtype = "float32"});
  ASSERT_TRUE(w);
  const std::int64_t V = (*w)->config().vocab_size;
  const std::size_t words = backend::mask_words(V);
  for (bool eager : {false, true}) {
    SCOPED_TRACE(eager ? "eager" : "graphs");
    auto gpu = demo_sampling_gpu(*w, eager);
    ASSERT_TRUE(gpu) << gpu.error().to_string();
    ASSERT_TRUE((*gpu)->supports_masks());
    auto cpu = backend::make_cpu_backend(*w, {.kv = {KvDtype::kFloat32, 16, 64}, .threads = 2});
    ASSERT_TRUE(cpu);
    FiveDecodes d;
    std::vector<std::int32_t> next = {11, 222, 3333, 444, 55};
    for (int step = 0; step < 5; ++step) {
      d.at(step);
      const auto& [positions, rows, slots, seqs] = d.batch();
      std::vector<float> cl(5 * static_cast<std::size_t>(V)), gl(cl.size());
      ASSERT_TRUE((*cpu)->forward({next, positions, slots, seqs, rows}, cl).is_ok());
      using Mode = backend::RowSampling::Mode;
      // Rows 0, 1 greedy and masked; row 2 random and masked; row 3 greedy, not masked; row 4
      // masked to a single token.
      std::vector<backend::RowSampling> modes(5, {.mode = Mode::kGreedy});
      modes[2] = {.mode = Mode::kRandom, .temperature = 1.0f, .top_p = 0.9f, .key = 5, .counter = static_cast<std::uint32_t>(step)};
      for (int r : {0, 1, 2, 4}) modes[static_cast<std::size_t>(r)].masked = true;
      auto allowed = [&](int r, std::int64_t t) {
        if (r == 4) return t == 100 + step;
        return (t * 7 + r * 13 + step) % (r == 1 ? 97 : 5) == 0;
      };
      std::vector<std::uint64_t> masks;
      for (int r : {0, 1, 2, 4}) {
        std::vector<std::uint64_t> m(words, 0);
        for (std::int64_t t = 0; t < V; ++t) {
          if (allowed(r, t)) m[static_cast<std::size_t>(t) >> 6] |= std::uint64_t{1} << (t & 63);
        }
        masks.insert(masks.end(), m.begin(), m.end());
      }
      std::vector<std::int32_t> picked(5, -1);
      backend::Batch batch{next, positions, slots, seqs, rows, modes, picked};
      ASSERT_TRUE((*gpu)->prepare(batch, gl).is_ok());
      ASSERT_TRUE((*gpu)->launch({}).is_ok());
      Status st = (*gpu)->supply_masks(masks);
      ASSERT_TRUE(st.is_ok()) << st.to_string();
      st = (*gpu)->wait();
      ASSERT_TRUE(st.is_ok()) << st.to_string();
      for (int r = 0; r < 5; ++r) {
        const float* row = &cl[static_cast<std::size_t>(r) * static_cast<std::size_t>(V)];
        std::int32_t want = -1;
        for (std::int64_t t = 0; t < V; ++t) {
          if ((r == 3 || allowed(r, t)) && (want < 0 || row[t] > row[want])) want = static_cast<std::int32_t>(t);
        }
        const std::int32_t got = picked[static_cast<std::size_t>(r)];
        if (r == 2) {
          EXPECT_TRUE(got >= 0 && allowed(2, got)) << "step " << step << ": random row drew " << got;
        } else {
          EXPECT_EQ(got, want) << "step " << step << " row " << r;
        }
      }
      next = {picked[0], picked[1], picked[2], picked[3], picked[4]};
    }
    // A step with masked rows needs its masks: the count must match.
    std::vector<std::int32_t> positions(1, 5), rows = {0}, one = {7};
    std::vector<std::int64_t> slots = {static_cast<std::int64_t>(d.tables[0][0]) * 16 + 5};
    std::vector<backend::SeqBatch> seqs = {{0, 1, 6, d.tables[0]}};
    std::vector<backend::RowSampling> modes = {{.mode = backend::RowSampling::Mode::kGreedy, .masked = true}};
    std::vector<std::int32_t> picked(1, -1);
    std::vector<float> gl(static_cast<std::size_t>(V));
    ASSERT_TRUE((*gpu)->prepare({one, positions, slots, seqs, rows, modes, picked}, gl).is_ok());
    ASSERT_TRUE((*gpu)->launch({}).is_ok());
    std::vector<std::uint64_t> two(2 * words, ~std::uint64_t{0});
    EXPECT_EQ((*gpu)->supply_masks(two).code(), StatusCode::kInvalidArgument);
    std::vector<std::uint64_t> all(words, ~std::uint64_t{0});
    EXPECT_TRUE((*gpu)->supply_masks(all).is_ok());
    EXPECT_TRUE((*gpu)->wait().is_ok());
    EXPECT_GE(picked[0], 0);
  }
}

TEST(CudaBackend, RejectsWhatItWasNotPlannedFor) {
  LMSERVE_REQUIRE_GPU();
  auto w = model::ModelWeights::load(lmserve::testing::source_dir() / "tests/fixtures/models/tiny-mistral", {});
  ASSERT_TRUE(w);
  auto b = cuda_backend(*w, KvDtype::kFloat32);
  ASSERT_TRUE(b);
  std::vector<std::int32_t> tokens(600, 1), positions(600), table;
  std::vector<std::int64_t> slots(600);
  for (int i = 0; i < 600; ++i) {
    positions[static_cast<std::size_t>(i)] = i;
    slots[static_cast<std::size_t>(i)] = i % (64 * 16);
  }
  for (int i = 0; i < 38; ++i) table.push_back(i);
  backend::SeqBatch seq{0, 600, 600, table};
  std::int32_t row = 599;
  std::vector<float> logits(512);
  Status s = b->forward({tokens, positions, slots, std::span<const backend::SeqBatch>(&seq, 1), std::span<const std::int32_t>(&row, 1)}, logits);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << "600 tokens > max_num_batched_tokens 512: " << s.to_string();
  std::vector<std::int32_t> bad = {1, 9999};
  std::vector<std::int32_t> pos2 = {0, 1};
  std::vector<std::int64_t> sl2 = {0, 1};
  backend::SeqBatch s2{0, 2, 2, table};
  EXPECT_EQ(b->forward({bad, pos2, sl2, std::span<const backend::SeqBatch>(&s2, 1), std::span<const std::int32_t>(&row, 0)}, {}).code(),
            StatusCode::kInvalidArgument);
  // Still works after the refusals.
  Sequence seq_ok(*b);
  auto l = seq_ok.step({1, 2, 3}, {2});
  EXPECT_TRUE(std::all_of(l.begin(), l.end(), [](float v) { return std::isfinite(v); }));
}

}  // namespace
}  // namespace lmserve::compare
