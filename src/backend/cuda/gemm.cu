#include "backend/cuda/gemm.cuh"

namespace lmserve::cuda {
namespace {

cudaDataType_t data_type(Act a) {
  switch (a) {
    case Act::kF32: return CUDA_R_32F;
    case Act::kBF16: return CUDA_R_16BF;
    case Act::kF16: return CUDA_R_16F;
  }
  return CUDA_R_32F;
}

std::string lt_error(const char* what, cublasStatus_t st) { return std::string(what) + ": cuBLASLt status " + std::to_string(static_cast<int>(st)); }

}  // namespace

Gemm::~Gemm() {
  for (auto& [key, p] : plans_) {
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatrixLayoutDestroy(p.b);
    cublasLtMatrixLayoutDestroy(p.c);
    cublasLtMatmulDescDestroy(p.desc);
  }
  if (workspace_) cudaFree(workspace_);
  if (handle_) cublasLtDestroy(handle_);
}

std::string Gemm::init(std::size_t workspace_bytes) {
  if (cublasStatus_t st = cublasLtCreate(&handle_); st != CUBLAS_STATUS_SUCCESS) return lt_error("cublasLtCreate", st);
  workspace_bytes_ = workspace_bytes;
  if (cudaError_t e = cudaMalloc(&workspace_, workspace_bytes); e != cudaSuccess) {
    return std::string("cuBLASLt workspace: ") + cudaGetErrorString(e);
  }
  return {};
}

std::string Gemm::plan_for(int m, int n, int k, Act act, Plan** out) {
  auto key = std::make_tuple(m, n, k, static_cast<int>(act));
  if (auto it = plans_.find(key); it != plans_.end()) {
    *out = &it->second;
    return {};
  }
  Plan p;
  const cudaDataType_t in = data_type(act);
  // Column-major view: C[m, n] = op(A)[m, k] * B[k, n] with A = W stored [k, m] (transposed),
  // B = X stored [k, n]; C is Y row-major [n, m].
  cublasStatus_t st = cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  if (st != CUBLAS_STATUS_SUCCESS) return lt_error("cublasLtMatmulDescCreate", st);
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta));
  cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb));
  cublasLtMatrixLayoutCreate(&p.a, in, static_cast<std::uint64_t>(k), static_cast<std::uint64_t>(m), k);
  cublasLtMatrixLayoutCreate(&p.b, in, static_cast<std::uint64_t>(k), static_cast<std::uint64_t>(n), k);
  cublasLtMatrixLayoutCreate(&p.c, CUDA_R_32F, static_cast<std::uint64_t>(m), static_cast<std::uint64_t>(n), m);
  cublasLtMatmulPreference_t pref;
  cublasLtMatmulPreferenceCreate(&pref);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes_, sizeof(workspace_bytes_));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  st = cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.a, p.b, p.c, p.c, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatrixLayoutDestroy(p.b);
    cublasLtMatrixLayoutDestroy(p.c);
    cublasLtMatmulDescDestroy(p.desc);
    return "cuBLASLt has no algorithm for " + std::to_string(n) + "x" + std::to_string(k) + " * " + std::to_string(k) + "x" +
           std::to_string(m);
  }
  p.algo = result.algo;
  *out = &plans_.emplace(key, p).first->second;
  return {};
}

std::string Gemm::run(const void* w, const void* x, float* y, int m, int n, int k, Act act, cudaStream_t s) {
  if (n == 0) return {};
  Plan* p = nullptr;
  if (std::string e = plan_for(m, n, k, act, &p); !e.empty()) return e;
  const float alpha = 1.0f, beta = 0.0f;
  cublasStatus_t st = cublasLtMatmul(handle_, p->desc, &alpha, w, p->a, x, p->b, &beta, y, p->c, y, p->c, &p->algo, workspace_,
                                     workspace_bytes_, s);
  if (st != CUBLAS_STATUS_SUCCESS) return lt_error("cublasLtMatmul", st);
  return {};
}

}  // namespace lmserve::cuda
