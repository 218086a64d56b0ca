// The elementwise and normalisation kernels of kernels.cuh: embedding, residual add + RMSNorm,
// QKV bias / q-k norm / RoPE with the paged KV write, SiLU x mul, conversions. Attention is in
// attention.cu, sampling in sample.cu.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "backend/cuda/common/device_util.cuh"
#include "backend/cuda/common/kernels.cuh"
#include "backend/cuda/common/quantize_fp8.cuh"

namespace lmserve::cuda {

int act_bytes(Act a) { return a == Act::kF32 ? 4 : 2; }

namespace {

template <Act A>
__global__ void embed_kernel(const void* table, const std::int32_t* tokens, int H, std::int64_t begin, std::int64_t rows, float* x) {
  pdl_wait();
  pdl_release();
  const std::int64_t token = static_cast<std::int64_t>(tokens[blockIdx.x]) - begin;
  float* out = x + static_cast<std::int64_t>(blockIdx.x) * H;
  if (token < 0 || token >= rows) {  // another rank's row
    for (int i = threadIdx.x; i < H; i += blockDim.x) out[i] = 0.0f;
    return;
  }
  for (int i = threadIdx.x; i < H; i += blockDim.x) out[i] = act_load<A>(table, token * H + i);
}

template <Act G>
__global__ void add_kernel(float* x, const void* d, std::int64_t n) {
  pdl_wait();
  pdl_release();
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    x[i] += act_load<G>(d, i);
  }
}

constexpr int kNormThreads = 1024;  // at most; a block has about H / 16 threads

// One block per row, about H / 16 threads. The row is read with float4 loads, up to kNormLoads
// per thread issued before any is used (the whole row in flight at once for H <= 16,384). Where
// those loads cover the row (every model's), the values stay in registers for the
// normalisation and the output goes out four at a time; else a second pass re-reads the row.
constexpr int kNormLoads = 4;

// delta in G: act or float32.
template <Act A, Act G>
__global__ void __launch_bounds__(kNormThreads) add_rmsnorm_kernel(float* __restrict__ x, const void* __restrict__ delta, const std::int32_t* rows,
                                                                   int H, const void* __restrict__ w, float eps, void* __restrict__ out, bool x_settled,
                                                                   std::uint8_t* __restrict__ xq, float* __restrict__ xs) {
  __shared__ float partial[kNormThreads / 32];
  const int threads = static_cast<int>(blockDim.x);
  const bool vec = H % 4 == 0, held = vec && H / 4 <= threads * kNormLoads;
  // Before the wait for the kernel before (which writes x or delta): the row index (staged by
  // the host), and the weights asked into L1 (no registers held), so that their loads after the
  // block sum hit instead of going to memory in the middle of the kernel's chain.
  const std::int64_t src = rows ? rows[blockIdx.x] : blockIdx.x;
  for (int i = threadIdx.x * 4; i < H; i += threads * 4) {
    asm volatile("prefetch.global.L1 [%0];\n" ::"l"(static_cast<const char*>(w) + static_cast<std::int64_t>(i) * (A == Act::kF32 ? 4 : 2)));
  }
  float* xr = x + src * H;
  float4* x4 = reinterpret_cast<float4*>(xr);
  const int n4 = H / 4;
  // x_settled: no kernel since the one before the previous wrote x (it finished before this
  // kernel could start), so a row held in registers is read before the wait too, from L2.
  const bool early_x = x_settled && held;
  float4 v[kNormLoads];
  if (early_x) {
#pragma unroll
    for (int u = 0; u < kNormLoads; ++u) {
      const int i = threadIdx.x + u * threads;
      if (i < n4) v[u] = __ldcg(x4 + i);
    }
  }
  pdl_wait();
  pdl_release();
  const std::int64_t o = static_cast<std::int64_t>(blockIdx.x) * H;
  const std::int64_t drow = src * H;  // delta's row
  float ss = 0.0f;
  if (vec) {
    for (int i0 = threadIdx.x; i0 < n4; i0 += threads * kNormLoads) {
      float4 d[kNormLoads];
#pragma unroll
      for (int u = 0; u < kNormLoads; ++u) {
        const int i = i0 + u * threads;
        if (i < n4) {
          if (!early_x) v[u] = x4[i];
          if (delta) d[u] = act_load4<G>(delta, drow + 4 * i);
        }
      }
#pragma unroll
      for (int u = 0; u < kNormLoads; ++u) {
        const int i = i0 + u * threads;
        if (i >= n4) continue;
        if (delta) {
          v[u].x += d[u].x, v[u].y += d[u].y, v[u].z += d[u].z, v[u].w += d[u].w;
          x4[i] = v[u];
        }
        ss += v[u].x * v[u].x + v[u].y * v[u].y + v[u].z * v[u].z + v[u].w * v[u].w;
      }
    }
  } else {
    for (int i = threadIdx.x; i < H; i += threads) {
      float e = xr[i];
      if (delta) {
        e += act_load<G>(delta, drow + i);
        xr[i] = e;
      }
      ss += e * e;
    }
  }
  ss = warp_sum(ss);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = ss;
  __syncthreads();
  float total = 0.0f;
  for (int i = 0; i < threads / 32; ++i) total += partial[i];
  const float inv = 1.0f / sqrtf(total / static_cast<float>(H) + eps);
  if (held) {
#pragma unroll
    for (int u = 0; u < kNormLoads; ++u) {
      const int i = threadIdx.x + u * threads;
      if (i >= H / 4) continue;
      const float4 g = act_load4<A>(w, 4 * i);
      act_store4<A>(out, o + 4 * i, g.x * (v[u].x * inv), g.y * (v[u].y * inv), g.z * (v[u].z * inv), g.w * (v[u].w * inv));
    }
  } else {
#pragma unroll 4
    for (int i = threadIdx.x; i < H; i += threads) act_store<A>(out, o + i, act_load<A>(w, i) * (xr[i] * inv));
  }
  if (xq == nullptr) return;
  // The row just written, quantized as launch_quantize_rows_fp8 does it (the same function on
  // the same act-rounded values: the same bytes), read back from L1 once the block has written it.
  __syncthreads();  // also: every thread has read partial[] for the norm
  quantize_row_e4m3<A, 0, false>(out, o, H, xq, xs + blockIdx.x, partial);
}

// The first product of a folded norm's chain has no product before it to leave g and the
// partials (Gemm::NormFold): one block per token row writes g = act(x * w) and its whole sum of
// squares (one partial per row).
template <Act A>
__global__ void __launch_bounds__(kNormThreads) norm_fold_start_kernel(const float* __restrict__ x, int H, const void* __restrict__ w,
                                                                       void* __restrict__ g, float* __restrict__ partials) {
  __shared__ float part[kNormThreads / 32];
  pdl_wait();
  pdl_release();
  const std::int64_t o = static_cast<std::int64_t>(blockIdx.x) * H;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < H; i += blockDim.x) {
    const float e = x[o + i];
    ss += e * e;
    act_store<A>(g, o + i, e * act_load<A>(w, i));
  }
  ss = warp_sum(ss);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.0f;
    for (int i = 0; i < static_cast<int>(blockDim.x) / 32; ++i) total += part[i];
    partials[blockIdx.x] = total;
  }
}

