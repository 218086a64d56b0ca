// Device helpers shared by lmserve's CUDA kernels (kernels.cu, attention.cu, sample.cu):
// loads and stores in the act and KV dtypes, warp reductions, and the switches that turn a
// runtime Act / Kv into a template argument. CUDA-side header: backend/cuda only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "backend/cuda/common/kernels.cuh"

namespace lmserve::cuda {

template <Act A>
__device__ __forceinline__ float act_load(const void* p, std::int64_t i) {
  if constexpr (A == Act::kF32) return static_cast<const float*>(p)[i];
  if constexpr (A == Act::kBF16) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  if constexpr (A == Act::kF16) return __half2float(static_cast<const __half*>(p)[i]);
}

template <Act A>
__device__ __forceinline__ void act_store(void* p, std::int64_t i, float v) {
  if constexpr (A == Act::kF32) static_cast<float*>(p)[i] = v;
  if constexpr (A == Act::kBF16) static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
  if constexpr (A == Act::kF16) static_cast<__half*>(p)[i] = __float2half_rn(v);
}

// Two consecutive values (i even) in one 8- or 4-byte load.
template <Act A>
__device__ __forceinline__ float2 act_load2(const void* p, std::int64_t i) {
  if constexpr (A == Act::kF32) {
    return *reinterpret_cast<const float2*>(static_cast<const float*>(p) + i);
  } else if constexpr (A == Act::kBF16) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(static_cast<const __nv_bfloat16*>(p) + i));
  } else {
    return __half22float2(*reinterpret_cast<const __half2*>(static_cast<const __half*>(p) + i));
  }
}

// Four consecutive values (i a multiple of 4) in one 16- or 8-byte load.
template <Act A>
__device__ __forceinline__ float4 act_load4(const void* p, std::int64_t i) {
  if constexpr (A == Act::kF32) {
    return *reinterpret_cast<const float4*>(static_cast<const float*>(p) + i);
  } else if constexpr (A == Act::kBF16) {
    const uint2 r = *reinterpret_cast<const uint2*>(static_cast<const __nv_bfloat16*>(p) + i);
    const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&r.x)), hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&r.y));
    return make_float4(lo.x, lo.y, hi.x, hi.y);
  } else {
    const uint2 r = *reinterpret_cast<const uint2*>(static_cast<const __half*>(p) + i);
    const float2 lo = __half22float2(*reinterpret_cast<const __half2*>(&r.x)), hi = __half22float2(*reinterpret_cast<const __half2*>(&r.y));
    return make_float4(lo.x, lo.y, hi.x, hi.y);
  }
}

// Two consecutive outputs (i even) in one 8- or 4-byte store.
template <Act A>
__device__ __forceinline__ void act_store2(void* p, std::int64_t i, float a, float b) {
  if constexpr (A == Act::kF32) {
    *reinterpret_cast<float2*>(static_cast<float*>(p) + i) = make_float2(a, b);
  } else if constexpr (A == Act::kBF16) {
    *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(p) + i) = __floats2bfloat162_rn(a, b);
  } else {
    *reinterpret_cast<__half2*>(static_cast<__half*>(p) + i) = __floats2half2_rn(a, b);
  }
}

// Four consecutive outputs (i a multiple of 4) in one 16- or 8-byte store.
template <Act A>
__device__ __forceinline__ void act_store4(void* p, std::int64_t i, float a, float b, float c, float d) {
  if constexpr (A == Act::kF32) {
    *reinterpret_cast<float4*>(static_cast<float*>(p) + i) = make_float4(a, b, c, d);
  } else if constexpr (A == Act::kBF16) {
    const __nv_bfloat162 lo = __floats2bfloat162_rn(a, b), hi = __floats2bfloat162_rn(c, d);
    *reinterpret_cast<uint2*>(static_cast<__nv_bfloat16*>(p) + i) = make_uint2(*reinterpret_cast<const unsigned*>(&lo), *reinterpret_cast<const unsigned*>(&hi));
  } else {
    const __half2 lo = __floats2half2_rn(a, b), hi = __floats2half2_rn(c, d);
    *reinterpret_cast<uint2*>(static_cast<__half*>(p) + i) = make_uint2(*reinterpret_cast<const unsigned*>(&lo), *reinterpret_cast<const unsigned*>(&hi));
  }
}

