// Decode attention on the tensor cores (attention_util.cuh: decode_mma_supported,
// launch_decode_mma). A unit of work is one (one-token item, KV head, context split); the
// group's G <= 16 query heads are the 16 rows of an mma.sync m16n8k16 tile (rows G..15 zero).
// The unit's keys are cut into warp tiles of kKeys keys (K and V 4 KB each), which a warp
// streams through its own ring of kStages shared-memory stages by cp.async, synchronising only
// itself. Per tile it computes S = Q K^T, the online softmax of flash attention and O += P V with
// the running max, sum and O in registers. Two ways to map units to warps:
//  - block units (AttnArgs::warp_units false): one block of W = 4 warps per unit (8 with
//    AttnArgs::wide_blocks); warp w takes tiles w, w + W, ..., and the warps' partial results are
//    merged through shared memory at the end. For few units (small batches), where four or eight
//    warps per unit keep the SMs busy.
//  - warp units (true): one warp per unit, four units (consecutive KV heads of an item) per
//    block, no merge and no block barrier. For large batches of short contexts: a block-unit
//    block at ~200 keys gives each warp ~3 tiles, so its start (the item's metadata and block
//    table, a chain of dependent loads), its merge and the wait for its slowest warp cost as
//    much as its streaming; a warp unit streams all ~13 tiles after one start.
//
// Why: the CUDA-core decode kernel spends ~1,160 instructions per 8 KB of K/V (16 lanes per key
// row, 32 FMAs and 16 shuffles per 8 elements) and ran a 200 x 1,500-key step at 1.6 TB/s; here
// 8 KB cost ~32 mma and a few hundred other instructions per warp, so the loads should set the
// pace.
//
// Operand layouts without ldmatrix, so that fp8 caches convert in registers:
//  - S = Q K^T sums over the head dimension, so any permutation of it applied to Q and K alike
//    leaves S unchanged: the thread with c = lane % 4 holds k-indices {2c, 2c+1, 2c+8, 2c+9} of
//    each 16-wide k-step kk, which stand for dims c * D/4 + 4 kk + {0, 1, 2, 3}. A thread then
//    reads one contiguous D/4-element stretch of each key row it needs.
//  - O = P V: column n of n-tile nt is dim n * D/8 + nt, so the thread with q = lane / 4 reads
//    one contiguous D/8-element stretch of each V row, and its accumulators for columns 2c and
//    2c + 1 are dims (2c) * D/8 + nt and (2c + 1) * D/8 + nt.
//  - Key 8n + q of a warp tile is column q of S fragment n, so P's k-index k of k-step j is key
//    16j + k (the fragments of S are P's A operands as they are).
// 16-bit caches of the act's type feed the act's mma; fp8 caches feed f16 mma (Q in f16, scaled
// first so that S comes out in the exp2 domain).

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "backend/cuda/attention/attention_util.cuh"
#include "backend/cuda/common/device_util.cuh"
#include "backend/cuda/common/kernels.cuh"

namespace lmserve::cuda {
namespace {

// Two stages: a warp computes on one tile while the next one loads, which covers the memory
// latency (a tile takes a warp ~1,000 instructions); a third stage makes 110 KB of shared memory
// per block and so only 2 blocks (8 warps) per SM, each warp stalled on its own dependencies
// (docs/perf.md). With two, 3 blocks (12 warps) fit by shared memory (74 KB each) and registers
// (<= 168, kMinBlocks).
constexpr int kWarps = 4, kThreads = 32 * kWarps, kStages = 2, kHalfTileBytes = 4096, kMinBlocks = 3;
// Wide block units (AttnArgs::wide_blocks): twice the warps, so twice a unit's tiles in flight and
// half as many per warp in turn. 8 x 2 stages of 8.5 KB (bf16, D = 128) is 139 KB: one block per
// SM, which pays only where the units leave most SMs idle anyway (docs/perf.md, "decode
// attention at b1 in blocks of 8 warps", compares the block shapes).
constexpr int kWideWarps = 8;

template <Kv K>
constexpr bool kFp8 = K == Kv::kE5M2 || K == Kv::kE4M3;

template <int D, Kv K, int W = kWarps, int St = kStages>
struct Shape {
  static constexpr int kRowBytes = D * kKvElemBytes<K>;
  static constexpr int kUnits = kRowBytes / 16;                                              // 16-byte units per row
  static constexpr int kStride = kRowBytes + 16;                                             // padded: fewer bank conflicts
  static constexpr int kKeys = kHalfTileBytes / kRowBytes < 32 ? kHalfTileBytes / kRowBytes : 32;  // keys per warp tile
  static constexpr int kStageBytes = 2 * kKeys * kStride;                                    // K rows, then V rows
  static constexpr std::size_t kRingBytes = static_cast<std::size_t>(W) * St * kStageBytes;
  static constexpr std::size_t kMergeBytes = static_cast<std::size_t>(W) * 16 * (D + 2) * sizeof(float);
  static constexpr std::size_t kSmem = kRingBytes > kMergeBytes ? kRingBytes : kMergeBytes;
  static_assert(kKeys % 16 == 0 && (kKeys * kUnits) % 32 == 0, "whole k-steps, whole rounds of copies");
};

// The mma element type: the act's for a cache of the act's type, f16 for fp8.
template <Kv K, Act A>
constexpr Act kMmaAct = kFp8<K> ? Act::kF16 : A;

// Two fp8 values (low byte first) as an f16 pair.
template <Kv K>
__device__ __forceinline__ unsigned fp8x2_to_f16x2(unsigned pair) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair & 0xFFFFu), K == Kv::kE5M2 ? __NV_E5M2 : __NV_E4M3);
  return static_cast<unsigned>(h.x) | (static_cast<unsigned>(h.y) << 16);
}

