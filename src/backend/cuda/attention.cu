// Paged attention kernels (kernels.cuh, launch_attention): a tiled kernel for prefill and
// chunks (query rows of one item staged together), a streaming kernel for decode steps, and
// the combine of context splits.
#include <cmath>

#include "backend/cuda/device_util.cuh"
#include "backend/cuda/kernels.cuh"

namespace lmserve::cuda {
namespace {

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
