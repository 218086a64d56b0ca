// Matrix products: Y[n, m] (float32, row-major) = X[n, k] * W[m, k]^T, with X and W in the
// model's dtype and a float32 accumulator. One or two rows of 16-bit X: a weight-streaming kernel
// of our own (gemm.cu); otherwise cuBLASLt (bf16/f16 tensor cores, or exact float32 without TF32). Plans (layouts + the heuristic's algorithm) are cached per shape, so a
// shape seen once can be captured into a CUDA graph. Not thread-safe: one per backend.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <string>
#include <tuple>

#include "backend/cuda/kernels.cuh"

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
  // out[n, I] (act) = silu(X W_gate^T) * (X W_up^T) for W = [W_gate; W_up] of [2I, k]: one
  // weight-streaming pass where run() would stream (no float32 intermediate, no second kernel),
  // else run() into scratch [n, 2I] and launch_silu_mul.
  std::string run_gate_up_silu(const void* w, const void* x, float* scratch, void* out, int I, int n, int k, Act act, cudaStream_t s);
  std::size_t workspace_bytes() const { return workspace_bytes_; }

 private:
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  std::string plan_for(int m, int n, int k, Act act, Plan** out);
  static bool thin(const void* w, const void* x, int n, int k, Act act);  // the weight-streaming kernel applies

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  std::size_t workspace_bytes_ = 0;
  std::map<std::tuple<int, int, int, int>, Plan> plans_;
};

}  // namespace lmserve::cuda