// One warp per (token, head) over q heads, k heads, v heads: block (t, y) takes heads y * warps
// + w, stride warps * gridDim.y, of token t. launch_qkv_rope gives a block all of a token's
// heads (gridDim.y 1) when there are enough tokens to fill the GPU, so that the token's rotation
// table is made once, not once per block, and each warp loads its next head while it rotates
// and stores the current one; for few tokens (decode at a small batch) the heads spread over
// blocks. A lane holds E consecutive pairs (i, i + half) of a head, i = lane * E + e (E = 1 or
// 2, the fewer that covers half with 32 lanes), loaded in one 4- or 8-byte access per half. For
// the head dims attention_supports (16, 32, 64, 128) half is a multiple of E, so a lane holds
// all E pairs or none (lanes past half at head dims 16 and 32).
constexpr int kRopeThreads = 256, kRopeMaxE = 2;

// v[0..valid) = p[off..off + valid) as floats (valid: the E pairs a lane holds, or 0), zeros past it.
template <Act G>
__device__ __forceinline__ void load_pairs(const void* p, std::int64_t off, int valid, float (&v)[kRopeMaxE]) {
  if (valid == 2) {
    const float2 f = act_load2<G>(p, off);
    v[0] = f.x, v[1] = f.y;
  } else {
#pragma unroll
    for (int e = 0; e < kRopeMaxE; ++e) v[e] = e < valid ? act_load<G>(p, off + e) : 0.0f;
  }
}

