// Resolves a fixture's folder reference: "../shared/..." lives beside the checkout
// (lmserve::testing::shared_dir()), anything else is relative to the repository root.
#pragma once

#include <filesystem>
#include <string>

#include "test_paths.h"

namespace lmserve::testing {

inline std::filesystem::path resolve_fixture_path(const std::string& ref) {
  const std::string shared_prefix = "../shared/";
  if (ref.starts_with(shared_prefix)) return shared_dir() / ref.substr(shared_prefix.size());
  return source_dir() / ref;
}

}  // namespace lmserve::testing
