#include "backend/devices.h"

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
