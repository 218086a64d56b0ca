#include "backend/device/devices.h"

#include <atomic>
#include <cstdlib>
#include <string>
#include <thread>

#include "backend/cuda/cuda_backend.h"

#include "backend/device/device_memory.h"
#include "backend/device/gpu_power.h"

#include <gtest/gtest.h>

#include "common/build_info.h"
#include "model/weights.h"
#include "test_paths.h"

namespace lmserve {
namespace {

TEST(Devices, ProbeMatchesBuild) {
  DeviceProbe probe = probe_devices();
  EXPECT_EQ(probe.cuda_compiled, build_info().cuda);
  if (probe.devices.empty()) {
    EXPECT_FALSE(probe.reason.empty()) << "an empty device list must say why";
  } else {
    EXPECT_TRUE(probe.reason.empty());
  }
}

TEST(Devices, EveryGpuRunsTheSelfTest) {
  DeviceProbe probe = probe_devices();
  if (probe.devices.empty()) GTEST_SKIP() << "no GPU: " << probe.reason;
  for (const auto& d : probe.devices) {
    EXPECT_FALSE(d.name.empty());
    EXPECT_GT(d.total_bytes, 0u);
    EXPECT_GT(d.multiprocessors, 0);
    EXPECT_GE(d.cc_major, 7) << describe(d);
    Status s = run_device_self_test(d.index);
    EXPECT_TRUE(s.is_ok()) << "cuda:" << d.index << " " << s.to_string();
  }
}

TEST(Devices, SelfTestOfAMissingDeviceIsUnavailable) {
  DeviceProbe probe = probe_devices();
  Status s = run_device_self_test(static_cast<int>(probe.devices.size()) + 7);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.to_string();
}

TEST(Devices, DescribeNamesTheCard) {
  DeviceInfo d{.index = 0, .name = "NVIDIA H200", .total_bytes = 150754820096ull, .cc_major = 9,
               .cc_minor = 0, .multiprocessors = 132};
  EXPECT_EQ(describe(d), "NVIDIA H200 (sm_90), 140.4 GiB, 132 SMs");
}

}  // namespace
}  // namespace lmserve

