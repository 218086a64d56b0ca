// FP8 weights (issue #34): the activations quantized per token, the weight-streaming kernel of
// e4m3 weights for one or two rows, and Gemm's FP8 products (gemm.cuh, "FP8 weights").
#include <cuda_fp8.h>

#include <algorithm>
#include <string>

#include "backend/cuda/common/device_util.cuh"
#include "backend/cuda/gemm/gemm.cuh"

namespace lmserve::cuda {
namespace {

constexpr int kQuantThreads = 256;
constexpr float kE4M3Max = 448.0f;

// Row t of x (act, k elements, k % 4 == 0): xs[t] = max|x| / 448 (1 when that is 0 or not
// finite, as the CPU reference), xq[t, i] = e4m3(x[t, i] / xs[t]) rounded to nearest even and
// saturated. The row is read twice; the second time from L1 or L2.
template <Act A>
__global__ void __launch_bounds__(kQuantThreads) quantize_rows_kernel(const void* __restrict__ x, int k, std::uint8_t* __restrict__ xq,
                                                                      float* __restrict__ xs) {
  __shared__ float part[kQuantThreads / 32];
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * k;
  pdl_wait();
  pdl_release();
  float amax = 0.0f;
  for (int i = threadIdx.x * 4; i < k; i += kQuantThreads * 4) {
    const float4 v = act_load4<A>(x, row + i);
    amax = fmaxf(amax, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
  }
  amax = warp_max(amax);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = amax;
  __syncthreads();
  amax = 0.0f;
#pragma unroll
  for (int w = 0; w < kQuantThreads / 32; ++w) amax = fmaxf(amax, part[w]);
  const float s = amax > 0.0f && isfinite(amax) ? amax / kE4M3Max : 1.0f;
  if (threadIdx.x == 0) xs[blockIdx.x] = s;
  for (int i = threadIdx.x * 4; i < k; i += kQuantThreads * 4) {
    const float4 v = act_load4<A>(x, row + i);
    const float f[4] = {v.x / s, v.y / s, v.z / s, v.w / s};
    std::uint32_t packed = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) packed |= static_cast<std::uint32_t>(__nv_cvt_float_to_fp8(f[j], __NV_SATFINITE, __NV_E4M3)) << (8 * j);
    *reinterpret_cast<std::uint32_t*>(xq + row + i) = packed;
  }
}

// Sixteen e4m3 values packed in 16 bytes, as floats (exact: e4m3 is a subset of f16).
__device__ __forceinline__ void unpack16_e4m3(const uint4& u, float (&f)[16]) {
  const std::uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const auto pair = static_cast<__nv_fp8x2_storage_t>(w[i] >> (16 * h));
      const float2 p = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3)));
      f[4 * i + 2 * h] = p.x;
      f[4 * i + 2 * h + 1] = p.y;
    }
  }
}

// ---- one or two rows: streaming e4m3 weights ----
// The bf16 weight-streaming kernel's scheme (gemm.cu) on bytes: each warp streams two rows of W
// with 16-byte loads (16 weights each), kLoads loads per row in flight, S warps sharing a pair
// of rows where W has few; the quantized X rows come through L2. Sums in float32, then scaled by
// the token's and the row's scales. (A version that multiplied on the tensor cores and quantized
// X itself, every block from its own pass over the row, was slower: docs/perf.md, "FP8 weights
// on the H200".)
constexpr int kThreads = 256, kRows = 2, kLoads = 4, kWarpsPerSm = 24;

enum class Store { kF32, kAct, kAddF32 };

