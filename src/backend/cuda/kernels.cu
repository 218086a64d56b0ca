#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cmath>

#include "backend/cuda/kernels.cuh"

namespace lmserve::cuda {

int act_bytes(Act a) { return a == Act::kF32 ? 4 : 2; }

namespace {

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

template <Act A>
__global__ void embed_kernel(const void* table, const std::int32_t* tokens, int H, float* x) {
  const std::int64_t row = static_cast<std::int64_t>(tokens[blockIdx.x]) * H;
  float* out = x + static_cast<std::int64_t>(blockIdx.x) * H;
  for (int i = threadIdx.x; i < H; i += blockDim.x) out[i] = act_load<A>(table, row + i);
}

__global__ void add_kernel(float* x, const float* d, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    x[i] += d[i];
  }
}

constexpr int kNormThreads = 256;

template <Act A>
__global__ void add_rmsnorm_kernel(float* x, const float* delta, const std::int32_t* rows, int H, const void* w, float eps, void* out) {
  __shared__ float partial[kNormThreads / 32];
  const std::int64_t src = rows ? rows[blockIdx.x] : blockIdx.x;
  float* xr = x + src * H;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < H; i += blockDim.x) {
    float v = xr[i];
    if (delta) {
      v += delta[src * H + i];
      xr[i] = v;
    }
    ss += v * v;
  }
  ss = warp_sum(ss);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = ss;
  __syncthreads();
  float total = 0.0f;
  for (int i = 0; i < kNormThreads / 32; ++i) total += partial[i];
  const float inv = 1.0f / sqrtf(total / static_cast<float>(H) + eps);
  const std::int64_t o = static_cast<std::int64_t>(blockIdx.x) * H;
  for (int i = threadIdx.x; i < H; i += blockDim.x) act_store<A>(out, o + i, act_load<A>(w, i) * (xr[i] * inv));
}

// One block per token, one warp per head (q heads, k heads, v heads).
template <Act A, Kv K>
__global__ void qkv_rope_kernel(QkvRopeArgs a) {
  const int t = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int D = a.D, half = D / 2, heads = a.nh + 2 * a.nkv;
  const float* row = a.qkv + static_cast<std::int64_t>(t) * heads * D;
  const std::int32_t pos = a.positions[t];
  const std::int64_t slot = a.slots[t];
  void* kc = a.kv_ptrs[2 * a.layer];
  void* vc = a.kv_ptrs[2 * a.layer + 1];
  for (int hi = warp; hi < heads; hi += warps) {
    const int base = hi * D;
    const bool is_q = hi < a.nh, is_k = !is_q && hi < a.nh + a.nkv;
    const int kvh = is_q ? 0 : (is_k ? hi - a.nh : hi - a.nh - a.nkv);
    // Each lane holds pairs (i, i + half), i = lane, lane + 32, ... (D <= 256).
    float lo[4], hi_v[4];
    float ss = 0.0f;
    for (int j = 0; j < 4; ++j) {
      const int i = lane + 32 * j;
      lo[j] = hi_v[j] = 0.0f;
      if (i < half) {
        lo[j] = row[base + i];
        hi_v[j] = row[base + i + half];
        if (a.bias) {
          lo[j] += act_load<A>(a.bias, base + i);
          hi_v[j] += act_load<A>(a.bias, base + i + half);
        }
        ss += lo[j] * lo[j] + hi_v[j] * hi_v[j];
      }
    }
    const void* nw = is_q ? a.q_norm : (is_k ? a.k_norm : nullptr);
    if (nw) {
      const float inv = 1.0f / sqrtf(warp_sum(ss) / static_cast<float>(D) + a.eps);
      for (int j = 0; j < 4; ++j) {
        const int i = lane + 32 * j;
        if (i < half) {
          lo[j] = act_load<A>(nw, i) * (lo[j] * inv);
          hi_v[j] = act_load<A>(nw, i + half) * (hi_v[j] * inv);
        }
      }
    }
    for (int j = 0; j < 4; ++j) {
      const int i = lane + 32 * j;
      if (i >= half) continue;
      float x0 = lo[j], x1 = hi_v[j];
      if (is_q || is_k) {
        const float angle = static_cast<float>(pos) * a.inv_freq[i];
        const float c = static_cast<float>(cos(static_cast<double>(angle)));
        const float s = static_cast<float>(sin(static_cast<double>(angle)));
        x0 = lo[j] * c - hi_v[j] * s;
        x1 = hi_v[j] * c + lo[j] * s;
      }
      if (is_q) {
        float* q = a.q_out + static_cast<std::int64_t>(t) * a.nh * D + base;
        q[i] = x0;
        q[i + half] = x1;
      } else if (slot >= 0) {
        const std::int64_t at = (slot * a.nkv + kvh) * D;
        const float* sc = is_k ? a.k_scale : a.v_scale;
        const float scale = sc ? sc[kvh] : 1.0f;
        kv_store<K>(is_k ? kc : vc, at + i, x0, scale);
        kv_store<K>(is_k ? kc : vc, at + i + half, x1, scale);
        float* amax = is_k ? a.k_amax : a.v_amax;
        if (amax) {
          atomic_max_abs(&amax[kvh], x0);
          atomic_max_abs(&amax[kvh], x1);
        }
      }
    }
  }
}

