// Paged attention kernels (kernels.cuh, launch_attention): a tiled kernel for prefill and
// chunks (query rows of one item staged together), a streaming kernel for decode steps, and
// the combine of context splits; the tensor-core kernels are in decode_mma.cu and
// prefill_mma.cu (attention_util.cuh), launched from here.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "backend/cuda/attention/attention_util.cuh"
#include "backend/cuda/common/device_util.cuh"
#include "backend/cuda/common/kernels.cuh"

namespace lmserve::cuda {
namespace {

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
    if (r < rows) v = act_load<A>(a.q, static_cast<std::int64_t>(tok0 + r / group) * qstride + (g * group + r % group) * D + d);
    sq[r][d] = v;
  }
  if (tid < R) {
    s_pos[tid] = tid < rows ? a.positions[tok0 + tid / group] : -1;
    s_m[tid] = -INFINITY;
    s_l[tid] = 0.0f;
  }
  const int kv_len = a.positions[tok0 + cnt - 1] + 1;
  const int per = split_keys(kv_len, a.splits, a.min_split_keys);
  const int begin = split * per, end = min(kv_len, begin + per);
  if (split > 0 && begin >= kv_len) return;  // an unused split (the whole block)
  const bool write_out = single_split(kv_len, a.splits, per);
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
        const std::int64_t slot = BlockIndex(a.block_size).slot(bt, p);
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
  if (write_out) {
#pragma unroll
    for (int k = 0; k < RPT; ++k) {
      const int r = r_own + k * RSTEP;
      if (r >= rows) continue;
      const std::int64_t at = static_cast<std::int64_t>(tok0 + r / group) * qstride + (g * group + r % group) * D + d_own;
      act_store<A>(a.out, at, s_l[r] > 0.0f ? acc[k] / s_l[r] : 0.0f);
    }
  } else {
    float* part = split_partial(a, item, g, split, 0);
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
  pdl_wait();
  pdl_release();
  const int tok = a.item_token[item], seq = a.item_seq[item];
  const int row = tid / TPR, d0 = (tid % TPR) * 8;
  const std::int64_t qrow = static_cast<std::int64_t>(tok) * a.nh * D + static_cast<std::int64_t>(g) * G * D;
  float q[GM][8], acc[GM][8];
#pragma unroll
  for (int h = 0; h < GM; ++h) {
#pragma unroll
    for (int v = 0; v < 8; ++v) {
      q[h][v] = h < G ? act_load<A>(a.q, qrow + h * D + d0 + v) : 0.0f;
      acc[h][v] = 0.0f;
    }
  }
  if (tid < GM) {
    s_m[tid] = -INFINITY;
    s_l[tid] = 0.0f;
  }
  const int kv_len = a.positions[tok] + 1;
  const int per = split_keys(kv_len, a.splits, a.min_split_keys);
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
    if (single_split(kv_len, a.splits, per)) {
      act_store<A>(a.out, qrow + h * D + d, s_l[h] > 0.0f ? o / s_l[h] : 0.0f);
    } else {
      float* part = split_partial(a, item, g, split, h);
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
  // The item's metadata (staged by the host) before the wait for the attention kernel.
  const int item = blockIdx.x, g = blockIdx.y, D = a.D;
  const int group = a.nh / a.nkv;
  const int tok0 = a.item_token[item], rows = a.item_count[item] * group;
  const float* part = split_partial(a, item, g, 0, 0);
  const int kv_len = a.positions[tok0 + a.item_count[item] - 1] + 1, per = split_keys(kv_len, a.splits, a.min_split_keys);
  pdl_wait();
  pdl_release();
  if (single_split(kv_len, a.splits, per)) return;  // its one split wrote the output
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

// Partials of split contexts summed into the output: one block per (item, KV head), one thread
// per output element of the item's rows where it can.
template <int D>
void combine_splits(const AttnArgs& a, cudaStream_t s) {
  if (a.splits <= 1 || a.num_items == 0) return;
  dim3 grid(static_cast<unsigned>(a.num_items), static_cast<unsigned>(a.nkv));
  LMSERVE_WITH_ACT(a.act, A, (launch_pdl(attention_combine_kernel<A>, grid, dim3(std::min(1024, kAttnRows * D)), 0, s, a)));
}

template <int D>
void run_attention(const AttnArgs& a, cudaStream_t s) {
  const int group = a.nh / a.nkv;
  AttnArgs rest = a;  // what the prefill kernels take
  const bool mma = a.num_single > 0 && !a.cuda_core_decode && decode_mma_supported(D, a.kv, a.act, group);
  if (a.num_single > 0 && (mma || group <= 8)) {
    AttnArgs d = a;
    d.num_items = a.num_single;
    // The tensor-core kernel splits a block's keys over its four warps, so it takes longer splits.
    d.min_split_keys = mma ? kMmaMinSplitKeys : kMinSplitKeys;
    dim3 grid(static_cast<unsigned>(d.num_items), static_cast<unsigned>(d.nkv), static_cast<unsigned>(d.splits));
    if (mma) {
      launch_decode_mma(d, s);
    } else if (group <= 4) {
      LMSERVE_WITH_ACT(d.act, A, LMSERVE_WITH_KV(d.kv, K, (launch_pdl(decode_attention_kernel<D, K, A, 4>, grid, dim3(kDecodeThreads), kDecodeRingBytes, s, d))));
    } else {
      LMSERVE_WITH_ACT(d.act, A, LMSERVE_WITH_KV(d.kv, K, (launch_pdl(decode_attention_kernel<D, K, A, 8>, grid, dim3(kDecodeThreads), kDecodeRingBytes, s, d))));
    }
    combine_splits<D>(d, s);
    rest.item_token += a.num_single;
    rest.item_count += a.num_single;
    rest.item_seq += a.num_single;
    rest.num_items -= a.num_single;
    rest.num_single = 0;
    rest.splits = 1;
  } else if (a.num_single < a.num_items) {
    rest.splits = 1;  // the tiled kernel splits contexts only when every item is one token
  }
  if (rest.num_items == 0) return;
  if (prefill_mma_supported(D, rest.act) && rest.num_single < rest.num_items) {
    launch_prefill_mma(rest, s);
  } else {
    dim3 grid(static_cast<unsigned>(rest.num_items), static_cast<unsigned>(rest.nkv), static_cast<unsigned>(rest.splits));
    LMSERVE_WITH_ACT(rest.act, A, LMSERVE_WITH_KV(rest.kv, K, (attention_kernel<D, K, A><<<grid, kAttnThreads, 0, s>>>(rest))));
    combine_splits<D>(rest, s);
  }
}


}  // namespace

int attention_item_tokens(int head_dim, int group, Act act) {
  return std::max(1, (prefill_mma_supported(head_dim, act) ? kMmaRows : kAttnRows) / std::max(1, group));
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
  configure_decode_mma();
  allow_decode_rings<16>();
  allow_decode_rings<32>();
  allow_decode_rings<64>();
  allow_decode_rings<128>();
}

int decode_splits(std::int64_t units, int sms) {
  if (units <= 0) return 1;
  if (units >= 4 * static_cast<std::int64_t>(sms)) return 1;
  return static_cast<int>(std::min<std::int64_t>(16, (4 * static_cast<std::int64_t>(sms) + units - 1) / units));
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