// kSwiGlu: W is [2m, k]; row group p reads gate row p and up row m + p and writes
// silu(gate) * up (in act) to y[t * m + p]. Otherwise y is [n, m] and group p reads rows 2p, 2p + 1.
template <Act A, int N, int S, bool kSwiGlu>
__global__ void __launch_bounds__(kThreads) gemv_fp8_kernel(const std::uint8_t* __restrict__ w, const float* __restrict__ ws,
                                                            const std::uint8_t* __restrict__ xq, const float* __restrict__ xs, void* __restrict__ y,
                                                            int m, int n, int k, Store store) {
  constexpr int kWarps = kThreads / 32;
  static_assert(kWarps % S == 0, "a block holds whole row groups");
  __shared__ float red[kWarps][kRows][N];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, part = warp % S;
  const int group = static_cast<int>(blockIdx.x) * (kWarps / S) + warp / S;
  const int row0 = kSwiGlu ? group : group * kRows;
  const int chunks = k / 16, stride = 32 * S;
  std::int64_t rows[kRows];
  const uint4* wr[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    rows[r] = kSwiGlu ? min(group, m - 1) + static_cast<std::int64_t>(r) * m : min(row0 + r, m - 1);
    wr[r] = reinterpret_cast<const uint4*>(w + rows[r] * k);
  }
  float acc[kRows][N] = {};
  uint4 raw[kLoads][kRows];
  const int first = part * 32 + lane, step = stride * kLoads;
  auto load_w = [&](int c0) {
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int c = c0 + u * stride;
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (c < chunks) raw[u][r] = __ldg(wr[r] + c);
      }
    }
  };
  // W's first loads before the wait (no kernel writes W).
  load_w(first);
  pdl_wait();
  pdl_release();
  for (int c0 = first; c0 < chunks; c0 += step) {
    if (c0 != first) load_w(c0);
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int c = c0 + u * stride;
      if (c >= chunks) continue;
#pragma unroll
      for (int t = 0; t < N; ++t) {
        if (t >= n) continue;
        float xf[16];
        unpack16_e4m3(__ldcg(reinterpret_cast<const uint4*>(xq + static_cast<std::int64_t>(t) * k) + c), xf);
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          float wf[16];
          unpack16_e4m3(raw[u][r], wf);
#pragma unroll
          for (int v = 0; v < 16; ++v) acc[r][t] += wf[v] * xf[v];
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int t = 0; t < N; ++t) {
      const float v = warp_sum(acc[r][t]);
      if (lane == 0) red[warp][r][t] = v;
    }
  }
  if constexpr (S > 1) __syncthreads();
  if (part != 0 || lane != 0) return;
#pragma unroll
  for (int t = 0; t < N; ++t) {
    if (t >= n) continue;
    float v[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      v[r] = 0.0f;
#pragma unroll
      for (int p = 0; p < S; ++p) v[r] += red[warp + p][r][t];
      v[r] *= xs[t] * ws[rows[r]];
    }
    if constexpr (kSwiGlu) {
      if (group < m) act_store<A>(y, static_cast<std::int64_t>(t) * m + group, v[0] / (1.0f + expf(-v[0])) * v[1]);
    } else {
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (row0 + r >= m) continue;
        const std::int64_t at = static_cast<std::int64_t>(t) * m + row0 + r;
        if (store == Store::kAct) {
          act_store<A>(y, at, v[r]);
        } else if (store == Store::kAddF32) {
          static_cast<float*>(y)[at] += v[r];
        } else {
          static_cast<float*>(y)[at] = v[r];
        }
      }
    }
  }
}

template <Act A, int S, bool kSwiGlu>
void launch_split(const std::uint8_t* w, const float* ws, const std::uint8_t* xq, const float* xs, void* y, int m, int n, int k, Store store,
                  cudaStream_t s) {
  const int groups_per_block = kThreads / 32 / S, outputs_per_group = kSwiGlu ? 1 : kRows;
  const unsigned blocks = static_cast<unsigned>((m + groups_per_block * outputs_per_group - 1) / (groups_per_block * outputs_per_group));
  auto* kernel = n == 1 ? gemv_fp8_kernel<A, 1, S, kSwiGlu> : gemv_fp8_kernel<A, 2, S, kSwiGlu>;
  launch_pdl(kernel, dim3(blocks), dim3(kThreads), 0, s, w, ws, xq, xs, y, m, n, k, store);
}