constexpr int kAttnThreads = 128;
constexpr int kKeyTile = 32;

// One block per (work item, KV head, context split). The item's query rows (tokens x the
// group's heads) attend to KV tiles staged in shared memory, so each K/V element is read
// once per group and per item; online softmax keeps one running max and sum per row.
template <int D, Kv K, Act A>
__global__ void __launch_bounds__(kAttnThreads) attention_kernel(AttnArgs a) {
  constexpr int R = kAttnRows, RPT = R * D / kAttnThreads, RSTEP = kAttnThreads / D;
  __shared__ float sq[R][D];
  __shared__ float sk[kKeyTile][D + 1];
  __shared__ float sv[kKeyTile][D];
  __shared__ float sp[R][kKeyTile];
  __shared__ float s_m[R], s_l[R], s_alpha[R];
  __shared__ int s_pos[R];
  const int item = blockIdx.x, g = blockIdx.y, split = blockIdx.z, tid = threadIdx.x;
  const int group = a.nh / a.nkv;
  const int tok0 = a.item_token[item], cnt = a.item_count[item], seq = a.item_seq[item];
  const int rows = cnt * group;
  const int qstride = a.nh * D;
  for (int i = tid; i < R * D; i += kAttnThreads) {
    const int r = i / D, d = i % D;
    float v = 0.0f;
    if (r < rows) v = a.q[static_cast<std::int64_t>(tok0 + r / group) * qstride + (g * group + r % group) * D + d];
    sq[r][d] = v;
  }
  if (tid < R) {
    s_pos[tid] = tid < rows ? a.positions[tok0 + tid / group] : -1;
    s_m[tid] = -INFINITY;
    s_l[tid] = 0.0f;
  }
  const int kv_len = a.positions[tok0 + cnt - 1] + 1;
  int per = (kv_len + a.splits - 1) / a.splits;
  per = (per + kKeyTile - 1) / kKeyTile * kKeyTile;
  const int begin = split * per, end = min(kv_len, begin + per);
  const std::int32_t* bt = a.block_tables + static_cast<std::int64_t>(seq) * (*a.bt_stride);
  const void* kc = a.kv_ptrs[2 * a.layer];
  const void* vc = a.kv_ptrs[2 * a.layer + 1];
  const float ks = a.k_scale ? a.k_scale[g] : 1.0f, vs = a.v_scale ? a.v_scale[g] : 1.0f;
  const int d_own = tid % D, r_own = tid / D;
  float acc[RPT];
  for (int k = 0; k < RPT; ++k) acc[k] = 0.0f;
  const int lane = tid & 31, warp = tid >> 5;
  __syncthreads();
  for (int t0 = begin; t0 < end; t0 += kKeyTile) {
    for (int i = tid; i < kKeyTile * D; i += kAttnThreads) {
      const int j = i / D, d = i % D, p = t0 + j;
      float kx = 0.0f, vx = 0.0f;
      if (p < end) {
        const std::int64_t slot = static_cast<std::int64_t>(bt[p / a.block_size]) * a.block_size + p % a.block_size;
        const std::int64_t at = (slot * a.nkv + g) * D + d;
        kx = kv_load<K>(kc, at) * ks;
        vx = kv_load<K>(vc, at) * vs;
      }
      sk[j][d] = kx;
      sv[j][d] = vx;
    }
    __syncthreads();
    for (int i = tid; i < R * kKeyTile; i += kAttnThreads) {
      const int r = i / kKeyTile, j = i % kKeyTile, p = t0 + j;
      float s = -INFINITY;
      if (p < end && p <= s_pos[r]) {
        float dot = 0.0f;
#pragma unroll 16
        for (int d = 0; d < D; ++d) dot += sq[r][d] * sk[j][d];
        s = dot * a.scale;
      }
      sp[r][j] = s;
    }
    __syncthreads();
    for (int r = warp; r < R; r += kAttnThreads / 32) {
      const float s = sp[r][lane];
      const float m_old = s_m[r];
      const float m_new = fmaxf(m_old, warp_max(s));
      const float p = m_new == -INFINITY ? 0.0f : expf(s - m_new);
      const float sum = warp_sum(p);
      sp[r][lane] = p;
      __syncwarp();
      if (lane == 0) {
        const float alpha = m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
        s_alpha[r] = alpha;
        s_l[r] = s_l[r] * alpha + sum;
        s_m[r] = m_new;
      }
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < RPT; ++k) {
      const int r = r_own + k * RSTEP;
      float v = acc[k] * s_alpha[r];
#pragma unroll 8
      for (int j = 0; j < kKeyTile; ++j) v += sp[r][j] * sv[j][d_own];
      acc[k] = v;
    }
    __syncthreads();
  }
  if (a.splits == 1) {
#pragma unroll
    for (int k = 0; k < RPT; ++k) {
      const int r = r_own + k * RSTEP;
      if (r >= rows) continue;
      const std::int64_t at = static_cast<std::int64_t>(tok0 + r / group) * qstride + (g * group + r % group) * D + d_own;
      act_store<A>(a.out, at, s_l[r] > 0.0f ? acc[k] / s_l[r] : 0.0f);
    }
  } else {
    float* part = a.partial + ((static_cast<std::int64_t>(item) * a.nkv + g) * a.splits + split) * R * (D + 2);
#pragma unroll
    for (int k = 0; k < RPT; ++k) {
      const int r = r_own + k * RSTEP;
      part[r * (D + 2) + d_own] = acc[k];
      if (d_own == 0) {
        part[r * (D + 2) + D] = s_m[r];
        part[r * (D + 2) + D + 1] = s_l[r];
      }
    }
  }
}

