// Pieces shared by the attention kernels (attention.cu, decode_mma.cu): context splits,
// cp.async, the 16-bit mma.sync types and ldmatrix. Device code only; included by .cu files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/common/device_util.cuh"
#include "backend/cuda/common/kernels.cuh"

namespace lmserve::cuda {

constexpr int kAttnThreads = 128;
constexpr int kKeyTile = 32;
// The tensor-core decode kernel's AttnArgs::min_split_keys (kernels.cuh: kMinSplitKeys for the
// others): its four warps share a split, 16-32 keys per tile each.
constexpr int kMmaMinSplitKeys = 256;

// Keys per split of a kv_len-key context planned for `splits` splits, at least min_keys
// (AttnArgs::min_split_keys): a multiple of kKeyTile.
__device__ __forceinline__ int split_keys(int kv_len, int splits, int min_keys) {
  const int per = max((kv_len + splits - 1) / splits, min_keys);
  return (per + kKeyTile - 1) / kKeyTile * kKeyTile;
}

// Whether the one split of a context that needs only one writes the output itself (then the
// combine kernel leaves the item alone): always with one planned split, and for contexts of at
// most `per` keys.
__device__ __forceinline__ bool single_split(int kv_len, int splits, int per) { return splits == 1 || kv_len <= per; }

// Row `row` of the partial result of (item, KV head g, context split) in AttnArgs::partial, the
// combine kernel's input: D unnormalised outputs, then the running max (natural log) and sum.
__device__ __forceinline__ float* split_partial(const AttnArgs& a, int item, int g, int split, int row) {
  return a.partial + (((static_cast<std::int64_t>(item) * a.nkv + g) * a.splits + split) * kAttnRows + row) * (a.D + 2);
}

// ln 2: a running max kept in the exp2 domain, as the partials' natural-log max.
constexpr float kLn2 = 0.6931471805599453f;

// A key position's cache slot through a sequence's block table: shifts and masks where the
// block size is a power of two (16 by default), else a division.
struct BlockIndex {
  int size, shift;
  __device__ __forceinline__ explicit BlockIndex(int block_size) : size(block_size), shift(-1) {
    if ((block_size & (block_size - 1)) == 0) {
      shift = 0;
      while ((1 << shift) < block_size) ++shift;
    }
  }
  // The block-table index of position p, and p's place in its block.
  __device__ __forceinline__ int block(int p) const { return shift >= 0 ? p >> shift : p / size; }
  __device__ __forceinline__ int offset(int p) const { return shift >= 0 ? p & (size - 1) : p % size; }
  __device__ __forceinline__ std::int64_t slot(const std::int32_t* table, int p) const {
    return static_cast<std::int64_t>(table[block(p)]) * size + offset(p);
  }
};

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

template <Kv K>
inline constexpr int kKvElemBytes = K == Kv::kF32 ? 4 : (K == Kv::kBF16 || K == Kv::kF16 ? 2 : 1);

template <Act A>
struct MmaType;
template <>
struct MmaType<Act::kBF16> {
  using T = __nv_bfloat16;
  static __device__ __forceinline__ T from(float x) { return __float2bfloat16_rn(x); }
  static __device__ __forceinline__ unsigned pack(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const unsigned*>(&v);
  }
  static __device__ __forceinline__ float2 unpack(unsigned u) { return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u)); }
  static __device__ __forceinline__ void mma(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};
template <>
struct MmaType<Act::kF16> {
  using T = __half;
  static __device__ __forceinline__ T from(float x) { return __float2half_rn(x); }
  static __device__ __forceinline__ unsigned pack(float lo, float hi) {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const unsigned*>(&v);
  }
  static __device__ __forceinline__ float2 unpack(unsigned u) { return __half22float2(*reinterpret_cast<const __half2*>(&u)); }
  static __device__ __forceinline__ void mma(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

// Four 8x8 matrices of 16-bit values from shared memory; lane l gives the address of row l % 8
// of matrix l / 8 (16-byte aligned); .trans hands each thread a column pair instead of a row pair.
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* p) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n" : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const void* p) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// 2^x; kFtz: by the SFU alone (ex2.approx.ftz), where exp2f is ex2.approx without .ftz, which
// keeps subnormal results at the cost of a test and two scalings around the SFU op. In the
// softmax x <= 0, and a result below 2^-126 (flushed to 0) is nothing next to the row's largest
// term, 1.
template <bool kFtz>
__device__ __forceinline__ float softmax_exp2(float x) {
  if constexpr (kFtz) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
  } else {
    return exp2f(x);
  }
}

