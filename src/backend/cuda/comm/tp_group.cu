// The tensor-parallel group's buffers, meeting flags and collectives (tp_group.h).
#include "backend/cuda/comm/tp_group.h"

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>

#include <algorithm>

#include "backend/cuda/common/device_util.cuh"

namespace lmserve::cuda {
namespace {

constexpr int kBlocks = 48;    // every collective's grid: a block meets the peers' block of its index
constexpr int kThreads = 512;

// One rank's meeting flags: flags[b][k] is the last collective that rank k's block b reached
// (written by rank k), counter[b] the last one this rank's block b reached.
struct Signals {
  unsigned flags[kBlocks][TpGroup::kMaxRanks];
  unsigned counter[kBlocks];
};

struct Peers {
  const void* buf[TpGroup::kMaxRanks];
  Signals* sig[TpGroup::kMaxRanks];
};

__device__ __forceinline__ void store_release(unsigned* p, unsigned v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Block b of every rank meets here: thread k tells rank k this rank has arrived, then waits until
// rank k has (flags only grow; compared modulo 2^32).
__device__ __forceinline__ void meet(const Peers& p, Signals* self, int tp, int rank) {
  __shared__ unsigned gen;
  if (threadIdx.x == 0) {
    gen = self->counter[blockIdx.x] + 1;
    self->counter[blockIdx.x] = gen;
  }
  __syncthreads();
  if (threadIdx.x < tp) {
    const unsigned g = gen;
    store_release(&p.sig[threadIdx.x]->flags[blockIdx.x][rank], g);
    const unsigned long long start = global_ns();
    while (static_cast<int>(load_acquire(&self->flags[blockIdx.x][threadIdx.x]) - g) < 0) {
      if (global_ns() - start > static_cast<unsigned long long>(TpGroup::kWaitSeconds * 1e9)) __trap();
    }
  }
  __syncthreads();
}

template <Act A>
__global__ void __launch_bounds__(kThreads) all_reduce_kernel(Peers p, Signals* self, int tp, int rank, float* out, std::int64_t n) {
  pdl_wait();
  meet(p, self, tp, rank);
  pdl_release();
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t quads = n / 4;
  for (std::int64_t i = first; i < quads; i += stride) {
    float4 acc = act_load4<A>(p.buf[0], 4 * i);
    for (int r = 1; r < tp; ++r) {
      const float4 v = act_load4<A>(p.buf[r], 4 * i);
      acc.x += v.x, acc.y += v.y, acc.z += v.z, acc.w += v.w;
    }
    reinterpret_cast<float4*>(out)[i] = acc;
  }
  for (std::int64_t i = 4 * quads + first; i < n; i += stride) {
    float acc = act_load<A>(p.buf[0], i);
    for (int r = 1; r < tp; ++r) acc += act_load<A>(p.buf[r], i);
    out[i] = acc;
  }
}

struct Ranges {
  std::int64_t begin[TpGroup::kMaxRanks + 1];
};

// Element i of the gathered [rows x V] logits: rank k's, at `at` in that rank's [rows x width] rows.
__device__ __forceinline__ int source_of(std::int64_t i, const Ranges& v, int tp, std::int64_t* at) {
  const std::int64_t V = v.begin[tp], row = i / V, col = i % V;
  int k = 0;
  while (col >= v.begin[k + 1]) ++k;
  *at = row * (v.begin[k + 1] - v.begin[k]) + col - v.begin[k];
  return k;
}

__global__ void __launch_bounds__(kThreads) gather_kernel(Peers p, Signals* self, int tp, int rank, float* out, int rows, Ranges v) {
  pdl_wait();
  meet(p, self, tp, rank);
  pdl_release();
  if (rank == 0) {
    const std::int64_t n = static_cast<std::int64_t>(rows) * v.begin[tp];
    for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
      std::int64_t at = 0;
      const int k = source_of(i, v, tp, &at);
      out[i] = static_cast<const float*>(p.buf[k])[at];
    }
  }
  meet(p, self, tp, rank);  // the peers write their logits again only after rank 0 has read them
}

// kNccl, rank 0: out [rows x V] from rank 0's own logits (mine) and the others' as received, one
// after the other in `stage` (rank k's rows x width_k at the sum of the earlier ranks' sizes).
__global__ void __launch_bounds__(kThreads) place_kernel(const float* mine, const float* stage, float* out, int rows, int tp, Ranges v) {
  pdl_wait();
  pdl_release();
  const std::int64_t n = static_cast<std::int64_t>(rows) * v.begin[tp];
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::int64_t at = 0;
    const int k = source_of(i, v, tp, &at);
    out[i] = (k == 0 ? mine : stage + static_cast<std::int64_t>(rows) * (v.begin[k] - v.begin[1]))[at];
  }
}

template <Act A>
__global__ void widen_kernel(const void* in, float* out, std::int64_t n) {
  pdl_wait();
  pdl_release();
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    out[i] = act_load<A>(in, i);
  }
}

}  // namespace

