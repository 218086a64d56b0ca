// Paged attention kernels (kernels.cuh, launch_attention): a tiled kernel for prefill and
// chunks (query rows of one item staged together), a streaming kernel for decode steps, and
// the combine of context splits.

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <string>

#include "backend/cuda/attention_util.cuh"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/kernels.cuh"

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

// ---- prefill attention on the tensor cores (mma.sync m16n8k16, float32 accumulators) --------
// One block per (item, KV head): kMmaRows (128) rows = the item's query tokens x the group's
// heads; each warp owns 16 x MT consecutive rows (PrefillShape) and keeps their running max and
// sum and the O accumulators in registers (flash-attention style). Per tile of 64 keys: S = Q K^T
// from K in shared memory (ldmatrix), the causal mask and the online softmax on the S
// fragments, P rounded to the input type and reused as the A operand of O += P V (V by
// ldmatrix.trans). K/V tiles go through a ring of kStages buffers, kStages - 1 tiles ahead of
// the one in use: 16-bit caches of the model's type come in by cp.async; other caches are
// converted by the threads. (With 4 warps, 64 rows and one tile ahead, an 8k prefill ran at ~129 TFLOP/s:
// every block re-read the context for 64 rows, one 32 KB tile in flight per block.)
// Shared-memory rows are padded by kMmaPad elements so that ldmatrix's eight rows fall in
// different banks.
constexpr int kMmaKeys = 64, kMmaPad = 8;

// The kernel's two shapes (PrefillShape<MT>): MT = 1, 8 warps of 16 rows and three K/V tiles
// in the ring (measured: ~151 TFLOP/s at 8k, one block per SM, issue-bound at 8 warps per SM);
// MT = 2, 4 warps of 32 rows and two tiles, so that two blocks fit per SM: each K/V fragment a
// warp loads feeds two mma instead of one and every warp has two independent chains of mma and
// softmax work. With MT = 2 the Q fragments are reloaded from shared memory per key tile (the
// accumulators of 32 rows leave no registers to hold them).
template <int MT>
struct PrefillShape {
  static constexpr int kWarps = 8 / MT, kThreads = 32 * kWarps, kStages = MT == 1 ? 3 : 2;
  static_assert(kWarps * 16 * MT == kMmaRows, "the warps cover the item's rows");
};

template <int D, Act A, int MT>
constexpr std::size_t mma_smem_bytes() {
  using T = typename MmaType<A>::T;
  return (static_cast<std::size_t>(kMmaRows) + 2 * PrefillShape<MT>::kStages * kMmaKeys) * (D + kMmaPad) * sizeof(T)  // Q; the K, V ring
         + static_cast<std::size_t>(kMmaRows) * sizeof(int);                                                        // query positions
}

template <int D, Kv K, Act A, int MT>
__global__ void __launch_bounds__(PrefillShape<MT>::kThreads) prefill_mma_kernel(AttnArgs a) {
  using M = MmaType<A>;
  using T = typename M::T;
  using P = PrefillShape<MT>;
  constexpr int R = kMmaRows, BN = kMmaKeys, LD = D + kMmaPad, KD = D / 16, ND = D / 8, NS = P::kStages, NT = P::kThreads;
  extern __shared__ __align__(128) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem);
  T* sK = sQ + R * LD;         // [NS][BN][LD]
  T* sV = sK + NS * BN * LD;   // [NS][BN][LD]
  int* s_qpos = reinterpret_cast<int*>(sV + NS * BN * LD);

  // Blocks start in index order, and an item's work grows with its position: the last items
  // of a sequence (the most keys) go first, so the short ones fill the tail of the grid.
  const int item = a.num_items - 1 - static_cast<int>(blockIdx.x), g = blockIdx.y, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int G = a.nh / a.nkv;
  const int tok0 = a.item_token[item], cnt = a.item_count[item], seq = a.item_seq[item];
  const int rows = cnt * G;
  const int qstride = a.nh * D;
  const BlockIndex blk(a.block_size);
  // Q scaled by the softmax scale in the exp2 domain (as the decode kernels do), so that S comes
  // out of the mma ready for the online softmax. Each thread's 16-byte pieces of it are all
  // asked for before any is used: a loop of one element per load waited out a memory round trip
  // per iteration, ~70 us a block, which made this kernel take ~0.7 ms a layer for 8,192 tokens
  // of 128-token prompts (H200, ncu; docs/perf.md).
  const float scale = a.scale * 1.4426950408889634f;
  constexpr int kQPieces = R * D / 8 / NT;
  static_assert(R * D / 8 % NT == 0, "whole rounds of 16-byte pieces");
  uint4 qv[kQPieces];