// qkv in G: act or float32.
template <Act A, Kv K, Act G>
__global__ void __launch_bounds__(kRopeThreads) qkv_rope_kernel(QkvRopeArgs a, int E) {
  const int t = blockIdx.x, lane = threadIdx.x & 31, warps = kRopeThreads / 32, warp = blockIdx.y * warps + (threadIdx.x >> 5);
  const int D = a.D, half = D / 2, heads = a.nh + 2 * a.nkv;
  const std::int64_t row = static_cast<std::int64_t>(t) * heads * D;  // the token's qkv row
  // Before the wait for the QKV product: the token's position and slot (staged by the host) and
  // its rotation table. The rotation of pair i depends on the token only: one thread per pair
  // computes it (in double, for large positions) for every head of the block. Per head, the
  // double sin/cos made the kernel instruction-bound at 8,192 tokens (ncu: IPC 2.2, 11% of the
  // FP64 peak, DRAM 27%).
  const std::int32_t pos = a.positions[t];
  const std::int64_t slot = a.slots[t];
  __shared__ float s_cos[kRopeThreads / 2], s_sin[kRopeThreads / 2];
  if (static_cast<int>(threadIdx.x) < half) {
    const float angle = static_cast<float>(pos) * a.inv_freq[threadIdx.x];
    s_cos[threadIdx.x] = static_cast<float>(cos(static_cast<double>(angle)));
    s_sin[threadIdx.x] = static_cast<float>(sin(static_cast<double>(angle)));
  }
  pdl_wait();
  pdl_release();
  void* kc = a.kv_ptrs[2 * a.layer];
  void* vc = a.kv_ptrs[2 * a.layer + 1];
  const int i0 = lane * E, valid = i0 < half ? E : 0;
  // Head hi's pairs of this lane, with the bias added.
  auto load = [&](int hi, float (&lo)[kRopeMaxE], float (&hv)[kRopeMaxE]) {
    const int base = hi * D;
    load_pairs<G>(a.qkv, row + base + i0, valid, lo);
    load_pairs<G>(a.qkv, row + base + half + i0, valid, hv);
    if (a.bias) {
      float blo[kRopeMaxE], bhv[kRopeMaxE];
      load_pairs<A>(a.bias, base + i0, valid, blo);
      load_pairs<A>(a.bias, base + half + i0, valid, bhv);
#pragma unroll
      for (int e = 0; e < kRopeMaxE; ++e) lo[e] += blo[e], hv[e] += bhv[e];
    }
  };
  const int stride = warps * static_cast<int>(gridDim.y);
  float lo[kRopeMaxE], hv[kRopeMaxE];
  if (warp < heads) load(warp, lo, hv);
  __syncthreads();  // the table
  for (int hi = warp; hi < heads; hi += stride) {
    float nlo[kRopeMaxE], nhv[kRopeMaxE];  // the next head's, in flight while this one is stored
    if (hi + stride < heads) load(hi + stride, nlo, nhv);
    const int base = hi * D;
    const bool is_q = hi < a.nh, is_k = !is_q && hi < a.nh + a.nkv;
    const int kvh = is_q ? 0 : (is_k ? hi - a.nh : hi - a.nh - a.nkv);
    const void* nw = is_q ? a.q_norm : (is_k ? a.k_norm : nullptr);
    if (nw) {
      float ss = 0.0f;
#pragma unroll
      for (int e = 0; e < kRopeMaxE; ++e) ss += lo[e] * lo[e] + hv[e] * hv[e];  // zeros past half
      const float inv = 1.0f / sqrtf(warp_sum(ss) / static_cast<float>(D) + a.eps);
#pragma unroll
      for (int e = 0; e < kRopeMaxE; ++e) {
        if (e < valid) {
          lo[e] = act_load<A>(nw, i0 + e) * (lo[e] * inv);
          hv[e] = act_load<A>(nw, i0 + e + half) * (hv[e] * inv);
        }
      }
    }
    float x0[kRopeMaxE], x1[kRopeMaxE];
#pragma unroll
    for (int e = 0; e < kRopeMaxE; ++e) {
      x0[e] = lo[e], x1[e] = hv[e];
      if ((is_q || is_k) && e < valid) {
        const float c = s_cos[i0 + e], s = s_sin[i0 + e];
        x0[e] = lo[e] * c - hv[e] * s;
        x1[e] = hv[e] * c + lo[e] * s;
      }
    }
    if (is_q) {
      const std::int64_t q = static_cast<std::int64_t>(t) * a.nh * D + base + i0;
      if (valid == 2) {
        act_store2<A>(a.q_out, q, x0[0], x0[1]);
        act_store2<A>(a.q_out, q + half, x1[0], x1[1]);
      } else {
#pragma unroll
        for (int e = 0; e < kRopeMaxE; ++e) {
          if (e < valid) act_store<A>(a.q_out, q + e, x0[e]), act_store<A>(a.q_out, q + e + half, x1[e]);
        }
      }
    } else if (slot >= 0) {
      const std::int64_t at = (slot * a.nkv + kvh) * D + i0;
      const float* sc = is_k ? a.k_scale : a.v_scale;
      const float scale = sc ? sc[kvh] : 1.0f;
      float* amax = is_k ? a.k_amax : a.v_amax;
#pragma unroll
      for (int e = 0; e < kRopeMaxE; ++e) {
        if (e >= valid) continue;
        kv_store<K>(is_k ? kc : vc, at + e, x0[e], scale);
        kv_store<K>(is_k ? kc : vc, at + e + half, x1[e], scale);
        if (amax) {
          atomic_max_abs(&amax[kvh], x0[e]);
          atomic_max_abs(&amax[kvh], x1[e]);
        }
      }
    }
#pragma unroll
    for (int e = 0; e < kRopeMaxE; ++e) lo[e] = nlo[e], hv[e] = nhv[e];
  }
}

