// FP8 weights on CUDA (issue #34) against the CPU reference: the per-token quantization of the
// activations bit for bit, every FP8 product form (the weight-streaming kernel at one or two
// rows, cuBLASLt's FP8 tensor cores with outer-vector scales otherwise) against the CPU's
// matmul of e4m3 weights, and whole models quantized with --quantization fp8 (prefill, decode
// through graphs and eagerly) against the CPU backend.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/model/cuda_ops.h"
#include "backend_sequence.h"
#include "compare_util.h"
#include "test_paths.h"

namespace lmserve::compare {
namespace {

namespace ops = cuda::ops;

class Fp8Ops : public ::testing::TestWithParam<Act> {};

// Rows of `out` quantized per token on the device: the scales and e4m3 bytes the CPU
// reference gives for the same rows, exactly.
void expect_quantized_as_the_cpu(const std::vector<float>& out, int rows, int k, const std::vector<std::uint8_t>& xq, const std::vector<float>& xs) {
  std::vector<float> want_q(out.size()), want_s(static_cast<std::size_t>(rows));
  backend::cpu::quantize_rows_fp8(out.data(), rows, k, want_q.data(), want_s.data());
  EXPECT_EQ(xs, want_s);
  std::size_t differ = 0;
  for (std::size_t i = 0; i < xq.size(); ++i) differ += fp8_e4m3_to_float(xq[i]) != want_q[i];
  EXPECT_EQ(differ, 0u);
}

// Rows of x in act: the device's scales and e4m3 bytes are the CPU's exactly (both divide the
// same act-rounded values by the same max / 448 and round to nearest even, saturating). A row of
// zeros has scale 1; a row with one huge value saturates nothing (it sets the scale). The widths
// take each of the kernel's forms: rows held in registers in 4 or 16 groups, or read twice.
TEST_P(Fp8Ops, ActivationsQuantizePerTokenAsTheCpu) {
  LMSERVE_REQUIRE_GPU();
  const Act act = GetParam();
  std::mt19937 rng(34);
  for (auto [n, k] : {std::pair{1, 16}, {2, 4096}, {5, 14336}, {64, 272}, {300, 4096}, {3, 4112}, {2, 17408}}) {
    SCOPED_TRACE(std::to_string(n) + "x" + std::to_string(k));
    auto x = random_vec(rng, static_cast<std::size_t>(n) * k, -3, 3);
    std::fill(x.begin(), x.begin() + k, 0.0f);  // row 0: zeros
    if (n > 1) x[static_cast<std::size_t>(k) + 3] = 1000.0f;
    x = rounded(act, x);
    std::vector<std::uint8_t> xq;
    std::vector<float> xs;
    ASSERT_EQ(ops::quantize_rows_fp8(act, x, n, k, &xq, &xs), "");
    expect_quantized_as_the_cpu(x, n, k, xq, xs);
    EXPECT_EQ(xs[0], 1.0f);
  }
}

// The norm before an FP8 product quantizes its own output (one kernel instead of two): the
// bytes and scales are those of quantizing the norm's act-rounded output, exactly. H = 17,408
// takes the kernel's path that does not hold the row in registers.
TEST_P(Fp8Ops, TheNormQuantizesItsOutputAsTheCpu) {
  LMSERVE_REQUIRE_GPU();
  const Act act = GetParam();
  std::mt19937 rng(36);
  for (auto [R, H] : {std::pair{1, 4096}, {2, 64}, {7, 1024}, {3, 17408}}) {
    SCOPED_TRACE(std::to_string(R) + "x" + std::to_string(H));
    auto x = random_vec(rng, static_cast<std::size_t>(R) * H, -4, 4);
    const auto delta = random_vec(rng, x.size(), -1, 1);
    const auto w = random_vec(rng, static_cast<std::size_t>(H), -2, 2);
    std::vector<float> out;
    std::vector<std::uint8_t> xq;
    std::vector<float> xs;
    ASSERT_EQ(ops::add_rmsnorm(act, &x, &delta, nullptr, R, H, w, 1e-5f, &out, &xq, &xs), "");
    expect_quantized_as_the_cpu(out, R, H, xq, xs);
  }
}

// The SiLU kernel before down_proj quantizes its own output where cuBLASLt ran gate/up: the
// bytes and scales of quantizing its act-rounded output, exactly, as two kernels gave them.
TEST_P(Fp8Ops, TheSiluQuantizesItsOutputAsTheCpu) {
  LMSERVE_REQUIRE_GPU();
  const Act act = GetParam();
  std::mt19937 rng(37);
  for (auto [T, I] : {std::pair{3, 14336}, {64, 768}, {1, 16}, {300, 1024}}) {
    SCOPED_TRACE(std::to_string(T) + "x" + std::to_string(I));
    const auto gu = rounded(act, random_vec(rng, static_cast<std::size_t>(T) * 2 * I, -6, 6));
    std::vector<float> out, plain;
    std::vector<std::uint8_t> xq;
    std::vector<float> xs;
    ASSERT_EQ(ops::silu_mul(act, gu, T, I, &out, &xq, &xs), "");
    ASSERT_EQ(ops::silu_mul(act, gu, T, I, &plain), "");
    EXPECT_EQ(out, plain) << "the same output as the kernel that does not quantize";
    expect_quantized_as_the_cpu(out, T, I, xq, xs);
  }
}

// y = x W^T for W in e4m3 with a scale per row: both sides sum the same exact e4m3 products
// (the weight-streaming kernel in float32 like the CPU: ~1e-7 apart on the H200; cuBLASLt's FP8
// tensor cores in narrower steps: ~2.3e-4), so the bound is 1e-3 relative L2, where a wrong
// scale or a missed row is O(1).
TEST_P(Fp8Ops, ProductsMatchTheCpu) {
  LMSERVE_REQUIRE_GPU();
  const Act act = GetParam();
  std::mt19937 rng(35);
  ThreadPool pool(2);
  for (auto [m, n, k] : {std::tuple{64, 1, 64}, {4096, 1, 4096}, {4100, 2, 1024}, {300, 2, 14336}, {6144, 64, 4096}, {512, 5, 256}, {256, 19, 768},
                         {1536, 300, 256}, {4096, 3, 14336}, {128, 3, 256}, {96, 3, 256}, {1000, 33, 512}, {256, 300, 768}}) {
    const std::string shape = std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k);
    SCOPED_TRACE(shape);
    std::vector<std::uint8_t> wq(static_cast<std::size_t>(m) * k);
    for (auto& b : wq) {
      b = static_cast<std::uint8_t>(rng());
      if ((b & 0x7F) == 0x7F) b ^= 1;  // e4m3 has no infinity; 0x7F / 0xFF are NaN
    }
    // Scales small enough that gate x up stays within float16 at k = 14,336.
    const auto ws = random_vec(rng, static_cast<std::size_t>(m), 1e-4f, 1e-3f);
    const auto x = rounded(act, random_vec(rng, static_cast<std::size_t>(n) * k, -2, 2));
    model::Tensor wt{model::DType::kF8E4M3, {m, k}, wq.data(), "w", ws.data(), m};
    std::vector<float> want(static_cast<std::size_t>(n) * m);
    backend::cpu::matmul(pool, x.data(), n, k, wt, nullptr, want.data(), m);
    for (bool prepare : {false, true}) {
      SCOPED_TRACE(prepare ? "prepared" : "planned on first use");
      std::vector<float> got;
      std::string e = ops::gemm_fp8(act, wq, ws, x, m, n, k, ops::Fp8Product::kF32, prepare, &got);
      std::printf("[ fp8 ] %s %s%s float32 out: %s rel-L2 %.3g\n", act_name(act), shape.c_str(), prepare ? " prepared" : "", e.c_str(),
                  e.empty() ? rel_l2(got, want) : -1.0);
      EXPECT_EQ(e, "");
      if (!e.empty()) continue;
      EXPECT_LE(rel_l2(got, want), 1e-3);
      e = ops::gemm_fp8(act, wq, ws, x, m, n, k, ops::Fp8Product::kAct, prepare, &got);
      EXPECT_EQ(e, "");
      EXPECT_LE(rel_l2(got, rounded(act, want)), std::max(tolerance(act), 1e-3)) << "output in the act's dtype";
      std::printf("[ fp8 ] %s %s act out: %s rel-L2 %.3g\n", act_name(act), shape.c_str(), e.c_str(), rel_l2(got, rounded(act, want)));
      auto y = random_vec(rng, want.size(), -3, 3);
      std::vector<float> want_add(want.size());
      for (std::size_t i = 0; i < want.size(); ++i) want_add[i] = y[i] + want[i];
      e = ops::gemm_fp8(act, wq, ws, x, m, n, k, ops::Fp8Product::kAdd, prepare, &y);
      EXPECT_EQ(e, "");
      EXPECT_LE(rel_l2(y, want_add), 1e-3) << "added into y";
      std::printf("[ fp8 ] %s %s added: %s rel-L2 %.3g\n", act_name(act), shape.c_str(), e.c_str(), rel_l2(y, want_add));
      if (m % 2 == 0) {
        const int I = m / 2;
        std::vector<float> gate_up_silu, want_gu(static_cast<std::size_t>(n) * I);
        e = ops::gemm_fp8(act, wq, ws, x, m, n, k, ops::Fp8Product::kGateUpSilu, prepare, &gate_up_silu);
        EXPECT_EQ(e, "");
        for (int t = 0; t < n; ++t) {
          const float* row = &want[static_cast<std::size_t>(t) * m];
          backend::cpu::silu_mul(row, row + I, I, &want_gu[static_cast<std::size_t>(t) * I]);
        }
        EXPECT_LE(rel_l2(gate_up_silu, rounded(act, want_gu)), std::max(tolerance(act), 1e-3)) << "gate / up and SiLU";
        std::printf("[ fp8 ] %s %s gate/up: %s rel-L2 %.3g\n", act_name(act), shape.c_str(), e.c_str(), rel_l2(gate_up_silu, rounded(act, want_gu)));
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, Fp8Ops, ::testing::Values(kF32, kBF16, kF16),
                         [](const ::testing::TestParamInfo<Act>& p) { return std::string(act_name(p.param)); });

// The demo model quantized at load (--quantization fp8) on both backends: prompts of 5, 2 and 19
// tokens (cuBLASLt at 5 and 19, the weight-streaming kernel at 2), then decode steps of one row
// (the weight-streaming kernel), through graphs and eagerly. The products agree to ~2e-4 (the
// tensor cores' FP8 sums against the CPU's exact ones, ProductsMatchTheCpu), but quantizing the
// activations amplifies that: a value within 2e-4 of an e4m3 rounding boundary lands on the
// other side, a 1/16 change of that element, and such flips compound through the layers (with
// float32 activations the two-token prefill, where no flip happened, agreed to 3e-7). So the
// logits are held to 0.1 relative L2: a wrong scale, row or token is O(1). The model's accuracy
// under FP8 is held by the perplexity test (Engine.Fp8WeightsKeepHeldOutPerplexityWithinOnePercent,
// on CUDA too).
TEST(CudaBackend, Fp8WeightsMatchTheCpu) {
  LMSERVE_REQUIRE_GPU();
  for (const char* dtype : {"float32", "bfloat16"}) {
    auto w = model::ModelWeights::load(lmserve::testing::source_dir() / "models/demo", {.dtype = dtype, .quantization = "fp8"});
    ASSERT_TRUE(w) << w.error().to_string();
    ASSERT_TRUE((*w)->fp8());
    const double bound = 0.1;
    for (bool eager : {false, true}) {
      SCOPED_TRACE(std::string(dtype) + (eager ? " eager" : " graphs"));
      backend::CudaBackendOptions o;
      o.kv_dtype = backend::KvDtype::kFloat32;
      o.num_blocks = 64;
      o.max_num_seqs = 8;
      o.max_num_batched_tokens = 512;
      o.max_model_len = 1024;
      o.enforce_eager = eager;
      auto gpu = backend::make_cuda_backend(*w, o);
      ASSERT_TRUE(gpu) << gpu.error().to_string();
      auto cpu = backend::make_cpu_backend(*w, {.kv = {backend::KvDtype::kFloat32, 16, 64}, .threads = 2});
      ASSERT_TRUE(cpu);
      using Sequence = lmserve::testing::BackendSequence;
      std::vector<std::vector<std::int32_t>> prompts = {{5, 17, 99, 1000, 3}, {42, 43}, {7, 7, 7, 7, 7, 7, 7, 7, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17}};
      for (const auto& prompt : prompts) {
        Sequence g(**gpu), c(**cpu);
        std::vector<std::int32_t> last = {static_cast<std::int32_t>(prompt.size()) - 1};
        auto lg = g.step(prompt, last);
        auto lc = c.step(prompt, last);
        EXPECT_LE(rel_l2(lg, lc), bound) << "prefill";
        std::printf("[ fp8 model ] %s prefill of %zu: rel-L2 %.3g\n", dtype, prompt.size(), rel_l2(lg, lc));
        for (int step = 0; step < 4; ++step) {
          const auto next = static_cast<std::int32_t>(std::max_element(lc.begin(), lc.end()) - lc.begin());
          lg = g.step({next}, {0});
          lc = c.step({next}, {0});
          EXPECT_LE(rel_l2(lg, lc), bound) << "decode step " << step;
        }
      }
    }
  }
}

}  // namespace
}  // namespace lmserve::compare
