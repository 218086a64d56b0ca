// Matrix products: Y[n, m] (row-major; float32, or the model's dtype where run() is asked for
// it) = X[n, k] * W[m, k]^T, with X and W in the model's dtype and a float32 accumulator. One or two rows of 16-bit X: a weight-streaming kernel
// of our own (gemm.cu); otherwise cuBLASLt (bf16/f16 tensor cores, or exact float32 without
// TF32). Plans (layouts + the heuristic's algorithm) are cached per (m, k, dtype) and bucket of
// n (powers of two and 1.5x them): a step's token count changes from step to step, and a plan
// per new count costs each new count its time on the host (docs/perf.md, "cuBLASLt plans per
// bucket"). prepare() makes the plans of every
// bucket up to a size at start-up, timing the heuristic's first candidates. Not thread-safe:
// one per backend.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <string>
#include <tuple>

#include "backend/cuda/common/kernels.cuh"
#include "backend/device/algo_cache.h"

namespace lmserve::cuda {

// Rows of x (act, [n, k], k % 4 == 0) quantized per token to e4m3 (Gemm's FP8 products): xs[t] =
// max|x[t]| / 448 (1 for a row of zeros), xq[t, i] = e4m3(x[t, i] / xs[t]), round to nearest even,
// saturated.
void launch_quantize_rows_fp8(const void* x, Act act, int n, int k, void* xq, float* xs, cudaStream_t s);

class Gemm {
 public:
  Gemm() = default;
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;
  ~Gemm();

  // Empty string on success, else what failed.
  std::string init(std::size_t workspace_bytes);
  std::string run(const void* w, const void* x, float* y, int m, int n, int k, Act act, cudaStream_t s);
  // Y in `out`: float32, or act (rounded once from the float32 accumulator).
  std::string run(const void* w, const void* x, void* y, Act out, int m, int n, int k, Act act, cudaStream_t s);
  // Y (float32) += X W^T, the sum added in the product's epilogue (cuBLASLt's beta = 1 with C =
  // D = Y in place; the weight-streaming kernel adds its sums): a layer's output joins the
  // float32 residual stream without a pass of its own and without being rounded to act first.
  std::string run_add(const void* w, const void* x, float* y, int m, int n, int k, Act act, cudaStream_t s);
  // Up to this many rows of 16-bit X (k % 8 == 0, 16-byte aligned), a product streams W through
  // a kernel of our own instead of cuBLASLt.
  static constexpr int kStreamRows = 2;
  // out[n, I] (act) = silu(X W_gate^T) * (X W_up^T) for W = [W_gate; W_up] of [2I, k]: one
  // weight-streaming pass where run() would stream (no intermediate, no second kernel), else
  // cuBLASLt into scratch [n, 2I] in act (float32 accumulation, rounded once)
  // and launch_silu_mul.
  // Buffers a product of up to max_n rows may run on, for prepare() to time algorithms on.
  struct Operands {
    const void* w = nullptr;
    const void* x = nullptr;  // max_n rows
    void* y = nullptr;        // max_n rows of m, in the plan's output dtype
    cudaStream_t stream = nullptr;
    bool accumulate = false;  // time the products as run_add runs them (beta = 1; y's values change)
    // FP8 products (prepare_fp8): w and x in e4m3, and their scales (per row of W, per row of X).
    const float* w_scales = nullptr;
    const float* x_scales = nullptr;
  };
  // Plans for every bucket of n up to max_n (start-up; run() makes any that is missing). With
  // `tune`, each bucket's algorithm is the fastest of the
  // heuristic's first candidates, timed on those buffers at the bucket's n (at most max_n).
  // `out`: the products' output dtype (float32 for run(), act for
  // run_gate_up_silu() and the layer products).
  std::string prepare(int m, int k, Act act, int max_n, const Operands* tune = nullptr, Act out = Act::kF32);
  std::string run_gate_up_silu(const void* w, const void* x, void* scratch, void* out, int I, int n, int k, Act act, cudaStream_t s);
  // A norm folded into the products around it at one or two rows (the weight-streaming kernel),
  // by RMSNorm(x) W^T = inv * ((x * w) W^T), inv = 1 / sqrt(mean(x^2) + eps) one number per
  // token row. The product before the norm (run_add_fold) adds its sums into the float32
  // residual, writes g = act(residual * w) and each block's sum of the residual's squares over
  // its rows; the product after (run_folded, run_gate_up_silu_folded) streams W against g and
  // scales each sum by inv from those partials. No norm kernel runs between them; the result
  // differs from norm-then-product only by where act's rounding falls (before inv, not after).
  struct NormFold {
    const float* in_partials = nullptr;  // the product before's partials, [n][in_parts]
    int in_parts = 0;
    float* out_partials = nullptr;       // run_add_fold: this product's, [n][*parts]
    const void* norm_w = nullptr;        // run_add_fold: the next norm's weights (act)
    void* g = nullptr;                   // run_add_fold: [n, m] in act
    int H = 0;                           // the norm's width (run_folded: k)
    float eps = 0.0f;
  };
  // Whether n rows of act with inner size k take the weight-streaming kernel, which the fold needs
  // (buffers 16-byte aligned besides).
  static bool can_fold(int n, int k, Act act);
  // y (float32 [n, m]) += X W^T, then fold.g and fold.out_partials as above; *parts: the partials
  // per token row. The residual y must not be written by the kernel right before this one.
  std::string run_add_fold(const void* w, const void* x, float* y, int m, int n, int k, Act act, const NormFold& fold, int* parts, cudaStream_t s);
  // Y (in `out`) = inv * (G W^T) for G = fold.g's [n, k] (g above), inv from fold.in_partials.
  std::string run_folded(const void* w, const void* g, void* y, Act out, int m, int n, int k, Act act, const NormFold& fold, cudaStream_t s);
  // run_gate_up_silu on g, gate and up scaled by inv before the SiLU.
  std::string run_gate_up_silu_folded(const void* w, const void* g, void* out, int I, int n, int k, Act act, const NormFold& fold, cudaStream_t s);
  std::size_t workspace_bytes() const { return workspace_bytes_; }

