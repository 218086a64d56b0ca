// Whole-file reads for configuration and model files.
#pragma once

#include <filesystem>
#include <string>

#include "common/status.h"

namespace lmserve {

// The file's bytes; NotFound naming the path if it cannot be opened.
Result<std::string> read_file(const std::filesystem::path& path);

}  // namespace lmserve
