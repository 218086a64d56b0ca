// Plain-C++ view of the CUDA runtime's device queries: the seam between device/ (monitoring,
// device list, CUDA-free) and the CUDA runtime. Implemented by backend/cuda/probe.cu when the
// build has CUDA; device/'s callers guard their use with LMSERVE_WITH_CUDA otherwise.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lmserve::cuda {

struct RawDevice {
  int index = 0;
  std::string name;
  std::uint64_t total_bytes = 0;
  int cc_major = 0;
  int cc_minor = 0;
  int multiprocessors = 0;
};

struct RawProbe {
  int runtime_version = 0;
  int driver_version = 0;
  std::vector<RawDevice> devices;
  std::string error;  // the CUDA error that stopped the probe, if any
};

RawProbe probe();

enum class SelfTestResult { kPassed, kUnavailable, kWrongResult };

// Fills a buffer on `device` with a kernel and checks it on the host; `failure` says why not.
SelfTestResult self_test(int device, std::string* failure);

}  // namespace lmserve::cuda

namespace lmserve::cuda {

// The device's PCI bus id ("0000:3B:00.0"), to find the same GPU through NVML; empty on error.
std::string pci_bus_id(int device);
// cudaMemGetInfo on `device`; false when it cannot be read.
bool memory_info(int device, std::uint64_t* free_bytes, std::uint64_t* total_bytes);

}  // namespace lmserve::cuda
