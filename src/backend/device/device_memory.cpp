#include "backend/device/device_memory.h"

#include <algorithm>

#include "backend/device/nvml.h"

#if LMSERVE_WITH_CUDA
#include "backend/device/probe.h"
#endif

namespace lmserve {

GpuMemorySampler system_gpu_memory_sampler() {
  return [](int device) -> std::optional<GpuMemorySample> {
    if (auto m = nvml::memory(device)) return GpuMemorySample{device, m->used, m->total, "nvml"};
#if LMSERVE_WITH_CUDA
    std::uint64_t free_b = 0, total = 0;
    if (cuda::memory_info(device, &free_b, &total) && total > 0) return GpuMemorySample{device, total - free_b, total, "cuda"};
#endif
    return std::nullopt;
  };
}

DeviceMemoryMonitor::DeviceMemoryMonitor(std::vector<int> devices, std::chrono::milliseconds period, GpuMemorySampler sampler)
    : devices_(std::move(devices)), sampler_(std::move(sampler)) {
  sample_all();
  ticker_.emplace(period, [this] { sample_all(); });
}

DeviceMemoryMonitor::~DeviceMemoryMonitor() { ticker_.reset(); }

void DeviceMemoryMonitor::sample_all() {
  std::vector<GpuMemorySample> now;
  for (int d : devices_) {
    if (auto s = sampler_(d)) now.push_back(*s);
  }
  std::lock_guard lock(mu_);
  latest_ = std::move(now);
  ++samples_;
}

std::vector<GpuMemorySample> DeviceMemoryMonitor::latest() const {
  std::lock_guard lock(mu_);
  return latest_;
}

double DeviceMemoryMonitor::max_used_share() const {
  std::lock_guard lock(mu_);
  double m = 0;
  for (const auto& s : latest_) m = std::max(m, static_cast<double>(s.used_bytes) / static_cast<double>(s.total_bytes));
  return m;
}

std::uint64_t DeviceMemoryMonitor::samples_taken() const {
  std::lock_guard lock(mu_);
  return samples_;
}

}  // namespace lmserve
