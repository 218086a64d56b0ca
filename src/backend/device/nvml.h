// NVML, loaded at run time with dlopen("libnvidia-ml.so.1"): the build machines have no nvml.h
// and no driver, so the few entry points used are declared in nvml.cpp. Every read answers
// nullopt where NVML, the device or the entry point is missing.
//
// Threading: get() and the reads may be called from any thread (NVML is thread-safe).
#pragma once

#include <cstdint>
#include <optional>

namespace lmserve::nvml {

struct Memory {
  std::uint64_t total = 0, used = 0;
};

struct ClocksAndPower {
  unsigned sm_mhz = 0, max_sm_mhz = 0;
  unsigned power_mw = 0, power_limit_mw = 0;  // 0: not reported
  // NVML's clocks event ("throttle") reasons bit mask; 0 where the entry point is missing.
  std::uint64_t clock_event_reasons = 0;
};

// The CUDA device `device` (matched by PCI bus id, as CUDA_VISIBLE_DEVICES may renumber them),
// else NVML's device of that index.
std::optional<Memory> memory(int device);
std::optional<ClocksAndPower> clocks_and_power(int device);

// NVML's reason bits (nvmlClocksEventReason*).
inline constexpr std::uint64_t kReasonGpuIdle = 0x1, kReasonSwPowerCap = 0x4, kReasonHwSlowdown = 0x8,
                                kReasonSwThermal = 0x20, kReasonHwThermal = 0x40, kReasonHwPowerBrake = 0x80;

}  // namespace lmserve::nvml