// Eight consecutive cache elements (i is a multiple of 8) as floats, in one or two vector loads.
template <Kv K>
__device__ __forceinline__ void kv_load8(const void* p, std::int64_t i, float (&out)[8]) {
  if constexpr (K == Kv::kF32) {
    const float4* v = reinterpret_cast<const float4*>(static_cast<const float*>(p) + i);
    const float4 a = v[0], b = v[1];
    out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w, out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
  } else if constexpr (K == Kv::kBF16 || K == Kv::kF16) {
    const uint4 u = *reinterpret_cast<const uint4*>(static_cast<const std::uint16_t*>(p) + i);
    const std::uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      float2 f;
      if constexpr (K == Kv::kBF16) {
        f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[k]));
      } else {
        f = __half22float2(*reinterpret_cast<const __half2*>(&w[k]));
      }
      out[2 * k] = f.x;
      out[2 * k + 1] = f.y;
    }
  } else {
    const uint2 u = *reinterpret_cast<const uint2*>(static_cast<const std::uint8_t*>(p) + i);
    const std::uint32_t w[2] = {u.x, u.y};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const auto pair = static_cast<__nv_fp8x2_storage_t>(w[k / 2] >> (16 * (k % 2)));
      const float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pair, K == Kv::kE5M2 ? __NV_E5M2 : __NV_E4M3)));
      out[2 * k] = f.x;
      out[2 * k + 1] = f.y;
    }
  }
}

// Decode attention (every item is one query token): one block per (item, KV head, split)
// streams the split's keys in chunks. A K or V row is read once for the whole GQA group with
// 8-element vector loads, D / 8 threads per row; each of the group's GM (>= G) query heads
// keeps its running max and sum. Scores of a chunk go through shared memory; the per-row
// partial outputs are summed at the end.
constexpr int kDecodeThreads = 128;
constexpr int kDecodeChunk = 256;

