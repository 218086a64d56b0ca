#include "backend/device_memory.h"

#include <dlfcn.h>

#include <algorithm>
#include <memory>

#if LMSERVE_WITH_CUDA
#include "backend/cuda/probe.h"
#endif

namespace lmserve {
namespace {

// The few NVML entry points used, declared here: the build machine has no nvml.h.
struct NvmlMemory {
  unsigned long long total, free, used;
};
using NvmlDevice = void*;
using NvmlInit = int (*)();
using NvmlByPci = int (*)(const char*, NvmlDevice*);
using NvmlByIndex = int (*)(unsigned, NvmlDevice*);
using NvmlMemInfo = int (*)(NvmlDevice, NvmlMemory*);

class Nvml {
 public:
  static Nvml* get() {
    static std::unique_ptr<Nvml> n = [] {
      auto x = std::make_unique<Nvml>();
      return x->load() ? std::move(x) : nullptr;
    }();
    return n.get();
  }

  std::optional<GpuMemorySample> read(int device) {
    NvmlDevice d = nullptr;
    bool found = false;
#if LMSERVE_WITH_CUDA
    // CUDA and NVML may number devices differently (CUDA_VISIBLE_DEVICES): match by PCI id.
    const std::string pci = cuda::pci_bus_id(device);
    found = !pci.empty() && by_pci_(pci.c_str(), &d) == 0;
#endif
    if (!found && by_index_(static_cast<unsigned>(device), &d) != 0) return std::nullopt;
    NvmlMemory m{};
    if (mem_(d, &m) != 0 || m.total == 0) return std::nullopt;
    return GpuMemorySample{device, m.used, m.total, "nvml"};
  }

 private:
  bool load() {
    handle_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!handle_) return false;
    auto init = reinterpret_cast<NvmlInit>(dlsym(handle_, "nvmlInit_v2"));
    by_pci_ = reinterpret_cast<NvmlByPci>(dlsym(handle_, "nvmlDeviceGetHandleByPciBusId_v2"));
    by_index_ = reinterpret_cast<NvmlByIndex>(dlsym(handle_, "nvmlDeviceGetHandleByIndex_v2"));
    mem_ = reinterpret_cast<NvmlMemInfo>(dlsym(handle_, "nvmlDeviceGetMemoryInfo"));
    return init && by_pci_ && by_index_ && mem_ && init() == 0;
  }

  void* handle_ = nullptr;  // never closed: NVML stays loaded for the process's life
  NvmlByPci by_pci_ = nullptr;
  NvmlByIndex by_index_ = nullptr;
  NvmlMemInfo mem_ = nullptr;
};

}  // namespace

GpuMemorySampler system_gpu_memory_sampler() {
  return [](int device) -> std::optional<GpuMemorySample> {
    if (Nvml* n = Nvml::get()) {
      if (auto s = n->read(device)) return s;
    }
#if LMSERVE_WITH_CUDA
    std::uint64_t free_b = 0, total = 0;
    if (cuda::memory_info(device, &free_b, &total) && total > 0) return GpuMemorySample{device, total - free_b, total, "cuda"};
#endif
    return std::nullopt;
  };
}

DeviceMemoryMonitor::DeviceMemoryMonitor(std::vector<int> devices, std::chrono::milliseconds period, GpuMemorySampler sampler)
    : devices_(std::move(devices)), period_(period), sampler_(std::move(sampler)) {
  sample_all();
  thread_ = std::thread([this] {
    std::unique_lock lock(mu_);
    while (!cv_.wait_for(lock, period_, [this] { return stop_; })) {
      lock.unlock();
      sample_all();
      lock.lock();
    }
  });
}

DeviceMemoryMonitor::~DeviceMemoryMonitor() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

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