// gu in G: the act (the gate / up product comes out of cuBLASLt in the
// model's dtype, as vLLM's does, which halves this kernel's reads and the GEMM's writes for
// 16-bit models against float32 products) or float32 (float32 models).
template <Act A, Act G>
__global__ void silu_mul_kernel(const void* gu, int I, void* out) {
  pdl_wait();
  pdl_release();
  const std::int64_t t = blockIdx.y, row = t * 2 * I;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < I; i += gridDim.x * blockDim.x) {
    const float gate = act_load<G>(gu, row + i);
    act_store<A>(out, t * I + i, gate / (1.0f + expf(-gate)) * act_load<G>(gu, row + I + i));
  }
}

// Outputs 4i..4i+3 of token t: out[t, j] = silu(gu[t, j]) * gu[t, I + j].
template <Act A, Act G>
__device__ __forceinline__ void silu_mul4(const void* gu, int I, void* out, std::int64_t t, int i) {
  const std::int64_t row = t * 2 * I;
  const float4 g = act_load4<G>(gu, row + 4 * i), u = act_load4<G>(gu, row + I + 4 * i);
  act_store4<A>(out, t * I + 4 * i, g.x / (1.0f + expf(-g.x)) * u.x, g.y / (1.0f + expf(-g.y)) * u.y, g.z / (1.0f + expf(-g.z)) * u.z,
                g.w / (1.0f + expf(-g.w)) * u.w);
}

// silu_mul_kernel four elements at a time (I a multiple of 4): 16- or 8-byte loads of gate and
// up keep more bytes in flight than one element per thread did (~2.1 TB/s at 8,192 tokens).
template <Act A, Act G>
__global__ void silu_mul4_kernel(const void* gu, int I, void* out) {
  pdl_wait();
  pdl_release();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < I / 4; i += gridDim.x * blockDim.x) silu_mul4<A, G>(gu, I, out, blockIdx.y, i);
}

