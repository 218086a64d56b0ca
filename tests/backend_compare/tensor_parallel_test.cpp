// Tensor parallelism on CUDA (issue #36): TP 2 and TP 4 against TP 1 on the GPU. The ranks may
// share a GPU (CudaBackendOptions::devices), so the whole path — shards, the one-shot all-reduce
// and the logits' gather over peer pointers, a thread per rank, graphs — runs on a one-GPU machine
// too; what a second GPU adds is NVLink between them. float32: every fixture model's logits over a
// prefill and decode steps within float32 rounding of TP 1 and the greedy continuation the same,
// through graphs and eagerly; bfloat16, narrow KV caches, FP8 weights (against the CPU's TP 2,
// whose ranks quantize their shares the same way), device sampling and the swap space.
#include <gtest/gtest.h>

#include <stdlib.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend_sequence.h"
#include "compare_util.h"
#include "test_paths.h"
#include "test_util.h"

namespace lmserve::compare {
namespace {

using backend::Backend;
using backend::KvDtype;

// The ranks here share GPU 0, which needs CUDA to load every module when this process first
// touches the GPU (cuda/comm/tp_group.h), before any test runs.
[[maybe_unused]] const bool kEagerModules = setenv("CUDA_MODULE_LOADING", "EAGER", 1) == 0;

std::shared_ptr<const model::ModelWeights> load(const std::string& name, const std::string& dtype, const std::string& quantization = "none") {
  const auto root = lmserve::testing::source_dir();
  const auto dir = name == "demo" ? root / "models/demo" : root / "tests/fixtures/models" / name;
  auto w = model::ModelWeights::load(dir, {.dtype = dtype, .quantization = quantization});
  EXPECT_TRUE(w) << w.error().to_string();
  return w ? *w : nullptr;
}

// TP ranks all on GPU 0 (or one rank), small limits, 64 blocks each.
std::unique_ptr<Backend> gpu_backend(std::shared_ptr<const model::ModelWeights> w, int tp, KvDtype kv, bool eager, bool sampling = false) {
  backend::CudaBackendOptions o;
  o.tensor_parallel_size = tp;
  o.devices.assign(static_cast<std::size_t>(tp), 0);
  o.kv_dtype = kv;
  o.num_blocks = 64;
  o.max_num_seqs = 8;
  o.max_num_batched_tokens = 512;
  o.max_model_len = 1024;
  o.enforce_eager = eager;
  o.device_sampling = sampling;
  auto b = backend::make_cuda_backend(std::move(w), o);
  EXPECT_TRUE(b) << b.error().to_string();
  return b ? std::move(*b) : nullptr;
}

using Pass = lmserve::testing::GreedyPass;
using lmserve::testing::argmax_of;
Pass run(Backend& b, int steps, const std::vector<std::int32_t>* fed = nullptr) { return lmserve::testing::greedy_pass(b, steps, fed); }

// The worst relative L2 over every logits row of `got` against `want`.
double worst(const Pass& got, const Pass& want, std::int64_t V) {
  double w = 0;
  for (std::size_t p = 0; p * V < want.prefill.size(); ++p) {
    const auto at = static_cast<std::ptrdiff_t>(p * V), end = static_cast<std::ptrdiff_t>((p + 1) * V);
    w = std::max(w, rel_l2(std::vector<float>(got.prefill.begin() + at, got.prefill.begin() + end),
                           std::vector<float>(want.prefill.begin() + at, want.prefill.begin() + end)));
  }
  for (std::size_t s = 0; s < want.decode.size(); ++s) w = std::max(w, rel_l2(got.decode[s], want.decode[s]));
  return w;
}

struct Case {
  std::string model, dtype = "float32";
  KvDtype kv = KvDtype::kFloat32;
  double tolerance = 1e-5;
  bool same_greedy = true;
};

class CudaTensorParallel : public ::testing::TestWithParam<Case> {};

TEST_P(CudaTensorParallel, MatchesOneRank) {
  LMSERVE_REQUIRE_GPU();
  const Case& c = GetParam();
  auto w = load(c.model, c.dtype);
  ASSERT_TRUE(w);
  const std::int64_t V = w->config().vocab_size;
  for (bool eager : {true, false}) {
    auto one = gpu_backend(w, 1, c.kv, eager);
    ASSERT_TRUE(one);
    const Pass want = run(*one, 24);
    for (int tp : {2, 4}) {
      SCOPED_TRACE("TP " + std::to_string(tp) + (eager ? " eager" : " graphs"));
      auto b = gpu_backend(w, tp, c.kv, eager);
      ASSERT_TRUE(b);
      const double bad = worst(run(*b, 24, &want.greedy), want, V);
      EXPECT_LE(bad, c.tolerance);
      if (c.same_greedy) {
        EXPECT_EQ(run(*b, 24).greedy, want.greedy);
      }
      std::printf("[ cuda tp ] %s %s kv %s TP %d %s: worst rel-L2 %.3g\n", c.model.c_str(), c.dtype.c_str(), std::string(backend::kv_dtype_name(c.kv)).c_str(),
                  tp, eager ? "eager" : "graphs", bad);
    }
  }
}

// bf16 products round each rank's partial sum before the all-reduce adds them (TP 1 rounds the
// whole sum once): logits within bf16's rounding. A narrow KV cache rounds values that differ in
// the last float32 bit to neighbouring codes now and then (e4m3's scales are calibrated per rank).
INSTANTIATE_TEST_SUITE_P(Fixtures, CudaTensorParallel,
                         ::testing::Values(Case{"demo"}, Case{"tiny-llama3"}, Case{"tiny-llama-linear"}, Case{"tiny-qwen2"}, Case{"tiny-qwen3"},
                                           Case{"tiny-mistral"}, Case{"demo", "bfloat16", KvDtype::kBFloat16, 3e-2, false},
                                           Case{"demo", "float32", KvDtype::kFp8E5M2, 2e-2, false}, Case{"demo", "float32", KvDtype::kFp8E4M3, 2e-2, false}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           std::string n = i.param.model + "_" + i.param.dtype + "_" + std::string(backend::kv_dtype_name(i.param.kv));
                           for (char& ch : n) ch = std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
                           return n;
                         });

// FP8 weights: a rank quantizes its share of o's and down's inputs per token with its own scale,
// as the CPU's ranks do, so CUDA TP 2 is held to the CPU's TP 2 as CUDA TP 1 is to the CPU's TP 1
// (fp8_test.cpp: 0.1 relative L2).
TEST(CudaTensorParallel, Fp8WeightsMatchTheCpusRanks) {
  LMSERVE_REQUIRE_GPU();
  auto w = load("demo", "bfloat16", "fp8");
  ASSERT_TRUE(w && w->fp8());
  auto cpu = backend::make_cpu_backend(w, {.kv = {KvDtype::kFloat32, 16, 64}, .threads = 2, .tensor_parallel_size = 2});
  ASSERT_TRUE(cpu);
  const Pass want = run(**cpu, 8);
  for (bool eager : {true, false}) {
    SCOPED_TRACE(eager ? "eager" : "graphs");
    auto b = gpu_backend(w, 2, KvDtype::kFloat32, eager);
    ASSERT_TRUE(b);
    const double bad = worst(run(*b, 8, &want.greedy), want, w->config().vocab_size);
    EXPECT_LE(bad, 0.1);
    std::printf("[ cuda tp ] demo fp8 TP 2 %s against the CPU's TP 2: worst rel-L2 %.3g\n", eager ? "eager" : "graphs", bad);
  }
}

// Rank 0 samples from the gathered logits: greedy rows get TP 1's argmax; five sequences decode
// in one graph step.
TEST(CudaTensorParallel, DeviceSamplingOnRankZero) {
  LMSERVE_REQUIRE_GPU();
  auto w = load("demo", "float32");
  ASSERT_TRUE(w);
  const std::int64_t V = w->config().vocab_size;
  for (bool eager : {true, false}) {
    SCOPED_TRACE(eager ? "eager" : "graphs");
    auto one = gpu_backend(w, 1, KvDtype::kFloat32, eager);
    auto two = gpu_backend(w, 2, KvDtype::kFloat32, eager, true);
    ASSERT_TRUE(one && two);
    std::vector<std::int32_t> next = {11, 222, 3333, 444, 55};
    for (int step = 0; step < 6; ++step) {
      std::vector<std::int32_t> positions(5, step), rows = {0, 1, 2, 3, 4};
      std::vector<std::int64_t> slots;
      std::vector<std::vector<std::int32_t>> tables(5);
      std::vector<backend::SeqBatch> seqs;
      for (int s = 0; s < 5; ++s) {
        tables[static_cast<std::size_t>(s)] = {s * 4};
        slots.push_back(static_cast<std::int64_t>(s * 4) * 16 + step);
      }
      for (int s = 0; s < 5; ++s) seqs.push_back({s, 1, step + 1, tables[static_cast<std::size_t>(s)]});
      std::vector<float> ref(5 * static_cast<std::size_t>(V)), got(ref.size());
      ASSERT_TRUE(one->forward({next, positions, slots, seqs, rows}, ref).is_ok());
      std::vector<backend::RowSampling> modes(5, {.mode = backend::RowSampling::Mode::kGreedy});
      std::vector<std::int32_t> picked(5, -1);
      const Status st = two->forward({next, positions, slots, seqs, rows, modes, picked}, got);
      ASSERT_TRUE(st.is_ok()) << st.to_string();
      for (int s = 0; s < 5; ++s) {
        const std::int32_t want = argmax_of(&ref[static_cast<std::size_t>(s) * V], V);
        EXPECT_EQ(picked[static_cast<std::size_t>(s)], want) << "step " << step << " row " << s;
        next[static_cast<std::size_t>(s)] = want;
      }
    }
  }
}

// Every rank's part of a block goes to the host swap space and back.
TEST(CudaTensorParallel, SwappedBlocksComeBackExactly) {
  LMSERVE_REQUIRE_GPU();
  auto w = load("demo", "bfloat16");
  ASSERT_TRUE(w);
  auto one = gpu_backend(w, 1, KvDtype::kBFloat16, false);
  auto four = gpu_backend(w, 4, KvDtype::kBFloat16, false);
  ASSERT_TRUE(one && four);
  EXPECT_EQ(four->kv_block_bytes(), 2 * one->kv_block_bytes());  // 2 KV heads, each on two of the 4 ranks
  auto r = lmserve::testing::swap_round_trip(*four);
  ASSERT_TRUE(r.error.is_ok()) << r.error.to_string();
  EXPECT_EQ(r.swapped, r.direct);
  EXPECT_EQ(r.in_one_call, r.direct);
  EXPECT_NE(r.overwritten, r.direct);
}

}  // namespace
}  // namespace lmserve::compare