// NCCL's entry points, from the library loaded at run time.
struct TpGroup::Nccl {
  void* lib = nullptr;
  decltype(&ncclGetVersion) get_version = nullptr;
  decltype(&ncclCommInitAll) init_all = nullptr;
  decltype(&ncclCommDestroy) destroy = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclSend) send = nullptr;
  decltype(&ncclRecv) recv = nullptr;
  decltype(&ncclGroupStart) group_start = nullptr;
  decltype(&ncclGroupEnd) group_end = nullptr;
  std::string why(ncclResult_t r) const { return error_string ? error_string(r) : "NCCL error " + std::to_string(static_cast<int>(r)); }
};

std::string TpGroup::start_nccl(std::size_t gather_bytes) {
  nccl_ = std::make_unique<Nccl>();
  Nccl& n = *nccl_;
  n.lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (!n.lib) return std::string("NCCL is not installed (libnccl.so.2: ") + dlerror() + ")";
  auto sym = [&](auto& f, const char* name) {
    f = reinterpret_cast<std::remove_reference_t<decltype(f)>>(dlsym(n.lib, name));
    return f != nullptr;
  };
  if (!sym(n.get_version, "ncclGetVersion") || !sym(n.init_all, "ncclCommInitAll") || !sym(n.destroy, "ncclCommDestroy") ||
      !sym(n.error_string, "ncclGetErrorString") || !sym(n.all_reduce, "ncclAllReduce") || !sym(n.send, "ncclSend") || !sym(n.recv, "ncclRecv") ||
      !sym(n.group_start, "ncclGroupStart") || !sym(n.group_end, "ncclGroupEnd")) {
    return "libnccl.so.2 lacks an entry point lmserve uses (NCCL 2.7 or later needed)";
  }
  std::vector<int> devices;
  for (const Rank& r : ranks_) {
    if (std::find(devices.begin(), devices.end(), r.device) != devices.end()) return "NCCL needs a GPU per rank (use the peer all-reduce to share one)";
    devices.push_back(r.device);
  }
  std::vector<ncclComm_t> comms(devices.size());
  if (ncclResult_t r = n.init_all(comms.data(), static_cast<int>(devices.size()), devices.data()); r != ncclSuccess) return "ncclCommInitAll: " + n.why(r);
  for (std::size_t k = 0; k < comms.size(); ++k) ranks_[k].comm = comms[k];
  // Rank 0 receives every other rank's logits before placing them.
  cudaSetDevice(ranks_[0].device);
  if (cudaError_t e = cudaMalloc(&ranks_[0].stage, std::max<std::size_t>(gather_bytes * (ranks_.size() - 1), 256)); e != cudaSuccess) {
    return std::string("NCCL staging: ") + cudaGetErrorString(e);
  }
  return {};
}

std::string TpGroup::nccl_all_reduce(int rank, int which, backend::ActDtype act, float* out, std::int64_t n, CUstream_st* stream) const {
  const Rank& r = ranks_[static_cast<std::size_t>(rank)];
  const ncclDataType_t type = act == backend::ActDtype::kFloat32 ? ncclFloat32 : (act == backend::ActDtype::kBFloat16 ? ncclBfloat16 : ncclFloat16);
  const bool wide = act == backend::ActDtype::kFloat32;
  // float32 straight into out; a 16-bit act in place, then widened into out.
  if (ncclResult_t e = nccl_->all_reduce(r.buf[which], wide ? static_cast<void*>(out) : r.buf[which], static_cast<std::size_t>(n), type, ncclSum,
                                         static_cast<ncclComm_t>(r.comm), stream);
      e != ncclSuccess) {
    return "ncclAllReduce: " + nccl_->why(e);
  }
  if (!wide) {
    const Act a = static_cast<Act>(act);
    LMSERVE_WITH_ACT(a, A, (launch_pdl(widen_kernel<A>, dim3(grid_for(n, 256)), dim3(256), 0, stream, r.buf[which], out, n)));
  }
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return std::string("all-reduce: ") + cudaGetErrorString(e);
  return {};
}