// Bytes 2p and 2p + 1 of four fp8 values as an f16 pair. An e5m2 value is the high byte of the
// f16 of the same value (sign, 5 exponent bits, 2 mantissa bits), so one byte permute with zero
// bytes places it; e4m3 is converted.
template <Kv K, int P>
__device__ __forceinline__ unsigned fp8_half_to_f16x2(unsigned four) {
  if constexpr (K == Kv::kE5M2) {
    return __byte_perm(four, 0u, P == 0 ? 0x1404u : 0x3424u);
  } else {
    return fp8x2_to_f16x2<K>(P == 0 ? four : four >> 16);
  }
}

// Byte `byte` of x and of y as an f16 pair (x's the low half).
template <Kv K>
__device__ __forceinline__ unsigned fp8_bytes_to_f16x2(unsigned x, unsigned y, unsigned byte) {
  if constexpr (K == Kv::kE5M2) {
    return __byte_perm(x, y, (byte << 4) | ((byte + 4) << 12)) & 0xFF00FF00u;
  } else {
    return fp8x2_to_f16x2<K>(__byte_perm(x, y, byte | ((byte + 4) << 4)));
  }
}

// A warp unit's result from its registers: rows q and q + 8 (h = 0, 1) of the thread's quad,
// dims (2c) * D/8 + nt and (2c + 1) * D/8 + nt (o[nt][2h], o[nt][2h + 1]); the output when
// the unit is its item's only split, else the combine kernel's format (natural-log max, sum,
// unnormalised O), as the block units' merge writes them.
template <int D, Act A>
__device__ __forceinline__ void store_warp_unit(const AttnArgs& a, const float (&o)[D / 8][4], const float (&m_run)[2], float (&l_run)[2],
                                                std::int64_t qrow, int item, int g, int split, float vscale, bool whole) {
  constexpr int ND = D / 8, VW = D / 8;
  const int lane = threadIdx.x & 31, q = lane >> 2, c = lane & 3, G = a.nh / a.nkv;
#pragma unroll
  for (int h = 0; h < 2; ++h) {  // every lane of the quad: the row's sum
    l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 1);
    l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 2);
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = q + 8 * h;
    if (r >= G) continue;
    if (whole) {
      const float f = l_run[h] > 0.0f ? vscale / l_run[h] : 0.0f;
#pragma unroll
      for (int nt = 0; nt < ND; ++nt) {
        act_store<A>(a.out, qrow + r * D + (2 * c) * VW + nt, o[nt][2 * h] * f);
        act_store<A>(a.out, qrow + r * D + (2 * c + 1) * VW + nt, o[nt][2 * h + 1] * f);
      }
    } else {
      float* part = split_partial(a, item, g, split, r);
#pragma unroll
      for (int nt = 0; nt < ND; ++nt) {
        part[(2 * c) * VW + nt] = o[nt][2 * h] * vscale;
        part[(2 * c + 1) * VW + nt] = o[nt][2 * h + 1] * vscale;
      }
      if (c == 0) {
        part[D] = m_run[h] == -INFINITY ? -INFINITY : m_run[h] * kLn2;
        part[D + 1] = l_run[h];
      }
    }
  }
}