template <int D, Kv K, Act A, int GM>
__global__ void __launch_bounds__(kDecodeThreads) decode_attention_kernel(AttnArgs a) {
  constexpr int TPR = D / 8, RPP = kDecodeThreads / TPR;
  __shared__ float s_p[GM][kDecodeChunk];
  __shared__ float s_red[RPP][GM][D];
  __shared__ float s_m[GM], s_l[GM], s_alpha[GM];
  const int item = blockIdx.x, g = blockIdx.y, split = blockIdx.z, tid = threadIdx.x;
  const int G = a.nh / a.nkv, lane = tid & 31, warp = tid >> 5;
  const int tok = a.item_token[item], seq = a.item_seq[item];
  const int row = tid / TPR, d0 = (tid % TPR) * 8;
  const std::int64_t qrow = static_cast<std::int64_t>(tok) * a.nh * D + static_cast<std::int64_t>(g) * G * D;
  float q[GM][8], acc[GM][8];
#pragma unroll
  for (int h = 0; h < GM; ++h) {
#pragma unroll
    for (int v = 0; v < 8; ++v) {
      q[h][v] = h < G ? a.q[qrow + h * D + d0 + v] : 0.0f;
      acc[h][v] = 0.0f;
    }
  }
  if (tid < GM) {
    s_m[tid] = -INFINITY;
    s_l[tid] = 0.0f;
  }
  const int kv_len = a.positions[tok] + 1;
  int per = (kv_len + a.splits - 1) / a.splits;
  per = (per + kKeyTile - 1) / kKeyTile * kKeyTile;
  const int begin = split * per, end = min(kv_len, begin + per);
  const std::int32_t* bt = a.block_tables + static_cast<std::int64_t>(seq) * (*a.bt_stride);
  const void* kc = a.kv_ptrs[2 * a.layer];
  const void* vc = a.kv_ptrs[2 * a.layer + 1];
  const float kscale = (a.k_scale ? a.k_scale[g] : 1.0f) * a.scale, vs = a.v_scale ? a.v_scale[g] : 1.0f;
  auto at = [&](int p) {
    const std::int64_t slot = static_cast<std::int64_t>(bt[p / a.block_size]) * a.block_size + p % a.block_size;
    return (slot * a.nkv + g) * D + d0;
  };
  __syncthreads();
  for (int c0 = begin; c0 < end; c0 += kDecodeChunk) {
    const int n = min(kDecodeChunk, end - c0);
    // Scores. The trip count is the same for every thread, so the row's shuffles converge.
    for (int j0 = 0; j0 < n; j0 += RPP) {
      const int j = j0 + row;
      const bool ok = j < n;
      float k[8];
      if (ok) {
        kv_load8<K>(kc, at(c0 + j), k);
      } else {
#pragma unroll
        for (int v = 0; v < 8; ++v) k[v] = 0.0f;
      }
      float dot[GM];
#pragma unroll
      for (int h = 0; h < GM; ++h) {
        float s = 0.0f;
#pragma unroll
        for (int v = 0; v < 8; ++v) s += q[h][v] * k[v];
        dot[h] = s;
      }
#pragma unroll
      for (int o = TPR / 2; o > 0; o >>= 1) {
#pragma unroll
        for (int h = 0; h < GM; ++h) dot[h] += __shfl_xor_sync(0xffffffffu, dot[h], o);
      }
      if (ok && d0 == 0) {
#pragma unroll
        for (int h = 0; h < GM; ++h) {
          if (h < G) s_p[h][j] = dot[h] * kscale;
        }
      }
    }
    __syncthreads();
    for (int h = warp; h < G; h += kDecodeThreads / 32) {
      float mx = -INFINITY;
      for (int j = lane; j < n; j += 32) mx = fmaxf(mx, s_p[h][j]);
      const float m_old = s_m[h], m_new = fmaxf(m_old, warp_max(mx));
      float sum = 0.0f;
      for (int j = lane; j < n; j += 32) {
        const float e = expf(s_p[h][j] - m_new);
        s_p[h][j] = e;
        sum += e;
      }
      sum = warp_sum(sum);
      __syncwarp();  // every lane has read s_m[h] before lane 0 replaces it
      if (lane == 0) {
        const float alpha = m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
        s_alpha[h] = alpha;
        s_l[h] = s_l[h] * alpha + sum;
        s_m[h] = m_new;
      }
    }
    __syncthreads();
#pragma unroll
    for (int h = 0; h < GM; ++h) {
      const float alpha = h < G ? s_alpha[h] : 0.0f;
#pragma unroll
      for (int v = 0; v < 8; ++v) acc[h][v] *= alpha;
    }
    for (int j = row; j < n; j += RPP) {
      float x[8];
      kv_load8<K>(vc, at(c0 + j), x);
#pragma unroll
      for (int h = 0; h < GM; ++h) {
        if (h < G) {
          const float p = s_p[h][j] * vs;
#pragma unroll
          for (int v = 0; v < 8; ++v) acc[h][v] += p * x[v];
        }
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int h = 0; h < GM; ++h) {
#pragma unroll
    for (int v = 0; v < 8; ++v) s_red[row][h][d0 + v] = acc[h][v];
  }
  __syncthreads();
  for (int i = tid; i < G * D; i += kDecodeThreads) {
    const int h = i / D, d = i % D;
    float o = 0.0f;
    for (int r = 0; r < RPP; ++r) o += s_red[r][h][d];
    if (a.splits == 1) {
      act_store<A>(a.out, qrow + h * D + d, s_l[h] > 0.0f ? o / s_l[h] : 0.0f);
    } else {
      float* part = a.partial + ((static_cast<std::int64_t>(item) * a.nkv + g) * a.splits + split) * kAttnRows * (D + 2) + h * (D + 2);
      part[d] = o;
      if (d == 0) {
        part[D] = s_m[h];
        part[D + 1] = s_l[h];
      }
    }
  }
}

template <Act A>
__global__ void attention_combine_kernel(AttnArgs a) {
  const int item = blockIdx.x, g = blockIdx.y, D = a.D;
  const int group = a.nh / a.nkv;
  const int tok0 = a.item_token[item], rows = a.item_count[item] * group;
  const float* part = a.partial + (static_cast<std::int64_t>(item) * a.nkv + g) * a.splits * kAttnRows * (D + 2);
  for (int i = threadIdx.x; i < rows * D; i += blockDim.x) {
    const int r = i / D, d = i % D;
    float mx = -INFINITY;
    for (int s = 0; s < a.splits; ++s) mx = fmaxf(mx, part[(s * kAttnRows + r) * (D + 2) + D]);
    float l = 0.0f, o = 0.0f;
    for (int s = 0; s < a.splits; ++s) {
      const float* p = part + (s * kAttnRows + r) * (D + 2);
      if (p[D] == -INFINITY) continue;
      const float w = expf(p[D] - mx);
      l += p[D + 1] * w;
      o += p[d] * w;
    }
    const std::int64_t at = static_cast<std::int64_t>(tok0 + r / group) * a.nh * D + (g * group + r % group) * D + d;
    act_store<A>(a.out, at, l > 0.0f ? o / l : 0.0f);
  }
}

template <Act A>
__global__ void silu_mul_kernel(const float* gu, int I, void* out) {
  const std::int64_t t = blockIdx.y;
  const float* row = gu + t * 2 * I;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < I; i += gridDim.x * blockDim.x) {
    const float gate = row[i];
    act_store<A>(out, t * I + i, gate / (1.0f + expf(-gate)) * row[I + i]);
  }
}

// ---- sampling: one block of kSampleThreads per row ---------------------------------------
constexpr int kSampleThreads = 1024;
constexpr int kSampleWarps = kSampleThreads / 32;

// A float's bits as an unsigned integer that orders like the float (NaN aside).
__device__ __forceinline__ std::uint32_t order_key(float x) {
  const std::uint32_t u = __float_as_uint(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11).
__device__ uint4 philox4x32(uint4 c, uint2 k) {
#pragma unroll
  for (int r = 0; r < 10; ++r) {
    const std::uint32_t hi0 = __umulhi(0xD2511F53u, c.x), lo0 = 0xD2511F53u * c.x;
    const std::uint32_t hi1 = __umulhi(0xCD9E8D57u, c.z), lo1 = 0xCD9E8D57u * c.z;
    c = make_uint4(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
    k.x += 0x9E3779B9u;
    k.y += 0xBB67AE85u;
  }
  return c;
}

// Gumbel noise -log(-log u) for element i of the stream (key, counter); u in (0, 1).
__device__ float gumbel(const SampleSpec& sp, int i) {
  const uint4 r = philox4x32(make_uint4(static_cast<std::uint32_t>(i) >> 2, sp.counter, 0x6c6d7376u, 0u), make_uint2(sp.key_lo, sp.key_hi));
  const std::uint32_t w[4] = {r.x, r.y, r.z, r.w};
  const float u = (static_cast<float>(w[i & 3] >> 8) + 0.5f) * (1.0f / 16777216.0f);
  return -logf(-logf(u));
}

// Probability relative to the largest, exp((x - max) / t), in 2^-40 units: integer sums are
// exact and order-free, so a draw does not depend on the order atomics land in.
__device__ __forceinline__ unsigned long long fixed_weight(float x, float mx, float inv_t) {
  const float w = expf((x - mx) * inv_t);
  return w > 0.0f ? static_cast<unsigned long long>(w * 1099511627776.0f) : 0ull;  // NaN: 0
}

// Block-wide (value, index) max, ties to the lower index; every thread gets the result.
__device__ void block_argmax(float* v, int* i, float* sv, int* si) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, *v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, *i, o);
    if (ov > *v || (ov == *v && oi < *i)) *v = ov, *i = oi;
  }
  __syncthreads();
  if (lane == 0) sv[warp] = *v, si[warp] = *i;
  __syncthreads();
  *v = sv[lane];
  *i = si[lane];
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, *v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, *i, o);
    if (ov > *v || (ov == *v && oi < *i)) *v = ov, *i = oi;
  }
}

