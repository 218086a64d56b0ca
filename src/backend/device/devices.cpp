#include "backend/device/devices.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#ifdef LMSERVE_WITH_CUDA
#include "backend/device/probe.h"
#endif

namespace lmserve {

DeviceProbe probe_devices() {
  DeviceProbe probe;
#ifdef LMSERVE_WITH_CUDA
  probe.cuda_compiled = true;
  cuda::RawProbe raw = cuda::probe();
  probe.runtime_version = raw.runtime_version;
  probe.driver_version = raw.driver_version;
  for (const auto& d : raw.devices) {
    probe.devices.push_back(DeviceInfo{.index = d.index,
                                       .name = d.name,
                                       .total_bytes = d.total_bytes,
                                       .cc_major = d.cc_major,
                                       .cc_minor = d.cc_minor,
                                       .multiprocessors = d.multiprocessors});
  }
  if (probe.devices.empty()) probe.reason = raw.error.empty() ? "no CUDA device found" : raw.error;
#else
  probe.reason = "this build has no CUDA backend (configured without nvcc or with -DLMSERVE_CUDA=OFF)";
#endif
  return probe;
}

Status run_device_self_test(int index) {
#ifdef LMSERVE_WITH_CUDA
  std::string failure;
  switch (cuda::self_test(index, &failure)) {
    case cuda::SelfTestResult::kPassed: return Status::ok();
    case cuda::SelfTestResult::kUnavailable: return Status(StatusCode::kUnavailable, failure);
    case cuda::SelfTestResult::kWrongResult: return Status(StatusCode::kInternal, failure);
  }
  return Status(StatusCode::kInternal, "unknown self-test result");
#else
  (void)index;
  return Status(StatusCode::kUnavailable, "this build has no CUDA backend");
#endif
}

BatchLimits default_batch_limits(const DeviceInfo* gpu, BatchUsage usage) {
  const bool offline = usage == BatchUsage::kOffline;
  if (gpu == nullptr) return offline ? BatchLimits{256, 8192} : BatchLimits{64, 2048};
  std::string name = gpu->name;
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  const bool large = gpu->total_bytes >= 70ull * 1024 * 1024 * 1024 && name.find("a100") == std::string::npos;
  if (large) return offline ? BatchLimits{1024, 16384} : BatchLimits{1024, 8192};
  return offline ? BatchLimits{256, 8192} : BatchLimits{256, 2048};
}

std::string describe(const DeviceInfo& d) {
  return fmt::format("{} (sm_{}{}), {:.1f} GiB, {} SMs", d.name, d.cc_major, d.cc_minor,
                     static_cast<double>(d.total_bytes) / (1024.0 * 1024.0 * 1024.0), d.multiprocessors);
}

}  // namespace lmserve