  // ---- FP8 weights (issue #34) ----
  // W in e4m3 [m, k] with a float32 scale per row (per output channel). X, in act, is quantized
  // per token into the scratch of set_fp8_scratch (launch_quantize_rows_fp8: scale max|x[t]| /
  // 448, 1 for a row of zeros; e4m3(x / scale) rounded to nearest even, saturated), then
  // y[t, o] = (sum_i xq[t, i] wq[o, i]) xs[t] ws[o]: cuBLASLt's FP8 tensor cores with both scales
  // applied as outer vectors in the epilogue, or at one or two rows a weight-streaming kernel of
  // our own (gemm_fp8.cu: mma.sync on the e4m3 bytes, float32 sums). The CPU backend's matmul is the
  // reference: the streaming kernel agrees to ~1e-7, cuBLASLt to ~2e-4 (the tensor cores' FP8
  // sums are narrower than float32). k must be a multiple of 16, the pointers 16-byte aligned.
  // x null: X's rows are in the scratch already (launch_add_rmsnorm quantizes its output there).
  struct Fp8Weight {
    const void* w = nullptr;
    const float* scales = nullptr;
  };
  // The quantized activations: xq of max_n x max_k bytes, xs of max_n floats.
  void set_fp8_scratch(void* xq, float* xs) { xq_ = xq, xs_ = xs; }
  std::string run_fp8(const Fp8Weight& w, const void* x, void* y, Act out, int m, int n, int k, Act act, cudaStream_t s);
  // y (float32) += the product, in the epilogue as run_add.
  std::string run_add_fp8(const Fp8Weight& w, const void* x, float* y, int m, int n, int k, Act act, cudaStream_t s);
  // run_gate_up_silu with FP8 weights [2I, k]: scratch [n, 2I] in act where cuBLASLt runs. With
  // quantize_out (I % 16 == 0) out's rows are also left quantized in the scratch of
  // set_fp8_scratch, for the next FP8 product to take with x null (down_proj): where cuBLASLt
  // runs, by the SiLU kernel itself (launch_silu_mul's xq).
  std::string run_gate_up_silu_fp8(const Fp8Weight& w, const void* x, void* scratch, void* out, int I, int n, int k, Act act, cudaStream_t s,
                                   bool quantize_out = false);
  // prepare() for FP8 products: tune's w and x in e4m3 with their scales.
  std::string prepare_fp8(int m, int k, int max_n, const Operands* tune = nullptr, Act out = Act::kF32);
  // While set, a timed plan's algorithm is taken from the cache when cuBLASLt accepts it for the
  // product (cublasLtMatmulAlgoCheck), and recorded there when it had to be timed (--tuning-cache).
  void set_algo_cache(backend::AlgoCache* cache) { cache_ = cache; }