__device__ unsigned long long block_sum_u64(unsigned long long x, unsigned long long* s) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  __syncthreads();
  if (lane == 0) s[warp] = x;
  __syncthreads();
  x = s[lane];
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

struct SelectShared {
  unsigned long long hist[256];
  unsigned long long rem;
  std::uint32_t bin;
};

// Radix select over order keys, 8 bits a pass: the largest key K such that the weight of the
// elements with key >= K (and key >= floor) reaches `target` (>= 1, <= their total weight).
// weight(x) is an integer (1 counts elements; fixed_weight sums probabilities).
template <class Weight>
__device__ std::uint32_t radix_select(const float* row, int V, std::uint32_t floor, unsigned long long target, Weight weight,
                                      SelectShared& sh) {
  const int tid = threadIdx.x, lane = tid & 31;
  std::uint32_t prefix = 0, mask = 0;
  unsigned long long rem = target;
  for (int shift = 24; shift >= 0; shift -= 8) {
    if (tid < 256) sh.hist[tid] = 0;
    __syncthreads();
    for (int i = tid; i < V; i += kSampleThreads) {
      const float x = row[i];
      const std::uint32_t k = order_key(x);
      if (k >= floor && (k & mask) == prefix) {
        const unsigned long long w = weight(x);
        if (w) atomicAdd(&sh.hist[(k >> shift) & 255u], w);
      }
    }
    __syncthreads();
    if (tid < 32) {
      // Lane l owns bins 255 - 8l down to 248 - 8l; an inclusive scan from the top bin down.
      unsigned long long own = 0;
      for (int j = 0; j < 8; ++j) own += sh.hist[255 - 8 * lane - j];
      unsigned long long incl = own;
      for (int o = 1; o < 32; o <<= 1) {
        const unsigned long long up = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += up;
      }
      const unsigned ballot = __ballot_sync(0xffffffffu, incl >= rem);
      const int first = ballot ? __ffs(static_cast<int>(ballot)) - 1 : 31;
      if (lane == first) {
        unsigned long long cum = incl - own;
        int bin = 255 - 8 * lane - 7;
        for (int j = 0; j < 8; ++j) {
          const int b = 255 - 8 * lane - j;
          if (cum + sh.hist[b] >= rem) {
            bin = b;
            break;
          }
          cum += sh.hist[b];
        }
        sh.bin = static_cast<std::uint32_t>(bin);
        sh.rem = rem > cum ? rem - cum : 1;
      }
    }
    __syncthreads();
    prefix |= sh.bin << shift;
    mask |= 255u << shift;
    rem = sh.rem;
  }
  return prefix;
}