#pragma unroll
  for (int u = 0; u < kQPieces; ++u) {
    const int i = tid + u * NT, r = i / (D / 8), d0 = i % (D / 8) * 8;
    qv[u] = make_uint4(0, 0, 0, 0);
    if (r < rows) qv[u] = *reinterpret_cast<const uint4*>(static_cast<const T*>(a.q) + static_cast<std::int64_t>(tok0 + r / G) * qstride + (g * G + r % G) * D + d0);
  }
#pragma unroll
  for (int u = 0; u < kQPieces; ++u) {
    const int i = tid + u * NT, r = i / (D / 8), d0 = i % (D / 8) * 8;
    unsigned* w = &qv[u].x;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 f = M::unpack(w[e]);
      w[e] = M::pack(f.x * scale, f.y * scale);
    }
    *reinterpret_cast<uint4*>(sQ + r * LD + d0) = qv[u];
  }
  if (tid < R) s_qpos[tid] = tid < rows ? a.positions[tok0 + tid / G] : -1;
  const int kv_len = a.positions[tok0 + cnt - 1] + 1;
  const std::int32_t* bt = a.block_tables + static_cast<std::int64_t>(seq) * (*a.bt_stride);
  const void* kc = a.kv_ptrs[2 * a.layer];
  const void* vc = a.kv_ptrs[2 * a.layer + 1];
  const float ks = a.k_scale ? a.k_scale[g] : 1.0f, vs = a.v_scale ? a.v_scale[g] : 1.0f;
  // A cache of the model's 16-bit type without scales is copied as it is.
  constexpr bool kSameType = (K == Kv::kBF16 && A == Act::kBF16) || (K == Kv::kF16 && A == Act::kF16);
  const bool raw = kSameType && !a.k_scale && !a.v_scale;
  const int tiles = (kv_len + BN - 1) / BN;

  // Tile t's K and V into buffer t % NS: by cp.async or converted; one commit group per call
  // (empty past the last tile), so that the waits count tiles.
  auto load_tile = [&](int t) {
    T* dk = sK + (t % NS) * BN * LD;
    T* dv = sV + (t % NS) * BN * LD;
    if constexpr (kKvElemBytes<K> == 1) {
      // fp8: the thread's pieces of the tile asked for kRound at a time before any of them is
      // converted (one at a time, each waited out a memory round trip); rounds of 4 keep the
      // two-m-tile kernel at D = 128 from spilling. (The conversion below repeats the generic
      // path's on purpose: ptxas spilled 40 bytes there when both went through one helper.)
      constexpr int kPieces = BN * D / 8 / NT, kRound = kPieces < 4 ? kPieces : 4;
      static_assert(BN * D / 8 % NT == 0 && kPieces % kRound == 0, "whole rounds of pieces");
#pragma unroll
      for (int u0 = 0; u0 < kPieces; u0 += kRound) {
        KvRaw8<K> kr[kRound], vr[kRound];
#pragma unroll
        for (int u = 0; u < kRound; ++u) {
          const int i = tid + (u0 + u) * NT, j = i / (D / 8), d0 = (i % (D / 8)) * 8, p = t * BN + j;
          if (t < tiles && p < kv_len) {
            const std::int64_t at = (blk.slot(bt, p) * a.nkv + g) * D + d0;
            kr[u] = kv_fetch8<K>(kc, at);
            vr[u] = kv_fetch8<K>(vc, at);
          }
        }
#pragma unroll
        for (int u = 0; u < kRound; ++u) {
          const int i = tid + (u0 + u) * NT, j = i / (D / 8), d0 = (i % (D / 8)) * 8, p = t * BN + j;
          if (t >= tiles) break;
          T* rk = dk + j * LD + d0;
          T* rv = dv + j * LD + d0;
          if (p >= kv_len) {
            *reinterpret_cast<uint4*>(rk) = make_uint4(0, 0, 0, 0);
            *reinterpret_cast<uint4*>(rv) = make_uint4(0, 0, 0, 0);
            continue;
          }
          float kx[8], vx[8];
          kv_unpack8<K>(kr[u], kx);
          kv_unpack8<K>(vr[u], vx);
#pragma unroll
          for (int v = 0; v < 8; ++v) {
            rk[v] = M::from(kx[v] * ks);
            rv[v] = M::from(vx[v] * vs);
          }
        }
      }
    } else {
      for (int i = tid; t < tiles && i < BN * D / 8; i += NT) {
        const int j = i / (D / 8), d0 = (i % (D / 8)) * 8, p = t * BN + j;
        T* rk = dk + j * LD + d0;
        T* rv = dv + j * LD + d0;
        if (p >= kv_len) {
          *reinterpret_cast<uint4*>(rk) = make_uint4(0, 0, 0, 0);
          *reinterpret_cast<uint4*>(rv) = make_uint4(0, 0, 0, 0);
          continue;
        }
        const std::int64_t at = (blk.slot(bt, p) * a.nkv + g) * D + d0;
        if (raw) {
          cp_async16(rk, static_cast<const T*>(kc) + at);
          cp_async16(rv, static_cast<const T*>(vc) + at);
        } else {
          float kx[8], vx[8];
          kv_load8<K>(kc, at, kx);
          kv_load8<K>(vc, at, vx);
#pragma unroll
          for (int v = 0; v < 8; ++v) {
            rk[v] = M::from(kx[v] * ks);
            rv[v] = M::from(vx[v] * vs);
          }
        }
      }
    }
    cp_async_commit();
  };

