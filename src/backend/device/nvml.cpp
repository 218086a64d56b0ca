#include "backend/device/nvml.h"

#include <dlfcn.h>

#include <memory>
#include <string>

#if LMSERVE_WITH_CUDA
#include "backend/device/probe.h"
#endif

namespace lmserve::nvml {
namespace {

struct NvmlMemory {
  unsigned long long total, free, used;
};
using Device = void*;
using Init = int (*)();
using ByPci = int (*)(const char*, Device*);
using ByIndex = int (*)(unsigned, Device*);
using MemInfo = int (*)(Device, NvmlMemory*);
using ClockInfo = int (*)(Device, int, unsigned*);  // nvmlClockType_t: NVML_CLOCK_SM = 1
using Milliwatts = int (*)(Device, unsigned*);
using Reasons = int (*)(Device, unsigned long long*);
constexpr int kClockSm = 1;

class Library {
 public:
  static Library* get() {
    static std::unique_ptr<Library> n = [] {
      auto x = std::make_unique<Library>();
      return x->load() ? std::move(x) : nullptr;
    }();
    return n.get();
  }

  std::optional<Device> device(int cuda_device) const {
    Device d = nullptr;
#if LMSERVE_WITH_CUDA
    const std::string pci = cuda::pci_bus_id(cuda_device);
    if (!pci.empty() && by_pci_(pci.c_str(), &d) == 0) return d;
#endif
    if (by_index_(static_cast<unsigned>(cuda_device), &d) != 0) return std::nullopt;
    return d;
  }

  MemInfo mem = nullptr;
  ClockInfo clock = nullptr, max_clock = nullptr;
  Milliwatts power = nullptr, power_limit = nullptr;
  Reasons reasons = nullptr;

 private:
  template <typename F>
  F sym(const char* name) {
    return reinterpret_cast<F>(dlsym(handle_, name));
  }

  bool load() {
    handle_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!handle_) return false;
    auto init = sym<Init>("nvmlInit_v2");
    by_pci_ = sym<ByPci>("nvmlDeviceGetHandleByPciBusId_v2");
    by_index_ = sym<ByIndex>("nvmlDeviceGetHandleByIndex_v2");
    mem = sym<MemInfo>("nvmlDeviceGetMemoryInfo");
    clock = sym<ClockInfo>("nvmlDeviceGetClockInfo");
    max_clock = sym<ClockInfo>("nvmlDeviceGetMaxClockInfo");
    power = sym<Milliwatts>("nvmlDeviceGetPowerUsage");
    power_limit = sym<Milliwatts>("nvmlDeviceGetEnforcedPowerLimit");
    // Renamed in the r535 drivers; the old name stays exported beside it.
    reasons = sym<Reasons>("nvmlDeviceGetCurrentClocksEventReasons");
    if (!reasons) reasons = sym<Reasons>("nvmlDeviceGetCurrentClocksThrottleReasons");
    return init && by_pci_ && by_index_ && init() == 0;
  }

  void* handle_ = nullptr;  // never closed: NVML stays loaded for the process's life
  ByPci by_pci_ = nullptr;
  ByIndex by_index_ = nullptr;
};

}  // namespace

std::optional<Memory> memory(int device) {
  Library* n = Library::get();
  if (!n || !n->mem) return std::nullopt;
  auto d = n->device(device);
  NvmlMemory m{};
  if (!d || n->mem(*d, &m) != 0 || m.total == 0) return std::nullopt;
  return Memory{m.total, m.used};
}

std::optional<ClocksAndPower> clocks_and_power(int device) {
  Library* n = Library::get();
  if (!n || !n->clock) return std::nullopt;
  auto d = n->device(device);
  ClocksAndPower c;
  if (!d || n->clock(*d, kClockSm, &c.sm_mhz) != 0) return std::nullopt;
  if (n->max_clock) n->max_clock(*d, kClockSm, &c.max_sm_mhz);
  if (n->power) n->power(*d, &c.power_mw);
  if (n->power_limit) n->power_limit(*d, &c.power_limit_mw);
  unsigned long long r = 0;
  if (n->reasons && n->reasons(*d, &r) == 0) c.clock_event_reasons = r;
  return c;
}

}  // namespace lmserve::nvml