// Warps per row pair: the fewest (at most 8) that give kWarpsPerSm warps per multiprocessor.
// m: rows of W, or outputs per token (kSwiGlu). xq, xs: n <= 2 rows quantized.
template <Act A, bool kSwiGlu>
void launch_gemv_fp8(const void* w, const float* ws, const void* xq, const float* xs, void* y, int m, int n, int k, Store store, cudaStream_t s) {
  const auto* W = static_cast<const std::uint8_t*>(w);
  const auto* X = static_cast<const std::uint8_t*>(xq);
  const std::int64_t pairs = kSwiGlu ? m : (m + kRows - 1) / kRows, want = static_cast<std::int64_t>(kWarpsPerSm) * multiprocessors();
  int S = 1;
  while (S < 8 && S * pairs < want) S *= 2;
  switch (S) {
    case 1: return launch_split<A, 1, kSwiGlu>(W, ws, X, xs, y, m, n, k, store, s);
    case 2: return launch_split<A, 2, kSwiGlu>(W, ws, X, xs, y, m, n, k, store, s);
    case 4: return launch_split<A, 4, kSwiGlu>(W, ws, X, xs, y, m, n, k, store, s);
    default: return launch_split<A, 8, kSwiGlu>(W, ws, X, xs, y, m, n, k, store, s);
  }
}

// The weight-streaming kernel applies (after quantize(): k % 16 == 0, X's rows aligned).
bool stream_fp8(const Gemm::Fp8Weight& w, int n) { return n <= Gemm::kStreamRows && aligned16(w.w); }

}  // namespace

void launch_quantize_rows_fp8(const void* x, Act act, int n, int k, void* xq, float* xs, cudaStream_t s) {
  if (n == 0) return;
  auto* q = static_cast<std::uint8_t*>(xq);
  LMSERVE_WITH_ACT(act, A, (launch_pdl(quantize_rows_kernel<A>, dim3(static_cast<unsigned>(n)), dim3(kQuantThreads), 0, s, x, k, q, xs)));
}

std::string Gemm::quantize(const void* x, int n, int k, Act act, cudaStream_t s) {
  if (!xq_ || !xs_) return "gemm: FP8 products need the scratch of set_fp8_scratch";
  if (k % 16 != 0 || !aligned16(x)) return "gemm: FP8 products need k divisible by 16 and aligned rows";
  launch_quantize_rows_fp8(x, act, n, k, xq_, xs_, s);
  return {};
}

std::string Gemm::run_fp8(const Fp8Weight& w, const void* x, void* y, Act out, int m, int n, int k, Act act, cudaStream_t s) {
  if (n == 0) return {};
  if (out != Act::kF32 && out != act) return "gemm: output dtype neither float32 nor the inputs'";
  LMSERVE_TRY(quantize(x, n, k, act, s));
  if (stream_fp8(w, n)) {
    const Store store = out != Act::kF32 ? Store::kAct : Store::kF32;
    LMSERVE_WITH_ACT(act, A, (launch_gemv_fp8<A, false>(w.w, w.scales, xq_, xs_, y, m, n, k, store, s)));
    return {};
  }
  return run_lt(w.w, xq_, y, out, m, n, k, act, 0.0f, s, w.scales, xs_);
}

std::string Gemm::run_add_fp8(const Fp8Weight& w, const void* x, float* y, int m, int n, int k, Act act, cudaStream_t s) {
  if (n == 0) return {};
  LMSERVE_TRY(quantize(x, n, k, act, s));
  if (stream_fp8(w, n)) {
    LMSERVE_WITH_ACT(act, A, (launch_gemv_fp8<A, false>(w.w, w.scales, xq_, xs_, y, m, n, k, Store::kAddF32, s)));
    return {};
  }
  return run_lt(w.w, xq_, y, Act::kF32, m, n, k, act, 1.0f, s, w.scales, xs_);
}

std::string Gemm::run_gate_up_silu_fp8(const Fp8Weight& w, const void* x, void* scratch, void* out, int I, int n, int k, Act act, cudaStream_t s) {
  if (n == 0) return {};
  LMSERVE_TRY(quantize(x, n, k, act, s));
  if (stream_fp8(w, n)) {
    LMSERVE_WITH_ACT(act, A, (launch_gemv_fp8<A, true>(w.w, w.scales, xq_, xs_, out, I, n, k, Store::kAct, s)));
    return {};
  }
  LMSERVE_TRY(run_lt(w.w, xq_, scratch, act, 2 * I, n, k, act, 0.0f, s, w.scales, xs_));
  launch_silu_mul(scratch, act, n, I, out, act, s);
  return {};
}

}  // namespace lmserve::cuda
