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

// max(|v.x|, |v.y|, |v.z|, |v.w|).
__device__ __forceinline__ float abs_max4(float4 v) { return fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))); }

// The row's scale from each thread's amax: max / 448, 1 when that is 0 or not finite. Every
// thread of the block calls it and gets the scale; `part` holds threads / 32 floats of shared
// memory that no thread reads any more.
__device__ __forceinline__ float row_scale_e4m3(float amax, int threads, float* part) {
  amax = warp_max(amax);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = amax;
  __syncthreads();
  amax = 0.0f;
  for (int w = 0; w < threads / 32; ++w) amax = fmaxf(amax, part[w]);
  return amax > 0.0f && isfinite(amax) ? amax / 448.0f : 1.0f;
}

// Four values divided by the scale, each rounded to e4m3 (nearest even, saturated): one word.
__device__ __forceinline__ std::uint32_t pack_e4m3(float4 v, float s) {
  const float f[4] = {v.x / s, v.y / s, v.z / s, v.w / s};
  std::uint32_t packed = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) packed |= static_cast<std::uint32_t>(__nv_cvt_float_to_fp8(f[j], __NV_SATFINITE, __NV_E4M3)) << (8 * j);
  return packed;
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
  for (int i = threadIdx.x * 4; i < k; i += threads * 4) amax = fmaxf(amax, abs_max4(quantize_load4<A, kReadOnly>(x, row + i)));
  const float s = row_scale_e4m3(amax, threads, part);
  if (threadIdx.x == 0) *scale = s;
  for (int i = threadIdx.x * 4; i < k; i += threads * 4) {
    *reinterpret_cast<std::uint32_t*>(xq + row + i) = pack_e4m3(quantize_load4<A, kReadOnly>(x, row + i), s);
  }
}

// The same with the row read once, all its loads in flight together and its values held in
// registers (k <= kThreads * 4 * kGroups), through the read-only path.
template <Act A, int kThreads, int kGroups>
__device__ __forceinline__ void quantize_row_e4m3_held(const void* x, std::int64_t row, int k, std::uint8_t* __restrict__ xq,
                                                       float* __restrict__ scale, float* part) {
  float4 v[kGroups];
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    const int i = (threadIdx.x + g * kThreads) * 4;
    v[g] = i < k ? quantize_load4<A, true>(x, row + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  float amax = 0.0f;
#pragma unroll
  for (int g = 0; g < kGroups; ++g) amax = fmaxf(amax, abs_max4(v[g]));
  const float s = row_scale_e4m3(amax, kThreads, part);
  if (threadIdx.x == 0) *scale = s;
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    const int i = (threadIdx.x + g * kThreads) * 4;
    if (i < k) *reinterpret_cast<std::uint32_t*>(xq + row + i) = pack_e4m3(v[g], s);
  }
}

}  // namespace lmserve::cuda
