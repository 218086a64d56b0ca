// FP8 weights (issue #34): the activations quantized per token, the weight-streaming kernel of
// e4m3 weights for one or two rows, and Gemm's FP8 products (gemm.cuh, "FP8 weights").
#include <algorithm>
#include <string>

#include "backend/cuda/common/device_util.cuh"
#include "backend/cuda/common/quantize_fp8.cuh"
#include "backend/cuda/gemm/gemm.cuh"

namespace lmserve::cuda {
namespace {

constexpr int kQuantThreads = 256;

// Row t of x (act, k elements, k % 4 == 0) quantized per token (quantize_fp8.cuh): xs[t], xq[t, :].
// kGroups > 0: the row held in registers (k <= kQuantThreads * 4 * kGroups), read once with its
// loads in flight together; 0: read twice in a loop, any k.
template <Act A, int kGroups>
__global__ void __launch_bounds__(kQuantThreads) quantize_rows_kernel(const void* __restrict__ x, int k, std::uint8_t* __restrict__ xq,
                                                                      float* __restrict__ xs) {
  __shared__ float part[kQuantThreads / 32];
  pdl_wait();
  pdl_release();
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * k;
  if constexpr (kGroups > 0) {
    quantize_row_e4m3_held<A, kQuantThreads, kGroups>(x, row, k, xq, xs + blockIdx.x, part);
  } else {
    quantize_row_e4m3<A, kQuantThreads, true>(x, row, k, xq, xs + blockIdx.x, part);
  }
}

// ---- one or two rows: streaming e4m3 weights through the tensor cores ----
// mma.sync m16n8k32 multiplies e4m3 weights and e4m3 activations as they are (no conversion on
// the CUDA cores, which bound the kernel that unpacked 16 weights a load to floats) and sums the
// exact products in float32. A warp takes a tile of 16 rows of W (kSwiGlu: 8 gate rows and their
// 8 up rows); lane (g, t) = (lane / 4, lane % 4) streams 16-byte pieces of rows g and g + 8, the
// four lanes of a group 64 consecutive bytes of k a step. The products' k order is permuted
// (the sum does not depend on it): of a piece, bytes 0-3 and 4-7 are the A registers of rows g
// and g + 8 at columns 4t.. and 16 + 4t.. of the first MMA, bytes 8-15 those of the second; lane
// (g, t) gives the same bytes of token g's quantized row as B. Tokens 2..7 of the MMA are zero.
// S warps share a tile, splitting k; their sums meet in shared memory, and the tile's first
// warp scales them by the token's and the row's scales and stores.
constexpr int kThreads = 256, kLoads = 4;

enum class Store { kF32, kAct, kAddF32 };

__device__ __forceinline__ void mma_e4m3(float (&c)[4], std::uint32_t a0, std::uint32_t a1, std::uint32_t a2, std::uint32_t a3, std::uint32_t b0,
                                         std::uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// kSwiGlu: W is [2m, k]; tile p's rows are gate rows 8p..8p+7 and up rows m + 8p..; output o gets
// silu(gate) * up (in act) at y[t * m + o]. Otherwise y is [n, m] and tile p holds rows 16p..16p+15.
template <Act A, int S, bool kSwiGlu>
__global__ void __launch_bounds__(kThreads) gemv_fp8_kernel(const std::uint8_t* __restrict__ w, const float* __restrict__ ws,
                                                            const std::uint8_t* __restrict__ xq, const float* __restrict__ xs, void* __restrict__ y,
                                                            int m, int n, int k, Store store) {
  constexpr int kWarps = kThreads / 32;
  static_assert(kWarps % S == 0, "a block holds whole tiles");
  __shared__ float red[kWarps][16][2];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, part = warp % S;
  const int tile = static_cast<int>(blockIdx.x) * (kWarps / S) + warp / S;
  const int g = lane >> 2, t = lane & 3;
  std::int64_t ra, rb;
  if constexpr (kSwiGlu) {
    ra = min(tile * 8 + g, m - 1);
    rb = ra + m;
  } else {
    ra = min(tile * 16 + g, m - 1);
    rb = min(tile * 16 + g + 8, m - 1);
  }
  const uint4* wa = reinterpret_cast<const uint4*>(w + ra * k);
  const uint4* wb = reinterpret_cast<const uint4*>(w + rb * k);
  const uint4* xr = reinterpret_cast<const uint4*>(xq + static_cast<std::int64_t>(min(g, 1)) * k);
  const bool x_lane = g < n;  // lanes of groups 0 (and 1) carry the tokens
  const int pieces = k / 16, steps = (pieces + 3) / 4;
  float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  uint4 ka[kLoads], kb[kLoads], kx[kLoads];
  const uint4 zero = make_uint4(0, 0, 0, 0);
  auto load_w = [&](int s0) {
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int piece = (s0 + u * S) * 4 + t;
      const bool in = piece < pieces;
      ka[u] = in ? __ldg(wa + piece) : zero;
      kb[u] = in ? __ldg(wb + piece) : zero;
    }
  };
  auto load_x = [&](int s0) {
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int piece = (s0 + u * S) * 4 + t;
      kx[u] = x_lane && piece < pieces ? __ldcg(xr + piece) : zero;
    }
  };
  // W's first loads before the wait (no kernel writes W); X is the kernel before's output.
  load_w(part);
  pdl_wait();
  pdl_release();
  load_x(part);
  for (int s0 = part; s0 < steps; s0 += S * kLoads) {
    if (s0 != part) {
      load_w(s0);
      load_x(s0);
    }
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      if (s0 + u * S >= steps) continue;  // the same for the whole warp
      mma_e4m3(c, ka[u].x, kb[u].x, ka[u].y, kb[u].y, kx[u].x, kx[u].y);
      mma_e4m3(c, ka[u].z, kb[u].z, ka[u].w, kb[u].w, kx[u].z, kx[u].w);
    }
  }
  // c: rows g and g + 8 (c[0], c[1] and c[2], c[3]) for tokens 2t and 2t + 1: tokens 0, 1 at t = 0.
  if (t == 0) {
    red[warp][g][0] = c[0];
    red[warp][g][1] = c[1];
    red[warp][g + 8][0] = c[2];
    red[warp][g + 8][1] = c[3];
  }
  __syncthreads();
  if (part != 0) return;
  auto sum = [&](int r, int tok) {
    float v = 0.0f;
#pragma unroll
    for (int p = 0; p < S; ++p) v += red[warp + p][r][tok];
    return v;
  };
  if constexpr (kSwiGlu) {
    const int o = tile * 8 + lane;
    if (lane >= 8 || o >= m) return;
    for (int tok = 0; tok < n; ++tok) {
      const float gate = sum(lane, tok) * xs[tok] * ws[o], up = sum(lane + 8, tok) * xs[tok] * ws[o + m];
      act_store<A>(y, static_cast<std::int64_t>(tok) * m + o, gate / (1.0f + expf(-gate)) * up);
    }
  } else {
    const int row = tile * 16 + lane;
    if (lane >= 16 || row >= m) return;
    for (int tok = 0; tok < n; ++tok) {
      const float v = sum(lane, tok) * xs[tok] * ws[row];
      const std::int64_t at = static_cast<std::int64_t>(tok) * m + row;
      if (store == Store::kAct) {
        act_store<A>(y, at, v);
      } else if (store == Store::kAddF32) {
        static_cast<float*>(y)[at] += v;
      } else {
        static_cast<float*>(y)[at] = v;
      }
    }
  }
}