template <Kv K>
__device__ __forceinline__ float kv_load(const void* p, std::int64_t i) {
  if constexpr (K == Kv::kF32) return static_cast<const float*>(p)[i];
  if constexpr (K == Kv::kBF16) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  if constexpr (K == Kv::kF16) return __half2float(static_cast<const __half*>(p)[i]);
  if constexpr (K == Kv::kE5M2) {
    return __half2float(__half(__nv_cvt_fp8_to_halfraw(static_cast<const __nv_fp8_storage_t*>(p)[i], __NV_E5M2)));
  }
  if constexpr (K == Kv::kE4M3) {
    return __half2float(__half(__nv_cvt_fp8_to_halfraw(static_cast<const __nv_fp8_storage_t*>(p)[i], __NV_E4M3)));
  }
}

// Rounds to nearest even and saturates to the largest finite value, as the CPU backend does.
template <Kv K>
__device__ __forceinline__ void kv_store(void* p, std::int64_t i, float v, float scale) {
  if constexpr (K == Kv::kF32) static_cast<float*>(p)[i] = v;
  if constexpr (K == Kv::kBF16) static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
  if constexpr (K == Kv::kF16) static_cast<__half*>(p)[i] = __float2half_rn(v);
  if constexpr (K == Kv::kE5M2) static_cast<__nv_fp8_storage_t*>(p)[i] = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E5M2);
  if constexpr (K == Kv::kE4M3) static_cast<__nv_fp8_storage_t*>(p)[i] = __nv_cvt_float_to_fp8(v / scale, __NV_SATFINITE, __NV_E4M3);
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// |v| >= 0, so the float's bit pattern orders like an int.
__device__ __forceinline__ void atomic_max_abs(float* addr, float v) { atomicMax(reinterpret_cast<int*>(addr), __float_as_int(fabsf(v))); }

// Eight bf16 or f16 values packed in 16 bytes, as floats.
template <Act A>
__device__ __forceinline__ void unpack8(const uint4& u, float (&f)[8]) {
  const std::uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 p;
    if constexpr (A == Act::kBF16) {
      p = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[i]));
    } else {
      p = __half22float2(*reinterpret_cast<const __half2*>(&w[i]));
    }
    f[2 * i] = p.x;
    f[2 * i + 1] = p.y;
  }
}

// kv_load8 in two steps, so that a thread can have several loads in flight before it uses any:
// the bytes of eight consecutive cache elements (i is a multiple of 8) in one or two vector
// loads, then those elements as floats.
template <Kv K>
struct KvRaw8 {
  std::uint32_t w[K == Kv::kF32 ? 8 : (K == Kv::kBF16 || K == Kv::kF16 ? 4 : 2)];
};
template <Kv K>
__device__ __forceinline__ KvRaw8<K> kv_fetch8(const void* p, std::int64_t i) {
  KvRaw8<K> r;
  if constexpr (K == Kv::kF32) {
    const uint4* v = reinterpret_cast<const uint4*>(static_cast<const float*>(p) + i);
    const uint4 a = v[0], b = v[1];
    r.w[0] = a.x, r.w[1] = a.y, r.w[2] = a.z, r.w[3] = a.w, r.w[4] = b.x, r.w[5] = b.y, r.w[6] = b.z, r.w[7] = b.w;
  } else if constexpr (K == Kv::kBF16 || K == Kv::kF16) {
    const uint4 a = *reinterpret_cast<const uint4*>(static_cast<const std::uint16_t*>(p) + i);
    r.w[0] = a.x, r.w[1] = a.y, r.w[2] = a.z, r.w[3] = a.w;
  } else {
    const uint2 u = *reinterpret_cast<const uint2*>(static_cast<const std::uint8_t*>(p) + i);
    r.w[0] = u.x, r.w[1] = u.y;
  }
  return r;
}
template <Kv K>
__device__ __forceinline__ void kv_unpack8(const KvRaw8<K>& r, float (&out)[8]) {
  if constexpr (K == Kv::kF32) {
#pragma unroll
    for (int k = 0; k < 8; ++k) out[k] = __uint_as_float(r.w[k]);
  } else if constexpr (K == Kv::kBF16 || K == Kv::kF16) {
    unpack8<K == Kv::kBF16 ? Act::kBF16 : Act::kF16>(make_uint4(r.w[0], r.w[1], r.w[2], r.w[3]), out);
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const auto pair = static_cast<__nv_fp8x2_storage_t>(r.w[k / 2] >> (16 * (k % 2)));
      const float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pair, K == Kv::kE5M2 ? __NV_E5M2 : __NV_E4M3)));
      out[2 * k] = f.x;
      out[2 * k + 1] = f.y;
    }
  }
}
// Eight consecutive cache elements (i is a multiple of 8) as floats.
template <Kv K>
__device__ __forceinline__ void kv_load8(const void* p, std::int64_t i, float (&out)[8]) {
  kv_unpack8<K>(kv_fetch8<K>(p, i), out);
}