 private:
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  // The plan of n's bucket with its B and C layouts set to n columns; `exact`: the heuristic's
  // answer for n itself (when the bucket's algorithm refuses n).
  // With w_scales: W and X in e4m3 with outer-vector scales, act ignored (the heuristic has no
  // algorithm for FP8 without the scales' pointers; tune's are used where it is given).
  std::string plan_for(int m, int n, int k, Act act, Act out, bool exact, Plan** plan, const float* w_scales = nullptr, const float* x_scales = nullptr);
  std::string make_plan(int m, int n, int k, Act act, Act out, const Operands* tune, int tune_n, Plan* p, bool fp8 = false,
                        const float* w_scales = nullptr, const float* x_scales = nullptr);
  // Y (in `out`) = X W^T + beta Y by cuBLASLt; with fp8_scales, W and X in e4m3 and the sums
  // scaled by w_scales[o] x_scales[t].
  std::string run_lt(const void* w, const void* x, void* y, Act out, int m, int n, int k, Act act, float beta, cudaStream_t s,
                     const float* w_scales = nullptr, const float* x_scales = nullptr);
  std::string prepare_plans(int m, int k, Act act, int max_n, const Operands* tune, Act out, bool fp8);
  static void set_scales(const Plan& p, const float* w_scales, const float* x_scales);
  // FP8: X quantized into the scratch; the weight-streaming kernel at up to kStreamRows rows.
  std::string quantize(const void* x, int n, int k, Act act, cudaStream_t s);
  void* xq_ = nullptr;
  float* xs_ = nullptr;
  std::string fastest(const Plan& p, const cublasLtMatmulHeuristicResult_t* candidates, int count, const Operands& o, int* best);
  static bool thin(const void* w, const void* x, int n, int k, Act act);  // the weight-streaming kernel applies

  // The cached algorithm of the product `shape` when cuBLASLt accepts it for p, else false.
  bool from_cache(const std::string& shape, Plan* p);
  backend::AlgoCache* cache_ = nullptr;
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  std::size_t workspace_bytes_ = 0;
  std::map<std::tuple<int, int, int, int, int>, Plan> plans_;  // (m, bucket of n or -n if exact, k, act, out)

 public:
  // Plans made and the seconds their heuristic queries took (bench's --step-report).
  int plans_made() const { return plans_made_; }
  double plan_seconds() const { return plan_seconds_; }
  // Plans whose algorithm was timed, and of them those where it is not the heuristic's first;
  // plans whose algorithm came from the tuning cache.
  int plans_tuned() const { return plans_tuned_; }
  int plans_cached() const { return plans_cached_; }
  int plans_retuned() const { return plans_retuned_; }

 private:
  int plans_made_ = 0, plans_tuned_ = 0, plans_retuned_ = 0, plans_cached_ = 0;
  double plan_seconds_ = 0;
};

}  // namespace lmserve::cuda