__global__ void __launch_bounds__(kSampleThreads) sample_kernel(const float* logits, int V, const SampleSpec* specs, std::int32_t* tokens) {
  __shared__ float s_v[kSampleWarps];
  __shared__ int s_i[kSampleWarps];
  __shared__ unsigned long long s_u[kSampleWarps];
  __shared__ SelectShared sh;
  const SampleSpec sp = specs[blockIdx.x];
  const float* row = logits + static_cast<std::int64_t>(blockIdx.x) * V;
  const int tid = threadIdx.x;
  if (sp.mode <= 0) {
    if (tid == 0) tokens[blockIdx.x] = -1;
    return;
  }
  float bv = -INFINITY;
  int bi = V;  // larger than any index: loses every tie
  for (int i = tid; i < V; i += kSampleThreads) {
    const float x = row[i];
    if (x > bv) bv = x, bi = i;
  }
  block_argmax(&bv, &bi, s_v, s_i);
  const float mx = bv;
  const int top = bi < V ? bi : 0;
  if (sp.mode == 1 || !(sp.temperature > 0.0f) || !(mx > -INFINITY)) {
    if (tid == 0) tokens[blockIdx.x] = top;
    return;
  }
  const float inv_t = 1.0f / sp.temperature;
  if (isinf(inv_t)) {  // a temperature too small to divide by: the argmax, as its limit
    if (tid == 0) tokens[blockIdx.x] = top;
    return;
  }
  std::uint32_t floor = 0;  // kept: order_key(x) >= floor
  if (sp.top_k > 0 && sp.top_k < V) {
    floor = radix_select(row, V, 0u, static_cast<unsigned long long>(sp.top_k), [](float) { return 1ull; }, sh);
  }
  if (sp.top_p < 1.0f) {
    auto w = [&](float x) { return fixed_weight(x, mx, inv_t); };
    unsigned long long total = 0;
    for (int i = tid; i < V; i += kSampleThreads) {
      const float x = row[i];
      if (order_key(x) >= floor) total += w(x);
    }
    total = block_sum_u64(total, s_u);
    const double want = ceil(static_cast<double>(sp.top_p) * static_cast<double>(total));
    const unsigned long long target = want < 1.0 ? 1ull : (want > static_cast<double>(total) ? total : static_cast<unsigned long long>(want));
    if (total > 0) floor = max(floor, radix_select(row, V, floor, target, w, sh));
  }
  float best = -INFINITY;
  int pick = V;
  for (int i = tid; i < V; i += kSampleThreads) {
    const float x = row[i];
    if (order_key(x) < floor) continue;
    const float rel = (x - mx) * inv_t;
    if (sp.min_p > 0.0f && expf(rel) < sp.min_p) continue;
    const float score = rel + gumbel(sp, i);
    if (score > best || (score == best && i < pick)) best = score, pick = i;
  }
  block_argmax(&best, &pick, s_v, s_i);
  if (tid == 0) tokens[blockIdx.x] = pick < V ? pick : top;
}

