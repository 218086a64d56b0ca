#include "backend/cuda/gemm/gemm.cuh"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>

#include "backend/cuda/common/device_util.cuh"

namespace lmserve::cuda {
namespace {

const char* act_name(Act a) { return a == Act::kF32 ? "f32" : a == Act::kBF16 ? "bf16" : "f16"; }

// ---- thin products: a weight-streaming kernel -------------------------------------------
// With one or two token rows a step is bound by reading W once, not by the tensor cores: each
// warp streams kGemvRows rows of W with 16-byte loads (the X rows, small and shared by every
// warp, come through L1/L2) and keeps float32 sums for up to N token rows. At most two: past
// that the per-byte instruction count outgrows the memory time (docs/perf.md, "the
// weight-streaming kernel").
// Each lane issues kGemvLoads loads per row before using any (8 KB in flight per warp), and
// where W has few rows S warps share a pair of rows, each summing every S-th stretch of k, so
// that at least kGemvWarpsPerSm warps per multiprocessor stream (the 4096-row projections of
// an 8B model otherwise fill a fraction of the GPU and wait on latency).
constexpr int kGemvMaxN = Gemm::kStreamRows, kGemvRows = 2, kGemvThreads = 256, kGemvLoads = 4, kGemvWarpsPerSm = 24;

enum class GemvStore { kF32, kAct, kAddF32 };

// kSwiGlu: W is [2m, k] (gate rows, then up rows); row group p reads gate row p and up row
// m + p and writes silu(gate) * up to y[t * m + p] in the act type (the SiLU x mul kernel's
// formula, so the result is the same as the product followed by that kernel). Otherwise y is
// [n, m] (float, the act type, or float added to: GemvStore) and row group p reads rows 2p and
// 2p + 1.
//
// kPipe (gemv_pipe says when): two buffers of kGemvLoads / 2 loads per row, the next one's
// loads issued before the current one is used, so that a warp that loops over k always has
// loads in flight (the same registers as one buffer of kGemvLoads).
//
// kFold (Gemm::NormFold): kFoldIn, x is g = x_res * w_norm and every sum is scaled by the norm's
// inv = 1 / sqrt(mean(x_res^2) + eps) of its token row, from the partial sums of squares the
// product before left (summed in a fixed order by every block alike); kFoldOut, y is the float32
// residual the sums are added to, and the block also writes g = act(y * w_norm) for the product
// after and its sum of y^2 over its rows (partials[t * gridDim.x + block]). The residual and the
// norm's weights are read before the wait for the kernel before: nothing between the kernel
// before the previous and this one writes them (o_proj follows attention, down gate/up).
enum GemvFoldMode { kFoldNone = 0, kFoldIn = 1, kFoldOut = 2 };

template <Act A, int N, int S, bool kSwiGlu, bool kPipe = false, int kFold = kFoldNone>
__global__ void __launch_bounds__(kGemvThreads) gemv_kernel(const std::uint16_t* __restrict__ w, const std::uint16_t* __restrict__ x,
                                                            void* __restrict__ y, int m, int n, int k, GemvStore store, Gemm::NormFold fold) {
  constexpr int kWarps = kGemvThreads / 32;
  static_assert(kWarps % S == 0, "a block holds whole row groups");
  static_assert(!kSwiGlu || kGemvRows == 2, "a gate row and an up row");
  static_assert(!(kSwiGlu && kFold == kFoldOut), "the gated product is never a norm's producer");
  __shared__ float red[kWarps][kGemvRows][N];
  __shared__ float fold_ss[kWarps][N];  // kFoldIn: per warp; kFoldOut: per row group
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, part = warp % S;
  const int group = static_cast<int>(blockIdx.x) * (kWarps / S) + warp / S;
  const int row0 = kSwiGlu ? group : group * kGemvRows;
  const bool writer = part == 0 && lane == 0;
  const int chunks = k / 8, stride = 32 * S;
  const uint4* wr[kGemvRows];
#pragma unroll
  for (int r = 0; r < kGemvRows; ++r) {
    const std::int64_t row = kSwiGlu ? min(group, m - 1) + static_cast<std::int64_t>(r) * m : min(row0 + r, m - 1);
    wr[r] = reinterpret_cast<const uint4*>(w + row * k);
  }
  float acc[kGemvRows][N] = {};
  constexpr int L = kPipe ? kGemvLoads / 2 : kGemvLoads;  // loads per row in one buffer
  using Buffer = uint4[L][kGemvRows];
  auto load_w = [&](Buffer& raw, int c0) {
#pragma unroll
    for (int u = 0; u < L; ++u) {
      const int c = c0 + u * stride;
#pragma unroll
      for (int r = 0; r < kGemvRows; ++r) {
        if (c < chunks) raw[u][r] = __ldg(wr[r] + c);
      }
    }
  };
  auto use_w = [&](const Buffer& raw, int c0) {
#pragma unroll
    for (int u = 0; u < L; ++u) {
      const int c = c0 + u * stride;
      if (c >= chunks) continue;
#pragma unroll
      for (int t = 0; t < N; ++t) {
        if (t < n) {
          float xf[8];
          // X was written by the previous kernel: read through L2 only.
          unpack8<A>(__ldcg(reinterpret_cast<const uint4*>(x + static_cast<std::int64_t>(t) * k) + c), xf);
#pragma unroll
          for (int r = 0; r < kGemvRows; ++r) {
            float wf[8];
            unpack8<A>(raw[u][r], wf);
#pragma unroll
            for (int v = 0; v < 8; ++v) acc[r][t] += wf[v] * xf[v];
          }
        }
      }
    }
  };
  // The first weights are asked for before the wait for the previous kernel (no kernel writes
  // W): under programmatic dependent launch the stream starts during that kernel's tail.
  const int first = part * 32 + lane, step = stride * L;
  Buffer ra, rb;
  load_w(ra, first);
  if constexpr (kPipe) load_w(rb, first + step);
  // kFoldOut: the writer's residual values and norm weights, before the wait (see above).
  float res[kGemvRows][N] = {}, wn[kGemvRows] = {};
  if constexpr (kFold == kFoldOut) {
    if (writer) {
#pragma unroll
      for (int r = 0; r < kGemvRows; ++r) {
        if (row0 + r >= m) continue;
        wn[r] = act_load<A>(fold.norm_w, row0 + r);
#pragma unroll
        for (int t = 0; t < N; ++t) {
          if (t < n) res[r][t] = __ldcg(static_cast<const float*>(y) + static_cast<std::int64_t>(t) * m + row0 + r);
        }
      }
    }
  }
  pdl_wait();
  pdl_release();
  // kFoldIn: this thread's share of the partial sums of squares (the product before is done).
  float ss[N] = {};
  if constexpr (kFold == kFoldIn) {
    for (int i = threadIdx.x; i < fold.in_parts; i += kGemvThreads) {
#pragma unroll
      for (int t = 0; t < N; ++t) {
        if (t < n) ss[t] += __ldcg(fold.in_partials + static_cast<std::int64_t>(t) * fold.in_parts + i);
      }
    }
  }
  if constexpr (kPipe) {
    for (int c0 = first; c0 < chunks; c0 += 2 * step) {
      use_w(ra, c0);
      if (c0 + 2 * step < chunks) load_w(ra, c0 + 2 * step);
      if (c0 + step >= chunks) break;
      use_w(rb, c0 + step);
      if (c0 + 3 * step < chunks) load_w(rb, c0 + 3 * step);
    }
  } else {
    for (int c0 = first; c0 < chunks; c0 += step) {
      if (c0 != first) load_w(ra, c0);
      use_w(ra, c0);
    }
  }
#pragma unroll
  for (int r = 0; r < kGemvRows; ++r) {
#pragma unroll
    for (int t = 0; t < N; ++t) {
      const float v = warp_sum(acc[r][t]);
      if (lane == 0) red[warp][r][t] = v;
    }
  }
  if constexpr (kFold == kFoldIn) {
#pragma unroll
    for (int t = 0; t < N; ++t) {
      const float v = warp_sum(ss[t]);
      if (lane == 0) fold_ss[warp][t] = v;
    }
  }
  if constexpr (S > 1 || kFold == kFoldIn) __syncthreads();
  float inv[N];
  if constexpr (kFold == kFoldIn) {
#pragma unroll
    for (int t = 0; t < N; ++t) {
      float total = 0.0f;
#pragma unroll
      for (int q = 0; q < kWarps; ++q) total += fold_ss[q][t];
      inv[t] = 1.0f / sqrtf(total / static_cast<float>(fold.H) + fold.eps);
    }
  }
  float out_ss[N] = {};  // kFoldOut: the writer's sum of the new residual's squares
  if (writer) {
    float v[kGemvRows][N];
#pragma unroll
    for (int r = 0; r < kGemvRows; ++r) {
#pragma unroll
      for (int t = 0; t < N; ++t) {
        v[r][t] = 0.0f;
#pragma unroll
        for (int p = 0; p < S; ++p) v[r][t] += red[warp + p][r][t];
        if constexpr (kFold == kFoldIn) v[r][t] *= inv[t];
      }
    }
#pragma unroll
    for (int t = 0; t < N; ++t) {
      if (t >= n) continue;
      if constexpr (kFold == kFoldOut) {
#pragma unroll
        for (int r = 0; r < kGemvRows; ++r) {
          if (row0 + r >= m) continue;
          const std::int64_t at = static_cast<std::int64_t>(t) * m + row0 + r;
          const float sum = res[r][t] + v[r][t];
          static_cast<float*>(y)[at] = sum;
          act_store<A>(fold.g, at, sum * wn[r]);
          out_ss[t] += sum * sum;
        }
      } else if constexpr (kSwiGlu) {
        const float gate = v[0][t];
        if (group < m) act_store<A>(y, static_cast<std::int64_t>(t) * m + group, gate / (1.0f + expf(-gate)) * v[1][t]);
      } else {
#pragma unroll
        for (int r = 0; r < kGemvRows; ++r) {
          if (row0 + r >= m) continue;
          const std::int64_t at = static_cast<std::int64_t>(t) * m + row0 + r;
          if (store == GemvStore::kAct) {
            act_store<A>(y, at, v[r][t]);
          } else if (store == GemvStore::kAddF32) {
            static_cast<float*>(y)[at] += v[r][t];
          } else {
            static_cast<float*>(y)[at] = v[r][t];
          }
        }
      }
    }
  }
  if constexpr (kFold == kFoldOut) {
    // The block's sum of squares over its rows, its row groups taken in order.
    if (writer) {
#pragma unroll
      for (int t = 0; t < N; ++t) fold_ss[warp / S][t] = out_ss[t];
    }
    __syncthreads();
    if (threadIdx.x == 0) {
#pragma unroll
      for (int t = 0; t < N; ++t) {
        if (t >= n) break;
        float total = 0.0f;
#pragma unroll
        for (int g = 0; g < kWarps / S; ++g) total += fold_ss[g][t];
        fold.out_partials[static_cast<std::int64_t>(t) * gridDim.x + blockIdx.x] = total;
      }
    }
  }
}

// The two-buffer loop (gemv_kernel's kPipe) for two token rows, whose use of a buffer takes
// twice the instructions, and for long rows (k >= kGemvPipeK), where a warp loops over many
// buffers; one buffer of kGemvLoads otherwise, where the second buffer bought nothing
// (docs/perf.md, "the weight-streaming kernel's buffers").
constexpr int kGemvPipeK = 8192;
bool gemv_pipe(int n, int k) { return n >= 2 || k >= kGemvPipeK; }

// Returns the blocks launched (a kFoldOut product's partials per token row).
template <Act A, int S, bool kSwiGlu, int kFold = kFoldNone>
int launch_gemv_split(const std::uint16_t* w, const std::uint16_t* x, void* y, int m, int n, int k, GemvStore store, const Gemm::NormFold& fold,
                      cudaStream_t s) {
  const int groups_per_block = kGemvThreads / 32 / S, outputs_per_group = kSwiGlu ? 1 : kGemvRows;
  const unsigned blocks = static_cast<unsigned>((m + groups_per_block * outputs_per_group - 1) / (groups_per_block * outputs_per_group));
  const bool pipe = gemv_pipe(n, k);
  auto* kernel = n == 1 ? (pipe ? gemv_kernel<A, 1, S, kSwiGlu, true, kFold> : gemv_kernel<A, 1, S, kSwiGlu, false, kFold>)
                        : (pipe ? gemv_kernel<A, 2, S, kSwiGlu, true, kFold> : gemv_kernel<A, 2, S, kSwiGlu, false, kFold>);
  launch_pdl(kernel, dim3(blocks), dim3(kGemvThreads), 0, s, w, x, y, m, n, k, store, fold);
  return static_cast<int>(blocks);
}

template <Act A, bool kSwiGlu>
int gemv_slots() {  // blocks resident at once over the GPU (every instance has ~64 registers)
  static const int slots = [] {
    int per_sm = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, gemv_kernel<A, 1, 1, kSwiGlu>, kGemvThreads, 0);
    return std::max(1, per_sm) * multiprocessors();
  }();
  return slots;
}

// Warps per row pair: the fewest that give kGemvWarpsPerSm warps per multiprocessor (at most 8);
// then the one of it, 2x, 4x ... 8 whose whole waves of blocks take least time (a block of S
// warps per pair does 1/S of the work of one with a warp per pair), if 5% less than the fewest:
// a last wave of blocks left part-empty costs a whole wave (docs/perf.md, "GEMV waves").
template <Act A, bool kSwiGlu>
int gemv_warps_per_pair(std::int64_t pairs) {
  const std::int64_t want = static_cast<std::int64_t>(kGemvWarpsPerSm) * multiprocessors();
  int S = 1;
  while (S < 8 && S * pairs < want) S *= 2;
  const std::int64_t slots = gemv_slots<A, kSwiGlu>(), warps = kGemvThreads / 32;
  auto cost = [&](int s) {
    const std::int64_t blocks = (pairs + warps / s - 1) / (warps / s);
    return static_cast<double>((blocks + slots - 1) / slots) / s;
  };
  int best = S;
  for (int s = 2 * S; s <= 8; s *= 2) {
    if (cost(s) < 0.95 * cost(best)) best = s;
  }
  return best;
}

// m: rows of W (plain) or outputs per token (kSwiGlu: W has 2m rows, and y is in A). Returns
// the blocks launched.
template <Act A, bool kSwiGlu = false, int kFold = kFoldNone>
int launch_gemv(const void* w, const void* x, void* y, int m, int n, int k, cudaStream_t s, GemvStore store = GemvStore::kF32,
                const Gemm::NormFold& fold = {}) {
  const auto* W = static_cast<const std::uint16_t*>(w);
  const auto* X = static_cast<const std::uint16_t*>(x);
  const std::int64_t pairs = kSwiGlu ? m : (m + kGemvRows - 1) / kGemvRows;
  switch (gemv_warps_per_pair<A, kSwiGlu>(pairs)) {
    case 1: return launch_gemv_split<A, 1, kSwiGlu, kFold>(W, X, y, m, n, k, store, fold, s);
    case 2: return launch_gemv_split<A, 2, kSwiGlu, kFold>(W, X, y, m, n, k, store, fold, s);
    case 4: return launch_gemv_split<A, 4, kSwiGlu, kFold>(W, X, y, m, n, k, store, fold, s);
    default: return launch_gemv_split<A, 8, kSwiGlu, kFold>(W, X, y, m, n, k, store, fold, s);
  }
}

cudaDataType_t data_type(Act a) {
  switch (a) {
    case Act::kF32: return CUDA_R_32F;
    case Act::kBF16: return CUDA_R_16BF;
    case Act::kF16: return CUDA_R_16F;
  }
  return CUDA_R_32F;
}

std::string lt_error(const char* what, cublasStatus_t st) { return std::string(what) + ": cuBLASLt status " + std::to_string(static_cast<int>(st)); }

}  // namespace

