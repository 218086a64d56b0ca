// What this binary is: version, commit, compiler, and whether the CUDA backend is in it.
#pragma once

#include <string_view>

namespace lmserve {

struct BuildInfo {
  std::string_view version;      // "0.1.0"
  std::string_view git_commit;   // short hash at configure time, or "unknown"
  std::string_view build_type;   // CMake build type
  std::string_view compiler;     // "GNU 12.2.0"
  bool cuda = false;             // the CUDA backend is compiled in
  std::string_view cuda_archs;   // e.g. "90a"; empty without CUDA
  std::string_view nvcc_version; // empty without CUDA
};

const BuildInfo& build_info();

}  // namespace lmserve
