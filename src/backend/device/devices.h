// Which compute devices this process can use. CUDA-free: callers never see CUDA types.
//
// probe_devices() asks the CUDA runtime (when the CUDA backend is compiled in) how many
// GPUs there are and what they are. It never fails: a build without CUDA, a machine
// without a driver or without a GPU yields an empty device list and a `reason` that says
// why, fit for a log line or a test's skip message. Thread-safe; each call probes afresh.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace lmserve {

struct DeviceInfo {
  int index = 0;                 // CUDA ordinal
  std::string name;              // "NVIDIA H200"
  std::uint64_t total_bytes = 0; // device memory
  int cc_major = 0;              // compute capability, e.g. 9.0
  int cc_minor = 0;
  int multiprocessors = 0;
};

struct DeviceProbe {
  bool cuda_compiled = false;
  int runtime_version = 0;  // CUDA runtime, e.g. 13000; 0 when unknown
  int driver_version = 0;   // highest CUDA version the driver supports; 0 without a driver
  std::vector<DeviceInfo> devices;
  std::string reason;       // why `devices` is empty; empty when it is not
};

DeviceProbe probe_devices();

// Runs a small kernel on device `index` and checks every element it wrote: proof that code
// compiled for this build's architectures runs on that GPU. Unavailable without CUDA or
// without that device; Internal if the result is wrong.
Status run_device_self_test(int index);

// The batch limits a run gets when the user sets none: vLLM's rule, so that the same command
// line means the same batch on both. A GPU of at least 70 GiB other than an A100 (H100, H200,
// MI300X) gets 1,024 sequences, and 16,384 tokens per step offline (bench throughput) or 8,192
// behind the server; other GPUs 256 sequences and 8,192 / 2,048 tokens (vLLM found the large
// step slower on the A100). The CPU backend (gpu == nullptr) gets 256 / 8,192 offline and
// 64 / 2,048 behind the server: its steps take seconds, and latency would suffer first.
enum class BatchUsage { kOffline, kServer };
struct BatchLimits {
  std::int64_t max_num_seqs = 0;
  std::int64_t max_num_batched_tokens = 0;
};
BatchLimits default_batch_limits(const DeviceInfo* gpu, BatchUsage usage);

// "9.0 (sm_90), 139.8 GiB, 132 SMs" style one-line description.
std::string describe(const DeviceInfo& device);

}  // namespace lmserve