#pragma unroll
  for (int t = 0; t < NS - 1; ++t) load_tile(t);
  __syncthreads();  // Q and the query positions are in place
  // This warp's rows: m-tile mt is rows r0 + 16 mt .. + 15; each thread holds rows
  // r0 + 16 mt + lane / 4 (index 0) and + 8 (index 1) of each.
  const int r0 = warp * 16 * MT;
  // Q fragments (A operands, one per 16 columns of D), kept in registers with one m-tile.
  unsigned qf[MT == 1 ? KD : 1][4];
  auto q_frag = [&](int mt, int kk, unsigned (&f)[4]) {
    const int m = lane / 8;
    ldmatrix_x4(f, sQ + (r0 + 16 * mt + (m % 2) * 8 + lane % 8) * LD + kk * 16 + (m / 2) * 8);
  };
  if constexpr (MT == 1) {
#pragma unroll
    for (int kk = 0; kk < KD; ++kk) q_frag(0, kk, qf[kk]);
  }
  int qpos[MT][2];
  // top: the last key any row of the warp sees; bottom: the last key every (real) row sees.
  int top = -1, bottom = INT_MAX;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      qpos[mt][h] = s_qpos[r0 + 16 * mt + lane / 4 + 8 * h];
      top = max(top, qpos[mt][h]);
      bottom = min(bottom, qpos[mt][h] < 0 ? INT_MAX : qpos[mt][h]);
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    top = max(top, __shfl_xor_sync(0xffffffffu, top, o));
    bottom = min(bottom, __shfl_xor_sync(0xffffffffu, bottom, o));
  }
  float o_acc[MT][ND][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int n = 0; n < ND; ++n) o_acc[mt][n][0] = o_acc[mt][n][1] = o_acc[mt][n][2] = o_acc[mt][n][3] = 0.0f;
  }
  float m_run[MT][2], l_run[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) m_run[mt][0] = m_run[mt][1] = -INFINITY, l_run[mt][0] = l_run[mt][1] = 0.0f;

  for (int t = 0; t < tiles; ++t) {
    cp_async_wait<NS - 2>();  // this thread's copies of tile t have landed
    __syncthreads();          // ... everyone's; every warp is done with tile t - 1
    load_tile(t + NS - 1);    // into tile t - 1's buffer
    const int t0 = t * BN;
    if (t0 > top) continue;  // no row of this warp sees a key of the tile
    const T* k_tile = sK + (t % NS) * BN * LD;
    const T* v_tile = sV + (t % NS) * BN * LD;
    // S = Q K^T: per m-tile 16 rows x 64 keys, 8 fragments of 8 keys; each K fragment pair
    // loaded once for all m-tiles.
    float s[MT][BN / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int n = 0; n < BN / 8; ++n) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.0f;
    }
#pragma unroll
    for (int kk = 0; kk < KD; ++kk) {
      unsigned qk[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        if constexpr (MT == 1) {
#pragma unroll
          for (int e = 0; e < 4; ++e) qk[mt][e] = qf[kk][e];
        } else {
          q_frag(mt, kk, qk[mt]);
        }
      }
#pragma unroll
      for (int n = 0; n < BN / 8; n += 2) {
        // Matrices: keys of fragment n (d lo, d hi), then of fragment n + 1.
        const int m = lane / 8;
        unsigned b[4];
        ldmatrix_x4(b, k_tile + ((n + m / 2) * 8 + lane % 8) * LD + kk * 16 + (m % 2) * 8);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          M::mma(s[mt][n], qk[mt], b[0], b[1]);
          M::mma(s[mt][n + 1], qk[mt], b[2], b[3]);
        }
      }
    }
    const bool full = t0 + BN - 1 <= bottom && t0 + BN <= kv_len;  // every row sees every key
    unsigned pf[MT][BN / 16][4];  // P as A operands, one per 16 keys
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      // Mask (only where the tile crosses a row's diagonal or the context's end; the padding
      // rows are never stored), then the online softmax step.
      float mx[2] = {-INFINITY, -INFINITY};
      if (full) {
#pragma unroll
        for (int n = 0; n < BN / 8; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) mx[e / 2] = fmaxf(mx[e / 2], s[mt][n][e]);
        }
      } else {
#pragma unroll
        for (int n = 0; n < BN / 8; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int p = t0 + n * 8 + (lane % 4) * 2 + (e % 2), h = e / 2;
            const float x = (p <= qpos[mt][h] && p < kv_len) ? s[mt][n][e] : -INFINITY;
            s[mt][n][e] = x;
            mx[h] = fmaxf(mx[h], x);
          }
        }
      }
      online_softmax<M, MT == 1 || D == 64>(s[mt], mx, m_run[mt], l_run[mt], o_acc[mt], pf[mt]);
    }
    // O += P V: B operands from V (keys x d) transposed by ldmatrix, each for all m-tiles.
