// Device memory as the admission watermark and the metrics see it (ARCHITECTURE.md, "device
// memory"): a thread samples every GPU every 100 ms. The source is NVML, loaded at run time
// with dlopen("libnvidia-ml.so.1") — it counts every process on the card, as nvidia-smi does —
// or, where NVML is missing, cudaMemGetInfo. Build machines need neither: without a GPU the
// monitor simply has no samples.
//
// Threading: latest(), max_used_share() and source() may be called from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/thread_pool.h"

namespace lmserve {

struct GpuMemorySample {
  int device = 0;
  std::uint64_t used_bytes = 0, total_bytes = 0;
  std::string source;  // "nvml" or "cuda"
};

// Reads one device; nullopt when it cannot be read.
using GpuMemorySampler = std::function<std::optional<GpuMemorySample>(int device)>;

// NVML where libnvidia-ml.so.1 loads and knows the device, else the CUDA runtime.
GpuMemorySampler system_gpu_memory_sampler();

class DeviceMemoryMonitor {
 public:
  // Takes a first sample of every device before returning, then one per `period`.
  DeviceMemoryMonitor(std::vector<int> devices, std::chrono::milliseconds period = std::chrono::milliseconds(100),
                      GpuMemorySampler sampler = system_gpu_memory_sampler());
  ~DeviceMemoryMonitor();
  DeviceMemoryMonitor(const DeviceMemoryMonitor&) = delete;
  DeviceMemoryMonitor& operator=(const DeviceMemoryMonitor&) = delete;

  std::vector<GpuMemorySample> latest() const;
  // The largest used / total over the devices; 0 when none could be read.
  double max_used_share() const;
  std::uint64_t samples_taken() const;

 private:
  void sample_all();

  std::vector<int> devices_;
  GpuMemorySampler sampler_;
  mutable std::mutex mu_;
  std::vector<GpuMemorySample> latest_;
  std::uint64_t samples_ = 0;
  std::optional<PeriodicTask> ticker_;  // last: stopped before the members above go
};

}  // namespace lmserve