template <int D, Kv K, Act A, bool kWarpUnits, int W = kWarps, int St = kStages>
__global__ void __launch_bounds__(32 * W, W == kWarps ? kMinBlocks : 1) decode_mma_kernel(AttnArgs a) {
  static_assert(!kWarpUnits || (W == kWarps && St == kStages), "warp units: the one shape");
  using S = Shape<D, K, W, St>;
  using M = MmaType<kMmaAct<K, A>>;
  constexpr int KD = D / 16, ND = D / 8, NF = S::kKeys / 8, KSTEPS = S::kKeys / 16;
  constexpr int QW = D / 4;  // dims of a K row one thread reads
  constexpr int VW = D / 8;  // dims of a V row one thread reads
  extern __shared__ __align__(16) unsigned char smem[];
  const int split = blockIdx.z, tid = threadIdx.x;
  const int warp = tid >> 5, lane = tid & 31, q = lane >> 2, c = lane & 3;
  const int unit = blockIdx.x * W + warp;  // warp units: this warp's (item, KV head)
  const int item = kWarpUnits ? unit / a.nkv : (a.heads_first ? blockIdx.y : blockIdx.x);
  const int g = kWarpUnits ? unit % a.nkv : (a.heads_first ? blockIdx.x : blockIdx.y);
  // The unit's tiles are first, first + strides, ...: all of them for a warp unit.
  constexpr int strides = kWarpUnits ? 1 : W;
  const int first = kWarpUnits ? 0 : warp;
  const int G = a.nh / a.nkv;
  // Until the wait for the QKV/RoPE kernel (pdl_wait below) this kernel reads only what the host
  // staged (the items, positions, block tables) and the keys of earlier steps: this step's
  // token (the last key of the context) and Q come after it.
  if (kWarpUnits && item >= a.num_items) return;  // the last block's spare warps
  const int tok = a.item_token[item], seq = a.item_seq[item];
  const int kv_len = a.positions[tok] + 1;
  const int per = split_keys(kv_len, a.splits, a.min_split_keys);
  const int begin = split * per, end = min(kv_len, begin + per);
  if (split > 0 && begin >= kv_len) return;  // an unused split (the whole block, or the warp)

  const std::int32_t* bt = a.block_tables + static_cast<std::int64_t>(seq) * (*a.bt_stride);
  const char* kc = static_cast<const char*>(a.kv_ptrs[2 * a.layer]);
  const char* vc = static_cast<const char*>(a.kv_ptrs[2 * a.layer + 1]);
  const int tiles = (end - begin + S::kKeys - 1) / S::kKeys;
  const int mine = tiles > first ? (tiles - first + strides - 1) / strides : 0;  // this warp's tiles
  unsigned char* ring = smem + static_cast<std::size_t>(warp) * St * S::kStageBytes;

  // This warp's k-th tile (the unit's tile first + strides k) into stage k % St: one commit group per
  // call, empty past the warp's last tile, so that the waits count tiles. Calls come in order
  // k = 0, 1, ...; lane j < kKeys holds the block-table entry of key j of the tile, loaded by the
  // call before, so that the load's latency passes under a tile's compute instead of stalling the
  // copies (and with them the compute that follows them in the loop).
  const BlockIndex blk(a.block_size);
  auto entry_of = [&](int k) {
    const int p = begin + (first + strides * k) * S::kKeys + lane;
    return k < mine && lane < S::kKeys && p < end ? bt[blk.block(p)] : 0;
  };
  // A lane's copies: 16-byte unit w of rows lane / kUnits + i * kRowsPerRound (32 % kUnits == 0).
  constexpr int kRowsPerRound = 32 / S::kUnits;
  static_assert(32 % S::kUnits == 0, "a lane's unit is the same in every round");
  const int w = lane % S::kUnits, j0 = lane / S::kUnits;
  int entry = entry_of(0);
  auto issue = [&](int k) {
    if (k < mine) {
      const int k0 = begin + (first + strides * k) * S::kKeys;
      const int slot = entry * a.block_size + blk.offset(k0 + lane);  // lane j < kKeys: key k0 + j's
      entry = entry_of(k + 1);
      unsigned char* dk = ring + (k % St) * S::kStageBytes + j0 * S::kStride + w * 16;
      unsigned char* dv = dk + S::kKeys * S::kStride;
#pragma unroll
      for (int i = 0; i < S::kKeys / kRowsPerRound; ++i) {
        const int j = j0 + i * kRowsPerRound;
        const int sj = __shfl_sync(0xffffffffu, slot, j);
        const int off = i * kRowsPerRound * S::kStride;
        if (k0 + j < end) {
          const std::int64_t at = (static_cast<std::int64_t>(sj) * a.nkv + g) * S::kRowBytes + w * 16;
          cp_async16(dk + off, kc + at);
          cp_async16(dv + off, vc + at);
        } else {  // past the split: zeros, so that P = 0 never meets a poisoned V
          *reinterpret_cast<uint4*>(dk + off) = make_uint4(0, 0, 0, 0);
          *reinterpret_cast<uint4*>(dv + off) = make_uint4(0, 0, 0, 0);
        }
      }
    }
    cp_async_commit();
  };

  float o[ND][4];
#pragma unroll
  for (int n = 0; n < ND; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};

  // The warp's first St - 1 tiles: before the wait those that hold only earlier steps' keys (all
  // but a tile with the context's last key, which the kernel before writes), so that they stream
  // while the kernel before finishes; the others after it.
  int ahead = 0;
  while (ahead < St - 1 && ahead < mine && min(begin + (first + strides * ahead) * S::kKeys + S::kKeys, end) < kv_len) issue(ahead++);
  pdl_wait();
  pdl_release();
  while (ahead < St - 1) issue(ahead++);

  // Q after the first tiles' copies are issued: its loads' latency hides under theirs.
  const float kscale = a.k_scale ? a.k_scale[g] : 1.0f, vscale = a.v_scale ? a.v_scale[g] : 1.0f;
  const float qscale = a.scale * kscale * 1.4426950408889634f;  // S in the exp2 domain
  const std::int64_t qrow = static_cast<std::int64_t>(tok) * a.nh * D + static_cast<std::int64_t>(g) * G * D;
  // Q fragments: rows q (regs 0, 2) and q + 8 (regs 1, 3); dims c * QW + 4 kk + {0,1} / {2,3}.
  unsigned qf[KD][4];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = q + 8 * h;
#pragma unroll
    for (int kk = 0; kk < KD; ++kk) {
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (r < G) v = act_load4<A>(a.q, qrow + r * D + c * QW + 4 * kk);
      qf[kk][h] = M::pack(v.x * qscale, v.y * qscale);
      qf[kk][2 + h] = M::pack(v.z * qscale, v.w * qscale);
    }
  }

  for (int k = 0; k < mine; ++k) {
    cp_async_wait<St - 2>();  // this lane's copies of tile k have landed
    __syncwarp();             // ... and every lane's; the stage of tile k - 1 is free
    issue(k + St - 1);
    const unsigned char* tk = ring + (k % St) * S::kStageBytes;
    const unsigned char* tv = tk + S::kKeys * S::kStride;
    const int t0 = begin + (first + strides * k) * S::kKeys;

    // S = Q K^T: fragment n holds keys 8n..8n+7 (column q: key 8n + q).
    float s[NF][4];
#pragma unroll
    for (int n = 0; n < NF; ++n) {
      s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
      const unsigned char* row = tk + (8 * n + q) * S::kStride + c * QW * kKvElemBytes<K>;
      constexpr int kRegs = QW * kKvElemBytes<K> / 4;
      unsigned kr[kRegs];
#pragma unroll
      for (int u = 0; u < kRegs / 4; ++u) {
        const uint4 v = *reinterpret_cast<const uint4*>(row + 16 * u);
        kr[4 * u] = v.x, kr[4 * u + 1] = v.y, kr[4 * u + 2] = v.z, kr[4 * u + 3] = v.w;
      }
#pragma unroll
      for (int kk = 0; kk < KD; ++kk) {
        unsigned b0, b1;
        if constexpr (kFp8<K>) {  // register kk: dims 4kk..4kk+3 of the stretch
          b0 = fp8_half_to_f16x2<K, 0>(kr[kk]);
          b1 = fp8_half_to_f16x2<K, 1>(kr[kk]);
        } else {                  // registers 2kk, 2kk + 1: dims 4kk + {0,1}, {2,3}
          b0 = kr[2 * kk];
          b1 = kr[2 * kk + 1];
        }
        M::mma(s[n], qf[kk], b0, b1);
      }
    }
    // Online softmax (exp2 domain); keys past the split are masked.
    if (t0 + S::kKeys > end) {  // only a split's last tile has keys past it
#pragma unroll
      for (int n = 0; n < NF; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[n][e] = t0 + 8 * n + 2 * c + (e & 1) < end ? s[n][e] : -INFINITY;
      }
    }
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < NF; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) mx[e >> 1] = fmaxf(mx[e >> 1], s[n][e]);
    }
    unsigned pf[KSTEPS][4];
    online_softmax<M, true>(s, mx, m_run, l_run, o, pf);
    // O += P V, one k-step of 16 keys at a time: keys 16j + 2c + {0, 1} (b0), + {8, 9} (b1).
