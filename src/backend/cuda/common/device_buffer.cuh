// One device allocation that frees itself (the model's buffers, the rate probes' operands).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>

namespace lmserve::cuda {

struct DeviceBuffer {
  void* p = nullptr;
  std::size_t bytes = 0;
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& o) noexcept : p(o.p), bytes(o.bytes) {
    o.p = nullptr;
    o.bytes = 0;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { reset(); }
  void reset() {
    if (p) cudaFree(p);
    p = nullptr;
    bytes = 0;
  }
  std::string alloc(std::size_t n) {
    reset();
    if (n == 0) n = 256;
    if (cudaError_t e = cudaMalloc(&p, n); e != cudaSuccess) {
      p = nullptr;
      return "cudaMalloc(" + std::to_string(n) + " bytes): " + cudaGetErrorString(e);
    }
    bytes = n;
    return {};
  }
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

}  // namespace lmserve::cuda