template <Act A, int S, bool kSwiGlu>
void launch_split(const std::uint8_t* w, const float* ws, const std::uint8_t* xq, const float* xs, void* y, int m, int n, int k, Store store,
                  cudaStream_t s) {
  const int tiles_per_block = kThreads / 32 / S, rows_per_tile = kSwiGlu ? 8 : 16;
  const unsigned blocks = static_cast<unsigned>((m + tiles_per_block * rows_per_tile - 1) / (tiles_per_block * rows_per_tile));
  launch_pdl(gemv_fp8_kernel<A, S, kSwiGlu>, dim3(blocks), dim3(kThreads), 0, s, w, ws, xq, xs, y, m, n, k, store);
}

// A block's eight warps share one tile, whatever m: on the H200 that beat sizing the split to
// fill the multiprocessors with fewer warps a tile (b1 3.172-3.177 ms against 3.404-3.407, b2
// 3.319-3.322 against 3.610-3.617; gate/up, whose 448 blocks of two tiles were 1.13 waves, gained
// most). m: rows of W, or outputs per token (kSwiGlu). xq, xs: n <= 2 rows quantized.
template <Act A, bool kSwiGlu>
void launch_gemv_fp8(const void* w, const float* ws, const void* xq, const float* xs, void* y, int m, int n, int k, Store store, cudaStream_t s) {
  launch_split<A, kThreads / 32, kSwiGlu>(static_cast<const std::uint8_t*>(w), ws, static_cast<const std::uint8_t*>(xq), xs, y, m, n, k, store, s);
}

