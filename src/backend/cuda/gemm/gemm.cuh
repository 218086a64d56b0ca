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

namespace lmserve::cuda {

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

 private:
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  // The plan of n's bucket with its B and C layouts set to n columns; `exact`: the heuristic's
  // answer for n itself (when the bucket's algorithm refuses n).
  std::string plan_for(int m, int n, int k, Act act, Act out, bool exact, Plan** plan);
  std::string make_plan(int m, int n, int k, Act act, Act out, const Operands* tune, int tune_n, Plan* p);
  // Y (in `out`) = X W^T + beta Y by cuBLASLt.
  std::string run_lt(const void* w, const void* x, void* y, Act out, int m, int n, int k, Act act, float beta, cudaStream_t s);
  std::string fastest(const Plan& p, const cublasLtMatmulHeuristicResult_t* candidates, int count, const Operands& o, int* best);
  static bool thin(const void* w, const void* x, int n, int k, Act act);  // the weight-streaming kernel applies

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  std::size_t workspace_bytes_ = 0;
  std::map<std::tuple<int, int, int, int, int>, Plan> plans_;  // (m, bucket of n or -n if exact, k, act, out)

 public:
  // Plans made and the seconds their heuristic queries took (bench's --step-report).
  int plans_made() const { return plans_made_; }
  double plan_seconds() const { return plan_seconds_; }
  // Plans whose algorithm was timed, and of them those where it is not the heuristic's first.
  int plans_tuned() const { return plans_tuned_; }
  int plans_retuned() const { return plans_retuned_; }

 private:
  int plans_made_ = 0, plans_tuned_ = 0, plans_retuned_ = 0;
  double plan_seconds_ = 0;
};

}  // namespace lmserve::cuda
