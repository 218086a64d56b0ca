// The device's measured ceilings (device_model.h): the copy bandwidth and the bf16 matrix-product
// rate, burst or sustained, that `bench` divides its figures by; and one layer product's time
// (tests/bench/cuda_benchmark.cpp).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/cuda/device_buffer.cuh"
#include "backend/cuda/device_model.h"
#include "backend/cuda/gemm.cuh"

namespace lmserve::cuda {

namespace {

// Milliseconds that `reps` runs of work() take on the default stream (after one untimed run).
template <typename Work>
float elapsed_ms(int reps, Work&& work) {
  work();
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaEventRecord(e0);
  for (int i = 0; i < reps; ++i) work();
  cudaEventRecord(e1);
  cudaEventSynchronize(e1);
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return cudaGetLastError() == cudaSuccess ? ms : 0.0f;
}

}  // namespace

double copy_bandwidth(int device) {
  if (cudaSetDevice(device) != cudaSuccess) return 0;
  constexpr std::size_t kBytes = 1ull << 30;
  constexpr int kReps = 10;
  DeviceBuffer a, b;
  if (!a.alloc(kBytes).empty() || !b.alloc(kBytes).empty()) return 0;
  const float ms = elapsed_ms(kReps, [&] { cudaMemcpy(b.p, a.p, kBytes, cudaMemcpyDeviceToDevice); });
  // A copy reads and writes every byte.
  return ms > 0 ? 2.0 * static_cast<double>(kBytes) * kReps / (ms / 1000.0) : 0;
}

namespace {

// Values in [-1, 1) from a hash of the index, as bf16.
__global__ void fill_random_bf16_kernel(std::uint16_t* p, std::int64_t n, std::uint32_t seed) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::uint32_t h = static_cast<std::uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    const float v = static_cast<float>(h >> 8) / 8388608.0f - 1.0f;
    p[i] = static_cast<std::uint16_t>(__float_as_uint(v) >> 16);
  }
}

}  // namespace

double matmul_rate(int device, double seconds) {
  if (cudaSetDevice(device) != cudaSuccess) return 0;
  constexpr int kN = 8192, kReps = 10;
  const std::size_t elems = static_cast<std::size_t>(kN) * kN;
  DeviceBuffer a, b, c;
  Gemm gemm;
  if (!a.alloc(elems * 2).empty() || !b.alloc(elems * 2).empty() || !c.alloc(elems * 4).empty() || !gemm.init(64ull << 20).empty()) return 0;
  fill_random_bf16_kernel<<<1024, 256>>>(a.as<std::uint16_t>(), static_cast<std::int64_t>(elems), 1u);
  fill_random_bf16_kernel<<<1024, 256>>>(b.as<std::uint16_t>(), static_cast<std::int64_t>(elems), 2u);
  if (!gemm.run(a.p, b.p, c.as<float>(), kN, kN, kN, Act::kBF16, nullptr).empty()) return 0;  // the plan, checked once
  auto product = [&] { gemm.run(a.p, b.p, c.as<float>(), kN, kN, kN, Act::kBF16, nullptr); };
  const double flop = 2.0 * kN * static_cast<double>(kN) * kN * kReps;
  if (seconds <= 0) {
    const float ms = elapsed_ms(kReps, product);
    return ms > 0 ? flop / (ms / 1000.0) : 0;
  }
  // Sustained: batches of kReps products for `seconds`, counting the second half only, once
  // the clock has settled where the power limit holds it.
  const auto t0 = std::chrono::steady_clock::now();
  double late_flop = 0, late_ms = 0;
  for (double elapsed = 0; elapsed < seconds;) {
    const float ms = elapsed_ms(kReps, product);
    if (ms <= 0) return 0;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (elapsed >= seconds / 2) late_flop += flop, late_ms += ms;
  }
  return late_ms > 0 ? late_flop / (late_ms / 1000.0) : 0;
}

double product_seconds(int device, int m, int n, int k, bool gate_up, int reps) {
  if (cudaSetDevice(device) != cudaSuccess || m <= 0 || n <= 0 || k <= 0 || reps <= 0) return 0;
  const std::size_t w_elems = static_cast<std::size_t>(gate_up ? 2 * m : m) * k;
  // Copies of W for at least 512 MB in all (ten times an H200's L2), one for a larger W.
  const int copies = static_cast<int>(std::max<std::size_t>(1, (512ull << 20) / (w_elems * 2) + 1));
  std::vector<DeviceBuffer> ws(static_cast<std::size_t>(copies));
  DeviceBuffer x, y, scratch;
  Gemm gemm;
  for (DeviceBuffer& w : ws) {
    if (!w.alloc(w_elems * 2).empty()) return 0;
    fill_random_bf16_kernel<<<1024, 256>>>(w.as<std::uint16_t>(), static_cast<std::int64_t>(w_elems), 3u);
  }
  const std::size_t out_elems = static_cast<std::size_t>(n) * m;
  if (!x.alloc(static_cast<std::size_t>(n) * k * 2).empty() || !y.alloc(out_elems * 2).empty() ||
      !scratch.alloc(out_elems * 2 * 4).empty() || !gemm.init(64ull << 20).empty()) {
    return 0;
  }
  fill_random_bf16_kernel<<<1024, 256>>>(x.as<std::uint16_t>(), static_cast<std::int64_t>(n) * k, 4u);
  cudaStream_t s = nullptr;
  if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) return 0;
  cudaDeviceSynchronize();
  int i = 0;
  std::string error;
  auto product = [&] {
    const void* w = ws[static_cast<std::size_t>(i++ % copies)].p;
    std::string e = gate_up ? gemm.run_gate_up_silu(w, x.p, scratch.p, y.p, m, n, k, Act::kBF16, s)
                            : gemm.run(w, x.p, y.p, Act::kBF16, m, n, k, Act::kBF16, s);
    if (error.empty()) error = std::move(e);
  };
  for (int c = 0; c < copies; ++c) product();  // plans made, every copy touched once
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaEventRecord(e0, s);
  for (int r = 0; r < reps; ++r) product();
  cudaEventRecord(e1, s);
  cudaEventSynchronize(e1);
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaStreamDestroy(s);
  if (!error.empty() || cudaGetLastError() != cudaSuccess || ms <= 0) return 0;
  return ms / 1000.0 / reps;
}

}  // namespace lmserve::cuda