// One key tile's step of the online softmax for a 16-row mma tile, in the exp2 domain (the
// decode and prefill tensor-core kernels): `mx` holds this thread's maxima of its two rows'
// scores in s (NF fragments of 8 keys, masked scores -inf). Updates the running max m_run and sum
// l_run, rescales O where some row's max moved (most tiles of a long row leave it), and leaves P
// rounded to M's type as mma A operands in pf (fragment n is the low (n even) or high (n odd)
// half of 16-key step n / 2); the sums are of the rounded values that the P V product uses.
// kFtz (softmax_exp2): for a kernel where the shorter exponential does not make ptxas spill
// (with nvcc 13.0 the two-m-tile prefill kernel at D = 128 spills 48 bytes with it).
template <typename M, bool kFtz, int NF, int ND>
__device__ __forceinline__ void online_softmax(const float (&s)[NF][4], float (&mx)[2], float (&m_run)[2], float (&l_run)[2],
                                               float (&o)[ND][4], unsigned (&pf)[NF / 2][4]) {
  float alpha[2], base[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
    const float m_new = fmaxf(m_run[h], mx[h]);
    alpha[h] = m_run[h] == -INFINITY ? 0.0f : softmax_exp2<kFtz>(m_run[h] - m_new);
    m_run[h] = m_new;
    // A row without a key yet has only -inf scores, whose exp2 is 0 from any finite base.
    base[h] = m_new == -INFINITY ? 0.0f : m_new;
  }
  float sum[2] = {0.0f, 0.0f};
#pragma unroll
  for (int n = 0; n < NF; ++n) {
    float e4[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) e4[e] = softmax_exp2<kFtz>(s[n][e] - base[e / 2]);
    const unsigned lo = M::pack(e4[0], e4[1]), hi = M::pack(e4[2], e4[3]);
    const float2 rl = M::unpack(lo), rh = M::unpack(hi);
    sum[0] += rl.x + rl.y;
    sum[1] += rh.x + rh.y;
    pf[n / 2][(n % 2) * 2 + 0] = lo;
    pf[n / 2][(n % 2) * 2 + 1] = hi;
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) l_run[h] = l_run[h] * alpha[h] + sum[h];
  if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
    for (int n = 0; n < ND; ++n) {
      o[n][0] *= alpha[0];
      o[n][1] *= alpha[0];
      o[n][2] *= alpha[1];
      o[n][3] *= alpha[1];
    }
  }
}

// The tensor-core decode kernel (decode_mma.cu) for the one-token items of a step: whether it
// runs for a model (16-bit acts, head dim 64 or 128, a KV cache of the act's type or fp8,
// group <= 16, unless AttnArgs::cuda_core_decode), its launch (grid items x KV heads
// x splits; partials in AttnArgs::partial when splits > 1, like the CUDA-core kernel), and its
// shared-memory limit (once per device, with configure_attention_kernels).
bool decode_mma_supported(int head_dim, Kv kv, Act act, int group);
void launch_decode_mma(const AttnArgs& a, cudaStream_t s);
void configure_decode_mma();

// The tensor-core prefill kernel (prefill_mma.cu) for the items of a step other than its
// one-token ones: whether it runs for a model (16-bit acts, head dim 64 or 128), and its launch
// (grid items x KV heads, unsplit).
bool prefill_mma_supported(int head_dim, Act act);
void launch_prefill_mma(const AttnArgs& a, cudaStream_t s);

}  // namespace lmserve::cuda