template <Act A>
__global__ void float_to_act_kernel(const float* in, void* out, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    act_store<A>(out, i, in[i]);
  }
}

template <Act A>
__global__ void act_to_float_kernel(const void* in, float* out, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    out[i] = act_load<A>(in, i);
  }
}

__global__ void fill_kernel(float* p, float v, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    p[i] = v;
  }
}

int grid_for(std::int64_t n, int threads) {
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

template <int D>
void run_attention(const AttnArgs& a, cudaStream_t s) {
  dim3 grid(static_cast<unsigned>(a.num_items), static_cast<unsigned>(a.nkv), static_cast<unsigned>(a.splits));
  const int group = a.nh / a.nkv;
  if (a.single && group <= 4) {
    LMSERVE_WITH_ACT(a.act, A, LMSERVE_WITH_KV(a.kv, K, (decode_attention_kernel<D, K, A, 4><<<grid, kDecodeThreads, 0, s>>>(a))));
  } else if (a.single && group <= 8) {
    LMSERVE_WITH_ACT(a.act, A, LMSERVE_WITH_KV(a.kv, K, (decode_attention_kernel<D, K, A, 8><<<grid, kDecodeThreads, 0, s>>>(a))));
  } else {
    LMSERVE_WITH_ACT(a.act, A, LMSERVE_WITH_KV(a.kv, K, (attention_kernel<D, K, A><<<grid, kAttnThreads, 0, s>>>(a))));
  }
  if (a.splits > 1) {
    dim3 cgrid(static_cast<unsigned>(a.num_items), static_cast<unsigned>(a.nkv));
    LMSERVE_WITH_ACT(a.act, A, (attention_combine_kernel<A><<<cgrid, 128, 0, s>>>(a)));
  }
}

}  // namespace