#pragma unroll
    for (int j = 0; j < KSTEPS; ++j) {
      constexpr int kRegs = VW * kKvElemBytes<K> / 4;  // of one key's stretch
      unsigned vr[4][kRegs];
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int key = 16 * j + 2 * c + (r & 1) + 8 * (r >> 1);
        const unsigned char* row = tv + key * S::kStride + q * VW * kKvElemBytes<K>;
        if constexpr (kRegs >= 4) {
#pragma unroll
          for (int u = 0; u < kRegs / 4; ++u) {
            const uint4 v = *reinterpret_cast<const uint4*>(row + 16 * u);
            vr[r][4 * u] = v.x, vr[r][4 * u + 1] = v.y, vr[r][4 * u + 2] = v.z, vr[r][4 * u + 3] = v.w;
          }
        } else {
          const uint2 v = *reinterpret_cast<const uint2*>(row);
          vr[r][0] = v.x, vr[r][1] = v.y;
        }
      }
#pragma unroll
      for (int nt = 0; nt < ND; ++nt) {
        unsigned b[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const unsigned x = vr[2 * h][kFp8<K> ? nt / 4 : nt / 2], y = vr[2 * h + 1][kFp8<K> ? nt / 4 : nt / 2];
          if constexpr (kFp8<K>) {
            b[h] = fp8_bytes_to_f16x2<K>(x, y, nt % 4);
          } else {
            b[h] = __byte_perm(x, y, nt % 2 ? 0x7632 : 0x5410);
          }
        }
        M::mma(o[nt], pf[j], b[0], b[1]);
      }
    }
  }
  cp_async_wait<0>();
  if constexpr (kWarpUnits) {
    store_warp_unit<D, A>(a, o, m_run, l_run, qrow, item, g, split, vscale, single_split(kv_len, a.splits, per));
    return;
  }
  __syncthreads();  // every warp is done with its ring: the memory holds the merge now

  // Each warp's rows: running max (exp2 domain), sum, unnormalised O.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 1);
    l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 2);
  }
  float* part_w = reinterpret_cast<float*>(smem) + static_cast<std::size_t>(warp) * 16 * (D + 2);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float* rowp = part_w + (q + 8 * h) * (D + 2);