// Programmatic dependent launch (Hopper). A kernel started by launch_pdl() may begin while the
// kernel before it in the stream is finishing; after pdl_wait() everything earlier kernels did is
// complete and visible. Before it a kernel may read what no kernel of the step writes (weights,
// what the host staged before the step) and what only kernels at least two back wrote (they
// completed before the kernel before this one got past its own wait and released this one; read
// such data through L2, e.g. __ldcg or cp.async.cg), but nothing the kernel right before it
// writes. Work done there leaves the chain of dependent loads after the wait: docs/perf.md, "Work
// before the wait in the decode kernels". pdl_release() lets the next kernel start its own
// preamble; every kernel calls it after its pdl_wait(), never before, which is what makes the
// two-back rule hold. Outside a PDL launch both are no-ops.
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
__device__ __forceinline__ void pdl_release() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }

// kernel<<<grid, block, smem, s>>>(args...) with programmatic stream serialization allowed, so
// that its preamble overlaps the previous kernel's tail: every kernel launched so must call
// pdl_wait() before it reads or writes memory that an earlier kernel of the stream writes or
// reads (docs/perf.md, "programmatic dependent launch").
template <typename... Params, typename... Args>
void launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t smem, cudaStream_t s, Args... args) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = s;
  config.attrs = &attr;
  config.numAttrs = 1;
  cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...);
}

// The current device's multiprocessors (asked once; the weight-streaming kernels size their
// grids by it).
inline int multiprocessors() {
  static const int sms = [] {
    int device = 0, n = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device);
    return n > 0 ? n : 1;
  }();
  return sms;
}

// An early return of a string error (empty: success) from a call that returns one.
#define LMSERVE_TRY(expr)                                \
  do {                                                   \
    if (std::string e_ = (expr); !e_.empty()) return e_; \
  } while (0)

inline bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

inline int grid_for(std::int64_t n, int threads) {
  std::int64_t b = (n + threads - 1) / threads;
  return static_cast<int>(b < 1 ? 1 : (b > 65535 ? 65535 : b));
}

// Runs the statement with a compile-time Act / Kv named by the second argument.
#define LMSERVE_WITH_ACT(act, A, ...)                          \
  switch (act) {                                               \
    case Act::kF32: { constexpr Act A = Act::kF32; __VA_ARGS__; } break;   \
    case Act::kBF16: { constexpr Act A = Act::kBF16; __VA_ARGS__; } break; \
    case Act::kF16: { constexpr Act A = Act::kF16; __VA_ARGS__; } break;   \
  }
#define LMSERVE_WITH_KV(kv, K, ...)                                        \
  switch (kv) {                                                            \
    case Kv::kF32: { constexpr Kv K = Kv::kF32; __VA_ARGS__; } break;      \
    case Kv::kBF16: { constexpr Kv K = Kv::kBF16; __VA_ARGS__; } break;    \
    case Kv::kF16: { constexpr Kv K = Kv::kF16; __VA_ARGS__; } break;      \
    case Kv::kE5M2: { constexpr Kv K = Kv::kE5M2; __VA_ARGS__; } break;    \
    case Kv::kE4M3: { constexpr Kv K = Kv::kE4M3; __VA_ARGS__; } break;    \
  }

}  // namespace lmserve::cuda
