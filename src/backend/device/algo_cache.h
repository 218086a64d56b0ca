// backend/device: what the CUDA side sees of the GEMM tuning cache (tuning_cache.h): a map from
// a product's full description to the cuBLASLt algorithm chosen for it. Plain C++17 (nvcc
// compiles gemm.cu with it) and no link dependency: the calls are virtual.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>

namespace lmserve::backend {

class AlgoCache {
 public:
  using Algo = std::array<std::uint64_t, 8>;  // a cublasLtMatmulAlgo_t's bytes
  virtual ~AlgoCache() = default;
  // `shape` names a product completely (dtypes, m, n, k, epilogue, the n it was timed at).
  virtual std::optional<Algo> find(const std::string& shape) = 0;
  virtual void put(const std::string& shape, const Algo& algo) = 0;
};

}  // namespace lmserve::backend
