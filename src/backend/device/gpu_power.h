// A GPU's clocks and power over a run, for the benchmarks: an H200 held at its 700 W board
// limit runs its SMs well below their top clock, and a run's tokens/s follow the clock, so a
// throughput figure without them cannot be compared with another machine's or another call's.
// Read from NVML (nvml.h); without it (build machines, CI) a recorder simply has no samples.
//
// Threading: GpuPowerRecorder's summary() may be called from any thread while it samples.
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

struct GpuPowerSample {
  unsigned sm_mhz = 0, max_sm_mhz = 0;
  double power_w = 0, power_limit_w = 0;  // 0: not reported
  bool idle = false;                      // the driver says no work was running
  bool power_capped = false;              // the clock was held down by the power limit (software cap or power brake)
  bool thermal = false;                   // ... or by temperature
};

using GpuPowerSampler = std::function<std::optional<GpuPowerSample>(int device)>;
GpuPowerSampler system_gpu_power_sampler();  // NVML; nullopt without it

// Over the busy samples (not idle): what a run's figures were made at.
struct GpuPowerSummary {
  std::size_t samples = 0, busy_samples = 0;
  double mean_sm_mhz = 0, min_sm_mhz = 0;
  unsigned max_sm_mhz = 0;  // the device's top SM clock
  double mean_power_w = 0, max_power_w = 0, power_limit_w = 0;
  double power_capped_share = 0, thermal_share = 0;  // of the busy samples

  // One line: "SM clock mean 1541 MHz (top 1980), power mean 684 W (limit 700 W); held by the
  // power limit in 97% of busy samples"; "no samples" without any.
  std::string describe() const;
};

GpuPowerSummary summarize(const std::vector<GpuPowerSample>& samples);

// Samples one device every `period` from construction until stop() or destruction.
class GpuPowerRecorder {
 public:
  explicit GpuPowerRecorder(int device, std::chrono::milliseconds period = std::chrono::milliseconds(200),
                            GpuPowerSampler sampler = system_gpu_power_sampler());
  ~GpuPowerRecorder();
  GpuPowerRecorder(const GpuPowerRecorder&) = delete;
  GpuPowerRecorder& operator=(const GpuPowerRecorder&) = delete;

  void stop();  // no samples after it returns
  GpuPowerSummary summary() const;

 private:
  int device_;
  GpuPowerSampler sampler_;
  mutable std::mutex mu_;
  std::vector<GpuPowerSample> samples_;
  std::optional<PeriodicTask> ticker_;  // last: stopped before the members above go
};

}  // namespace lmserve
