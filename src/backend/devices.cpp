#include "backend/devices.h"

#include <fmt/format.h>

#ifdef LMSERVE_WITH_CUDA
#include "backend/cuda/probe.h"
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

std::string describe(const DeviceInfo& d) {
  return fmt::format("{} (sm_{}{}), {:.1f} GiB, {} SMs", d.name, d.cc_major, d.cc_minor,
                     static_cast<double>(d.total_bytes) / (1024.0 * 1024.0 * 1024.0), d.multiprocessors);
}

}  // namespace lmserve
