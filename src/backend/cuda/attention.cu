// Paged attention kernels (kernels.cuh, launch_attention): a tiled kernel for prefill and
// chunks (query rows of one item staged together), a streaming kernel for decode steps, and
// the combine of context splits.
#include <mma.h>

#include <algorithm>
#include <cmath>

#include "backend/cuda/device_util.cuh"
#include "backend/cuda/kernels.cuh"

namespace lmserve::cuda {
namespace {

constexpr int kAttnThreads = 128;
constexpr int kKeyTile = 32;
// A context split covers at least this many keys: short contexts use fewer of the planned
// splits (the blocks of the others return at once, and the combine skips them).
constexpr int kMinSplitKeys = 64;

// Keys per split of a kv_len-key context planned for `splits` splits: a multiple of kKeyTile.
__device__ __forceinline__ int split_keys(int kv_len, int splits) {
  const int per = max((kv_len + splits - 1) / splits, kMinSplitKeys);
  return (per + kKeyTile - 1) / kKeyTile * kKeyTile;
}

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
  const int per = split_keys(kv_len, a.splits);
  const int begin = split * per, end = min(kv_len, begin + per);
  if (split > 0 && begin >= kv_len) return;  // an unused split (the whole block)
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

// Decode attention (every item is one query token): one block per (item, KV head, split)
// streams the split's keys in chunks of kDecodeChunk. K and V rows reach shared memory by
// cp.async through a ring of kDecodeRing tiles (8 KB each; the order of use: a chunk's K
// tiles, then its V tiles), so up to seven tiles per block are in flight without holding a
// register: loads issued one at a time by the threads that use them left a long context
// streaming at ~1.1 TB/s (one 16-byte load per thread in flight). A row is read once for the
// whole GQA group, D / 8 threads per row with 8 elements each; each of the group's GM (>= G)
// query heads keeps its running max and sum. Scores of a chunk go through shared memory; the
// per-row partial outputs are summed at the end (in the ring's memory).
constexpr int kDecodeThreads = 128;
constexpr int kDecodeChunk = 256;
constexpr int kDecodeTileBytes = 8192, kDecodeRing = 8;
constexpr int kDecodeRingBytes = kDecodeTileBytes * kDecodeRing;

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

template <int D, Kv K, Act A, int GM>
__global__ void __launch_bounds__(kDecodeThreads) decode_attention_kernel(AttnArgs a) {
  constexpr int TPR = D / 8, RPP = kDecodeThreads / TPR;
  constexpr int kRowBytes = D * kKvElemBytes<K>, kUnits = kRowBytes / 16;
  constexpr int KS = kDecodeTileBytes / kRowBytes < kDecodeChunk ? kDecodeTileBytes / kRowBytes : kDecodeChunk;  // keys per tile
  static_assert(kRowBytes % 16 == 0 && kDecodeChunk % KS == 0, "tiles of whole 16-byte rows");
  static_assert(static_cast<std::size_t>(RPP) * GM * D * sizeof(float) <= kDecodeRingBytes, "the final sums fit in the ring");
  extern __shared__ __align__(16) unsigned char s_ring[];
  __shared__ float s_p[GM][kDecodeChunk];
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
  const int per = split_keys(kv_len, a.splits);
  const int begin = split * per, end = min(kv_len, begin + per);
  if (split > 0 && begin >= kv_len) return;  // an unused split (the whole block)
  const std::int32_t* bt = a.block_tables + static_cast<std::int64_t>(seq) * (*a.bt_stride);
  const char* kc = static_cast<const char*>(a.kv_ptrs[2 * a.layer]);
  const char* vc = static_cast<const char*>(a.kv_ptrs[2 * a.layer + 1]);
  const float kscale = (a.k_scale ? a.k_scale[g] : 1.0f) * a.scale, vs = a.v_scale ? a.v_scale[g] : 1.0f;

  // Tile i of the split, in the order of use: chunk c holds nt(c) K tiles then nt(c) V tiles
  // (nt = kDecodeChunk / KS but for the last, shorter chunk).
  const int chunks = (end - begin + kDecodeChunk - 1) / kDecodeChunk;
  const int last_n = end - begin - (chunks - 1) * kDecodeChunk, last_nt = (last_n + KS - 1) / KS;
  const int tiles = (chunks - 1) * 2 * (kDecodeChunk / KS) + 2 * last_nt;
  auto issue = [&](int i) {
    if (i < tiles) {
      const int c = i / (2 * (kDecodeChunk / KS)), r = i % (2 * (kDecodeChunk / KS));
      const int nt = c == chunks - 1 ? last_nt : kDecodeChunk / KS;
      const bool is_v = r >= nt;
      const int k0 = begin + c * kDecodeChunk + (is_v ? r - nt : r) * KS, n = min(KS, end - k0);
      const char* base = is_v ? vc : kc;
      unsigned char* dst = s_ring + (i % kDecodeRing) * kDecodeTileBytes;
      for (int u = tid; u < n * kUnits; u += kDecodeThreads) {
        const int j = u / kUnits, w = u % kUnits, p = k0 + j;
        const std::int64_t slot = static_cast<std::int64_t>(bt[p / a.block_size]) * a.block_size + p % a.block_size;
        cp_async16(dst + j * kRowBytes + w * 16, base + ((slot * a.nkv + g) * D) * kKvElemBytes<K> + w * 16);
      }
    }
    cp_async_commit();  // one group per tile index, empty past the end, so the waits count tiles
  };
#pragma unroll
  for (int i = 0; i < kDecodeRing - 1; ++i) issue(i);
  int i = 0;
  // Tile i has landed for every thread, tile i - 1's slot is free again, tile i + ring - 1 is asked for.
  auto next_tile = [&]() -> const void* {
    cp_async_wait<kDecodeRing - 2>();
    __syncthreads();
    issue(i + kDecodeRing - 1);
    return s_ring + (i % kDecodeRing) * kDecodeTileBytes;
  };
  for (int c0 = begin; c0 < end; c0 += kDecodeChunk) {
    const int n = min(kDecodeChunk, end - c0), nt = (n + KS - 1) / KS;
    // Scores. The trip count is the same for every thread, so the row's shuffles converge.
    for (int t = 0; t < nt; ++t, ++i) {
      const void* tile = next_tile();
      for (int j0 = 0; j0 < KS; j0 += RPP) {
        const int j = t * KS + j0 + row;
        const bool ok = j < n;
        float k[8];
        if (ok) {
          kv_load8<K>(tile, static_cast<std::int64_t>(j0 + row) * D + d0, k);
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
    for (int t = 0; t < nt; ++t, ++i) {
      const void* tile = next_tile();
      for (int jj = row; jj < KS && t * KS + jj < n; jj += RPP) {
        float x[8];
        kv_load8<K>(tile, static_cast<std::int64_t>(jj) * D + d0, x);
#pragma unroll
        for (int h = 0; h < GM; ++h) {
          if (h < G) {
            const float p = s_p[h][t * KS + jj] * vs;
#pragma unroll
            for (int v = 0; v < 8; ++v) acc[h][v] += p * x[v];
          }
        }
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // every tile used: the ring holds the per-row sums now
  auto s_red = reinterpret_cast<float (*)[GM][D]>(s_ring);
#pragma unroll
  for (int h = 0; h < GM; ++h) {
#pragma unroll
    for (int v = 0; v < 8; ++v) s_red[row][h][d0 + v] = acc[h][v];
  }
  __syncthreads();
  for (int e = tid; e < G * D; e += kDecodeThreads) {
    const int h = e / D, d = e % D;
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

// ---- prefill attention on the tensor cores (WMMA, 16x16x16, float32 accumulators) ----------
// One block of 4 warps per (item, KV head): kMmaRows rows = the item's query tokens x the
// group's heads (warp w owns rows 16w..16w+15). Per tile of 64 keys: S = Q K^T (bf16/f16
// inputs), causal mask and online softmax in shared memory, P rounded to the input type, and
// O += P V with O kept in shared memory in float32 (rescaled by each row's alpha first).
// Rows in shared memory are padded (kMmaPad16 / kMmaPad32 elements) so that the fragment loads
// of a column do not all hit one bank; 16-bit K/V caches of the model's type come in by cp.async.
constexpr int kMmaThreads = 128, kMmaKeys = 64, kMmaPad16 = 8, kMmaPad32 = 4;

template <Act A>
struct MmaType;
template <>
struct MmaType<Act::kBF16> {
  using T = __nv_bfloat16;
  static __device__ __forceinline__ T from(float x) { return __float2bfloat16_rn(x); }
};
template <>
struct MmaType<Act::kF16> {
  using T = __half;
  static __device__ __forceinline__ T from(float x) { return __float2half_rn(x); }
};

template <int D, Act A>
constexpr std::size_t mma_smem_bytes() {
  using T = typename MmaType<A>::T;
  return static_cast<std::size_t>(kMmaRows) * (D + kMmaPad16) * sizeof(T) * 1       // Q
         + static_cast<std::size_t>(kMmaKeys) * (D + kMmaPad16) * sizeof(T) * 2      // K, V
         + static_cast<std::size_t>(kMmaRows) * (kMmaKeys + kMmaPad32) * 4           // S
         + static_cast<std::size_t>(kMmaRows) * (kMmaKeys + kMmaPad16) * sizeof(T)   // P
         + static_cast<std::size_t>(kMmaRows) * (D + kMmaPad32) * 4                  // O
         + static_cast<std::size_t>(kMmaRows) * 4 * 4;                               // m, l, alpha, query position
}

template <int D, Kv K, Act A>
__global__ void __launch_bounds__(kMmaThreads) prefill_mma_kernel(AttnArgs a) {
  namespace wmma = nvcuda::wmma;
  using M = MmaType<A>;
  using T = typename M::T;
  constexpr int R = kMmaRows, BN = kMmaKeys;
  // Leading dimensions (elements) of Q, K, V / S / P / O.
  constexpr int LQ = D + kMmaPad16, LS = BN + kMmaPad32, LP = BN + kMmaPad16, LO = D + kMmaPad32;
  extern __shared__ __align__(128) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem);
  T* sK = sQ + R * LQ;
  T* sV = sK + BN * LQ;
  float* sS = reinterpret_cast<float*>(sV + BN * LQ);
  T* sP = reinterpret_cast<T*>(sS + R * LS);
  float* sO = reinterpret_cast<float*>(sP + R * LP);
  float* s_m = sO + R * LO;
  float* s_l = s_m + R;
  float* s_alpha = s_l + R;
  int* s_qpos = reinterpret_cast<int*>(s_alpha + R);

  const int item = blockIdx.x, g = blockIdx.y, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int G = a.nh / a.nkv;
  const int tok0 = a.item_token[item], cnt = a.item_count[item], seq = a.item_seq[item];
  const int rows = cnt * G;
  const int qstride = a.nh * D;
  for (int i = tid; i < R * D; i += kMmaThreads) {
    const int r = i / D, d = i % D;
    float v = 0.0f;
    if (r < rows) v = a.q[static_cast<std::int64_t>(tok0 + r / G) * qstride + (g * G + r % G) * D + d];
    sQ[r * LQ + d] = M::from(v);
    sO[r * LO + d] = 0.0f;
  }
  if (tid < R) {
    s_qpos[tid] = tid < rows ? a.positions[tok0 + tid / G] : -1;
    s_m[tid] = -INFINITY;
    s_l[tid] = 0.0f;
  }
  const int kv_len = a.positions[tok0 + cnt - 1] + 1;
  const std::int32_t* bt = a.block_tables + static_cast<std::int64_t>(seq) * (*a.bt_stride);
  const void* kc = a.kv_ptrs[2 * a.layer];
  const void* vc = a.kv_ptrs[2 * a.layer + 1];
  const float ks = a.k_scale ? a.k_scale[g] : 1.0f, vs = a.v_scale ? a.v_scale[g] : 1.0f;
  // A cache of the model's 16-bit type without scales is copied as it is.
  constexpr bool kSameType = (K == Kv::kBF16 && A == Act::kBF16) || (K == Kv::kF16 && A == Act::kF16);
  const bool raw = kSameType && !a.k_scale && !a.v_scale;
  const int r0 = warp * 16;
  __syncthreads();
  for (int t0 = 0; t0 < kv_len; t0 += BN) {
    // K and V tiles in the MMA input type (zeros past the context).
    if (raw) {
      for (int i = tid; i < BN * D / 8; i += kMmaThreads) {
        const int j = i / (D / 8), d0 = (i % (D / 8)) * 8, p = t0 + j;
        T* dk = sK + j * LQ + d0;
        T* dv = sV + j * LQ + d0;
        if (p < kv_len) {
          const std::int64_t slot = static_cast<std::int64_t>(bt[p / a.block_size]) * a.block_size + p % a.block_size;
          const std::int64_t at = (slot * a.nkv + g) * D + d0;
          cp_async16(dk, static_cast<const T*>(kc) + at);
          cp_async16(dv, static_cast<const T*>(vc) + at);
        } else {
          *reinterpret_cast<uint4*>(dk) = make_uint4(0, 0, 0, 0);
          *reinterpret_cast<uint4*>(dv) = make_uint4(0, 0, 0, 0);
        }
      }
      cp_async_commit();
      cp_async_wait<0>();
    }
    for (int i = tid; !raw && i < BN * D / 8; i += kMmaThreads) {
      const int j = i / (D / 8), d0 = (i % (D / 8)) * 8, p = t0 + j;
      float kx[8], vx[8];
      if (p < kv_len) {
        const std::int64_t slot = static_cast<std::int64_t>(bt[p / a.block_size]) * a.block_size + p % a.block_size;
        const std::int64_t at = (slot * a.nkv + g) * D + d0;
        kv_load8<K>(kc, at, kx);
        kv_load8<K>(vc, at, vx);
      } else {
#pragma unroll
        for (int v = 0; v < 8; ++v) kx[v] = vx[v] = 0.0f;
      }
#pragma unroll
      for (int v = 0; v < 8; ++v) {
        sK[j * LQ + d0 + v] = M::from(kx[v] * ks);
        sV[j * LQ + d0 + v] = M::from(vx[v] * vs);
      }
    }
    __syncthreads();
    // S (this warp's 16 rows x 64 keys) = Q K^T.
    {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> s_frag[BN / 16];
#pragma unroll
      for (int c = 0; c < BN / 16; ++c) wmma::fill_fragment(s_frag[c], 0.0f);
#pragma unroll
      for (int k = 0; k < D; k += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> qa;
        wmma::load_matrix_sync(qa, sQ + r0 * LQ + k, LQ);
#pragma unroll
        for (int c = 0; c < BN / 16; ++c) {
          wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> kb;
          wmma::load_matrix_sync(kb, sK + c * 16 * LQ + k, LQ);
          wmma::mma_sync(s_frag[c], qa, kb, s_frag[c]);
        }
      }
#pragma unroll
      for (int c = 0; c < BN / 16; ++c) wmma::store_matrix_sync(sS + r0 * LS + c * 16, s_frag[c], LS, wmma::mem_row_major);
    }
    __syncwarp();
    // Online softmax: two lanes per row, 32 keys each.
    {
      const int r = r0 + lane / 2, half = lane % 2;
      const int qpos = s_qpos[r];
      float mx = -INFINITY;
      for (int j = half * 32; j < half * 32 + 32; ++j) {
        const int p = t0 + j;
        const float x = (p <= qpos && p < kv_len) ? sS[r * LS + j] * a.scale : -INFINITY;
        sS[r * LS + j] = x;
        mx = fmaxf(mx, x);
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      const float m_old = s_m[r], m_new = fmaxf(m_old, mx);
      float sum = 0.0f;
      for (int j = half * 32; j < half * 32 + 32; ++j) {
        const float e = m_new == -INFINITY ? 0.0f : expf(sS[r * LS + j] - m_new);
        const T pe = M::from(e);
        sP[r * LP + j] = pe;
        sum += static_cast<float>(pe);
      }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      __syncwarp();
      if (half == 0) {
        const float alpha = m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
        s_alpha[r] = alpha;
        s_l[r] = s_l[r] * alpha + sum;
        s_m[r] = m_new;
      }
    }
    __syncwarp();
    // O (this warp's rows) = alpha * O + P V.
    for (int i = lane; i < 16 * D; i += 32) sO[(r0 + i / D) * LO + i % D] *= s_alpha[r0 + i / D];
    __syncwarp();
#pragma unroll
    for (int c = 0; c < D / 16; ++c) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> o_frag;
      wmma::load_matrix_sync(o_frag, sO + r0 * LO + c * 16, LO, wmma::mem_row_major);
#pragma unroll
      for (int k = 0; k < BN; k += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> pa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> vb;
        wmma::load_matrix_sync(pa, sP + r0 * LP + k, LP);
        wmma::load_matrix_sync(vb, sV + k * LQ + c * 16, LQ);
        wmma::mma_sync(o_frag, pa, vb, o_frag);
      }
      wmma::store_matrix_sync(sO + r0 * LO + c * 16, o_frag, LO, wmma::mem_row_major);
    }
    __syncthreads();  // K/V tiles are replaced next
  }
  for (int i = tid; i < rows * D; i += kMmaThreads) {
    const int r = i / D, d = i % D;
    const std::int64_t at = static_cast<std::int64_t>(tok0 + r / G) * qstride + (g * G + r % G) * D + d;
    act_store<A>(a.out, at, s_l[r] > 0.0f ? sO[r * LO + d] / s_l[r] : 0.0f);
  }
}

template <Act A>
__global__ void attention_combine_kernel(AttnArgs a) {
  const int item = blockIdx.x, g = blockIdx.y, D = a.D;
  const int group = a.nh / a.nkv;
  const int tok0 = a.item_token[item], rows = a.item_count[item] * group;
  const float* part = a.partial + (static_cast<std::int64_t>(item) * a.nkv + g) * a.splits * kAttnRows * (D + 2);
  const int kv_len = a.positions[tok0 + a.item_count[item] - 1] + 1, per = split_keys(kv_len, a.splits);
  const int used = (kv_len + per - 1) / per;
  for (int i = threadIdx.x; i < rows * D; i += blockDim.x) {
    const int r = i / D, d = i % D;
    float mx = -INFINITY;
#pragma unroll 4
    for (int s = 0; s < used; ++s) mx = fmaxf(mx, part[(s * kAttnRows + r) * (D + 2) + D]);
    float l = 0.0f, o = 0.0f;
#pragma unroll 4
    for (int s = 0; s < used; ++s) {
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

bool mma_prefill(int head_dim, Act act) { return (head_dim == 64 || head_dim == 128) && act != Act::kF32; }

template <int D, Kv K, Act A>
void run_prefill_mma(const AttnArgs& a, cudaStream_t s) {
  constexpr std::size_t smem = mma_smem_bytes<D, A>();
  static const bool configured = [] {
    cudaFuncSetAttribute(prefill_mma_kernel<D, K, A>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    return true;
  }();
  (void)configured;
  dim3 grid(static_cast<unsigned>(a.num_items), static_cast<unsigned>(a.nkv));
  prefill_mma_kernel<D, K, A><<<grid, kMmaThreads, smem, s>>>(a);
}

template <int D>
void run_attention(const AttnArgs& a, cudaStream_t s) {
  dim3 grid(static_cast<unsigned>(a.num_items), static_cast<unsigned>(a.nkv), static_cast<unsigned>(a.splits));
  const int group = a.nh / a.nkv;
  if (a.single && group <= 4) {
    LMSERVE_WITH_ACT(a.act, A, LMSERVE_WITH_KV(a.kv, K, (decode_attention_kernel<D, K, A, 4><<<grid, kDecodeThreads, kDecodeRingBytes, s>>>(a))));
  } else if (a.single && group <= 8) {
    LMSERVE_WITH_ACT(a.act, A, LMSERVE_WITH_KV(a.kv, K, (decode_attention_kernel<D, K, A, 8><<<grid, kDecodeThreads, kDecodeRingBytes, s>>>(a))));
  } else if (!a.single && mma_prefill(D, a.act)) {
    if constexpr (D == 64 || D == 128) {
      if (a.act == Act::kBF16) {
        LMSERVE_WITH_KV(a.kv, K, (run_prefill_mma<D, K, Act::kBF16>(a, s)));
      } else {
        LMSERVE_WITH_KV(a.kv, K, (run_prefill_mma<D, K, Act::kF16>(a, s)));
      }
    }
  } else {
    LMSERVE_WITH_ACT(a.act, A, LMSERVE_WITH_KV(a.kv, K, (attention_kernel<D, K, A><<<grid, kAttnThreads, 0, s>>>(a))));
  }
  if (a.splits > 1) {
    dim3 cgrid(static_cast<unsigned>(a.num_items), static_cast<unsigned>(a.nkv));
    // One thread per output element of the item's rows where it can.
    LMSERVE_WITH_ACT(a.act, A, (attention_combine_kernel<A><<<cgrid, std::min(1024, kAttnRows * D), 0, s>>>(a)));
  }
}


}  // namespace

int attention_item_tokens(int head_dim, int group, Act act) {
  return std::max(1, (mma_prefill(head_dim, act) ? kMmaRows : kAttnRows) / std::max(1, group));
}

namespace {

template <int D, Kv K, Act A>
void allow_decode_ring() {
  cudaFuncSetAttribute(decode_attention_kernel<D, K, A, 4>, cudaFuncAttributeMaxDynamicSharedMemorySize, kDecodeRingBytes);
  cudaFuncSetAttribute(decode_attention_kernel<D, K, A, 8>, cudaFuncAttributeMaxDynamicSharedMemorySize, kDecodeRingBytes);
}

template <int D>
void allow_decode_rings() {
  for (Act act : {Act::kF32, Act::kBF16, Act::kF16}) {
    for (Kv kv : {Kv::kF32, Kv::kBF16, Kv::kF16, Kv::kE5M2, Kv::kE4M3}) {
      LMSERVE_WITH_ACT(act, A, LMSERVE_WITH_KV(kv, K, (allow_decode_ring<D, K, A>())));
    }
  }
}

}  // namespace

void configure_attention_kernels() {
  allow_decode_rings<16>();
  allow_decode_rings<32>();
  allow_decode_rings<64>();
  allow_decode_rings<128>();
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

}  // namespace lmserve::cuda