void launch_embed(const void* table, Act act, const std::int32_t* tokens, int T, int H, float* x, cudaStream_t s) {
  if (T == 0) return;
  LMSERVE_WITH_ACT(act, A, (embed_kernel<A><<<T, 256, 0, s>>>(table, tokens, H, x)));
}

void launch_add(float* x, const float* delta, std::int64_t n, cudaStream_t s) {
  if (n == 0) return;
  add_kernel<<<grid_for(n, 256), 256, 0, s>>>(x, delta, n);
}

void launch_add_rmsnorm(float* x, const float* delta, const std::int32_t* rows, int R, int H, const void* w, Act act, float eps, void* out,
                        cudaStream_t s) {
  if (R == 0) return;
  LMSERVE_WITH_ACT(act, A, (add_rmsnorm_kernel<A><<<R, kNormThreads, 0, s>>>(x, delta, rows, H, w, eps, out)));
}

void launch_qkv_rope(const QkvRopeArgs& a, cudaStream_t s) {
  if (a.T == 0) return;
  LMSERVE_WITH_ACT(a.act, A, LMSERVE_WITH_KV(a.kv, K, (qkv_rope_kernel<A, K><<<a.T, 256, 0, s>>>(a))));
}

bool attention_supports(int head_dim, int group) {
  return (head_dim == 16 || head_dim == 32 || head_dim == 64 || head_dim == 128) && group >= 1 && group <= kAttnRows;
}

void launch_attention(const AttnArgs& a, cudaStream_t s) {
  if (a.num_items == 0) return;
  switch (a.D) {
    case 16: run_attention<16>(a, s); break;
    case 32: run_attention<32>(a, s); break;
    case 64: run_attention<64>(a, s); break;
    case 128: run_attention<128>(a, s); break;
    default: break;  // rejected at backend creation (attention_supports)
  }
}

void launch_silu_mul(const float* gu, int T, int I, void* out, Act act, cudaStream_t s) {
  if (T == 0) return;
  dim3 grid(static_cast<unsigned>((I + 255) / 256 > 64 ? 64 : (I + 255) / 256), static_cast<unsigned>(T));
  LMSERVE_WITH_ACT(act, A, (silu_mul_kernel<A><<<grid, 256, 0, s>>>(gu, I, out)));
}

void launch_sample(const float* logits, int R, int V, const SampleSpec* specs, std::int32_t* tokens, cudaStream_t s) {
  if (R == 0) return;
  sample_kernel<<<R, kSampleThreads, 0, s>>>(logits, V, specs, tokens);
}

void launch_float_to_act(const float* in, void* out, Act act, std::int64_t n, cudaStream_t s) {
  if (n == 0) return;
  LMSERVE_WITH_ACT(act, A, (float_to_act_kernel<A><<<grid_for(n, 256), 256, 0, s>>>(in, out, n)));
}

void launch_act_to_float(const void* in, Act act, float* out, std::int64_t n, cudaStream_t s) {
  if (n == 0) return;
  LMSERVE_WITH_ACT(act, A, (act_to_float_kernel<A><<<grid_for(n, 256), 256, 0, s>>>(in, out, n)));
}

void launch_fill(float* p, float value, std::int64_t n, cudaStream_t s) {
  if (n == 0) return;
  fill_kernel<<<grid_for(n, 256), 256, 0, s>>>(p, value, n);
}

}  // namespace lmserve::cuda