Gemm::~Gemm() {
  for (auto& [key, p] : plans_) {
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatrixLayoutDestroy(p.b);
    cublasLtMatrixLayoutDestroy(p.c);
    cublasLtMatmulDescDestroy(p.desc);
  }
  if (workspace_) cudaFree(workspace_);
  if (handle_) cublasLtDestroy(handle_);
}

std::string Gemm::init(std::size_t workspace_bytes) {
  if (cublasStatus_t st = cublasLtCreate(&handle_); st != CUBLAS_STATUS_SUCCESS) return lt_error("cublasLtCreate", st);
  workspace_bytes_ = workspace_bytes;
  if (cudaError_t e = cudaMalloc(&workspace_, workspace_bytes); e != cudaSuccess) {
    return std::string("cuBLASLt workspace: ") + cudaGetErrorString(e);
  }
  return {};
}

namespace {

// n's bucket: the smallest 2^j or 3 x 2^(j-1) that holds it (at least 16).
int n_bucket(int n) {
  int b = 16;
  while (b < n) b = (b & (b - 1)) == 0 ? b + b / 2 : (b / 3) * 4;
  return b;
}

}  // namespace

std::string Gemm::make_plan(int m, int n, int k, Act act, Act out, const Operands* tune, int tune_n, Plan* p, bool fp8, const float* w_scales,
                            const float* x_scales) {
  const auto t0 = std::chrono::steady_clock::now();
  const cudaDataType_t in = fp8 ? CUDA_R_8F_E4M3 : data_type(act);
  // Column-major view: C[m, n] = op(A)[m, k] * B[k, n] with A = W stored [k, m] (transposed),
  // B = X stored [k, n]; C is Y row-major [n, m].
  cublasStatus_t st = cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  if (st != CUBLAS_STATUS_SUCCESS) return lt_error("cublasLtMatmulDescCreate", st);
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta));
  cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb));
  if (fp8) {
    // A per-row scale of W and one per token of X, applied to the float32 sums in the epilogue.
    const std::int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof(mode));
    cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof(mode));
    set_scales(*p, tune ? tune->w_scales : w_scales, tune ? tune->x_scales : x_scales);
  }
  cublasLtMatrixLayoutCreate(&p->a, in, static_cast<std::uint64_t>(k), static_cast<std::uint64_t>(m), k);
  cublasLtMatrixLayoutCreate(&p->b, in, static_cast<std::uint64_t>(k), static_cast<std::uint64_t>(n), k);
  cublasLtMatrixLayoutCreate(&p->c, data_type(out), static_cast<std::uint64_t>(m), static_cast<std::uint64_t>(n), m);
  cublasLtMatmulPreference_t pref;
  cublasLtMatmulPreferenceCreate(&pref);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes_, sizeof(workspace_bytes_));
  if (out != Act::kF32) {
    // A split-K product reduced in a 16-bit output (in place, or staged in the output type) rounds
    // every partial sum; a layer product is rounded once, so only the float32 reduction may run.
    const std::uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes, sizeof(schemes));
  }
  // A timed plan's algorithm may come from the tuning cache: the product named in full.
  std::string shape;
  if (tune && cache_) {
    shape = std::string(fp8 ? "e4m3" : act_name(act)) + "->" + act_name(out) + " m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" +
            std::to_string(k) + " timed_n=" + std::to_string(tune_n) + " beta=" + (tune->accumulate ? "1" : "0") + " workspace=" +
            std::to_string(workspace_bytes_);
    if (from_cache(shape, p)) {
      cublasLtMatmulPreferenceDestroy(pref);
      ++plans_cached_;
      plan_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      return {};
    }
  }
  constexpr int kCandidates = 8;
  cublasLtMatmulHeuristicResult_t results[kCandidates] = {};
  int found = 0;
  st = cublasLtMatmulAlgoGetHeuristic(handle_, p->desc, p->a, p->b, p->c, p->c, pref, tune ? kCandidates : 1, results, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  ++plans_made_;
  std::string error;
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
    error = "cuBLASLt has no algorithm for " + std::to_string(n) + "x" + std::to_string(k) + " * " + std::to_string(k) + "x" + std::to_string(m);
  } else {
    int best = 0;
    if (tune && found > 1) {
      const auto cols = static_cast<std::uint64_t>(tune_n);
      cublasLtMatrixLayoutSetAttribute(p->b, CUBLASLT_MATRIX_LAYOUT_COLS, &cols, sizeof(cols));
      cublasLtMatrixLayoutSetAttribute(p->c, CUBLASLT_MATRIX_LAYOUT_COLS, &cols, sizeof(cols));
      error = fastest(*p, results, found, *tune, &best);
      ++plans_tuned_;
      if (best != 0) ++plans_retuned_;
    }
    p->algo = results[best].algo;
    if (!shape.empty() && error.empty()) {
      backend::AlgoCache::Algo bytes{};
      std::memcpy(bytes.data(), &p->algo, sizeof(p->algo));
      cache_->put(shape, bytes);
    }
  }
  plan_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!error.empty()) {
    cublasLtMatrixLayoutDestroy(p->a);
    cublasLtMatrixLayoutDestroy(p->b);
    cublasLtMatrixLayoutDestroy(p->c);
    cublasLtMatmulDescDestroy(p->desc);
  }
  return error;
}

