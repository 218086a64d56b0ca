// Each CUDA op run once on host data — the seam tests/backend_compare uses to check every op
// against the CPU op of the same name (backend/cpu/cpu_ops.h). Plain C++17, no CUDA types.
// `act` is the model dtype: 0 float32, 1 bfloat16, 2 float16; act-typed inputs are given as
// floats and rounded to act on the device, act-typed outputs come back as floats. Every output
// buffer is poisoned (all bits set: NaN in every dtype) before the op, so an element the op
// fails to write shows up. Each returns "" or what failed (including "no GPU").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/cuda/model/device_model.h"

namespace lmserve::cuda::ops {

std::string embed(backend::ActDtype act, const std::vector<float>& table, int hidden, const std::vector<std::int32_t>& tokens, std::vector<float>* x);

// x += delta (if given, rows of x picked by `rows` if given), out = w * rmsnorm(x). delta is
// uploaded in act (rounded), as the layer's products leave it. With xq and xs, out's rows are
// also quantized per token by the same kernel (the e4m3 bytes and the scales).
std::string add_rmsnorm(backend::ActDtype act, std::vector<float>* x, const std::vector<float>* delta, const std::vector<std::int32_t>* rows, int R,
                        int hidden, const std::vector<float>& w, float eps, std::vector<float>* out, std::vector<std::uint8_t>* xq = nullptr,
                        std::vector<float>* xs = nullptr);

// y[n, m] = x[n, k] * w[m, k]^T (cuBLASLt, or the weight-streaming kernel for n <= 2), y in
// float32 or, with act_out, in act.
std::string gemm(backend::ActDtype act, const std::vector<float>& w, const std::vector<float>& x, int m, int n, int k, std::vector<float>* y, bool act_out = false);

// y[n, m] (float32, in and out) += x[n, k] * w[m, k]^T by Gemm::run_add (cuBLASLt with beta = 1
// in place, or the weight-streaming kernel for n <= 2). With `prepare`, Gemm::prepare(m, k, n)
// times its candidates as run_add runs them first (on a scratch y).
std::string gemm_add(backend::ActDtype act, const std::vector<float>& w, const std::vector<float>& x, int m, int n, int k, bool prepare, std::vector<float>* y);

// One Gemm through a series of products with the first ns[i] rows of x (as the engine's steps
// change their token count): ys[i] = x[:ns[i]] * w^T. With `prepare`, Gemm::prepare(m, k, max of
// ns) first, timing each bucket's candidates on these buffers; *plans_prepared / *plans_total:
// the plans made by then / in all.
std::string gemm_series(backend::ActDtype act, const std::vector<float>& w, const std::vector<float>& x, int m, int k, const std::vector<int>& ns, bool prepare,
                        std::vector<std::vector<float>>* ys, int* plans_prepared, int* plans_total);

// A norm folded into the products around it (Gemm::NormFold), n <= 2 rows of 16-bit act, norm
// weights norm_w [H]: y0 = rmsnorm(x) w2^T (float32) from launch_norm_fold_start's g; then
// x += a1 w1^T (w1 [H, k1]) with g and partials for the next norm (run_add_fold), y1 =
// rmsnorm(x) w2^T (run_folded) and gu = silu(rmsnorm(x) wgu_gate^T) * (rmsnorm(x) wgu_up^T)
// (run_gate_up_silu_folded, wgu [2I, H]). x: in and out.
std::string norm_fold(backend::ActDtype act, std::vector<float>* x, const std::vector<float>& norm_w, const std::vector<float>& w1, const std::vector<float>& a1,
                      int k1, const std::vector<float>& w2, int m2, const std::vector<float>& wgu, int I, int n, int H, float eps,
                      std::vector<float>* y0, std::vector<float>* y1, std::vector<float>* gu);

// FP8 weights (Gemm, "FP8 weights"): x's rows (uploaded in act) quantized per token, as
// backend/cpu's quantize_rows_fp8: xq the e4m3 bytes, xs the scales.
std::string quantize_rows_fp8(backend::ActDtype act, const std::vector<float>& x, int n, int k, std::vector<std::uint8_t>* xq, std::vector<float>* xs);

// A product of FP8 weights w ([m, k] e4m3 bytes, a scale per row) and x ([n, k], act) as the
// layers run it: kF32 y = x w^T in float32, kAct in act, kAdd y (float32, in and out) += x w^T,
// kGateUpSilu y[n, m / 2] = silu(x w_gate^T) * (x w_up^T) in act. With `prepare` the plans are
// made and timed first (Gemm::prepare_fp8), as the device model does.
enum class Fp8Product { kF32, kAct, kAdd, kGateUpSilu };
std::string gemm_fp8(backend::ActDtype act, const std::vector<std::uint8_t>& w, const std::vector<float>& w_scales, const std::vector<float>& x, int m, int n,
                     int k, Fp8Product kind, bool prepare, std::vector<float>* y);

// gu is uploaded in Gemm::gate_up_dtype(act) (rounded), as the gate / up GEMM leaves it. With xq
// (I % 16 == 0) the output's rows also come back quantized per token (launch_silu_mul's xq).
std::string silu_mul(backend::ActDtype act, const std::vector<float>& gu, int T, int I, std::vector<float>* out,
                     std::vector<std::uint8_t>* xq = nullptr, std::vector<float>* xs = nullptr);

// out[n, I] = silu(x w_gate^T) * (x w_up^T) for w = [w_gate; w_up] of [2I, k] (Gemm::run_gate_up_silu).
std::string gate_up_silu(backend::ActDtype act, const std::vector<float>& w, const std::vector<float>& x, int I, int n, int k, std::vector<float>* out);

struct KvCacheHost {
  backend::KvDtype kv = backend::KvDtype::kFloat32;
  int block_size = 16;
  std::vector<std::uint8_t> k, v;  // [slot][kv_head][head_dim] in the cache dtype
  std::vector<float> k_scale, v_scale;  // [kv_heads] (fp8_e4m3)
};

struct QkvRopeInput {
  std::vector<float> qkv;   // [T, (nh + 2 nkv) * D]
  std::vector<float> bias;  // empty or [(nh + 2 nkv) * D]
  std::vector<float> q_norm, k_norm;  // empty or [D]
  std::vector<float> inv_freq;
  std::vector<std::int32_t> positions;
  std::vector<std::int64_t> slots;
  int nh = 0, nkv = 0, D = 0;
  float eps = 1e-6f;
};
// Writes K/V into `cache` (updated in place) and returns the rotated q [T, nh * D]. qkv is
// uploaded in act (rounded), as the QKV product leaves it.
std::string qkv_rope(backend::ActDtype act, const QkvRopeInput& in, KvCacheHost* cache, std::vector<float>* q);

struct AttentionInput {
  std::vector<float> q;  // [T, nh * D]
  std::vector<std::int32_t> positions;
  std::vector<std::int32_t> seq_start, seq_len;
  std::vector<std::vector<std::int32_t>> tables;
  int nh = 0, nkv = 0, D = 0;
  int splits = 1;  // context splits for single-token sequences (decode)
  bool warp_units = false;  // AttnArgs::warp_units (the tensor-core decode kernel's one warp per unit)
  bool wide_blocks = false;  // AttnArgs::wide_blocks (its blocks of 8 warps)
  bool cuda_core_decode = false;  // AttnArgs::cuda_core_decode (the CUDA-core decode kernel where the tensor-core one applies)
};
std::string attention(backend::ActDtype act, const AttentionInput& in, const KvCacheHost& cache, std::vector<float>* out);

// One token per row of `logits` ([specs.size(), V]) as the row's spec says (SampleSpec).
std::string sample(const std::vector<float>& logits, int V, const std::vector<SampleSpec>& specs, std::vector<std::int32_t>* tokens);

}  // namespace lmserve::cuda::ops
