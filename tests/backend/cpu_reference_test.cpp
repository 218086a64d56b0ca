// The CPU reference backend against Hugging Face transformers (tests/fixtures/reference):
// float32 KV, whole-prompt prefill and token-by-token decode through the paged cache.
// Logits of the last prompt position within 1e-4 relative L2, the top-1 of every position
// and the 32-token greedy continuation identical.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "backend_sequence.h"
#include "test_paths.h"
#include "test_util.h"

namespace lmserve::backend {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using SingleSequence = lmserve::testing::BackendSequence;

std::int32_t argmax(const float* v, std::int64_t n) { return static_cast<std::int32_t>(std::max_element(v, v + n) - v); }

class CpuMatchesTransformers : public ::testing::TestWithParam<std::string> {};

TEST_P(CpuMatchesTransformers, LogitsAndGreedy) {
  fs::path root = lmserve::testing::source_dir();
  std::ifstream in(root / "tests/fixtures/reference" / (GetParam() + ".json"));
  json ref = json::parse(in);
  auto weights = model::ModelWeights::load(root / ref.at("model").get<std::string>(), {});
  ASSERT_TRUE(weights) << weights.error().to_string();
  const std::int64_t V = (*weights)->config().vocab_size;

  for (const auto& c : ref.at("cases")) {
    SCOPED_TRACE(c.at("name").get<std::string>());
    auto backend = make_cpu_backend(*weights, {.kv = {KvDtype::kFloat32, 16, 64}, .threads = 2});
    ASSERT_TRUE(backend) << backend.error().to_string();
    SingleSequence seq(**backend);
    auto prompt = c.at("prompt_ids").get<std::vector<std::int32_t>>();
    std::vector<std::int32_t> all(prompt.size());
    for (std::size_t i = 0; i < prompt.size(); ++i) all[i] = static_cast<std::int32_t>(i);
    auto logits = seq.step(prompt, all);

    auto top5 = c.at("top5_ids").get<std::vector<std::vector<std::int32_t>>>();
    for (std::size_t p = 0; p < prompt.size(); ++p) EXPECT_EQ(argmax(&logits[p * V], V), top5[p][0]) << "position " << p;

    auto expected = c.at("last_logits").get<std::vector<double>>();
    const float* last = &logits[(prompt.size() - 1) * V];
    double num = 0, den = 0;
    for (std::int64_t i = 0; i < V; ++i) {
      num += (last[i] - expected[i]) * (last[i] - expected[i]);
      den += expected[i] * expected[i];
    }
    EXPECT_LE(std::sqrt(num / den), 1e-4) << "relative L2 error of the last-position logits";
    std::printf("[ rel-L2 ] %s/%s %.3g\n", GetParam().c_str(), c.at("name").get<std::string>().c_str(), std::sqrt(num / den));

    auto greedy = c.at("greedy_ids").get<std::vector<std::int32_t>>();
    std::int32_t next = argmax(last, V);
    for (std::size_t i = 0; i < greedy.size(); ++i) {
      ASSERT_EQ(next, greedy[i]) << "greedy token " << i;
      next = argmax(seq.step({next}, {0}).data(), V);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CpuMatchesTransformers,
                         ::testing::Values("demo", "tiny-llama3", "tiny-llama-linear", "tiny-qwen2", "tiny-qwen3", "tiny-mistral"),
                         lmserve::testing::ParamName());

}  // namespace
}  // namespace lmserve::backend

namespace lmserve::backend {
namespace {

TEST(CpuBackend, NarrowKvDtypesStayCloseToFloat32) {
  auto weights = model::ModelWeights::load(lmserve::testing::source_dir() / "models/demo", {});
  ASSERT_TRUE(weights);
  const std::int64_t V = (*weights)->config().vocab_size;
  std::vector<std::int32_t> prompt;
  for (int i = 0; i < 100; ++i) prompt.push_back((i * 37 + 11) % 5000);
  auto last_logits = [&](KvDtype d) {
    auto b = make_cpu_backend(*weights, {.kv = {d, 16, 16}, .threads = 2});
    EXPECT_TRUE(b) << b.error().to_string();
    SingleSequence seq(**b);
    return seq.step(prompt, {static_cast<std::int32_t>(prompt.size() - 1)});
  };
  auto ref = last_logits(KvDtype::kFloat32);
  for (auto [d, bound] : {std::pair{KvDtype::kBFloat16, 0.02}, {KvDtype::kFloat16, 0.005}, {KvDtype::kFp8E4M3, 0.1},
                          {KvDtype::kFp8E5M2, 0.15}}) {
    auto got = last_logits(d);
    double num = 0, den = 0;
    for (std::int64_t i = 0; i < V; ++i) {
      num += (got[i] - ref[i]) * (got[i] - ref[i]);
      den += ref[i] * ref[i];
    }
    EXPECT_LT(std::sqrt(num / den), bound) << kv_dtype_name(d);
    EXPECT_GT(std::sqrt(num / den), 0.0) << kv_dtype_name(d) << " should differ from float32 at all";
  }
}

// The swap space gives back exactly what it took, for every KV dtype.
TEST(CpuBackend, SwappedBlocksComeBackExactly) {
  auto weights = model::ModelWeights::load(lmserve::testing::source_dir() / "tests/fixtures/models/tiny-mistral", {});
  ASSERT_TRUE(weights);
  for (KvDtype d : {KvDtype::kFloat32, KvDtype::kBFloat16, KvDtype::kFp8E5M2}) {
    SCOPED_TRACE(std::string(kv_dtype_name(d)));
    auto b = make_cpu_backend(*weights, {.kv = {d, 16, 12}, .threads = 2});
    ASSERT_TRUE(b);
    auto r = lmserve::testing::swap_round_trip(**b);
    ASSERT_TRUE(r.error.is_ok()) << r.error.to_string();
    EXPECT_EQ(r.swapped, r.direct);
    EXPECT_EQ(r.in_one_call, r.direct);
    EXPECT_NE(r.overwritten, r.direct);
    EXPECT_EQ((*b)->host_swap_bytes(), 8 * (*b)->kv_block_bytes());  // one chunk, 8 blocks
  }
}

TEST(CpuBackend, SwapsOutsideTheCacheOrTheSwapSpaceAreRejected) {
  auto weights = model::ModelWeights::load(lmserve::testing::source_dir() / "tests/fixtures/models/tiny-mistral", {});
  ASSERT_TRUE(weights);
  auto b = make_cpu_backend(*weights, {.kv = {KvDtype::kFloat32, 4, 4}, .threads = 1});
  ASSERT_TRUE(b);
  using Copies = std::vector<BlockCopy>;
  EXPECT_EQ((*b)->swap_blocks(Copies{{0, 0}}, {}).code(), StatusCode::kInvalidArgument);  // no swap space yet
  ASSERT_TRUE((*b)->set_host_blocks(2).is_ok());
  EXPECT_TRUE((*b)->swap_blocks(Copies{{3, 1}}, Copies{{0, 1}}).is_ok());
  EXPECT_EQ((*b)->swap_blocks(Copies{{4, 0}}, {}).code(), StatusCode::kInvalidArgument);   // device block
  EXPECT_EQ((*b)->swap_blocks({}, Copies{{0, 2}}).code(), StatusCode::kInvalidArgument);   // host block
  EXPECT_EQ((*b)->swap_blocks({}, Copies{{-1, 0}}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*b)->host_swap_bytes(), 2 * (*b)->kv_block_bytes());
}

TEST(CpuBackend, MalformedBatchesAreRejected) {
  auto weights = model::ModelWeights::load(lmserve::testing::source_dir() / "tests/fixtures/models/tiny-mistral", {});
  ASSERT_TRUE(weights);
  auto b = make_cpu_backend(*weights, {.kv = {KvDtype::kFloat32, 4, 4}, .threads = 1});
  ASSERT_TRUE(b);
  std::vector<std::int32_t> table = {0, 1};
  auto run = [&](std::vector<std::int32_t> tokens, std::vector<std::int32_t> pos, std::vector<std::int64_t> slots,
                 std::int32_t ctx, std::vector<std::int32_t> rows) {
    SeqBatch s{0, static_cast<std::int32_t>(tokens.size()), ctx, table};
    std::vector<float> logits(rows.size() * 512);
    return (*b)->forward({tokens, pos, slots, std::span<const SeqBatch>(&s, 1), rows}, logits);
  };
  EXPECT_TRUE(run({1, 2}, {0, 1}, {0, 1}, 2, {1}).is_ok());
  EXPECT_FALSE(run({1, 9999}, {0, 1}, {0, 1}, 2, {1}).is_ok());    // token id
  EXPECT_FALSE(run({1, 2}, {0, 1}, {0, 99}, 2, {1}).is_ok());      // slot outside the cache
  EXPECT_FALSE(run({1, 2}, {0, 5}, {0, 1}, 2, {1}).is_ok());       // position past the context
  EXPECT_FALSE(run({1, 2}, {0, 1}, {0, 1}, 9, {1}).is_ok());       // context beyond the block table
  EXPECT_FALSE(run({1, 2}, {0, 1}, {0, 1}, 2, {7}).is_ok());       // logits row
  EXPECT_FALSE(make_cpu_backend(*weights, {.kv = {KvDtype::kFloat32, 0, 4}}));
  EXPECT_FALSE(make_cpu_backend(*weights, {.kv = {KvDtype::kFp8E4M3, 4, 4}, .k_scales = {1.0f}, .v_scales = {1.0f}}));
}

}  // namespace
}  // namespace lmserve::backend