static_assert(sizeof(cublasLtMatmulAlgo_t) == sizeof(backend::AlgoCache::Algo), "a cached algorithm is a cublasLtMatmulAlgo_t's bytes");

bool Gemm::from_cache(const std::string& shape, Plan* p) {
  const auto cached = cache_->find(shape);
  if (!cached) return false;
  cublasLtMatmulAlgo_t algo;
  std::memcpy(&algo, cached->data(), sizeof(algo));
  cublasLtMatmulHeuristicResult_t check{};
  // Checked against this product's descriptors: bytes from a file are never run unchecked.
  if (cublasLtMatmulAlgoCheck(handle_, p->desc, p->a, p->b, p->c, p->c, &algo, &check) != CUBLAS_STATUS_SUCCESS ||
      check.workspaceSize > workspace_bytes_) {
    return false;
  }
  p->algo = algo;
  return true;
}

// The candidate whose product takes least time: one run to warm up, then the mean of kRuns
// between two events; a candidate cuBLASLt refuses is skipped.
std::string Gemm::fastest(const Plan& p, const cublasLtMatmulHeuristicResult_t* candidates, int count, const Operands& o, int* best) {
  constexpr int kRuns = 3;
  cudaEvent_t start = nullptr, stop = nullptr;
  if (cudaEventCreate(&start) != cudaSuccess || cudaEventCreate(&stop) != cudaSuccess) {
    if (start) cudaEventDestroy(start);
    return "gemm tuning: cudaEventCreate failed";
  }
  const float alpha = 1.0f, beta = o.accumulate ? 1.0f : 0.0f;
  float best_ms = 0;
  std::string error;
  for (int i = 0; i < count && error.empty(); ++i) {
    if (candidates[i].state != CUBLAS_STATUS_SUCCESS) continue;
    auto run = [&] {
      return cublasLtMatmul(handle_, p.desc, &alpha, o.w, p.a, o.x, p.b, &beta, o.y, p.c, o.y, p.c, &candidates[i].algo, workspace_,
                            workspace_bytes_, o.stream);
    };
    if (run() != CUBLAS_STATUS_SUCCESS) continue;
    cudaEventRecord(start, o.stream);
    bool ok = true;
    for (int r = 0; r < kRuns && ok; ++r) ok = run() == CUBLAS_STATUS_SUCCESS;
    cudaEventRecord(stop, o.stream);
    float ms = 0;
    if (cudaError_t e = cudaEventSynchronize(stop); e != cudaSuccess) {
      error = std::string("gemm tuning: ") + cudaGetErrorString(e);
    } else if (ok && cudaEventElapsedTime(&ms, start, stop) == cudaSuccess && (best_ms == 0 || ms < best_ms)) {
      best_ms = ms;
      *best = i;
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return error;
}

// A plan's key: (m, bucket of n or -n if exact, k, inputs, out); inputs are act, or kFp8Key.
constexpr int kFp8Key = 16;

std::string Gemm::plan_for(int m, int n, int k, Act act, Act out, bool exact, Plan** plan, const float* w_scales, const float* x_scales) {
  const bool fp8 = w_scales != nullptr;
  const int bucket = exact ? n : n_bucket(n);
  auto key = std::make_tuple(m, exact ? -n : bucket, k, fp8 ? kFp8Key : static_cast<int>(act), static_cast<int>(out));
  auto it = plans_.find(key);
  if (it == plans_.end()) {
    Plan p;
    if (std::string e = make_plan(m, bucket, k, act, out, nullptr, 0, &p, fp8, w_scales, x_scales); !e.empty()) return e;
    it = plans_.emplace(key, p).first;
  }
  Plan& p = it->second;
  if (!exact) {
    const auto cols = static_cast<std::uint64_t>(n);
    cublasLtMatrixLayoutSetAttribute(p.b, CUBLASLT_MATRIX_LAYOUT_COLS, &cols, sizeof(cols));
    cublasLtMatrixLayoutSetAttribute(p.c, CUBLASLT_MATRIX_LAYOUT_COLS, &cols, sizeof(cols));
  }
  *plan = &p;
  return {};
}

std::string Gemm::prepare(int m, int k, Act act, int max_n, const Operands* tune, Act out) {
  return prepare_plans(m, k, act, max_n, tune, out, false);
}

std::string Gemm::prepare_fp8(int m, int k, int max_n, const Operands* tune, Act out) {
  return prepare_plans(m, k, Act::kBF16, max_n, tune, out, true);
}

std::string Gemm::prepare_plans(int m, int k, Act act, int max_n, const Operands* tune, Act out, bool fp8) {
  for (int n = kGemvMaxN + 1; n <= max_n; n = n_bucket(n) + 1) {
    const int bucket = n_bucket(n);
    auto key = std::make_tuple(m, bucket, k, fp8 ? kFp8Key : static_cast<int>(act), static_cast<int>(out));
    if (plans_.count(key)) continue;
    Plan p;
    if (std::string e = make_plan(m, bucket, k, act, out, tune, std::min(bucket, max_n), &p, fp8); !e.empty()) return e;
    plans_.emplace(key, p);
  }
  return {};
}

bool Gemm::thin(const void* w, const void* x, int n, int k, Act act) { return can_fold(n, k, act) && aligned16(w) && aligned16(x); }

std::string Gemm::run_gate_up_silu(const void* w, const void* x, void* scratch, void* out, int I, int n, int k, Act act, cudaStream_t s) {
  if (n == 0) return {};
  if (thin(w, x, n, k, act)) {
    if (act == Act::kBF16) {
      launch_gemv<Act::kBF16, true>(w, x, out, I, n, k, s);
    } else {
      launch_gemv<Act::kF16, true>(w, x, out, I, n, k, s);
    }
    return {};
  }
  const Act mid = act;
  if (std::string e = run_lt(w, x, scratch, mid, 2 * I, n, k, act, 0.0f, s); !e.empty()) return e;
  launch_silu_mul(scratch, mid, n, I, out, act, s);
  return {};
}

std::string Gemm::run(const void* w, const void* x, float* y, int m, int n, int k, Act act, cudaStream_t s) {
  return run(w, x, y, Act::kF32, m, n, k, act, s);
}

std::string Gemm::run(const void* w, const void* x, void* y, Act out, int m, int n, int k, Act act, cudaStream_t s) {
  if (n == 0) return {};
  if (out != Act::kF32 && out != act) return "gemm: output dtype neither float32 nor the inputs'";
  if (thin(w, x, n, k, act)) {
    if (act == Act::kBF16) {
      launch_gemv<Act::kBF16>(w, x, y, m, n, k, s, out != Act::kF32 ? GemvStore::kAct : GemvStore::kF32);
    } else {
      launch_gemv<Act::kF16>(w, x, y, m, n, k, s, out != Act::kF32 ? GemvStore::kAct : GemvStore::kF32);
    }
    return {};
  }
  return run_lt(w, x, y, out, m, n, k, act, 0.0f, s);
}

std::string Gemm::run_add(const void* w, const void* x, float* y, int m, int n, int k, Act act, cudaStream_t s) {
  if (n == 0) return {};
  if (thin(w, x, n, k, act)) {
    if (act == Act::kBF16) {
      launch_gemv<Act::kBF16>(w, x, y, m, n, k, s, GemvStore::kAddF32);
    } else {
      launch_gemv<Act::kF16>(w, x, y, m, n, k, s, GemvStore::kAddF32);
    }
    return {};
  }
  return run_lt(w, x, y, Act::kF32, m, n, k, act, 1.0f, s);
}

bool Gemm::can_fold(int n, int k, Act act) { return act != Act::kF32 && n >= 1 && n <= kGemvMaxN && k % 8 == 0; }

std::string Gemm::run_add_fold(const void* w, const void* x, float* y, int m, int n, int k, Act act, const NormFold& fold, int* parts,
                               cudaStream_t s) {
  if (!thin(w, x, n, k, act) || !fold.g || !fold.norm_w || !fold.out_partials) return "gemm: a folded norm needs one or two 16-bit rows and its buffers";
  *parts = act == Act::kBF16 ? launch_gemv<Act::kBF16, false, kFoldOut>(w, x, y, m, n, k, s, GemvStore::kAddF32, fold)
                             : launch_gemv<Act::kF16, false, kFoldOut>(w, x, y, m, n, k, s, GemvStore::kAddF32, fold);
  return {};
}

std::string Gemm::run_folded(const void* w, const void* g, void* y, Act out, int m, int n, int k, Act act, const NormFold& fold, cudaStream_t s) {
  if (!thin(w, g, n, k, act) || !fold.in_partials || fold.in_parts < 1) return "gemm: a folded norm needs one or two 16-bit rows and its partials";
  const GemvStore store = out != Act::kF32 ? GemvStore::kAct : GemvStore::kF32;
  if (act == Act::kBF16) {
    launch_gemv<Act::kBF16, false, kFoldIn>(w, g, y, m, n, k, s, store, fold);
  } else {
    launch_gemv<Act::kF16, false, kFoldIn>(w, g, y, m, n, k, s, store, fold);
  }
  return {};
}

std::string Gemm::run_gate_up_silu_folded(const void* w, const void* g, void* out, int I, int n, int k, Act act, const NormFold& fold,
                                          cudaStream_t s) {
  if (!thin(w, g, n, k, act) || !fold.in_partials || fold.in_parts < 1) return "gemm: a folded norm needs one or two 16-bit rows and its partials";
  if (act == Act::kBF16) {
    launch_gemv<Act::kBF16, true, kFoldIn>(w, g, out, I, n, k, s, GemvStore::kAct, fold);
  } else {
    launch_gemv<Act::kF16, true, kFoldIn>(w, g, out, I, n, k, s, GemvStore::kAct, fold);
  }
  return {};
}

void Gemm::set_scales(const Plan& p, const float* w_scales, const float* x_scales) {
  cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w_scales, sizeof(w_scales));
  cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &x_scales, sizeof(x_scales));
}

std::string Gemm::run_lt(const void* w, const void* x, void* y, Act out, int m, int n, int k, Act act, float beta, cudaStream_t s,
                         const float* w_scales, const float* x_scales) {
  const float alpha = 1.0f;
  const bool fp8 = w_scales != nullptr;
  cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
  // The bucket's algorithm first; if cuBLASLt refuses it for this n, the heuristic's for n.
  for (bool exact : {false, true}) {
    Plan* p = nullptr;
    if (std::string e = plan_for(m, n, k, act, out, exact, &p, w_scales, x_scales); !e.empty()) return e;
    if (fp8) set_scales(*p, w_scales, x_scales);  // plans are shared by the layers' products
    st = cublasLtMatmul(handle_, p->desc, &alpha, w, p->a, x, p->b, &beta, y, p->c, y, p->c, &p->algo, workspace_, workspace_bytes_, s);
    if (st != CUBLAS_STATUS_NOT_SUPPORTED && st != CUBLAS_STATUS_INVALID_VALUE) break;
    if (exact) break;
  }
  if (st != CUBLAS_STATUS_SUCCESS) return lt_error("cublasLtMatmul", st);
  return {};
}

}  // namespace lmserve::cuda
