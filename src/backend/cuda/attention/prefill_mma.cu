// Prefill attention on the tensor cores (attention_util.cuh: prefill_mma_supported,
// launch_prefill_mma): the items of a step that have more than one token, or every item of a
// step with prefills in it, against their paged contexts.

#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "backend/cuda/attention/attention_util.cuh"
#include "backend/cuda/common/device_util.cuh"
#include "backend/cuda/common/kernels.cuh"

namespace lmserve::cuda {
namespace {

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
  // asked for before any is used: a loop of one element per load waits out a memory round trip
  // per iteration (docs/perf.md, "prefill attention's loads in flight together").
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

template <int D, Kv K, Act A, int MT>
void launch_shape(const AttnArgs& a, cudaStream_t s) {
  constexpr std::size_t smem = mma_smem_bytes<D, A, MT>();
  static const bool configured = [] {
    cudaFuncSetAttribute(prefill_mma_kernel<D, K, A, MT>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    return true;
  }();
  (void)configured;
  dim3 grid(static_cast<unsigned>(a.num_items), static_cast<unsigned>(a.nkv));
  prefill_mma_kernel<D, K, A, MT><<<grid, PrefillShape<MT>::kThreads, smem, s>>>(a);
}

// Two m-tiles per warp (PrefillShape<2>: 4 warps x 32 rows, two blocks per SM): it beat one
// m-tile per warp (8 warps x 16 rows) at 8k (docs/perf.md, "prefill attention with two m-tiles").
template <int D, Kv K, Act A>
void run_prefill_mma(const AttnArgs& a, cudaStream_t s) {
  launch_shape<D, K, A, 2>(a, s);
}

template <int D>
void launch_head_dim(const AttnArgs& a, cudaStream_t s) {
  if (a.act == Act::kBF16) {
    LMSERVE_WITH_KV(a.kv, K, (run_prefill_mma<D, K, Act::kBF16>(a, s)));
  } else {
    LMSERVE_WITH_KV(a.kv, K, (run_prefill_mma<D, K, Act::kF16>(a, s)));
  }
}

}  // namespace

bool prefill_mma_supported(int head_dim, Act act) { return (head_dim == 64 || head_dim == 128) && act != Act::kF32; }

void launch_prefill_mma(const AttnArgs& a, cudaStream_t s) {
  if (a.D == 64) {
    launch_head_dim<64>(a, s);
  } else if (a.D == 128) {
    launch_head_dim<128>(a, s);
  }
}

}  // namespace lmserve::cuda