std::string TpGroup::nccl_gather(int rank, float* out, int rows, const std::vector<std::int64_t>& ranges, CUstream_st* stream) const {
  const Rank& r = ranks_[static_cast<std::size_t>(rank)];
  auto* comm = static_cast<ncclComm_t>(r.comm);
  auto count = [&](int k) { return static_cast<std::size_t>(rows) * static_cast<std::size_t>(ranges[static_cast<std::size_t>(k) + 1] - ranges[static_cast<std::size_t>(k)]); };
  nccl_->group_start();
  ncclResult_t e = ncclSuccess;
  if (rank == 0) {
    auto* at = static_cast<float*>(r.stage);
    for (int k = 1; k < size() && e == ncclSuccess; ++k) {
      e = nccl_->recv(at, count(k), ncclFloat32, k, comm, stream);
      at += count(k);
    }
  } else {
    e = nccl_->send(r.buf[3], count(rank), ncclFloat32, 0, comm, stream);
  }
  const ncclResult_t end = nccl_->group_end();
  if (e != ncclSuccess || end != ncclSuccess) return "NCCL gather: " + nccl_->why(e != ncclSuccess ? e : end);
  if (rank == 0) {
    Ranges v{};
    for (std::size_t k = 0; k < ranges.size(); ++k) v.begin[k] = ranges[k];
    launch_pdl(place_kernel, dim3(kBlocks), dim3(kThreads), 0, stream, static_cast<const float*>(r.buf[3]), static_cast<const float*>(r.stage), out, rows,
               size(), v);
  }
  if (cudaError_t ce = cudaGetLastError(); ce != cudaSuccess) return std::string("gather: ") + cudaGetErrorString(ce);
  return {};
}

namespace {

// Ranks on one GPU wait for each other inside their collectives' kernels. With CUDA's lazy module
// loading (the default), a kernel's first launch loads its module, which waits for everything on
// the GPU: a rank launching, say, a cuBLASLt kernel for a new shape would wait for its peer's
// all-reduce, which waits for this rank's. So such a group needs every module loaded when the
// context is made (CUDA_MODULE_LOADING=EAGER in the environment). Ranks on distinct GPUs do not:
// a load waits only for its own GPU, whose collectives' peers have launched theirs already.
std::string check_shared_gpus(const std::vector<int>& devices) {
  std::vector<int> sorted = devices;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end()) return {};
  if (cudaError_t e = cudaSetDevice(devices[0]); e != cudaSuccess) return std::string("cudaSetDevice: ") + cudaGetErrorString(e);
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion("cuModuleGetLoadingMode", &fn, 12000, cudaEnableDefault, &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess || fn == nullptr) {
    return "ranks sharing a GPU need to know CUDA's module loading mode, which this driver does not tell";
  }
  int mode = 0;  // CUmoduleLoadingMode: 1 eager, 2 lazy
  if (reinterpret_cast<int (*)(int*)>(fn)(&mode) != 0 || mode != 1) {
    return "ranks sharing a GPU need CUDA's eager module loading (CUDA_MODULE_LOADING=EAGER in the environment): a module "
           "loaded lazily waits for the whole GPU, where another rank's collective waits for this one";
  }
  return {};
}

}  // namespace

std::shared_ptr<TpGroup> TpGroup::create(const std::vector<int>& devices, std::size_t product_bytes, std::size_t embed_bytes,
                                         std::size_t gather_bytes, Transport transport, std::string* error) {
  auto fail = [&](const std::string& what, cudaError_t e) -> std::shared_ptr<TpGroup> {
    *error = what + (e == cudaSuccess ? std::string() : std::string(": ") + cudaGetErrorString(e));
    return nullptr;
  };
  if (devices.empty() || devices.size() > static_cast<std::size_t>(kMaxRanks)) {
    return fail("a tensor-parallel group has 1 to " + std::to_string(kMaxRanks) + " ranks", cudaSuccess);
  }
  if (std::string e = check_shared_gpus(devices); !e.empty()) return fail(e, cudaSuccess);
  std::shared_ptr<TpGroup> g(new TpGroup());
  g->transport_ = transport;
  // A waiting collective's blocks hold their SMs. Where m ranks share a GPU, m - 1 of them may
  // wait while the last still has a GEMM to run before its collective: with every SM holding a
  // waiting block, that GEMM's blocks (a whole SM's registers each) would never start. So ranks
  // sharing a GPU take 1/m of the blocks each, leaving most SMs free.
  int sharing = 1;
  for (int d : devices) sharing = std::max(sharing, static_cast<int>(std::count(devices.begin(), devices.end(), d)));
  g->blocks_ = std::max(1, kBlocks / sharing);
  for (int d : devices) {
    for (int peer : devices) {
      if (transport == Transport::kNccl) break;  // NCCL finds its own way between the GPUs
      if (peer == d) continue;
      int can = 0;
      if (cudaError_t e = cudaDeviceCanAccessPeer(&can, d, peer); e != cudaSuccess) return fail("cudaDeviceCanAccessPeer", e);
      if (!can) {
        return fail("GPU " + std::to_string(d) + " cannot read GPU " + std::to_string(peer) +
                        "'s memory (no peer access); tensor parallelism needs it between every pair",
                    cudaSuccess);
      }
      if (cudaError_t e = cudaSetDevice(d); e != cudaSuccess) return fail("cudaSetDevice", e);
      cudaError_t e = cudaDeviceEnablePeerAccess(peer, 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled) {
        cudaGetLastError();  // enabled before (a repeated device, or an earlier group): fine
      } else if (e != cudaSuccess) {
        return fail("cudaDeviceEnablePeerAccess", e);
      }
    }
  }
  const std::size_t sizes[4] = {product_bytes, product_bytes, embed_bytes, gather_bytes};
  for (int d : devices) {
    Rank r;
    r.device = d;
    if (cudaError_t e = cudaSetDevice(d); e != cudaSuccess) return fail("cudaSetDevice", e);
    for (int i = 0; i < 4; ++i) {
      if (cudaError_t e = cudaMalloc(&r.buf[i], std::max<std::size_t>(sizes[i], 256)); e != cudaSuccess) {
        g->ranks_.push_back(r);  // freed by the destructor
        return fail("tensor-parallel buffers (" + std::to_string(sizes[i]) + " bytes)", e);
      }
    }
    cudaError_t e = cudaMalloc(&r.signals, sizeof(Signals));
    g->ranks_.push_back(r);
    if (e != cudaSuccess) return fail("tensor-parallel signals", e);
    if (e = cudaMemset(g->ranks_.back().signals, 0, sizeof(Signals)); e != cudaSuccess) return fail("cudaMemset", e);
  }
  for (int d : devices) {
    cudaSetDevice(d);
    if (cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess) return fail("cudaDeviceSynchronize", e);
  }
  if (transport == Transport::kNccl) {
    if (std::string e = g->start_nccl(gather_bytes); !e.empty()) return fail(e, cudaSuccess);
  }
  return g;
}