namespace lmserve {
namespace {

// The monitor with a fake sampler: what the admission limit and /metrics read.
// Tensor-parallel ranks on one GPU deadlock under CUDA's lazy module loading (cuda/comm/tp_group.h),
// so the backend refuses them, naming the setting, unless this process loads modules eagerly.
TEST(Devices, RanksSharingAGpuNeedEagerModuleLoading) {
  if (probe_devices().devices.empty()) GTEST_SKIP() << "no GPU";
  if (const char* m = std::getenv("CUDA_MODULE_LOADING"); m && std::string(m) == "EAGER") GTEST_SKIP() << "modules load eagerly here";
  auto w = model::ModelWeights::load(lmserve::testing::source_dir() / "tests/fixtures/models/tiny-llama3", {.dtype = "float32"});
  ASSERT_TRUE(w) << w.error().to_string();
  backend::CudaBackendOptions o;
  o.tensor_parallel_size = 2;
  o.devices = {0, 0};
  o.num_blocks = 8;
  o.max_num_seqs = 2;
  o.max_num_batched_tokens = 64;
  o.max_model_len = 64;
  auto b = backend::make_cuda_backend(*w, o);
  ASSERT_FALSE(b);
  EXPECT_NE(b.error().message().find("CUDA_MODULE_LOADING=EAGER"), std::string::npos) << b.error().to_string();
}

TEST(DeviceMemoryMonitor, SamplesEveryPeriodAndReportsTheFullestDevice) {
  std::atomic<std::uint64_t> used{10};
  GpuMemorySampler fake = [&](int d) -> std::optional<GpuMemorySample> {
    if (d == 2) return std::nullopt;  // a device that cannot be read is left out
    return GpuMemorySample{d, d == 0 ? used.load() : 50, 100, "fake"};
  };
  DeviceMemoryMonitor m({0, 1, 2}, std::chrono::milliseconds(10), fake);
  auto first = m.latest();  // sampled before the constructor returned
  ASSERT_EQ(first.size(), 2u);
  EXPECT_EQ(first[0].used_bytes, 10u);
  EXPECT_DOUBLE_EQ(m.max_used_share(), 0.5);
  used = 97;
  for (int i = 0; i < 500 && m.max_used_share() < 0.97; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  EXPECT_DOUBLE_EQ(m.max_used_share(), 0.97);
  EXPECT_GE(m.samples_taken(), 2u);
}

TEST(DeviceMemoryMonitor, NoDevicesNoSamples) {
  DeviceMemoryMonitor m({}, std::chrono::milliseconds(10));
  EXPECT_TRUE(m.latest().empty());
  EXPECT_EQ(m.max_used_share(), 0.0);
}

// Without a GPU (CI) the system sampler answers nothing rather than failing; with one it reads
// a plausible number from NVML or CUDA.
TEST(DeviceMemoryMonitor, SystemSamplerReadsAGpuOrNothing) {
  auto s = system_gpu_memory_sampler()(0);
  if (probe_devices().devices.empty()) {
    EXPECT_FALSE(s.has_value());
    return;
  }
  ASSERT_TRUE(s.has_value());
  EXPECT_GT(s->total_bytes, 1ull << 30);
  EXPECT_LE(s->used_bytes, s->total_bytes);
  std::printf("[ gpu 0 ] %s: %llu of %llu bytes in use\n", s->source.c_str(), static_cast<unsigned long long>(s->used_bytes),
              static_cast<unsigned long long>(s->total_bytes));
}

// What a run's clocks and power summary counts: busy samples only, the shares of them held by
// the power limit and by temperature, the device's top clock and limit from any sample.
TEST(GpuPower, SummaryCountsBusySamples) {
  std::vector<GpuPowerSample> v = {
      {.sm_mhz = 345, .max_sm_mhz = 1980, .power_w = 80, .power_limit_w = 700, .idle = true},
      {.sm_mhz = 1500, .max_sm_mhz = 1980, .power_w = 690, .power_limit_w = 700, .power_capped = true},
      {.sm_mhz = 1400, .max_sm_mhz = 1980, .power_w = 702, .power_limit_w = 700, .power_capped = true},
      {.sm_mhz = 1900, .max_sm_mhz = 1980, .power_w = 500, .power_limit_w = 700, .thermal = true},
      {.sm_mhz = 1600, .max_sm_mhz = 1980, .power_w = 600, .power_limit_w = 700},
  };
  GpuPowerSummary s = summarize(v);
  EXPECT_EQ(s.samples, 5u);
  EXPECT_EQ(s.busy_samples, 4u);
  EXPECT_DOUBLE_EQ(s.mean_sm_mhz, 1600.0);
  EXPECT_DOUBLE_EQ(s.min_sm_mhz, 1400.0);
  EXPECT_EQ(s.max_sm_mhz, 1980u);
  EXPECT_DOUBLE_EQ(s.mean_power_w, 623.0);
  EXPECT_DOUBLE_EQ(s.max_power_w, 702.0);
  EXPECT_DOUBLE_EQ(s.power_limit_w, 700.0);
  EXPECT_DOUBLE_EQ(s.power_capped_share, 0.5);
  EXPECT_DOUBLE_EQ(s.thermal_share, 0.25);
  EXPECT_EQ(s.describe(),
            "SM clock mean 1600 MHz, lowest 1400 (top 1980); power mean 623 W, highest 702 (limit 700 W); held by the power limit in 50% "
            "and by temperature in 25% of 4 busy samples");
  EXPECT_EQ(summarize({}).describe(), "no samples (no NVML)");
  EXPECT_EQ(summarize({v[0]}).describe(), "idle throughout");
}

TEST(GpuPower, RecorderSamplesItsDeviceUntilStopped) {
  std::atomic<int> calls{0};
  std::atomic<int> asked{-1};
  GpuPowerRecorder r(3, std::chrono::milliseconds(1), [&](int d) -> std::optional<GpuPowerSample> {
    asked = d;
    if (++calls % 2 == 0) return std::nullopt;  // an unreadable sample is left out
    return GpuPowerSample{.sm_mhz = 1000, .power_w = 100};
  });
  for (int i = 0; i < 2000 && r.summary().samples < 3; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  r.stop();
  const auto s = r.summary();
  EXPECT_GE(s.samples, 3u);
  EXPECT_EQ(asked, 3);
  EXPECT_DOUBLE_EQ(s.mean_sm_mhz, 1000.0);
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(r.summary().samples, s.samples);  // none after stop()
}

// Without a GPU (CI) the system sampler answers nothing; with one (and NVML) it reads a clock
// and a power draw within the device's limits.
TEST(GpuPower, SystemSamplerReadsAGpuOrNothing) {
  auto s = system_gpu_power_sampler()(0);
  if (probe_devices().devices.empty()) {
    EXPECT_FALSE(s.has_value());
    return;
  }
  if (!s) GTEST_SKIP() << "a GPU but no NVML";
  EXPECT_GT(s->sm_mhz, 0u);
  EXPECT_LE(s->sm_mhz, s->max_sm_mhz);
  EXPECT_GT(s->power_w, 0.0);
  EXPECT_GT(s->power_limit_w, 0.0);
  std::printf("[ gpu 0 ] SM %u of %u MHz, %.0f of %.0f W, idle %d, power-capped %d\n", s->sm_mhz, s->max_sm_mhz, s->power_w,
              s->power_limit_w, s->idle, s->power_capped);
}

}  // namespace
}  // namespace lmserve
