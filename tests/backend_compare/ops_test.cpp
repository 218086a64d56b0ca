// Every CUDA op against the CPU op of the same name (backend/cpu/cpu_ops.h) on fresh random
// inputs, sweeping dtype x batch x block size x GQA ratio x head dim x context length. Inputs
// in the model dtype are rounded to it first, so both sides see the same numbers; outputs are
// poisoned before each run (cuda_ops.h), so an unwritten element fails the bound.
// Bounds: float32 1e-5 relative L2, bfloat16/float16 1e-2 (compare_util.h: tolerance()).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/model/cuda_ops.h"
#include "compare_util.h"

namespace lmserve::compare {
namespace {

using backend::KvDtype;
namespace ops = cuda::ops;

model::Tensor f32_tensor(const std::vector<float>& v) { return model::Tensor{model::DType::kF32, {static_cast<std::int64_t>(v.size())}, v.data(), "t"}; }

class ActOps : public ::testing::TestWithParam<Act> {};

TEST_P(ActOps, Embed) {
  LMSERVE_REQUIRE_GPU();
  const Act act = GetParam();
  const int V = 300, H = 96;
  std::mt19937 rng(1);
  auto table = rounded(act, random_vec(rng, static_cast<std::size_t>(V * H)));
  std::vector<std::int32_t> tokens = {0, 299, 17, 17, 150};
  std::vector<float> got;
  ASSERT_EQ(ops::embed(act, table, H, tokens, &got), "");
  std::vector<float> want;
  for (auto t : tokens) want.insert(want.end(), table.begin() + t * H, table.begin() + (t + 1) * H);
  EXPECT_EQ(got, want);  // a gather is exact
}

TEST_P(ActOps, AddRmsNorm) {
  LMSERVE_REQUIRE_GPU();
  const Act act = GetParam();
  std::mt19937 rng(2);
  for (int H : {64, 198, 200, 4096, 4100, 20000}) {  // 198: not float4; 20000: the row re-read
    for (int T : {1, 7}) {
      SCOPED_TRACE("H=" + std::to_string(H) + " T=" + std::to_string(T));
      auto x = random_vec(rng, static_cast<std::size_t>(T * H), -3, 3), delta = rounded(act, random_vec(rng, x.size()));  // as a product leaves it
      auto w = rounded(act, random_vec(rng, static_cast<std::size_t>(H), 0.5f, 1.5f));
      auto gx = x;
      std::vector<float> got;
      ASSERT_EQ(ops::add_rmsnorm(act, &gx, &delta, nullptr, T, H, w, 1e-5f, &got), "");
      std::vector<float> want(x.size()), cx = x;
      auto wt = f32_tensor(w);
      for (int t = 0; t < T; ++t) {
        for (int i = 0; i < H; ++i) cx[t * H + i] += delta[t * H + i];
        backend::cpu::rms_norm(&cx[t * H], wt, 1e-5f, H, &want[t * H]);
      }
      EXPECT_LE(rel_l2(gx, cx), 1e-6) << "the residual sum";
      EXPECT_LE(rel_l2(got, rounded(act, want)), tolerance(act));
      // Picking rows (the final norm over sampled positions only).
      std::vector<std::int32_t> rows = {T - 1, 0};
      auto gx2 = cx;
      ASSERT_EQ(ops::add_rmsnorm(act, &gx2, nullptr, &rows, 2, H, w, 1e-5f, &got), "");
      std::vector<float> want2(static_cast<std::size_t>(2 * H));
      backend::cpu::rms_norm(&cx[(T - 1) * H], wt, 1e-5f, H, &want2[0]);
      backend::cpu::rms_norm(&cx[0], wt, 1e-5f, H, &want2[H]);
      EXPECT_LE(rel_l2(got, rounded(act, want2)), tolerance(act));
    }
  }
}

TEST_P(ActOps, Gemm) {
  LMSERVE_REQUIRE_GPU();
  const Act act = GetParam();
  std::mt19937 rng(3);
  // n <= 2 with k % 8 == 0 takes the weight-streaming kernel for 16-bit dtypes (on the H200 with
  // 1, 2, 4 or 8 warps per row pair: 7001, 4101, 2001 and 301 rows; its two-buffer loop at two
  // rows and at k = 14336, one buffer at one row otherwise); the rest cuBLASLt.
  for (auto [m, n, k] : {std::tuple{64, 1, 64}, {96, 5, 200}, {1000, 33, 256}, {384, 64, 1024}, {8, 3, 16}, {4103, 8, 4096}, {4101, 2, 4096}, {301, 2, 1000},
                         {77, 7, 3000}, {33, 4, 20}, {5, 1, 14336}, {2001, 1, 4104}, {7001, 2, 520}, {7001, 1, 8}}) {
    SCOPED_TRACE(std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k));
    auto w = rounded(act, random_vec(rng, static_cast<std::size_t>(m * k)));
    auto x = rounded(act, random_vec(rng, static_cast<std::size_t>(n * k)));
    std::vector<float> got, want(static_cast<std::size_t>(n * m));
    ASSERT_EQ(ops::gemm(act, w, x, m, n, k, &got), "");
    ThreadPool pool(2);
    model::Tensor wt{model::DType::kF32, {m, k}, w.data(), "w"};
    backend::cpu::matmul(pool, x.data(), n, k, wt, nullptr, want.data(), m);
    // Both accumulate in float32 from identical inputs; only the summation order differs.
    EXPECT_LE(rel_l2(got, want), 1e-5);
    // The layer products' form: the output rounded once to the act's dtype.
    ASSERT_EQ(ops::gemm(act, w, x, m, n, k, &got, true), "");
    EXPECT_LE(rel_l2(got, rounded(act, want)), std::max(tolerance(act) / 10, 1e-5)) << "output in the act's dtype";
    // The residual's form (run_add): the float32 sum added into y in the product's epilogue,
    // with the plan timed as run_add runs it or made on first use.
    const auto y0 = random_vec(rng, want.size(), -3, 3);
    std::vector<float> want_add(want.size());
    for (std::size_t i = 0; i < want.size(); ++i) want_add[i] = y0[i] + want[i];
    for (bool prepare : {false, true}) {
      auto y = y0;
      ASSERT_EQ(ops::gemm_add(act, w, x, m, n, k, prepare, &y), "");
      EXPECT_LE(rel_l2(y, want_add), 1e-5) << "added into y" << (prepare ? " (prepared)" : "");
    }
  }
}

// A step's token count changes from step to step; the products' cuBLASLt plans are per bucket
// of counts (powers of two and 1.5x them), made at start-up (Gemm::prepare), and each run sets
// its own count on the bucket's layouts. Every count gives the CPU's product (with prepare(), by
// the algorithm timed fastest for its bucket), and after prepare() no count makes a plan (none
// queries the heuristic in a step).
TEST_P(ActOps, GemmPlansAreSharedByTokenCountsOfABucket) {
  LMSERVE_REQUIRE_GPU();
  const Act act = GetParam();
  std::mt19937 rng(4);
  const int m = 200, k = 136;
  const std::vector<int> ns = {40, 33, 48, 47, 100, 97, 130, 3, 700, 513, 49, 16, 17};
  const int max_n = 700;
  auto w = rounded(act, random_vec(rng, static_cast<std::size_t>(m * k)));
  auto x = rounded(act, random_vec(rng, static_cast<std::size_t>(max_n * k)));
  std::vector<float> want(static_cast<std::size_t>(max_n) * m);
  ThreadPool pool(2);
  model::Tensor wt{model::DType::kF32, {m, k}, w.data(), "w"};
  backend::cpu::matmul(pool, x.data(), max_n, k, wt, nullptr, want.data(), m);
  for (bool prepare : {false, true}) {
    SCOPED_TRACE(prepare ? "prepared" : "made on first use");
    std::vector<std::vector<float>> got;
    int prepared = 0, total = 0;
    ASSERT_EQ(ops::gemm_series(act, w, x, m, k, ns, prepare, &got, &prepared, &total), "");
    ASSERT_EQ(got.size(), ns.size());
    for (std::size_t i = 0; i < ns.size(); ++i) {
      SCOPED_TRACE("n = " + std::to_string(ns[i]));
      const std::vector<float> want_n(want.begin(), want.begin() + static_cast<std::ptrdiff_t>(ns[i]) * m);
      EXPECT_LE(rel_l2(got[i], want_n), 1e-5);
    }
    // Buckets up to 768: 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768 (n = 3 is the
    // weight-streaming kernel's for 16-bit dtypes, cuBLASLt's bucket 16 for float32).
    if (prepare) {
      EXPECT_EQ(prepared, 12);
      EXPECT_EQ(total, prepared);
    } else {
      EXPECT_EQ(total, 7);  // 48 (40, 33, 48, 47), 128 (100, 97), 192, 768 (700, 513), 64, 16 (16; 3 in float32), 24
    }
  }
}

TEST_P(ActOps, GateUpSilu) {
  LMSERVE_REQUIRE_GPU();
  const Act act = GetParam();
  std::mt19937 rng(5);
  // n <= 2: one weight-streaming pass for 16-bit dtypes (1, 2, 4, 8 warps per row pair by the
  // output count on the H200: 7001, 4100, 2000, 300); n = 3, 64 and float32: cuBLASLt into the
  // act's dtype, then SiLU x mul (the CPU keeps gate and up in float32: within the tolerance).
  for (auto [I, n, k] : {std::tuple{300, 1, 512}, {2000, 2, 1000}, {4100, 1, 4096}, {7001, 2, 264}, {301, 3, 640}, {1024, 64, 640}, {64, 1, 8}}) {
    SCOPED_TRACE(std::to_string(I) + "x" + std::to_string(n) + "x" + std::to_string(k));
    auto w = rounded(act, random_vec(rng, static_cast<std::size_t>(2 * I) * k));
    auto x = rounded(act, random_vec(rng, static_cast<std::size_t>(n) * k));
    std::vector<float> got, gu(static_cast<std::size_t>(n) * 2 * I), want(static_cast<std::size_t>(n) * I);
    ASSERT_EQ(ops::gate_up_silu(act, w, x, I, n, k, &got), "");
    ThreadPool pool(2);
    model::Tensor wt{model::DType::kF32, {2 * I, k}, w.data(), "w"};
    backend::cpu::matmul(pool, x.data(), n, k, wt, nullptr, gu.data(), 2 * I);
    for (int t = 0; t < n; ++t) backend::cpu::silu_mul(&gu[static_cast<std::size_t>(t) * 2 * I], &gu[static_cast<std::size_t>(t) * 2 * I + I], I, &want[static_cast<std::size_t>(t) * I]);
    EXPECT_LE(rel_l2(got, rounded(act, want)), std::max(tolerance(act), 1e-5));
  }
}

// A norm folded into the products around it at one or two rows (Gemm::NormFold): the product
// before adds into the residual and leaves g = x * w with partial sums of squares, the products
// after scale their sums by the norm's inverse RMS. Against the CPU's add, RMSNorm (rounded to
// act, as the norm kernel leaves it) and products: only act's rounding falls elsewhere.
TEST_P(ActOps, NormFoldedIntoTheProductsAroundIt) {
  LMSERVE_REQUIRE_GPU();
  const Act act = GetParam();
  if (act == kF32) GTEST_SKIP() << "the weight-streaming kernel takes 16-bit rows only";
  std::mt19937 rng(11);
  const float eps = 1e-5f;
  // H = 4096 after an o_proj-like (k 4096) and a down-like product (k 14336: the two-buffer
  // loop); H = 520 and 1000 leave part-empty blocks; m2 as QKV's 6144 and small ones.
  for (auto [H, k1, m2, I, n] : {std::tuple{4096, 4096, 6144, 1000, 1}, {4096, 14336, 512, 600, 2}, {520, 264, 72, 40, 2}, {1000, 8, 24, 8, 1}}) {
    SCOPED_TRACE("H=" + std::to_string(H) + " k1=" + std::to_string(k1) + " m2=" + std::to_string(m2) + " I=" + std::to_string(I) + " n=" + std::to_string(n));
    const auto N = static_cast<std::size_t>(n);
    auto x = random_vec(rng, N * H, -3, 3);
    auto nw = rounded(act, random_vec(rng, static_cast<std::size_t>(H), 0.5f, 1.5f));
    auto w1 = rounded(act, random_vec(rng, static_cast<std::size_t>(H) * k1)), a1 = rounded(act, random_vec(rng, N * k1));
    auto w2 = rounded(act, random_vec(rng, static_cast<std::size_t>(m2) * H)), wgu = rounded(act, random_vec(rng, static_cast<std::size_t>(2 * I) * H));
    auto gx = x;
    std::vector<float> y0, y1, gu;
    ASSERT_EQ(ops::norm_fold(act, &gx, nw, w1, a1, k1, w2, m2, wgu, I, n, H, eps, &y0, &y1, &gu), "");
    ThreadPool pool(2);
    auto product = [&](const std::vector<float>& in, int k, const std::vector<float>& w, int m) {
      std::vector<float> out(N * m);
      model::Tensor wt{model::DType::kF32, {m, k}, w.data(), "w"};
      backend::cpu::matmul(pool, in.data(), n, k, wt, nullptr, out.data(), m);
      return out;
    };
    auto normed = [&](const std::vector<float>& xs) {
      std::vector<float> h(N * H);
      auto wt = f32_tensor(nw);
      for (std::size_t t = 0; t < N; ++t) backend::cpu::rms_norm(&xs[t * H], wt, eps, H, &h[t * H]);
      return rounded(act, h);
    };
    auto want_x = x;
    const auto delta = product(a1, k1, w1, H);
    for (std::size_t i = 0; i < want_x.size(); ++i) want_x[i] += delta[i];
    const auto h1 = normed(want_x);
    const auto g = product(h1, H, wgu, 2 * I);
    std::vector<float> want_gu(N * I);
    for (std::size_t t = 0; t < N; ++t) backend::cpu::silu_mul(&g[t * 2 * I], &g[t * 2 * I + I], I, &want_gu[t * I]);
    EXPECT_LE(rel_l2(gx, want_x), 1e-5) << "the residual sum";
    EXPECT_LE(rel_l2(y0, product(normed(x), H, w2, m2)), tolerance(act)) << "the chain's start";
    EXPECT_LE(rel_l2(y1, product(h1, H, w2, m2)), tolerance(act)) << "after the producer";
    EXPECT_LE(rel_l2(gu, rounded(act, want_gu)), tolerance(act)) << "gated";
  }
}

TEST_P(ActOps, SiluMul) {
  LMSERVE_REQUIRE_GPU();
  const Act act = GetParam();
  const int T = 5;
  std::mt19937 rng(4);
  for (int I : {300, 302}) {  // the four-wide kernel, and the one for sizes it does not divide
    SCOPED_TRACE("I = " + std::to_string(I));
    auto gu = rounded(act, random_vec(rng, static_cast<std::size_t>(T * 2 * I), -6, 6));  // gu in act, as the GEMM writes it
    std::vector<float> got, want(static_cast<std::size_t>(T * I));
    ASSERT_EQ(ops::silu_mul(act, gu, T, I, &got), "");
    for (int t = 0; t < T; ++t) backend::cpu::silu_mul(&gu[t * 2 * I], &gu[t * 2 * I + I], I, &want[t * I]);
    EXPECT_LE(rel_l2(got, rounded(act, want)), tolerance(act));
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ActOps, ::testing::Values(kF32, kBF16, kF16),
                         [](const ::testing::TestParamInfo<Act>& p) { return std::string(act_name(p.param)); });

// ---- the KV cache: RoPE + write, and paged attention -------------------------------------

struct KvCase {
  KvDtype kv;
  int block_size, group, head_dim;
};

std::string kv_case_name(const ::testing::TestParamInfo<KvCase>& i) {
  return std::string(backend::kv_dtype_name(i.param.kv)) + "_bs" + std::to_string(i.param.block_size) + "_gqa" +
         std::to_string(i.param.group) + "_d" + std::to_string(i.param.head_dim);
}

std::vector<KvCase> kv_cases() {
  std::vector<KvCase> out;
  for (auto kv : {KvDtype::kFloat32, KvDtype::kBFloat16, KvDtype::kFloat16, KvDtype::kFp8E5M2, KvDtype::kFp8E4M3}) {
    for (int bs : {16, 32}) {
      for (int g : {1, 4, 8}) {
        for (int d : {64, 128}) out.push_back({kv, bs, g, d});
      }
    }
    // Groups of 9-16 heads (the tensor-core decode kernel's rows; the tiled kernel's otherwise).
    for (int d : {64, 128}) out.push_back({kv, 16, 16, d});
  }
  return out;
}

// The error a KV dtype adds on top of the act bound (values are rounded once more).
double kv_tolerance(KvDtype kv, Act act) {
  switch (kv) {
    case KvDtype::kFloat32: return tolerance(act);
    case KvDtype::kBFloat16:
    case KvDtype::kFloat16: return std::max(tolerance(act), 1e-2);
    default: return 0.1;
  }
}

struct Cache {
  backend::cpu::KvLayer layer;
  ops::KvCacheHost host;
};

// A cache of `blocks` blocks for nkv heads, poisoned (0xFF), with scales for e4m3.
Cache make_cache(const KvCase& c, int nkv, int blocks, std::mt19937& rng) {
  Cache out;
  const std::size_t bytes = static_cast<std::size_t>(blocks) * c.block_size * nkv * c.head_dim * backend::kv_dtype_bytes(c.kv);
  out.host.kv = c.kv;
  out.host.block_size = c.block_size;
  out.host.k.assign(bytes, 0xFF);
  out.host.v.assign(bytes, 0xFF);
  if (c.kv == KvDtype::kFp8E4M3) {
    out.host.k_scale = random_vec(rng, static_cast<std::size_t>(nkv), 0.004f, 0.01f);
    out.host.v_scale = random_vec(rng, static_cast<std::size_t>(nkv), 0.004f, 0.01f);
  }
  return out;
}

backend::cpu::KvLayer view(Cache& c, const KvCase& k, int nkv) {
  return backend::cpu::KvLayer{reinterpret_cast<std::byte*>(c.host.k.data()), reinterpret_cast<std::byte*>(c.host.v.data()), k.kv, nkv,
                               k.head_dim, k.block_size, c.host.k_scale, c.host.v_scale};
}

class KvOps : public ::testing::TestWithParam<KvCase> {};

TEST_P(KvOps, QkvRopeWritesTheCache) {
  LMSERVE_REQUIRE_GPU();
  const KvCase c = GetParam();
  const int nkv = 2, nh = nkv * c.group, D = c.head_dim;
  std::mt19937 rng(5 + c.block_size + D + c.group);
  model::ModelConfig cfg;
  cfg.head_dim = D;
  cfg.rope_theta = 500000;
  cfg.rope_scaling = {model::RopeScaling::Type::kLlama3, 8.0, 1.0, 4.0, 64};
  // Llama; then Qwen2 bias + Qwen3 q/k norm; each with 11 tokens (a token's heads over several
  // blocks) and 600 (one block per token: kernels.cuh, kRopeTokensPerBlock = 512).
  for (int run = 0; run < 4; ++run) {
    const int variant = run % 2, T = run < 2 ? 11 : 600, blocks = (T + c.block_size - 1) / c.block_size + 1;
    SCOPED_TRACE(std::string(variant == 0 ? "plain" : "bias + qk norm") + ", " + std::to_string(T) + " tokens");
    for (Act act : {kF32, kBF16}) {
      SCOPED_TRACE(act_name(act));
      ops::QkvRopeInput in;
      in.nh = nh;
      in.nkv = nkv;
      in.D = D;
      in.qkv = rounded(act, random_vec(rng, static_cast<std::size_t>(T * (nh + 2 * nkv) * D), -2, 2));  // as the QKV product leaves it
      in.inv_freq = backend::rope_inv_freq(cfg);
      if (variant == 1) {
        in.bias = rounded(act, random_vec(rng, static_cast<std::size_t>((nh + 2 * nkv) * D)));
        in.q_norm = rounded(act, random_vec(rng, static_cast<std::size_t>(D), 0.5f, 1.5f));
        in.k_norm = rounded(act, random_vec(rng, static_cast<std::size_t>(D), 0.5f, 1.5f));
      }
      std::vector<std::int32_t> slots_order(static_cast<std::size_t>(blocks * c.block_size));
      std::iota(slots_order.begin(), slots_order.end(), 0);
      std::shuffle(slots_order.begin(), slots_order.end(), rng);
      for (int t = 0; t < T; ++t) {
        in.positions.push_back(t * 397 % 5000);  // far apart positions, large angles
        in.slots.push_back(t == 3 ? -1 : slots_order[static_cast<std::size_t>(t)]);  // -1: padding, not written
      }
      Cache gpu = make_cache(c, nkv, blocks, rng), cpu = gpu;
      std::vector<float> q;
      ASSERT_EQ(ops::qkv_rope(act, in, &gpu.host, &q), "");

      // The CPU: bias (added by its matmul), q/k norm, RoPE, write_kv.
      const int W = (nh + 2 * nkv) * D;
      std::vector<float> want_q(static_cast<std::size_t>(T * nh * D));
      auto qn = f32_tensor(in.q_norm), kn = f32_tensor(in.k_norm);
      auto L = view(cpu, c, nkv);
      for (int t = 0; t < T; ++t) {
        std::vector<float> row(in.qkv.begin() + t * W, in.qkv.begin() + (t + 1) * W);
        if (!in.bias.empty()) {
          for (int i = 0; i < W; ++i) row[static_cast<std::size_t>(i)] += in.bias[static_cast<std::size_t>(i)];
        }
        for (int h = 0; h < nh + nkv; ++h) {
          float* v = &row[static_cast<std::size_t>(h * D)];
          if (!in.q_norm.empty()) backend::cpu::rms_norm(v, h < nh ? qn : kn, 1e-6f, D, v);
          backend::cpu::apply_rope(v, D, in.positions[static_cast<std::size_t>(t)], in.inv_freq);
        }
        std::copy(row.begin(), row.begin() + nh * D, want_q.begin() + t * nh * D);
        if (in.slots[static_cast<std::size_t>(t)] >= 0) {
          backend::cpu::write_kv(L, in.slots[static_cast<std::size_t>(t)], &row[static_cast<std::size_t>(nh * D)],
                                 &row[static_cast<std::size_t>((nh + nkv) * D)]);
        }
      }
      // Q in the act's dtype: the float32 result rounded once.
      EXPECT_LE(rel_l2(q, rounded(act, want_q)), std::max(tolerance(act) / 10, 1e-5));
      // The caches: the same slots written (the rest still poison), values within the dtype's rounding.
      std::vector<float> gk, ck;
      std::size_t mismatched_poison = 0;
      const int eb = backend::kv_dtype_bytes(c.kv);
      for (std::size_t i = 0; i < gpu.host.k.size(); i += static_cast<std::size_t>(eb)) {
        const bool gpoison = std::all_of(&gpu.host.k[i], &gpu.host.k[i] + eb, [](auto b) { return b == 0xFF; });
        const bool cpoison = std::all_of(&cpu.host.k[i], &cpu.host.k[i] + eb, [](auto b) { return b == 0xFF; });
        mismatched_poison += gpoison != cpoison;
      }
      EXPECT_EQ(mismatched_poison, 0u) << "the CUDA op wrote other slots than the CPU op";
      // Dequantise both caches through the CPU attention-free path: compare raw decoded values.
      for (std::size_t i = 0; i < gpu.host.k.size() / static_cast<std::size_t>(eb); ++i) {
        auto decode = [&](const std::vector<std::uint8_t>& bytes) {
          const std::uint8_t* p = &bytes[i * static_cast<std::size_t>(eb)];
          switch (c.kv) {
            case KvDtype::kFloat32: {
              float f;
              std::memcpy(&f, p, 4);
              return f;
            }
            case KvDtype::kBFloat16: return bf16_to_float(static_cast<std::uint16_t>(p[0] | p[1] << 8));
            case KvDtype::kFloat16: return f16_to_float(static_cast<std::uint16_t>(p[0] | p[1] << 8));
            case KvDtype::kFp8E5M2: return fp8_e5m2_to_float(p[0]);
            case KvDtype::kFp8E4M3: return fp8_e4m3_to_float(p[0]);
          }
          return 0.0f;
        };
        const float g = decode(gpu.host.k), cc = decode(cpu.host.k);
        if (std::isfinite(cc)) {
          gk.push_back(g);
          ck.push_back(cc);
        }
      }
      ASSERT_FALSE(ck.empty());
      EXPECT_LE(rel_l2(gk, ck), kv_tolerance(c.kv, kF32) / 10) << "K as stored";
    }
  }
}

TEST_P(KvOps, PagedAttentionDecodeAndChunkedPrefill) {
  LMSERVE_REQUIRE_GPU();
  const KvCase c = GetParam();
  const int nkv = 2, nh = nkv * c.group, D = c.head_dim;
  std::mt19937 rng(6 + c.block_size * 3 + D + c.group);
  // Context lengths that are not multiples of the block size, one long enough to split.
  const std::vector<int> contexts = {1, c.block_size + 3, 3 * c.block_size - 5, 301, 629};
  int blocks = 0;
  for (int n : contexts) blocks += (n + c.block_size - 1) / c.block_size;
  Cache cache = make_cache(c, nkv, blocks, rng);
  auto L = view(cache, c, nkv);
  // Non-contiguous block tables: a shuffled pool.
  std::vector<std::int32_t> pool(static_cast<std::size_t>(blocks));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  std::vector<std::vector<std::int32_t>> tables;
  std::size_t next = 0;
  for (int n : contexts) {
    std::vector<std::int32_t> t;
    for (int p = 0; p < n; p += c.block_size) t.push_back(pool[next++]);
    tables.push_back(t);
    for (int p = 0; p < n; ++p) {
      auto k = random_vec(rng, static_cast<std::size_t>(nkv * D), -2, 2), v = random_vec(rng, k.size(), -2, 2);
      backend::cpu::write_kv(L, static_cast<std::int64_t>(t[static_cast<std::size_t>(p / c.block_size)]) * c.block_size + p % c.block_size,
                             k.data(), v.data());
    }
  }
  for (Act act : {kF32, kBF16, kF16}) {
    // decode, decode with the context split, chunked prefill, long chunks; the two decodes again
    // with one warp per (item, KV head, split) in the tensor-core decode kernel (10 units: the
    // last block has two spare warps; split, most units past their context), and again with its
    // blocks of 8 warps; and with the CUDA-core decode kernel, the fallback for the shapes the
    // tensor-core one does not take.
    for (int mode = 0; mode < 10; ++mode) {
      static const char* const kModes[] = {" decode", " split decode", " chunked prefill", " long chunks", " decode, warp units",
                                           " split decode, warp units", " decode, wide blocks", " split decode, wide blocks",
                                           " decode, CUDA cores", " split decode, CUDA cores"};
      SCOPED_TRACE(std::string(act_name(act)) + kModes[mode]);
      ops::AttentionInput in;
      in.nh = nh;
      in.nkv = nkv;
      in.D = D;
      in.splits = mode == 1 || mode == 5 || mode == 7 || mode == 9 ? 8 : 1;
      in.warp_units = mode == 4 || mode == 5;
      in.wide_blocks = mode == 6 || mode == 7;
      in.cuda_core_decode = mode >= 8;
      in.tables = tables;
      std::vector<backend::SeqBatch> seqs;
      for (std::size_t s = 0; s < contexts.size(); ++s) {
        const int n = contexts[s];
        // Prefill: the last up-to-13 (or, long chunks, up-to-200) positions are new, the rest a
        // cached prefix: several items per sequence, causal masks inside key tiles.
        const int q = mode == 2 ? std::min(n, 13) : (mode == 3 ? std::min(n, 200) : 1);
        in.seq_start.push_back(static_cast<std::int32_t>(in.positions.size()));
        in.seq_len.push_back(q);
        seqs.push_back({static_cast<std::int32_t>(in.positions.size()), q, n, in.tables[s]});
        for (int p = n - q; p < n; ++p) in.positions.push_back(p);
      }
      in.q = rounded(act, random_vec(rng, in.positions.size() * static_cast<std::size_t>(nh * D), -2, 2));
      std::vector<float> got;
      ASSERT_EQ(ops::attention(act, in, cache.host, &got), "");
      std::vector<float> want(got.size());
      std::vector<std::int32_t> tokens(in.positions.size(), 0);
      std::vector<std::int64_t> slots(in.positions.size(), 0);
      backend::Batch b{tokens, in.positions, slots, seqs, {}};
      ThreadPool tp(2);
      backend::cpu::paged_attention(tp, L, b, nh, in.q.data(), want.data());
      // Both read the same cache bytes; only float32 summation order (and act rounding) differ.
      EXPECT_LE(rel_l2(got, rounded(act, want)), tolerance(act));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Sweep, KvOps, ::testing::ValuesIn(kv_cases()), kv_case_name);

}  // namespace
}  // namespace lmserve::compare
