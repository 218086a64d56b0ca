#include "backend/devices.h"

#include <atomic>
#include <thread>

#include "backend/device_memory.h"

#include <gtest/gtest.h>

#include "common/build_info.h"

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

}  // namespace
}  // namespace lmserve