// silu_mul4_kernel for one row a block, which then quantizes the row it has written per token
// for the FP8 product after it (quantize_fp8.cuh): the same values and bytes as silu_mul4_kernel
// followed by launch_quantize_rows_fp8, without the second kernel's launch and its read of the
// row from memory.
constexpr int kSiluQuantThreads = 512;
template <Act A, Act G>
__global__ void __launch_bounds__(kSiluQuantThreads) silu_mul_quant_kernel(const void* gu, int I, void* out, std::uint8_t* __restrict__ xq,
                                                                           float* __restrict__ xs) {
  __shared__ float part[kSiluQuantThreads / 32];
  pdl_wait();
  pdl_release();
  const std::int64_t t = blockIdx.x;
  for (int i = threadIdx.x; i < I / 4; i += kSiluQuantThreads) silu_mul4<A, G>(gu, I, out, t, i);
  __syncthreads();  // the row is written: every thread reads all of it
  quantize_row_e4m3<A, kSiluQuantThreads, false>(out, t * I, I, xq, xs + t, part);
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

}  // namespace

void launch_embed(const void* table, Act act, const std::int32_t* tokens, int T, int H, float* x, cudaStream_t s) {
  if (T == 0) return;
  launch_embed_rows(table, act, tokens, T, H, 0, INT64_MAX, x, s);
}

void launch_embed_rows(const void* table, Act act, const std::int32_t* tokens, int T, int H, std::int64_t begin, std::int64_t rows, float* x,
                       cudaStream_t s) {
  if (T == 0) return;
  LMSERVE_WITH_ACT(act, A, (launch_pdl(embed_kernel<A>, dim3(T), dim3(256), 0, s, table, tokens, H, begin, rows, x)));
}

void launch_add(float* x, const void* delta, Act delta_act, std::int64_t n, cudaStream_t s) {
  if (n == 0) return;
  LMSERVE_WITH_ACT(delta_act, G, (launch_pdl(add_kernel<G>, dim3(grid_for(n, 256)), dim3(256), 0, s, x, delta, n)));
}

void launch_add_rmsnorm(float* x, const void* delta, Act delta_act, const std::int32_t* rows, int R, int H, const void* w, Act act, float eps,
                        void* out, cudaStream_t s, bool x_settled, void* xq, float* xs) {
  if (R == 0) return;
  if (xq != nullptr && H % 4 != 0) xq = nullptr, xs = nullptr;  // (FP8 products need H % 16 == 0 anyway)
  // kNormLoads float4 loads per thread (256 threads at H = 4,096): at most 64 registers a
  // thread, so 4 rows run per SM. With H / 4 threads a row would take a 1,024-thread block and
  // an SM would run one row at a time (docs/perf.md, "small kernels").
  const int threads = std::min(kNormThreads, std::max(32, (H / (4 * kNormLoads) + 31) / 32 * 32));
  const bool f32_delta = delta_act == Act::kF32;
  LMSERVE_WITH_ACT(act, A, (launch_pdl(f32_delta ? add_rmsnorm_kernel<A, Act::kF32> : add_rmsnorm_kernel<A, A>, dim3(R), dim3(threads), 0, s, x, delta,
                                       rows, H, w, eps, out, x_settled, static_cast<std::uint8_t*>(xq), xs)));
}

void launch_norm_fold_start(const float* x, int T, int H, const void* w, Act act, void* g, float* partials, cudaStream_t s) {
  if (T == 0) return;
  const int threads = std::min(kNormThreads, std::max(32, (H / 4 + 31) / 32 * 32));
  LMSERVE_WITH_ACT(act, A, (launch_pdl(norm_fold_start_kernel<A>, dim3(T), dim3(threads), 0, s, x, H, w, g, partials)));
}

