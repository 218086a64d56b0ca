// Host memory for the swap space (backend/cuda/device_model.cu, alloc_mapped_host): how fast
// pinned memory can be had by cudaHostAlloc or by touching anonymous memory (4 KiB pages or
// transparent huge pages, 1 or 8 threads) and registering it, and whether either stalls kernel
// launches on another thread. Build here, run on the GPU machine:
//   nvcc -O2 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -o .device/carry/pinbench scripts/device-pin-bench.cu -lpthread
#include <cuda_runtime.h>
#include <sys/mman.h>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>
#include <atomic>
using Clock = std::chrono::steady_clock;
static double secs(Clock::time_point a) { return std::chrono::duration<double>(Clock::now() - a).count(); }
__global__ void nop() {}
__global__ void spin(long long ns) { long long t0 = clock64(); while (clock64() - t0 < ns) {} }
int main() {
  cudaFree(0);
  const size_t chunk = 256ull << 20; const int n = 8;  // 2 GiB per method
  auto t = Clock::now();
  std::vector<void*> ps;
  for (int i = 0; i < n; ++i) { void* p; cudaHostAlloc(&p, chunk, cudaHostAllocMapped | cudaHostAllocPortable); ps.push_back(p); }
  double a = secs(t); printf("cudaHostAlloc mapped|portable 256MiB x8: %.3f s = %.2f GiB/s\n", a, 2.0 / a);
  t = Clock::now(); for (void* p : ps) cudaFreeHost(p); printf("cudaFreeHost x8: %.3f s\n", secs(t)); ps.clear();
  t = Clock::now();
  for (int i = 0; i < n; ++i) { void* p; cudaHostAlloc(&p, chunk, 0); ps.push_back(p); }
  a = secs(t); printf("cudaHostAlloc default 256MiB x8: %.3f s = %.2f GiB/s\n", a, 2.0 / a);
  for (void* p : ps) cudaFreeHost(p); ps.clear();
  for (int huge = 0; huge < 2; ++huge) for (int threads : {1, 8}) {
    t = Clock::now();
    char* base = (char*)mmap(nullptr, n * chunk, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (huge) madvise(base, n * chunk, MADV_HUGEPAGE);
    std::vector<std::thread> th;
    for (int k = 0; k < threads; ++k) th.emplace_back([&, k] { for (size_t o = k * (n * chunk / threads); o < (k + 1) * (n * chunk / threads); o += 4096) base[o] = 1; });
    for (auto& x : th) x.join();
    double touch = secs(t); t = Clock::now();
    for (int i = 0; i < n; ++i) if (cudaHostRegister(base + i * chunk, chunk, cudaHostRegisterMapped | cudaHostRegisterPortable) != cudaSuccess) printf("register failed\n");
    double reg = secs(t);
    printf("mmap%s touch %d threads: %.3f s (%.2f GiB/s), cudaHostRegister x8: %.3f s (%.2f GiB/s)\n", huge ? "+THP" : "", threads, touch, 2 / touch, reg, 2 / reg);
    for (int i = 0; i < n; ++i) cudaHostUnregister(base + i * chunk);
    munmap(base, n * chunk);
  }
  // Launch latency with and without a concurrent allocating thread.
  cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  for (int conc = 0; conc < 3; ++conc) {
    std::atomic<bool> stop{false};
    std::thread bg;
    if (conc == 1) bg = std::thread([&] { while (!stop) { void* p; cudaHostAlloc(&p, chunk, cudaHostAllocMapped | cudaHostAllocPortable); cudaFreeHost(p); } });
    if (conc == 2) bg = std::thread([&] { while (!stop) { char* b = (char*)mmap(nullptr, chunk, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0); madvise(b, chunk, MADV_HUGEPAGE); for (size_t o = 0; o < chunk; o += 4096) b[o] = 1; cudaHostRegister(b, chunk, cudaHostRegisterMapped | cudaHostRegisterPortable); cudaHostUnregister(b); munmap(b, chunk); } });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    double worst = 0, total = 0; int iters = 300;
    for (int i = 0; i < iters; ++i) { auto t1 = Clock::now(); spin<<<1, 1, 0, s>>>(2000000); nop<<<1,1,0,s>>>(); cudaStreamSynchronize(s); double d = secs(t1); worst = std::max(worst, d); total += d; }
    stop = true; if (bg.joinable()) bg.join();
    printf("launch+sync of a ~1 ms kernel, %s: mean %.3f ms, worst %.3f ms\n", conc == 0 ? "alone" : (conc == 1 ? "beside cudaHostAlloc loop" : "beside touch+register loop"), 1e3 * total / iters, 1e3 * worst);
  }
}
