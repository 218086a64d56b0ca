#include "backend/device/gpu_power.h"

#include <algorithm>
#include <cstdio>

#include "backend/device/nvml.h"

namespace lmserve {

GpuPowerSampler system_gpu_power_sampler() {
  return [](int device) -> std::optional<GpuPowerSample> {
    auto c = nvml::clocks_and_power(device);
    if (!c) return std::nullopt;
    const std::uint64_t r = c->clock_event_reasons;
    return GpuPowerSample{.sm_mhz = c->sm_mhz,
                          .max_sm_mhz = c->max_sm_mhz,
                          .power_w = c->power_mw / 1000.0,
                          .power_limit_w = c->power_limit_mw / 1000.0,
                          .idle = (r & nvml::kReasonGpuIdle) != 0,
                          .power_capped = (r & (nvml::kReasonSwPowerCap | nvml::kReasonHwPowerBrake)) != 0,
                          .thermal = (r & (nvml::kReasonSwThermal | nvml::kReasonHwThermal | nvml::kReasonHwSlowdown)) != 0};
  };
}

GpuPowerSummary summarize(const std::vector<GpuPowerSample>& samples) {
  GpuPowerSummary s;
  s.samples = samples.size();
  double mhz = 0, watts = 0, capped = 0, hot = 0;
  for (const auto& x : samples) {
    s.max_sm_mhz = std::max(s.max_sm_mhz, x.max_sm_mhz);
    s.power_limit_w = std::max(s.power_limit_w, x.power_limit_w);
    if (x.idle) continue;
    s.min_sm_mhz = s.busy_samples == 0 ? x.sm_mhz : std::min<double>(s.min_sm_mhz, x.sm_mhz);
    ++s.busy_samples;
    mhz += x.sm_mhz;
    watts += x.power_w;
    s.max_power_w = std::max(s.max_power_w, x.power_w);
    capped += x.power_capped;
    hot += x.thermal;
  }
  if (s.busy_samples > 0) {
    const double n = static_cast<double>(s.busy_samples);
    s.mean_sm_mhz = mhz / n;
    s.mean_power_w = watts / n;
    s.power_capped_share = capped / n;
    s.thermal_share = hot / n;
  }
  return s;
}

std::string GpuPowerSummary::describe() const {
  if (busy_samples == 0) return samples == 0 ? "no samples (no NVML)" : "idle throughout";
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "SM clock mean %.0f MHz, lowest %.0f (top %u); power mean %.0f W, highest %.0f (limit %.0f W); held by the power limit in "
                "%.0f%% and by temperature in %.0f%% of %zu busy samples",
                mean_sm_mhz, min_sm_mhz, max_sm_mhz, mean_power_w, max_power_w, power_limit_w, 100 * power_capped_share, 100 * thermal_share,
                busy_samples);
  return buf;
}

GpuPowerRecorder::GpuPowerRecorder(int device, std::chrono::milliseconds period, GpuPowerSampler sampler)
    : device_(device), sampler_(std::move(sampler)) {
  ticker_.emplace(period, [this] {
    if (auto s = sampler_(device_)) {
      std::lock_guard lock(mu_);
      samples_.push_back(*s);
    }
  });
}

GpuPowerRecorder::~GpuPowerRecorder() { stop(); }

void GpuPowerRecorder::stop() { ticker_.reset(); }

GpuPowerSummary GpuPowerRecorder::summary() const {
  std::lock_guard lock(mu_);
  return summarize(samples_);
}

}  // namespace lmserve
