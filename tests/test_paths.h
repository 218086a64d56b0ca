// Where tests find the repository, ../shared and the lmserve binary. The build fills in the
// defaults; environment variables of the same names override them, so that bundled test
// binaries run on another machine (scripts/device-bundle.sh).
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

namespace lmserve::testing {

inline std::filesystem::path path_from_env(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return (v != nullptr && *v != '\0') ? std::filesystem::path(v) : std::filesystem::path(fallback);
}

// The repository root: models/, tests/fixtures/.
inline std::filesystem::path source_dir() { return path_from_env("LMSERVE_SOURCE_DIR", LMSERVE_SOURCE_DIR); }
// ../shared beside the checkout: real tokenizers and chat templates.
inline std::filesystem::path shared_dir() { return path_from_env("LMSERVE_SHARED_DIR", LMSERVE_SHARED_DIR); }
inline std::string lmserve_binary() { return path_from_env("LMSERVE_BINARY", LMSERVE_BINARY).string(); }

}  // namespace lmserve::testing
