// Pinned host memory that kernels read and write directly: the swap space's chunks
// (device_model.h, alloc_mapped_host / free_mapped_host).
#include <cuda_runtime.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "backend/cuda/model/device_model.h"

namespace lmserve::cuda {
namespace {

// The mappings behind alloc_mapped_host's pointers (aligned inside a larger mmap).
std::mutex host_maps_mu;
std::map<void*, std::pair<void*, std::size_t>> host_maps;

}  // namespace

// Not cudaHostAlloc: it is an order of magnitude slower and holds a driver lock meanwhile, so
// launches on other threads wait. Anonymous memory in transparent huge pages, touched by a few
// threads and then registered, is fast and leaves launches alone (scripts/device-pin-bench.cu,
// docs/perf.md "the swap space").
void* alloc_mapped_host(std::size_t bytes) {
  constexpr std::size_t kHuge = std::size_t{2} << 20;
  const std::size_t len = (bytes + kHuge - 1) / kHuge * kHuge + kHuge;
  void* base = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) return nullptr;
  char* p = reinterpret_cast<char*>((reinterpret_cast<std::uintptr_t>(base) + kHuge - 1) / kHuge * kHuge);
  madvise(p, len - kHuge, MADV_HUGEPAGE);
  // Touch every page now (pinning would fault them one by one), a share per thread.
  const std::size_t span = len - kHuge;
  const unsigned n = std::clamp(std::thread::hardware_concurrency() / 2, 1u, 8u);
  std::vector<std::thread> touch;
  for (unsigned t = 0; t < n; ++t) {
    touch.emplace_back([p, span, n, t] {
      for (std::size_t o = span / n * t / 4096 * 4096; o < (t + 1 == n ? span : span / n * (t + 1)); o += 4096) p[o] = 0;
    });
  }
  for (auto& t : touch) t.join();
  void* device = nullptr;
  if (cudaHostRegister(p, span, cudaHostRegisterMapped | cudaHostRegisterPortable) != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it
    munmap(base, len);
    return nullptr;
  }
  // The swap kernel uses the host address on the device (unified addressing).
  if (cudaHostGetDevicePointer(&device, p, 0) != cudaSuccess || device != p) {
    cudaGetLastError();
    cudaHostUnregister(p);
    munmap(base, len);
    return nullptr;
  }
  std::lock_guard lock(host_maps_mu);
  host_maps[p] = {base, len};
  return p;
}

void free_mapped_host(void* p) {
  if (p == nullptr) return;
  std::pair<void*, std::size_t> m;
  {
    std::lock_guard lock(host_maps_mu);
    auto it = host_maps.find(p);
    if (it == host_maps.end()) return;
    m = it->second;
    host_maps.erase(it);
  }
  cudaHostUnregister(p);
  munmap(m.first, m.second);
}

}  // namespace lmserve::cuda
