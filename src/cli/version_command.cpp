#include <dlfcn.h>

#include <cstddef>
#include <cstdio>
#include <memory>
#include <string>

#include "backend/device/devices.h"
#include "cli/commands.h"
#include "common/build_info.h"

namespace lmserve::cli {
namespace {

std::string cuda_version_string(int v) {
  if (v <= 0) return "none";
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

// The process's malloc: jemalloc when it is linked in (LMSERVE_JEMALLOC) or preloaded, found by its
// control interface; otherwise the C library's.
std::string allocator_string() {
  using Mallctl = int (*)(const char*, void*, std::size_t*, void*, std::size_t);
  auto mallctl = reinterpret_cast<Mallctl>(dlsym(RTLD_DEFAULT, "mallctl"));
  const char* version = nullptr;
  std::size_t size = sizeof(version);
  if (mallctl != nullptr && mallctl("version", &version, &size, nullptr, 0) == 0 && version != nullptr) {
    return std::string("jemalloc ") + version;
  }
  return "libc malloc";
}

}  // namespace

Command add_version_command(CLI::App& app) {
  auto self_test = std::make_shared<bool>(false);
  app.add_flag("--self-test", *self_test, "run a small kernel on every GPU and check its result");
  return [self_test]() {
    const BuildInfo& b = build_info();
    std::printf("lmserve %s (commit %s, %s, %s)\n", std::string(b.version).c_str(),
                std::string(b.git_commit).c_str(), std::string(b.build_type).c_str(),
                std::string(b.compiler).c_str());
    std::printf("allocator: %s\n", allocator_string().c_str());
    DeviceProbe probe = probe_devices();
    if (b.cuda) {
      std::printf("cuda: compiled (nvcc %s, architectures %s), runtime %s, driver %s\n",
                  std::string(b.nvcc_version).c_str(), std::string(b.cuda_archs).c_str(),
                  cuda_version_string(probe.runtime_version).c_str(),
                  cuda_version_string(probe.driver_version).c_str());
    } else {
      std::printf("cuda: not compiled\n");
    }
    if (probe.devices.empty()) {
      std::printf("devices: none (%s); the CPU backend is used\n", probe.reason.c_str());
      return *self_test ? 1 : 0;
    }
    std::printf("devices: %zu\n", probe.devices.size());
    int failures = 0;
    for (const auto& d : probe.devices) {
      std::printf("  cuda:%d %s\n", d.index, describe(d).c_str());
      if (*self_test) {
        Status s = run_device_self_test(d.index);
        std::printf("  cuda:%d self-test: %s\n", d.index, s.is_ok() ? "passed" : s.to_string().c_str());
        failures += s.is_ok() ? 0 : 1;
      }
    }
    return failures == 0 ? 0 : 1;
  };
}

}  // namespace lmserve::cli