#pragma unroll
    for (int nt = 0; nt < ND; ++nt) {
      rowp[(2 * c) * VW + nt] = o[nt][2 * h];
      rowp[(2 * c + 1) * VW + nt] = o[nt][2 * h + 1];
    }
    if (c == 0) {
      rowp[D] = m_run[h];
      rowp[D + 1] = l_run[h];
    }
  }
  __syncthreads();
  const float* parts = reinterpret_cast<const float*>(smem);
  for (int e = tid; e < G * D; e += 32 * W) {
    const int h = e / D, d = e % D;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < W; ++w) mx = fmaxf(mx, parts[(w * 16 + h) * (D + 2) + D]);
    float l = 0.0f, acc = 0.0f;
#pragma unroll
    for (int w = 0; w < W; ++w) {
      const float* p = parts + (w * 16 + h) * (D + 2);
      if (p[D] == -INFINITY) continue;  // a warp without keys
      const float wgt = exp2f(p[D] - mx);
      l += p[D + 1] * wgt;
      acc += p[d] * wgt;
    }
    acc *= vscale;
    if (single_split(kv_len, a.splits, per)) {
      act_store<A>(a.out, qrow + h * D + d, l > 0.0f ? acc / l : 0.0f);
    } else {  // the combine kernel's format: natural-log max, sum, unnormalised O
      float* part = split_partial(a, item, g, split, h);
      part[d] = acc;
      if (d == 0) {
        part[D] = mx == -INFINITY ? -INFINITY : mx * kLn2;
        part[D + 1] = l;
      }
    }
  }
}

