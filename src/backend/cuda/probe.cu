#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "backend/device/probe.h"

namespace lmserve::cuda {
namespace {

std::string describe_error(const char* what, cudaError_t err) {
  return std::string(what) + ": " + cudaGetErrorString(err) + " (" + cudaGetErrorName(err) + ")";
}

// A value no stale or unwritten buffer holds by accident: odd, position-dependent.
__host__ __device__ unsigned expected_value(unsigned i) { return i * 2654435761u + 1u; }

__global__ void fill_pattern(unsigned* out, unsigned n) {
  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    out[i] = expected_value(i);
  }
}

}  // namespace

RawProbe probe() {
  RawProbe p;
  cudaRuntimeGetVersion(&p.runtime_version);
  cudaDriverGetVersion(&p.driver_version);  // 0 when no driver is installed
  int count = 0;
  if (cudaError_t err = cudaGetDeviceCount(&count); err != cudaSuccess) {
    p.error = describe_error("cudaGetDeviceCount", err);
    cudaGetLastError();  // reset the last-error state so later calls start clean
    return p;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaError_t err = cudaGetDeviceProperties(&prop, i); err != cudaSuccess) {
      p.error = describe_error("cudaGetDeviceProperties", err);
      continue;
    }
    p.devices.push_back(RawDevice{i, prop.name, prop.totalGlobalMem, prop.major, prop.minor,
                                  prop.multiProcessorCount});
  }
  return p;
}

SelfTestResult self_test(int device, std::string* failure) {
  constexpr unsigned kCount = 1u << 20;
  if (cudaError_t err = cudaSetDevice(device); err != cudaSuccess) {
    *failure = describe_error("cudaSetDevice", err);
    return SelfTestResult::kUnavailable;
  }
  unsigned* buffer = nullptr;
  if (cudaError_t err = cudaMalloc(&buffer, kCount * sizeof(unsigned)); err != cudaSuccess) {
    *failure = describe_error("cudaMalloc", err);
    return SelfTestResult::kUnavailable;
  }
  std::vector<unsigned> host(kCount, 0);
  cudaMemset(buffer, 0, kCount * sizeof(unsigned));
  fill_pattern<<<132, 256>>>(buffer, kCount);
  cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) err = cudaMemcpy(host.data(), buffer, kCount * sizeof(unsigned), cudaMemcpyDeviceToHost);
  cudaFree(buffer);
  if (err != cudaSuccess) {
    *failure = describe_error("self-test kernel", err);
    return SelfTestResult::kUnavailable;
  }
  for (unsigned i = 0; i < kCount; ++i) {
    if (host[i] != expected_value(i)) {
      *failure = "self-test kernel wrote " + std::to_string(host[i]) + " at index " + std::to_string(i) +
                 ", expected " + std::to_string(expected_value(i));
      return SelfTestResult::kWrongResult;
    }
  }
  return SelfTestResult::kPassed;
}

}  // namespace lmserve::cuda

namespace lmserve::cuda {

std::string pci_bus_id(int device) {
  char id[64] = {0};
  if (cudaDeviceGetPCIBusId(id, sizeof(id), device) != cudaSuccess) {
    cudaGetLastError();
    return {};
  }
  return id;
}

bool memory_info(int device, std::uint64_t* free_bytes, std::uint64_t* total_bytes) {
  int current = 0;
  if (cudaGetDevice(&current) != cudaSuccess || cudaSetDevice(device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  std::size_t f = 0, t = 0;
  const bool ok = cudaMemGetInfo(&f, &t) == cudaSuccess;
  cudaSetDevice(current);
  cudaGetLastError();
  *free_bytes = f;
  *total_bytes = t;
  return ok;
}

}  // namespace lmserve::cuda
