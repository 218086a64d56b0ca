// One row's per-token FP8 quantization, by a whole block: shared by launch_quantize_rows_fp8
// (gemm_fp8.cu) and the norm that quantizes its own output (kernels.cu), which must give the
// same bytes (and so the CPU reference's, backend/cpu's quantize_rows_fp8).
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

#include "backend/cuda/common/device_util.cuh"

namespace lmserve::cuda {

// Four values of x from i, through the non-coherent read-only path when kReadOnly.
template <Act A, bool kReadOnly>
__device__ __forceinline__ float4 quantize_load4(const void* x, std::int64_t i) {
  if constexpr (!kReadOnly) {
    return act_load4<A>(x, i);
  } else if constexpr (A == Act::kF32) {
    return __ldg(reinterpret_cast<const float4*>(static_cast<const float*>(x) + i));
  } else {
    const uint2 r = __ldg(reinterpret_cast<const uint2*>(static_cast<const std::uint16_t*>(x) + i));
    return act_load4<A>(&r, 0);
  }
}

// Row `row` (its first element's index) of x (act, k elements, k % 4 == 0): *scale = max|x| /
// 448 (1 when that is 0 or not finite), xq[row + i] = e4m3(x[row + i] / scale) rounded to nearest
// even and saturated. Every thread of the block calls it; `part` holds blockDim.x / 32 floats of
// shared memory that no thread reads any more. The row is read twice; the second time from L1
// or L2. kThreads: the block's size when the caller knows it at compile time (0: blockDim.x),
// so that the loops' stride is a constant. kReadOnly: x was written by an earlier kernel and is
// read through the non-coherent read-only path; the norm, which passes the row it has just
// written, must not. The quantization before o and down takes both (H200: with neither, as at
// 19e7949, a b1 step took ~95 us more, ~1.5 us a call).
template <Act A, int kThreads, bool kReadOnly>
__device__ __forceinline__ void quantize_row_e4m3(const void* x, std::int64_t row, int k, std::uint8_t* __restrict__ xq,
                                                  float* __restrict__ scale, float* part) {
  const int threads = kThreads > 0 ? kThreads : static_cast<int>(blockDim.x);
  float amax = 0.0f;
  for (int i = threadIdx.x * 4; i < k; i += threads * 4) {
    const float4 v = quantize_load4<A, kReadOnly>(x, row + i);
    amax = fmaxf(amax, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
  }
  amax = warp_max(amax);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = amax;
  __syncthreads();
  amax = 0.0f;
#pragma unroll
  for (int w = 0; w < threads / 32; ++w) amax = fmaxf(amax, part[w]);
  const float s = amax > 0.0f && isfinite(amax) ? amax / 448.0f : 1.0f;
  if (threadIdx.x == 0) *scale = s;
  for (int i = threadIdx.x * 4; i < k; i += threads * 4) {
    const float4 v = quantize_load4<A, kReadOnly>(x, row + i);
    const float f[4] = {v.x / s, v.y / s, v.z / s, v.w / s};
    std::uint32_t packed = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) packed |= static_cast<std::uint32_t>(__nv_cvt_float_to_fp8(f[j], __NV_SATFINITE, __NV_E4M3)) << (8 * j);
    *reinterpret_cast<std::uint32_t*>(xq + row + i) = packed;
  }
}

}  // namespace lmserve::cuda
