// The element types that cross the nvcc boundary: backend.h (C++23) and the CUDA backend's
// plain-C++ headers (model/device_model.h, model/cuda_ops.h; C++17 under nvcc) both take them
// from here, so a dtype travels as its enum, never as a bare int. The CUDA kernels' own Kv and
// Act (cuda/common/kernels.cuh) are checked against these at compile time.
#pragma once

namespace lmserve::backend {

// The KV cache's element type.
enum class KvDtype { kFloat32, kBFloat16, kFloat16, kFp8E5M2, kFp8E4M3 };
// The element type of the activations and of the weights the products read on a device.
enum class ActDtype { kFloat32, kBFloat16, kFloat16 };

}  // namespace lmserve::backend