#pragma unroll
    for (int j = 0; j < BN / 16; ++j) {
#pragma unroll
      for (int n = 0; n < ND; n += 2) {
        const int m = lane / 8;
        unsigned b[4];
        ldmatrix_x4_trans(b, v_tile + (j * 16 + (m % 2) * 8 + lane % 8) * LD + (n + m / 2) * 8);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          M::mma(o_acc[mt][n], pf[mt][j], b[0], b[1]);
          M::mma(o_acc[mt][n + 1], pf[mt][j], b[2], b[3]);
        }
      }
    }
  }
  cp_async_wait<0>();  // (only empty groups are left)
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      // The row sum over the quad (each thread summed its own columns).
      float l = l_run[mt][h];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const int r = r0 + 16 * mt + lane / 4 + h * 8;
      if (r >= rows) continue;
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
      const std::int64_t base = static_cast<std::int64_t>(tok0 + r / G) * qstride + (g * G + r % G) * D;
#pragma unroll
      for (int n = 0; n < ND; ++n) {
        const int d = n * 8 + (lane % 4) * 2;
        act_store<A>(a.out, base + d, o_acc[mt][n][2 * h] * inv);
        act_store<A>(a.out, base + d + 1, o_acc[mt][n][2 * h + 1] * inv);
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

bool mma_prefill(int head_dim, Act act) { return (head_dim == 64 || head_dim == 128) && act != Act::kF32; }

// Two m-tiles per warp (PrefillShape<2>: 4 warps x 32 rows, two blocks per SM) by default; it
// measured 62.4% of the matrix rate at 8k against 59.6% with one (H200, docs/perf.md).
// LMSERVE_CUDA_PREFILL_MT=1 picks the kernel with one m-tile per warp (8 warps x 16 rows).
int prefill_m_tiles() {
  static const int mt = env_is("LMSERVE_CUDA_PREFILL_MT", "1") ? 1 : 2;
  return mt;
}

template <int D, Kv K, Act A, int MT>
void launch_prefill_mma(const AttnArgs& a, cudaStream_t s) {
  constexpr std::size_t smem = mma_smem_bytes<D, A, MT>();
  static const bool configured = [] {
    cudaFuncSetAttribute(prefill_mma_kernel<D, K, A, MT>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    return true;
  }();
  (void)configured;
  dim3 grid(static_cast<unsigned>(a.num_items), static_cast<unsigned>(a.nkv));
  prefill_mma_kernel<D, K, A, MT><<<grid, PrefillShape<MT>::kThreads, smem, s>>>(a);
}

template <int D, Kv K, Act A>
void run_prefill_mma(const AttnArgs& a, cudaStream_t s) {
  if (prefill_m_tiles() == 2) {
    launch_prefill_mma<D, K, A, 2>(a, s);
  } else {
    launch_prefill_mma<D, K, A, 1>(a, s);
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
  const bool mma = a.num_single > 0 && decode_mma_supported(D, a.kv, a.act, group);
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
  if (mma_prefill(D, rest.act) && rest.num_single < rest.num_items) {
    if constexpr (D == 64 || D == 128) {
      if (rest.act == Act::kBF16) {
        LMSERVE_WITH_KV(rest.kv, K, (run_prefill_mma<D, K, Act::kBF16>(rest, s)));
      } else {
        LMSERVE_WITH_KV(rest.kv, K, (run_prefill_mma<D, K, Act::kF16>(rest, s)));
      }
    }
  } else {
    dim3 grid(static_cast<unsigned>(rest.num_items), static_cast<unsigned>(rest.nkv), static_cast<unsigned>(rest.splits));
    LMSERVE_WITH_ACT(rest.act, A, LMSERVE_WITH_KV(rest.kv, K, (attention_kernel<D, K, A><<<grid, kAttnThreads, 0, s>>>(rest))));
    combine_splits<D>(rest, s);
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
  configure_decode_mma();
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