void launch_qkv_rope(const QkvRopeArgs& a, cudaStream_t s) {
  if (a.T == 0) return;
  const int heads = a.nh + 2 * a.nkv, warps = kRopeThreads / 32, half = a.D / 2;
  const int E = half <= 32 ? 1 : kRopeMaxE;
  // A block per token from kRopeTokensPerBlock tokens on (8 blocks of 256 threads fit an SM).
  const int y = a.T >= kRopeTokensPerBlock ? 1 : (heads + warps - 1) / warps;
  const dim3 grid(static_cast<unsigned>(a.T), static_cast<unsigned>(y));
  const bool f32_qkv = a.qkv_act == Act::kF32;
  LMSERVE_WITH_ACT(a.act, A, LMSERVE_WITH_KV(a.kv, K, (launch_pdl(f32_qkv ? qkv_rope_kernel<A, K, Act::kF32> : qkv_rope_kernel<A, K, A>, grid,
                                                                  dim3(kRopeThreads), 0, s, a, E))));
}


void launch_silu_mul(const void* gu, Act gu_act, int T, int I, void* out, Act act, cudaStream_t s, void* xq, float* xs) {
  if (T == 0) return;
  const bool f32_in = gu_act == Act::kF32;
  if (xq != nullptr) {
    auto* q = static_cast<std::uint8_t*>(xq);
    LMSERVE_WITH_ACT(act, A, (launch_pdl(f32_in ? silu_mul_quant_kernel<A, Act::kF32> : silu_mul_quant_kernel<A, A>, dim3(static_cast<unsigned>(T)),
                                         dim3(kSiluQuantThreads), 0, s, gu, I, out, q, xs)));
    return;
  }
  if (I % 4 == 0) {
    const int blocks = (I / 4 + 255) / 256;
    dim3 grid(static_cast<unsigned>(blocks > 64 ? 64 : blocks), static_cast<unsigned>(T));
    LMSERVE_WITH_ACT(act, A, (launch_pdl(f32_in ? silu_mul4_kernel<A, Act::kF32> : silu_mul4_kernel<A, A>, grid, dim3(256), 0, s, gu, I, out)));
    return;
  }
  dim3 grid(static_cast<unsigned>((I + 255) / 256 > 64 ? 64 : (I + 255) / 256), static_cast<unsigned>(T));
  LMSERVE_WITH_ACT(act, A, (launch_pdl(f32_in ? silu_mul_kernel<A, Act::kF32> : silu_mul_kernel<A, A>, grid, dim3(256), 0, s, gu, I, out)));
}

void launch_float_to_act(const float* in, void* out, Act act, std::int64_t n, cudaStream_t s) {
  if (n == 0) return;
  LMSERVE_WITH_ACT(act, A, (float_to_act_kernel<A><<<grid_for(n, 256), 256, 0, s>>>(in, out, n)));
}

void launch_act_to_float(const void* in, Act act, float* out, std::int64_t n, cudaStream_t s) {
  if (n == 0) return;
  LMSERVE_WITH_ACT(act, A, (act_to_float_kernel<A><<<grid_for(n, 256), 256, 0, s>>>(in, out, n)));
}

__global__ void swap_blocks_kernel(void* const* kv_ptrs, const std::int32_t* blocks, char* const* host, std::size_t chunk, bool to_host) {
  char* dev = static_cast<char*>(kv_ptrs[blockIdx.y]) + static_cast<std::size_t>(blocks[blockIdx.x]) * chunk;
  char* h = host[blockIdx.x] + static_cast<std::size_t>(blockIdx.y) * chunk;
  const char* src = to_host ? dev : h;
  char* dst = to_host ? h : dev;
  const std::size_t vec = chunk / 16;
  for (std::size_t i = threadIdx.x; i < vec; i += blockDim.x) {
    reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(src)[i];
  }
  for (std::size_t i = vec * 16 + threadIdx.x; i < chunk; i += blockDim.x) dst[i] = src[i];
}

void launch_swap_blocks(void* const* kv_ptrs, int regions, const std::int32_t* blocks, char* const* host, int n, std::size_t chunk, bool to_host,
                        cudaStream_t s) {
  if (n == 0) return;
  swap_blocks_kernel<<<dim3(static_cast<unsigned>(n), static_cast<unsigned>(regions)), 256, 0, s>>>(kv_ptrs, blocks, host, chunk, to_host);
}

void launch_fill(float* p, float value, std::int64_t n, cudaStream_t s) {
  if (n == 0) return;
  fill_kernel<<<grid_for(n, 256), 256, 0, s>>>(p, value, n);
}

}  // namespace lmserve::cuda