template <int D, Kv K, Act A, int W, int St>
void launch_blocks(const AttnArgs& a, dim3 grid, cudaStream_t s) {
  launch_pdl(decode_mma_kernel<D, K, A, false, W, St>, grid, dim3(32 * W), Shape<D, K, W, St>::kSmem, s, a);
}

template <int D, Kv K, Act A>
void launch_one(const AttnArgs& args, cudaStream_t s) {
  AttnArgs a = args;
  const auto items = static_cast<unsigned>(a.num_items), heads = static_cast<unsigned>(a.nkv);
  if (a.warp_units) {
    const dim3 grid((items * heads + kWarps - 1) / kWarps, 1, static_cast<unsigned>(a.splits));
    launch_pdl(decode_mma_kernel<D, K, A, true>, grid, dim3(kThreads), Shape<D, K>::kRingBytes, s, a);
    return;
  }
  a.heads_first = a.num_items <= 65535;  // gridDim.y's limit
  const dim3 grid(a.heads_first ? heads : items, a.heads_first ? items : heads, static_cast<unsigned>(a.splits));
  if (a.wide_blocks) {
    launch_blocks<D, K, A, kWideWarps, kStages>(a, grid, s);
  } else {
    launch_blocks<D, K, A, kWarps, kStages>(a, grid, s);
  }
}

template <int D, Kv K, Act A, int W, int St>
void allow_blocks() {
  cudaFuncSetAttribute(decode_mma_kernel<D, K, A, false, W, St>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                       static_cast<int>(Shape<D, K, W, St>::kSmem));
}

template <int D, Kv K, Act A>
void allow_one() {
  allow_blocks<D, K, A, kWarps, kStages>();
  allow_blocks<D, K, A, kWideWarps, kStages>();
  cudaFuncSetAttribute(decode_mma_kernel<D, K, A, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(Shape<D, K>::kRingBytes));
}

// The (D, Kv, Act) combinations the kernel is built for; f(D, K, A) for the one asked.
template <typename F>
bool with_case(int D, Kv kv, Act act, F&& f) {
  auto by_kv = [&](auto d) {
    constexpr int kD = decltype(d)::value;
    if (act == Act::kBF16) {
      switch (kv) {
        case Kv::kBF16: f.template operator()<kD, Kv::kBF16, Act::kBF16>(); return true;
        case Kv::kE5M2: f.template operator()<kD, Kv::kE5M2, Act::kBF16>(); return true;
        case Kv::kE4M3: f.template operator()<kD, Kv::kE4M3, Act::kBF16>(); return true;
        default: return false;
      }
    }
    if (act == Act::kF16) {
      switch (kv) {
        case Kv::kF16: f.template operator()<kD, Kv::kF16, Act::kF16>(); return true;
        case Kv::kE5M2: f.template operator()<kD, Kv::kE5M2, Act::kF16>(); return true;
        case Kv::kE4M3: f.template operator()<kD, Kv::kE4M3, Act::kF16>(); return true;
        default: return false;
      }
    }
    return false;
  };
  if (D == 64) return by_kv(std::integral_constant<int, 64>{});
  if (D == 128) return by_kv(std::integral_constant<int, 128>{});
  return false;
}

struct Noop {
  template <int D, Kv K, Act A>
  void operator()() const {}
};
struct Launch {
  const AttnArgs& a;
  cudaStream_t s;
  template <int D, Kv K, Act A>
  void operator()() const { launch_one<D, K, A>(a, s); }
};
struct Allow {
  template <int D, Kv K, Act A>
  void operator()() const { allow_one<D, K, A>(); }
};

}  // namespace

bool decode_mma_supported(int head_dim, Kv kv, Act act, int group) {
  return group >= 1 && group <= 16 && with_case(head_dim, kv, act, Noop{});
}

bool decode_wide_blocks(std::int64_t units, int sms) { return units * kDecodeWideUnitsPerSm <= sms; }

bool decode_warp_units(std::int64_t units, int sms) { return units >= static_cast<std::int64_t>(kDecodeWarpUnitsPerSm) * sms; }

void launch_decode_mma(const AttnArgs& a, cudaStream_t s) {
  with_case(a.D, a.kv, a.act, Launch{a, s});
}

void configure_decode_mma() {
  for (int D : {64, 128}) {
    for (Act act : {Act::kBF16, Act::kF16}) {
      for (Kv kv : {Kv::kBF16, Kv::kF16, Kv::kE5M2, Kv::kE4M3}) with_case(D, kv, act, Allow{});
    }
  }
}

}  // namespace lmserve::cuda