TpGroup::~TpGroup() {
  for (Rank& r : ranks_) {
    cudaSetDevice(r.device);
    if (r.comm) nccl_->destroy(static_cast<ncclComm_t>(r.comm));
    if (r.stage) cudaFree(r.stage);
    for (void* b : r.buf) {
      if (b) cudaFree(b);
    }
    if (r.signals) cudaFree(r.signals);
  }
}

bool TpGroup::meet() {
  std::unique_lock lock(mu_);
  if (failed_) return false;
  const std::uint64_t round = round_;
  if (++arrived_ == size()) {
    arrived_ = 0;
    ++round_;
    cv_.notify_all();
    return true;
  }
  cv_.wait(lock, [&] { return failed_ || round_ != round; });
  return !failed_ || round_ != round;
}

void TpGroup::fail() {
  std::lock_guard lock(mu_);
  failed_ = true;
  cv_.notify_all();
}

std::string TpGroup::all_reduce(int rank, int which, backend::ActDtype act, float* out, std::int64_t n, CUstream_st* stream) const {
  if (transport_ == Transport::kNccl) return nccl_all_reduce(rank, which, act, out, n, stream);
  Peers p{};
  for (int k = 0; k < size(); ++k) {
    p.buf[k] = ranks_[static_cast<std::size_t>(k)].buf[which];
    p.sig[k] = static_cast<Signals*>(ranks_[static_cast<std::size_t>(k)].signals);
  }
  auto* self = static_cast<Signals*>(ranks_[static_cast<std::size_t>(rank)].signals);
  const Act a = static_cast<Act>(act);
  LMSERVE_WITH_ACT(a, A, (launch_pdl(all_reduce_kernel<A>, dim3(blocks_), dim3(kThreads), 0, stream, p, self, size(), rank, out, n)));
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return std::string("all-reduce: ") + cudaGetErrorString(e);
  return {};
}

std::string TpGroup::gather_rows(int rank, float* out, int rows, const std::vector<std::int64_t>& ranges, CUstream_st* stream) const {
  if (ranges.size() != ranks_.size() + 1) return "gather_rows: one range per rank";
  if (transport_ == Transport::kNccl) return nccl_gather(rank, out, rows, ranges, stream);
  Peers p{};
  Ranges v{};
  for (int k = 0; k < size(); ++k) {
    p.buf[k] = ranks_[static_cast<std::size_t>(k)].buf[3];
    p.sig[k] = static_cast<Signals*>(ranks_[static_cast<std::size_t>(k)].signals);
  }
  for (std::size_t k = 0; k < ranges.size(); ++k) v.begin[k] = ranges[k];
  auto* self = static_cast<Signals*>(ranks_[static_cast<std::size_t>(rank)].signals);
  launch_pdl(gather_kernel, dim3(blocks_), dim3(kThreads), 0, stream, p, self, size(), rank, out, rows, v);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return std::string("gather: ") + cudaGetErrorString(e);
  return {};
}

}  // namespace lmserve::cuda
