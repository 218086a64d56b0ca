// Builds without nvcc: the CUDA backend's entry points say so.
#include "backend/cuda/cuda_backend.h"

namespace lmserve::backend {

Result<std::unique_ptr<Backend>> make_cuda_backend(std::shared_ptr<const model::ModelWeights>, const CudaBackendOptions&) {
  return error(StatusCode::kUnavailable, "this lmserve was built without CUDA (no nvcc at build time)");
}

}  // namespace lmserve::backend
