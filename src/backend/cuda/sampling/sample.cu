// Sampling on the device (kernels.cuh, launch_sample; the contract is SampleSpec's in
// device_model.h): greedy argmax, and draws with temperature, top_k, top_p and min_p.
#include <cmath>

#include "backend/cuda/common/device_util.cuh"
#include "backend/cuda/common/kernels.cuh"

namespace lmserve::cuda {
namespace {

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

__global__ void __launch_bounds__(kSampleThreads) sample_kernel(const float* logits, int V, const SampleSpec* specs, std::int32_t* tokens,
                                                                const std::int32_t* rows) {
  __shared__ float s_v[kSampleWarps];
  __shared__ int s_i[kSampleWarps];
  __shared__ unsigned long long s_u[kSampleWarps];
  __shared__ SelectShared sh;
  pdl_wait();
  pdl_release();
  const int r = rows ? rows[blockIdx.x] : static_cast<int>(blockIdx.x);
  const SampleSpec sp = specs[r];
  const float* row = logits + static_cast<std::int64_t>(r) * V;
  const int tid = threadIdx.x;
  if (sp.mode <= 0) {
    if (tid == 0) tokens[r] = -1;
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
    if (tid == 0) tokens[r] = top;
    return;
  }
  const float inv_t = 1.0f / sp.temperature;
  if (isinf(inv_t)) {  // a temperature too small to divide by: the argmax, as its limit
    if (tid == 0) tokens[r] = top;
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
  if (tid == 0) tokens[r] = pick < V ? pick : top;
}

// Constrained decoding: a row's logits outside its mask become -infinity (launch_mask_rows).
__global__ void mask_kernel(float* logits, int V, const std::int32_t* rows, const std::uint64_t* masks, int words) {
  const int k = blockIdx.y;
  float* row = logits + static_cast<std::int64_t>(rows[k]) * V;
  const std::uint64_t* m = masks + static_cast<std::int64_t>(k) * words;
  for (int t = blockIdx.x * blockDim.x + threadIdx.x; t < V; t += gridDim.x * blockDim.x) {
    if (!((m[t >> 6] >> (t & 63)) & 1ull)) row[t] = -INFINITY;
  }
}

}  // namespace

void launch_sample(const float* logits, int R, int V, const SampleSpec* specs, std::int32_t* tokens, cudaStream_t s, const std::int32_t* rows) {
  if (R == 0) return;
  launch_pdl(sample_kernel, dim3(R), dim3(kSampleThreads), 0, s, logits, V, specs, tokens, rows);
}

void launch_mask_rows(float* logits, int V, const std::int32_t* rows, int R, const std::uint64_t* masks, int words, cudaStream_t s) {
  if (R == 0) return;
  constexpr int kThreads = 256, kPerThread = 4;
  const dim3 grid((V + kThreads * kPerThread - 1) / (kThreads * kPerThread), R);
  mask_kernel<<<grid, kThreads, 0, s>>>(logits, V, rows, masks, words);
}

}  // namespace lmserve::cuda