// The weight-streaming kernel applies (after quantize(): k % 16 == 0, X's rows aligned).
bool stream_fp8(const Gemm::Fp8Weight& w, int n) { return n <= Gemm::kStreamRows && aligned16(w.w); }

}  // namespace

void launch_quantize_rows_fp8(const void* x, Act act, int n, int k, void* xq, float* xs, cudaStream_t s) {
  if (n == 0) return;
  auto* q = static_cast<std::uint8_t*>(xq);
  const dim3 grid(static_cast<unsigned>(n)), block(kQuantThreads);
  constexpr int kRow = kQuantThreads * 4;  // the values one group of loads covers
  // Four groups up to k = 4,096 (o_proj's input at the 8B shape), sixteen up to 16,384 (down's
  // at one or two rows: 14,336). On an H100 the held row took 0.9% off the b1 step (docs/perf.md,
  // "FP8 at one or two rows").
  if (k <= 4 * kRow) {
    LMSERVE_WITH_ACT(act, A, (launch_pdl(quantize_rows_kernel<A, 4>, grid, block, 0, s, x, k, q, xs)));
  } else if (k <= 16 * kRow) {
    LMSERVE_WITH_ACT(act, A, (launch_pdl(quantize_rows_kernel<A, 16>, grid, block, 0, s, x, k, q, xs)));
  } else {
    LMSERVE_WITH_ACT(act, A, (launch_pdl(quantize_rows_kernel<A, 0>, grid, block, 0, s, x, k, q, xs)));
  }
}

std::string Gemm::quantize(const void* x, int n, int k, Act act, cudaStream_t s) {
  if (!xq_ || !xs_) return "gemm: FP8 products need the scratch of set_fp8_scratch";
  if (k % 16 != 0 || !aligned16(x)) return "gemm: FP8 products need k divisible by 16 and aligned rows";
  launch_quantize_rows_fp8(x, act, n, k, xq_, xs_, s);
  return {};
}

std::string Gemm::run_fp8(const Fp8Weight& w, const void* x, void* y, Act out, int m, int n, int k, Act act, cudaStream_t s) {
  if (n == 0) return {};
  if (out != Act::kF32 && out != act) return "gemm: output dtype neither float32 nor the inputs'";
  if (x != nullptr) LMSERVE_TRY(quantize(x, n, k, act, s));
  if (stream_fp8(w, n)) {
    const Store store = out != Act::kF32 ? Store::kAct : Store::kF32;
    LMSERVE_WITH_ACT(act, A, (launch_gemv_fp8<A, false>(w.w, w.scales, xq_, xs_, y, m, n, k, store, s)));
    return {};
  }
  return run_lt(w.w, xq_, y, out, m, n, k, act, 0.0f, s, w.scales, xs_);
}

std::string Gemm::run_add_fp8(const Fp8Weight& w, const void* x, float* y, int m, int n, int k, Act act, cudaStream_t s) {
  if (n == 0) return {};
  if (x != nullptr) LMSERVE_TRY(quantize(x, n, k, act, s));
  if (stream_fp8(w, n)) {
    LMSERVE_WITH_ACT(act, A, (launch_gemv_fp8<A, false>(w.w, w.scales, xq_, xs_, y, m, n, k, Store::kAddF32, s)));
    return {};
  }
  return run_lt(w.w, xq_, y, Act::kF32, m, n, k, act, 1.0f, s, w.scales, xs_);
}

std::string Gemm::run_gate_up_silu_fp8(const Fp8Weight& w, const void* x, void* scratch, void* out, int I, int n, int k, Act act, cudaStream_t s,
                                       bool quantize_out) {
  if (n == 0) return {};
  if (quantize_out && (I % 16 != 0 || !aligned16(out))) return "gemm: quantize_out needs I divisible by 16 and aligned rows";
  if (x != nullptr) LMSERVE_TRY(quantize(x, n, k, act, s));
  if (stream_fp8(w, n)) {
    LMSERVE_WITH_ACT(act, A, (launch_gemv_fp8<A, true>(w.w, w.scales, xq_, xs_, out, I, n, k, Store::kAct, s)));
    return quantize_out ? quantize(out, n, I, act, s) : std::string();
  }
  LMSERVE_TRY(run_lt(w.w, xq_, scratch, act, 2 * I, n, k, act, 0.0f, s, w.scales, xs_));
  // The gate/up product has read xq_ by now (stream order): the SiLU kernel may overwrite it.
  launch_silu_mul(scratch, act, n, I, out, act, s, quantize_out ? xq_ : nullptr, quantize_out ? xs_ : nullptr);
  return {};
}

}  // namespace lmserve::cuda
